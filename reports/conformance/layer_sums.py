"""The ``train`` row ``Dense bias sum``: a float32 Dense's bias gradient is the exact column sum
of its cotangent rounded once, over long batches built to be swamped.

The long story: docs/reports-conformance.md, section ``reports/conformance/layer_sums.py``.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["bias_cases", "check_bias_sum", "bias_sum_rows"]

U64 = 2.0 ** -53


def bias_cases():
    """Hypothesis strategy: ``(activation, rows, cols, seed)``."""
    from hypothesis import strategies as st

    return st.tuples(st.sampled_from(["linear", "relu"]), st.integers(1024, 4096),
                     st.integers(1, 3), st.integers(0, 2**31 - 1))


def _cotangent(rows, cols, seed):
    rng = np.random.default_rng(seed)
    sign = rng.choice([-1.0, 1.0], size=cols)
    small = rng.uniform(0.3, 0.5, size=(rows, cols)) * 2.0 ** -24 * sign   # below half an ulp
    g = small.astype(np.float32)
    g[0] = (sign * rng.uniform(1.0, 2.0, size=cols)).astype(np.float32)
    return g


def check_bias_sum(case):
    """fastlib's float32 Dense bias gradient against the exact sum rounded once (module doc).

    Returns
    -------
    properties.Result
    """
    from fastlib.layers import Dense

    from reports.conformance.oracle import Measure
    from reports.conformance.properties import Result

    activation, rows, cols, seed = case
    result = Result()
    layer = Dense(2, cols, activation, dtype=np.float32, seed=0)
    # positive pre-activations: relu' = 1 there, so the bias gradient is the cotangent's sum
    layer.load_parameters({"weight": np.full((2, cols), 0.5, np.float32),
                           "bias": np.full(cols, 0.25, np.float32)})
    layer.forward(np.ones((rows, 2), np.float32))
    g = _cotangent(rows, cols, seed)
    _, grads = layer.backward(g, need_input_grad=False)
    got = np.asarray(grads["bias"], np.float64)
    for j in range(cols):
        terms = [float(v) for v in g[:, j]]
        exact = math.fsum(terms)
        ulp = float(np.spacing(np.float32(abs(exact))))
        bound = ulp / 2 + rows * U64 * math.fsum(abs(t) for t in terms)
        err = abs(got[j] - exact)
        ok = err <= bound
        result.measures.append(Measure(
            f"bias[{j}] ({activation}, {rows} rows)", err / ulp, bound / ulp, ok,
            "" if ok else f"bias[{j}] of a {activation} Dense over {rows} rows: engine "
                          f"{got[j]!r}, exact sum {exact!r}, error {err / ulp:.1f} ulp > "
                          f"{bound / ulp:.2f} ulp (the sum rounded once)", unit="ulp"))
    return result


def bias_sum_rows():
    """The row (``runner.Row``, engine fastlib, float32)."""
    from reports.conformance.rows import Row, run_property

    def run(profile, seed):
        return run_property(bias_cases(), check_bias_sum, 3, seed,
                            lambda case: f"from reports.conformance.layer_sums import "
                                         f"check_bias_sum\nprint(check_bias_sum({case!r}))\n")
    return [Row("train", "Dense bias sum", "fastlib", "float32", run)]
