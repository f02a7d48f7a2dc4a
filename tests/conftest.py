"""Test configuration: Hypothesis profiles chosen by HYPOTHESIS_PROFILE (dev, ci, thorough)."""
import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=10, deadline=None)
settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=500,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# The exact oracle's values stay in each test process (not in the user's cache folder), so
# that no test's outcome depends on what an earlier run left there; tests of that cache set
# their own folder. Subprocesses the tests start inherit it.
os.environ.setdefault("VERIGRAD_CONFORM_CACHE", "off")

# ../shared/data/mnist from the project root: tests that need it skip cleanly when it is absent.
MNIST_DIR = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"


@pytest.fixture(scope="session")
def mnist_dir():
    """Path to the real MNIST files, or skip the test when they are not beside the project."""
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST not found at {MNIST_DIR}")
    return MNIST_DIR
