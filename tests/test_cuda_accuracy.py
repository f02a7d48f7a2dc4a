"""fastlib.cuda's float64 reductions and softmax family at the conformance suite's hard cases,
under numba's CUDA simulator (one subprocess), against exact values from mpmath / math.fsum.

Bounds, u = 2**-53:
- a sum of 4096 terms: the block's runs are compensated (fastlib/cuda/reduce.py NOTE), so
  |s' - s| <= (2 + log2 B) u sum|x| + O(n u^2) with B = 8 simulator threads; we allow 8 u sum|x|.
  Plain per-thread runs of 512 terms were 128 u sum|x| off.
- softmax / log_softmax / cross_entropy at logits near +-1e4: exp(x - m) / s is a few roundings
  (x - m exact here, exp and the division correctly rounded to within 1 ulp each), so 8 ulps of
  each output; the former exp(x - lse) lost |lse| ulps (858 eps).
"""
import json
import os
import pathlib
import subprocess
import sys

import mpmath
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, numpy as np
import fastlib.cuda as fc
rng = np.random.default_rng(7)
x = rng.standard_normal(4096) * np.exp(rng.uniform(-5, 5, 4096))
# 1 followed by terms below half an ulp of 1: a plain serial run starting at 1 drops them all
tiny = np.concatenate([[1.0], np.full(4095, 1e-16)])
z = np.array([[1e4, 1e4 - 1.0, 1e4 - 3.5, 1e4 - 0.25], [-1e4, -1e4 + 2.0, -1e4 + 0.5, -1e4 - 1.0]])
g = np.array([[0.3, -0.7, 0.2, 0.9], [-0.4, 0.1, 0.8, -0.6]])
t = np.array([1, 2])
out = {
    "x": x.tolist(), "z": z.tolist(), "g": g.tolist(), "t": t.tolist(),
    "sum": float(fc.forward("sum", [x])),
    "tiny": tiny.tolist(), "tiny_sum": float(fc.forward("sum", [tiny])),
    "mean": float(fc.forward("mean", [x])),
    "softmax": fc.forward("softmax", [z], axis=-1).tolist(),
    "log_softmax": fc.forward("log_softmax", [z], axis=-1).tolist(),
    "softmax_vjp": fc.vjp("softmax", [z], g, axis=-1)[0].tolist(),
    "ce": float(fc.forward("cross_entropy", [z, t.reshape(-1, 1)])),
    "ce_vjp": fc.vjp("cross_entropy", [z, t.reshape(-1, 1)], np.float64(1.0))[0].tolist(),
}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def sim():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [s for s in proc.stdout.splitlines() if s.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


U = 2.0 ** -53


def ulps(got, exact):
    exact = float(exact)
    return abs(got - exact) / np.spacing(abs(exact))


@pytest.mark.parametrize("case", ["x", "tiny"])
def test_long_float64_sum_is_compensated(sim, case):
    x = sim[case]
    got = sim["sum"] if case == "x" else sim["tiny_sum"]
    exact = mpmath.fsum([mpmath.mpf(v) for v in x])
    scale = sum(abs(v) for v in x)
    assert abs(got - float(exact)) <= 8 * U * scale
    if case == "x":
        assert abs(sim["mean"] - float(exact / len(x))) <= 8 * U * scale / len(x)


def _exact_rows(z):
    with mpmath.workdps(60):
        rows = []
        for row in z:
            zs = [mpmath.mpf(v) for v in row]
            lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in zs))
            rows.append((zs, lse))
        return rows


def test_softmax_family_at_logits_1e4(sim):
    worst = 0.0
    with mpmath.workdps(60):
        for i, (zs, lse) in enumerate(_exact_rows(sim["z"])):
            p = [mpmath.exp(v - lse) for v in zs]
            gp = mpmath.fsum(mpmath.mpf(gv) * pv for gv, pv in zip(sim["g"][i], p))
            for j in range(4):
                worst = max(worst, ulps(sim["softmax"][i][j], p[j]),
                            ulps(sim["log_softmax"][i][j], zs[j] - lse),
                            ulps(sim["softmax_vjp"][i][j], p[j] * (sim["g"][i][j] - gp)))
                onehot = 1 if j == sim["t"][i] else 0
                worst = max(worst, ulps(sim["ce_vjp"][i][j], (p[j] - onehot) / 2))
    assert worst <= 8, worst


def test_cross_entropy_at_logits_1e4(sim):
    with mpmath.workdps(60):
        rows = _exact_rows(sim["z"])
        exact = mpmath.fsum(lse - zs[t] for (zs, lse), t in zip(rows, sim["t"])) / 2
    assert ulps(sim["ce"], exact) <= 8
