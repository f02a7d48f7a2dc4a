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


def simulate_with_retry(script, *extra, timeout=900):
    """Run the checks; a failed one runs again in a fresh process and must pass there too.

    NOTE: numba's simulator has races of its own (it swaps a device function's global ``cuda``
    for a fake module and back around each call, and simulated threads are Python threads that
    overlap; see cuda_sim_check._past_simulator_race). Besides the AttributeError, the race can
    hand one thread a private ``cuda.shared.array`` instead of the block's, which silently
    breaks a tiled kernel for that launch. A real kernel bug fails both runs (the second run's
    failure detail is the one reported, with the first's beside it).
    """
    results = simulate(script, *extra, timeout=timeout)
    failed = [name for name, (ok, _) in results.items() if not ok]
    if failed:
        again = simulate(script, *extra, timeout=timeout)
        for name in failed:
            ok, detail = again.get(name, (False, "not reported on the second run"))
            results[name] = (ok, detail if ok else
                             f"{detail} (failed on both runs; first: {results[name][1]})")
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
