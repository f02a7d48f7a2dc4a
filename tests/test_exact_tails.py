"""Saturated tails come back right from both exact paths (spec.evaluate, reflib with dps=).

A fixed number of guard digits cancels 1 - tanh(80)^2 or Φ(-30) (written through erf) to zero;
the exact paths grow their working precision until the answer stops moving (spec.precision).
Expected values are closed forms that do not cancel, evaluated independently here with mpmath
at 600 digits.
"""
import mpmath
import numpy as np
import pytest

import reflib
import spec


def _closed_forms():
    sech2 = lambda x: 1 / mpmath.cosh(x) ** 2
    sig = lambda x: 1 / (1 + mpmath.exp(-x))
    dsig = lambda x: mpmath.exp(-x) / (1 + mpmath.exp(-x)) ** 2
    return [
        # (op, x, forward, derivative)
        ("tanh", 80.0, mpmath.tanh, sech2),
        ("tanh", -200.0, mpmath.tanh, sech2),
        ("sigmoid", 80.0, sig, dsig),
        ("sigmoid", -700.0, sig, dsig),
        ("gelu", -30.0, lambda x: x * mpmath.ncdf(x),
         lambda x: mpmath.ncdf(x) + x * mpmath.npdf(x)),
        ("silu", -80.0, lambda x: x * sig(x), lambda x: sig(x) * (1 + x * (1 - sig(x)))),
        ("softplus", -80.0, lambda x: mpmath.log1p(mpmath.exp(x)), sig),
    ]


CASES = _closed_forms()


@pytest.mark.parametrize("op,x,f,df", CASES, ids=[f"{c[0]}({c[1]})" for c in CASES])
@pytest.mark.parametrize("engine", ["spec", "reflib"])
def test_saturated_tails_are_exact(engine, op, x, f, df):
    dps = 40
    a, g = np.array([x]), np.array([1.0])
    if engine == "spec":
        out, (grad,) = spec.evaluate(op, [a], g, dps=dps)
    else:
        out = reflib.forward(op, [a], dps=dps)
        (grad,) = reflib.vjp(op, [a], g, dps=dps)
    with mpmath.workdps(600):
        want_f, want_df = f(mpmath.mpf(x)), df(mpmath.mpf(x))
        # relative 1e-35 at 40 digits: a few units in the last place, not a cancelled result
        assert abs(out[0] - want_f) <= mpmath.mpf("1e-35") * abs(want_f)
        assert want_df != 0
        assert abs(grad[0] - want_df) <= mpmath.mpf("1e-35") * abs(want_df)


def test_true_zeros_stay_zero_and_converge():
    """relu below zero and an exactly cancelling softmax VJP give exact zeros, not noise."""
    out, (grad,) = spec.evaluate("relu", [np.array([-1.0, 2.0])], np.array([1.0, 1.0]))
    assert grad[0] == 0 and grad[1] == 1
    # softmax's VJP for a constant cotangent is exactly zero (rows of J^T sum to zero)
    _, (gs,) = spec.evaluate("softmax", [np.array([[0.3, -1.2, 2.0]])], np.ones((1, 3)))
    assert all(abs(v) < mpmath.mpf("1e-300") for v in gs.reshape(-1))
