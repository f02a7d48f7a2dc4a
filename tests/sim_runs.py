"""Running a CUDA simulator script in a fresh process and reading its checks.

tests/cuda_sim_check.py (the ops) and tests/cuda_train_sim_check.py (device training) print
one JSON row per check; tests/test_cuda.py and tests/test_cuda_train.py run them through these
helpers. NUMBA_ENABLE_CUDASIM=1 must be set before numba is imported, and this pytest process
may already have imported numba without it: hence the subprocess.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(path):
    """The script at ``path`` as a module (to read its check names without running it)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_python(code_or_args, env_update, drop=(), timeout=900):
    """``python -c code`` (or ``python *args``) from the checkout, with the environment changed."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_update)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    args = code_or_args if isinstance(code_or_args, list) else ["-c", code_or_args]
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def simulate(script, *extra, timeout=900):
    """Run ``script`` under the simulator once; ``{check name: (ok, detail)}``."""
    proc = run_python([str(script), *extra], {"NUMBA_ENABLE_CUDASIM": "1"}, timeout=timeout)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row["check"]] = (row["ok"], row["detail"])
    if proc.returncode != 0 or not results:
        pytest.fail(f"the simulator run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return results


def assert_passed(results, check, script):
    """``check`` was reported by ``script``'s run and passed."""
    assert check in results, f"{check} was not reported by {script.name}"
    ok, detail = results[check]
    assert ok, f"{check}: {detail}"


def assert_only_known(results, known):
    """Every reported name is a known check (a crashed group reports ``group:<name>`` with its
    traceback, so any unknown name is a failure)."""
    extra = {name: detail for name, (ok, detail) in results.items() if name not in set(known)}
    assert not extra, f"unexpected reports (crashes?): {extra}"
