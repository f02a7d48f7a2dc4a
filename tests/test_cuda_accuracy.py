"""fastlib.cuda's float64 reductions and softmax family at the conformance suite's hard cases,
under numba's CUDA simulator (one subprocess), against exact values from mpmath / math.fsum.

Bounds, u = 2**-53:
- a sum of 4096 terms: the block's runs are compensated (fastlib/cuda/reduce.py NOTE), so
  |s' - s| <= (2 + log2 B) u sum|x| + O(n u^2) with B = 8 simulator threads; we allow 8 u sum|x|.
  Plain per-thread runs of 512 terms were 128 u sum|x| off.
- div's VJP: d/da is one IEEE division g / b, so it must equal the correctly rounded quotient
  exactly (Fraction arithmetic), in float64 and, formed in float64 and rounded once, in float32.
  Inputs include the ones a GPU run found 0.84 ulp off, where g * (1 / b) != g / b. The same
  for mean's VJP, g / count.
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
# div's VJP: the GPU's counterexample first, then draws where a reciprocal-multiply is wrong
da, db, dg = [2.949777087940359], [-2.170553962688067], [0.7441290770263]
while len(da) < 12:
    a_, b_, g_ = rng.uniform(-4, 4, 3)
    if g_ * (1.0 / b_) != g_ / b_:
        da.append(a_); db.append(b_); dg.append(g_)
for dt in ("float64", "float32"):
    a, b, g = (np.array(v, dtype=dt) for v in (da, db, dg))
    out["div_" + dt] = {"a": a.astype(float).tolist(), "b": b.astype(float).tolist(),
                        "g": g.astype(float).tolist(),
                        "ga": fc.vjp("div", [a, b], g)[0].astype(float).tolist()}
gm = np.array([[0.7441290770263, -0.3]])
out["mean_vjp"] = {"g": gm.tolist(), "n": 7,
                   "out": fc.vjp("mean", [np.ones((1, 7))], np.array([gm[0, 0]]), axis=1)[0]
                   .tolist()}
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


def _round(q, dtype):
    """The correctly rounded ``dtype`` value of the Fraction ``q`` (float() rounds to nearest;
    float32 from it is a second rounding, innocuous for a quotient of float32 numbers)."""
    return float(np.dtype(dtype).type(float(q)))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_div_vjp_da_is_one_correctly_rounded_division(sim, dtype):
    from fractions import Fraction
    case = sim["div_" + dtype]
    for a, b, g, got in zip(case["a"], case["b"], case["g"], case["ga"]):
        assert got == _round(Fraction(g) / Fraction(b), dtype), (a, b, g, got)


def test_mean_vjp_divides_by_the_count(sim):
    from fractions import Fraction
    case = sim["mean_vjp"]
    g, n = case["g"][0][0], case["n"]
    assert case["out"] == [[_round(Fraction(g) / n, "float64")] * n]


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
