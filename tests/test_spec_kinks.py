"""Kink conventions at the kink points (docs/CONTRACTS.md).

Expected values are the stated rules, written here by hand: relu'(x) = 1 if x > 0 else 0;
abs'(0) = 0; leaky_relu'(x) = 1 if x > 0 else negative_slope; maximum(a, b) sends the whole
gradient to a where a >= b, else to b.
"""
import dataclasses

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spec
from spec.opspec import call_formula

X = np.array([-2.0, -0.0, 0.0, 1e-300, 3.0])
G = np.array([1.5, 1.5, -2.0, 0.75, 0.5])


def _floats(a):
    return [float(v) for v in np.reshape(a, -1)]


def test_relu_derivative_is_zero_at_zero():
    _, (gx,) = spec.evaluate("relu", [X], G)
    assert _floats(gx) == [0.0, 0.0, 0.0, 0.75, 0.5]


def test_abs_derivative_is_zero_at_zero():
    _, (gx,) = spec.evaluate("abs", [X], G)
    assert _floats(gx) == [-1.5, 0.0, 0.0, 0.75, 0.5]


@pytest.mark.parametrize("slope", [0.01, 0.2, 2.0])
def test_leaky_relu_uses_the_slope_at_zero(slope):
    params = {} if slope == 0.01 else {"negative_slope": slope}
    out, (gx,) = spec.evaluate("leaky_relu", [X], G, params)
    with mpmath.workdps(50):
        s = mpmath.mpf(slope)    # the float slope, converted exactly
        assert list(gx) == [1.5 * s, 1.5 * s, -2 * s, mpmath.mpf(0.75), mpmath.mpf(0.5)]
        assert out[0] == -2 * s and out[2] == 0


def test_maximum_ties_go_to_the_first_argument():
    a = np.array([1.0, 2.0, -1.0, 0.0])
    b = np.array([1.0, 3.0, -2.0, -0.0])       # ties at 0 and 3 (-0.0 == 0.0)
    g = np.array([1.0, 2.0, 3.0, 4.0])
    out, (ga, gb) = spec.evaluate("maximum", [a, b], g)
    assert _floats(out) == [1.0, 3.0, -1.0, 0.0]
    assert _floats(ga) == [1.0, 0.0, 3.0, 4.0]
    assert _floats(gb) == [0.0, 2.0, 0.0, 0.0]


def test_maximum_ties_under_broadcasting_are_summed_to_the_first_argument():
    a = np.array([[0.5], [1.0]])               # (2, 1)
    b = np.array([0.5, 1.0, 0.0])              # (3,)
    g = np.arange(1.0, 7.0).reshape(2, 3)
    _, (ga, gb) = spec.evaluate("maximum", [a, b], g)
    # a >= b: row 0 -> [T, F, T]; row 1 -> [T, T, T]
    assert _floats(ga) == [1 + 3, 4 + 5 + 6]
    assert _floats(gb) == [0.0, 2.0, 0.0]


@pytest.mark.parametrize("name", [n for n, op in spec.OPS.items() if op.kinks])
@settings(max_examples=min(10, settings.default.max_examples))
@given(seed=st.integers(0, 2**32 - 1))
def test_declared_slopes_hold_at_sampled_kink_points(name, seed):
    """sample_inputs(near_kinks=True) puts values on the kink; the VJP there is slope · grad."""
    op = spec.OPS[name]
    rng = np.random.default_rng(seed)
    inputs, params = spec.sample_case(name, rng, near_kinks=True)
    resolved = op.resolve_params(params)
    out_shape = op.check_shapes([x.shape for x in inputs], params)
    grad = rng.uniform(-2, 2, size=out_shape)
    _, grads = spec.evaluate(name, inputs, grad, params)
    (kink,) = op.kinks
    slopes = call_formula(kink.slopes, resolved)
    if kink.kind == "zero":
        (x,), (gx,) = inputs, grads
        at = x == 0
        assert at.any()
        with mpmath.workdps(50):
            for idx in map(tuple, np.argwhere(at)):
                assert gx[idx] == mpmath.mpf(slopes["x"]) * mpmath.mpf(grad[idx])
    else:
        a, b = inputs
        ties = np.broadcast_to(a, out_shape) == np.broadcast_to(b, out_shape)
        assert ties.any()
        # Per-position contributions: compare the VJP of a restricted to one output position.
        for idx in map(tuple, np.argwhere(ties)):
            one = np.zeros(out_shape)
            one[idx] = 1.0
            _, (ga, gb) = spec.evaluate(name, inputs, one, params)
            assert sum(_floats(ga)) == slopes["a"] and sum(_floats(gb)) == slopes["b"]


def test_a_wrong_kink_convention_fails_the_proof_and_the_kink_test():
    """relu'(0) = 1 differs from the rule only at 0 (measure zero): no sampled point sees it,
    but the proof checks the convention at the kink itself, and so does evaluation here."""
    relu = spec.OPS["relu"]
    wrong = dataclasses.replace(relu, vjp={"x": lambda M, grad, x: M.where(M.ge(x, 0), grad,
                                                                          0 * grad)})
    result = spec.prove(wrong)
    assert not result.ok and "at the kink" in result.detail
    _, (gx,) = spec.evaluate(wrong, [np.array([0.0])], np.array([1.0]))
    assert float(gx[0]) == 1.0          # the wrong convention ...
    _, (gx,) = spec.evaluate("relu", [np.array([0.0])], np.array([1.0]))
    assert float(gx[0]) == 0.0          # ... and the registry's


def test_samplers_stay_away_from_kinks_by_default():
    rng = np.random.default_rng(0)
    for _ in range(50):
        (x,) = spec.sample_inputs("relu", rng, [(4, 4)])
        assert np.abs(x).min() >= spec.samples.KINK_MARGIN
        a, b = spec.sample_inputs("maximum", rng, [(3, 1), (1, 4)])
        assert np.abs(a - b).min() >= spec.samples.KINK_MARGIN
