"""Tests of ``train(device="cuda")``, the training step on the device.

1. Under numba's CUDA simulator, in one subprocess (tests/cuda_train_sim_check.py: the variable
   must be set before numba is imported): the frame (one device-to-host copy per step, host
   weights stale until synchronised and synchronised by any host read, save and resume bit for
   bit), the explosion guards, both clipping modes against the CPU, the errors for what
   the device cannot run, the launch budgets per step (the MLP, SwiGLU, the transformer block,
   every layer kind) and the CUDA graph bookkeeping through a stand-in graph builder. Each
   reported check is one test here.
2. Without a GPU and without the simulator (another subprocess): ``device="cuda"`` raises the
   clear RuntimeError and trains nothing on the CPU.
3. ``-m slow``: train_sh and the seven optimizers on the device against the CPU, and the
   conformance ``train`` rows of ``fastlib-cuda`` (every layer kind, the fused MLP, float32 and
   float64; mixed precision in bfloat16 and float16) through ``verigrad conform``.
"""
from __future__ import annotations

import json
import pathlib

import pytest

from tests.sim_runs import (assert_only_known, assert_passed, load_script, once_per_run_parts,
                             run_python, simulate)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "cuda_train_sim_check.py"
CHECKS = load_script(SCRIPT).check_names()
SLOW_CHECKS = [c for c in load_script(SCRIPT).check_names(slow=True) if c not in CHECKS]
# the check groups in two processes of about the same length (about three minutes each on
# two loaded cores), so two test workers can run them side by side; every other group goes
# in the second, so a group added later is never left out
FIRST_PART = ("recurrent", "graph", "budget", "mixed")
SECOND_PART = tuple(g for g in load_script(SCRIPT).GROUPS if g not in FIRST_PART)


def _run(args, env_update, drop=()):
    return run_python(args, env_update, drop, timeout=3600)


def _simulate(*extra):
    """Run the checks once, in a fresh process under the simulator."""
    return simulate(SCRIPT, *extra, timeout=3600)


@pytest.fixture(scope="module")
def sim_results():
    return once_per_run_parts(
        [(f"cuda_train_sim_check-{k}", lambda part=part: _simulate("--only", ",".join(part)))
         for k, part in enumerate((FIRST_PART, SECOND_PART))])


@pytest.mark.parametrize("check", CHECKS)
def test_device_training(sim_results, check):
    assert_passed(sim_results, check, SCRIPT)


def test_simulator_reports_only_known_checks(sim_results):
    assert_only_known(sim_results, CHECKS)


_NO_DEVICE = """
import numpy as np, fastlib, fastlib.cuda as fc
if fc.is_available():
    print("GPU PRESENT")
    raise SystemExit(0)
m = fastlib.Sequential([fastlib.Dense(2, 2)], dtype=np.float64)
before = {k: v.copy() for k, v in m.parameters().items()}
try:
    fastlib.train(m, np.ones((2, 2)), np.array([0, 1]), 1, 2, 0.1, "cross_entropy",
                  device="cuda", verbose=False)
    print("NO ERROR")
except RuntimeError as exc:
    same = all(np.array_equal(v, before[k]) for k, v in m.parameters().items())
    print("RAISED", same, exc)
"""


def test_without_gpu_or_simulator_device_cuda_raises_and_trains_nothing():
    proc = _run(["-c", _NO_DEVICE], {}, drop=("NUMBA_ENABLE_CUDASIM",))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip()
    if out == "GPU PRESENT":
        pytest.skip("a CUDA GPU is present: device='cuda' legitimately trains there")
    assert out.startswith("RAISED True"), out
    assert "device='cuda' is not available" in out and "NUMBA_ENABLE_CUDASIM=1" in out, out


@pytest.mark.slow
def test_device_training_slow_checks():
    results = _simulate("--slow", "--only", "slow")
    for check in SLOW_CHECKS:
        assert check in results, f"{check} was not reported"
        ok, detail = results[check]
        assert ok, f"{check}: {detail}"


@pytest.mark.slow
def test_conformance_train_rows_of_fastlib_cuda(tmp_path):
    out = tmp_path / "rows.json"
    proc = _run(["-m", "reports", "conform", "--engines", "fastlib-cuda", "--no-proofs", "--ops",
                 "train", "--json", str(out)], {"NUMBA_ENABLE_CUDASIM": "1"})
    assert out.exists(), proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    train = [r for r in rows if r["check"] == "train" and r["engine"] == "fastlib-cuda"]
    # every layer kind and the fused MLP, in both dtypes; mixed MLPs in both 16-bit formats,
    # the loss-scale runs and each format's step-by-step rounding points
    from reports.conformance.strategies import LAYER_KINDS
    wide = [r for r in train if r["dtype"] in ("float32", "float64")]
    assert len(wide) == 2 * (len(LAYER_KINDS) + 1), [r["name"] for r in wide]
    narrow = sorted((r["name"], r["dtype"]) for r in train if r not in wide)
    assert narrow == [("loss scale", "float16"), ("mixed MLP", "bfloat16"),
                      ("mixed MLP", "float16"), ("rounding points", "bfloat16"),
                      ("rounding points", "float16")], narrow
    bad = [(r["name"], r["dtype"], r["detail"]) for r in train if r["status"] != "pass"]
    assert not bad, bad
    assert proc.returncode == 0, proc.stdout[-3000:]
