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
import tempfile

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


_DONE = {}   # this process's finished runs, by name


def _shared_folder():
    """``(folder, fcntl)``: the folder every xdist worker of this pytest run shares, and the
    lock module; None outside xdist or without POSIX locks (each worker computes its own)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    try:
        import fcntl
    except ImportError:
        return None
    if run_id is None:
        return None
    folder = pathlib.Path(tempfile.gettempdir()) / f"verigrad-tests-{run_id}"
    folder.mkdir(exist_ok=True)
    return folder, fcntl


def once_per_run(name, compute):
    """``compute()`` (a JSON-able dict), run once per pytest run, however many xdist workers.

    A module-scoped fixture runs again in every worker that takes one of the module's tests,
    and again in a worker that comes back to the module after another (work stealing does
    that): a simulator run of several minutes would be paid two or three times. Under xdist
    the first worker computes under a lock in a folder all the run's workers share and leaves
    the result there; the others wait for the lock and read it. A failed ``compute`` leaves
    nothing, so the next worker that needs it runs it again (and fails in its own tests).
    """
    if name in _DONE:
        return _DONE[name]
    shared = _shared_folder()
    if shared is None:
        _DONE[name] = compute()
        return _DONE[name]
    folder, fcntl = shared
    path = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
        if path.exists():
            result = json.loads(path.read_text())
        else:
            result = compute()
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(result))
            partial.replace(path)
    _DONE[name] = {k: tuple(v) if isinstance(v, list) else v for k, v in result.items()}
    return _DONE[name]


def once_per_run_parts(parts):
    """The union of several :func:`once_per_run` results, ``parts`` = [(name, compute)].

    Under xdist, a worker computes first a part no other worker is computing (a lock it can
    take at once), so two workers that need the same parts compute different ones side by side
    instead of one waiting for the other; it waits only for parts already under way.
    """
    merged, todo, shared = {}, list(parts), _shared_folder()
    while todo:
        pick = 0
        if shared is not None and len(todo) > 1:
            folder, fcntl = shared
            for k, (name, _) in enumerate(todo):
                with open(folder / f"{name}.lock", "w") as lock:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue      # another worker is computing it
                pick = k              # free (or done): take this one now
                break
        name, compute = todo.pop(pick)
        merged.update(once_per_run(name, compute))
    return merged


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
