"""Test configuration: Hypothesis profiles chosen by HYPOTHESIS_PROFILE (dev, ci, thorough)."""
import os
import pathlib
import shutil
import tempfile

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


def pytest_configure(config):
    """The exact oracle's values go to a folder of this session (not the user's cache folder),
    shared by the test workers and the commands the tests start, so that no test's outcome
    depends on what an earlier run left behind and no exact value is computed twice in one
    run; tests of that cache set their own. A folder chosen in the environment wins."""
    if "VERIGRAD_CONFORM_CACHE" in os.environ or hasattr(config, "workerinput"):
        return                     # chosen outside, or a worker (it inherits the session's)
    folder = tempfile.mkdtemp(prefix="verigrad-test-exact-")
    os.environ["VERIGRAD_CONFORM_CACHE"] = folder
    config.verigrad_exact_folder = folder


def pytest_unconfigure(config):
    folder = getattr(config, "verigrad_exact_folder", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)

# ../shared/data/mnist from the project root: tests that need it skip cleanly when it is absent.
MNIST_DIR = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"


@pytest.fixture(scope="session")
def mnist_dir():
    """Path to the real MNIST files, or skip the test when they are not beside the project."""
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST not found at {MNIST_DIR}")
    return MNIST_DIR


@pytest.fixture
def nothing_runs(monkeypatch):
    """Make every expensive step fail loudly, so a test proves it was never reached."""
    from reports import accuracy
    from reports.commands import conform

    def boom(*a, **k):
        raise AssertionError("the command started working before refusing its arguments")

    monkeypatch.setattr(conform, "run_spec_proofs", boom)
    monkeypatch.setattr(conform, "run_engines", boom)
    monkeypatch.setattr(accuracy, "measure", boom)
