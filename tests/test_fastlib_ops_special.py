"""fastlib ops at kinks, saturation and extreme logits, in float32 and float64.

Expected values are hand derivations (the kink conventions of docs/CONTRACTS.md, the limits of
saturating functions) or mpmath evaluations of the textbook formulas at 60 digits; never
fastlib's own output.
"""
from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

import fastlib
import reflib
import spec

DTYPES = [np.float32, np.float64]
mp.mp.dps = 60


def _vjp1(name, x, **params):
    """The VJP of a unary op for cotangent 1 (= the derivative at each x)."""
    return fastlib.vjp(name, [x], np.ones_like(x), **params)[0]


# --- kink conventions ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_kink_conventions_by_hand(dtype):
    x = np.array([-1.0, -0.0, 0.0, 1.0], dtype)
    # NOTE: relu'(0) = 0; abs'(0) = 0; leaky_relu'(0) = slope (CONTRACTS.md)
    np.testing.assert_array_equal(_vjp1("relu", x), [0, 0, 0, 1])
    np.testing.assert_array_equal(_vjp1("abs", x), [-1, 0, 0, 1])
    np.testing.assert_array_equal(_vjp1("leaky_relu", x, negative_slope=0.25),
                                  [0.25, 0.25, 0.25, 1])
    np.testing.assert_array_equal(_vjp1("leaky_relu", x), dtype([0.01, 0.01, 0.01, 1]))
    np.testing.assert_array_equal(fastlib.forward("relu", [x]), [0, 0, 0, 1])
    # maximum: ties send the whole gradient to the first argument
    a = np.array([1.0, 2.0, 3.0, -0.0], dtype)
    b = np.array([1.0, 1.0, 4.0, 0.0], dtype)
    ga, gb = fastlib.vjp("maximum", [a, b], np.ones(4, dtype))
    np.testing.assert_array_equal(ga, [1, 1, 0, 1])
    np.testing.assert_array_equal(gb, [0, 0, 1, 0])
    # broadcast ties: b (1,) ties with both entries of a
    ga, gb = fastlib.vjp("maximum", [np.array([2.0, 2.0], dtype), np.array([2.0], dtype)],
                         np.array([3.0, 5.0], dtype))
    np.testing.assert_array_equal(ga, [3, 5])
    np.testing.assert_array_equal(gb, [0])


@pytest.mark.parametrize("name", ["relu", "abs", "leaky_relu", "maximum"])
@pytest.mark.parametrize("seed", range(5))
def test_kinks_sampled_on_the_kink_match_reflib(name, seed):
    """spec.sample_inputs(near_kinks=True) puts a quarter of the entries exactly on the kink."""
    rng = np.random.default_rng(seed)
    inputs, params = spec.sample_case(name, rng, near_kinks=True)
    grad = rng.standard_normal(np.shape(reflib.forward(name, inputs, **params)))
    for got, want in zip(fastlib.vjp(name, inputs, grad, **params),
                         reflib.vjp(name, inputs, grad, **params)):
        np.testing.assert_array_equal(got, want)
    # float32: the conventions do not depend on the dtype
    x32 = [x.astype(np.float32) for x in inputs]
    g32 = grad.astype(np.float32)
    for got, want in zip(fastlib.vjp(name, x32, g32, **params),
                         reflib.vjp(name, [x.astype(np.float64) for x in x32],
                                    g32.astype(np.float64), **params)):
        # leaky_relu's slope * g is rounded once in float32, once in float64 then float32:
        # at most one float32 ulp apart; the other VJPs select or negate: equal bits
        rtol = np.finfo(np.float32).eps if name == "leaky_relu" else 0
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=rtol, atol=0)


# --- saturation ---------------------------------------------------------------------------

def _sigmoid(x):
    return 1 / (1 + mp.exp(-x))


def _gelu_tanh(x):
    return x * _sigmoid(2 * mp.sqrt(2 / mp.pi) * (x + mp.mpf("0.044715") * x**3))


# name -> (f, f') as mpmath functions of an mpf (the textbook formulas)
MP_FUNCS = {
    "tanh": (mp.tanh, lambda x: 1 / mp.cosh(x)**2),
    "sigmoid": (_sigmoid, lambda x: _sigmoid(x) * _sigmoid(-x)),
    "softplus": (lambda x: mp.log1p(mp.exp(x)), _sigmoid),
    "silu": (lambda x: x * _sigmoid(x), lambda x: _sigmoid(x) * (1 + x * _sigmoid(-x))),
    "gelu": (lambda x: x * mp.ncdf(x), lambda x: mp.ncdf(x) + x * mp.npdf(x)),
    "gelu_tanh": (_gelu_tanh, lambda x: mp.diff(_gelu_tanh, x)),
    "exp": (mp.exp, mp.exp),
}
SATURATING_X = [-1e4, -200.0, -50.0, -20.0, -9.0, 9.0, 20.0, 50.0, 200.0, 1e4]


def _rounded(values, dtype):
    """mpf values rounded to ``dtype`` (inf where they overflow, 0 where they underflow)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.array([float(v) for v in values]).astype(dtype)


def _condition(fn, dfn, x):
    """|x f'(x) / f(x)|: how much f magnifies a relative perturbation of x (0 where f = 0)."""
    value = fn(x)
    return abs(x * dfn(x) / value) if value != 0 else mp.mpf(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(MP_FUNCS))
def test_saturating_activations_keep_relative_accuracy(name, dtype):
    f, df = MP_FUNCS[name]
    xs = [v for v in SATURATING_X if name != "exp" or abs(v) <= 50]
    x = np.array(xs, dtype)
    got = fastlib.forward(name, [x])
    dgot = _vjp1(name, x)
    points = [mp.mpf(float(v)) for v in x]
    want = _rounded([f(p) for p in points], dtype)
    dwant = _rounded([df(p) for p in points], dtype)
    cond = np.array([float(_condition(f, df, p)) for p in points])
    dcond = np.array([float(_condition(df, lambda t: mp.diff(df, t), p)) for p in points])
    eps = np.finfo(dtype).eps
    tiny = np.finfo(dtype).smallest_subnormal
    # Bound: 8 eps (1 + condition). A kernel whose roundings amount to a few-eps perturbation
    # of its intermediate values errs by that times the function's condition number |x f'/f|
    # (gelu_tanh at x = -9: ~170, its argument u = -66 is rounded before exp); 8 eps covers
    # the primitives (<= 2 ulp; tanh <= 7 ulp = 3.5 eps) plus <= 4 roundings. The subnormal
    # quantum covers results that underflow to 0 or to a subnormal.
    for g, w, c in ((got, want, cond), (dgot, dwant, dcond)):
        assert np.all(np.isfinite(g)), (name, g)
        err = np.abs(g.astype(np.float64) - w)
        assert np.all(err <= 8 * eps * (1 + c) * np.abs(w) + 8 * tiny), (name, x, g, w, c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_activations_at_the_largest_finite_inputs(dtype):
    big = np.finfo(dtype).max / 4
    x = np.array([-big, big], dtype)
    limits = {  # name -> (f(-big), f(big), f'(-big), f'(big)), the limits by hand
        "tanh": (-1, 1, 0, 0), "sigmoid": (0, 1, 0, 0), "softplus": (0, big, 0, 1),
        "silu": (0, big, 0, 1), "gelu": (0, big, 0, 1), "gelu_tanh": (0, big, 0, 1),
        "relu": (0, big, 0, 1),
    }
    for name, (f_lo, f_hi, d_lo, d_hi) in limits.items():
        np.testing.assert_array_equal(fastlib.forward(name, [x]), dtype([f_lo, f_hi]), name)
        np.testing.assert_array_equal(_vjp1(name, x), dtype([d_lo, d_hi]), name)


# --- extreme logits: softmax and the cross-entropies through log-sum-exp --------------------------

LOGITS = [[1e4, 0.0, -1e4], [-1e4, -1e4, 1e4], [0.5, -1e4, 1e4]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_sum_exp_family_at_plus_minus_1e4_by_hand(dtype):
    z = np.array(LOGITS, dtype)
    # every entry is exact: the shifted exps are 1 or underflow to 0 (e^-1e4 < 1e-4000)
    np.testing.assert_array_equal(fastlib.forward("logsumexp", [z], axis=1), [1e4, 1e4, 1e4])
    np.testing.assert_array_equal(fastlib.forward("softmax", [z]),
                                  [[1, 0, 0], [0, 0, 1], [0, 0, 1]])
    np.testing.assert_array_equal(fastlib.forward("log_softmax", [z]),
                                  dtype([[0, -1e4, -2e4], [-2e4, -2e4, 0],
                                         [0.5 - 1e4, -2e4, 0]]))
    target = np.array([0, 1, 2])
    # losses: rows 0 and 2 pick the max (loss 0), row 1 picks -1e4 (loss 2e4): mean 2e4 / 3
    loss = fastlib.forward("cross_entropy", [z, target])
    assert loss.dtype == dtype and loss == dtype(2e4 / 3)
    (gz, none) = fastlib.vjp("cross_entropy", [z, target], dtype(1.0))
    assert none is None
    np.testing.assert_array_equal(gz, dtype([[0, 0, 0], [0, -1, 1], [0, 0, 0]]) / dtype(3))
    onehot = np.eye(3, dtype=dtype)[target]
    assert fastlib.forward("categorical_cross_entropy", [z, onehot]) == dtype(2e4 / 3)
    gz, gt = fastlib.vjp("categorical_cross_entropy", [z, onehot], dtype(3.0))
    np.testing.assert_array_equal(gz, dtype([[0, 0, 0], [0, -1, 1], [0, 0, 0]]))
    np.testing.assert_array_equal(gt, -fastlib.forward("log_softmax", [z]))
    # binary with logits: terms max(z,0) - z t + log1p(exp(-|z|)), exact at |z| = 1e4
    t = np.array([[1, 0, 0], [0, 1, 1], [1, 0, 1]], dtype)
    # by hand: z = 0, t = 0 gives log 2; z = -1e4, t = 1 gives 1e4; z = 0.5, t = 1 gives
    # log1p(exp(-0.5)); every other entry is 0
    want = (np.log(2.0) + 1e4 + np.log1p(np.exp(-0.5))) / 9
    got = fastlib.forward("binary_cross_entropy_with_logits", [z, t])
    assert abs(float(got) - want) <= 4 * np.finfo(dtype).eps * want
    gz, gt = fastlib.vjp("binary_cross_entropy_with_logits", [z, t], dtype(9.0))
    assert np.all(np.isfinite(gz)) and np.all(np.isfinite(gt))
    np.testing.assert_array_equal(gt, -z)          # d/dt = -z / N, times 9 = N


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp", "cross_entropy",
                                  "categorical_cross_entropy",
                                  "binary_cross_entropy_with_logits"])
def test_log_sum_exp_family_finite_for_huge_finite_logits(name, dtype):
    """Finite outputs and gradients for logits near the largest finite value."""
    big = np.finfo(dtype).max / 8
    z = np.array([[big, -big, 0.0], [-big, -big, -big], [1.0, 2.0, 3.0]], dtype)
    second = {"cross_entropy": [np.array([1, 0, 2])],
              "categorical_cross_entropy": [np.eye(3, dtype=dtype)],
              "binary_cross_entropy_with_logits": [np.ones((3, 3), dtype)]}.get(name, [])
    out = fastlib.forward(name, [z] + second)
    grads = fastlib.vjp(name, [z] + second, np.ones(out.shape, dtype))
    assert np.all(np.isfinite(out))
    for g in grads:
        assert g is None or np.all(np.isfinite(g))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("center", [1e4, -3e5])
def test_log_softmax_vjp_at_large_logits_within_a_few_ulps(dtype, center):
    """log_softmax's VJP g - softmax(x) sum(g) at logits far from 0 against spec.evaluate.

    softmax must come from exp((x - max) - log sum exp(x - max)): exp(x - lse) with lse rounded
    to the dtype carries lse's rounding error (|lse| u) into every exponent, thousands of ULPs
    here. Bound: 4 ulps of |g| + |softmax sum(g)| (the two terms of the subtraction).
    """
    rng = np.random.default_rng(7)
    # float32 numbers (exact in both dtypes) spread over a few units around the center
    x = (np.float32(center) + rng.uniform(-4, 4, (4, 16)).astype(np.float32)).astype(dtype)
    g = rng.uniform(-1, 1, x.shape).astype(np.float32).astype(dtype)
    _, (exact,) = spec.evaluate("log_softmax", [x.astype(np.float64)], g.astype(np.float64),
                                params={"axis": -1}, dps=50)
    exact = np.array([[float(v) for v in row] for row in exact])
    got = fastlib.vjp("log_softmax", [x], g)[0]
    assert got.dtype == dtype
    p = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True).astype(np.float64))
    p /= p.sum(axis=1, keepdims=True)
    scale = np.abs(g) + np.abs(p * g.sum(axis=1, keepdims=True))
    ulps = np.abs(got.astype(np.float64) - exact) / (np.finfo(dtype).eps * scale)
    assert np.all(ulps <= 4), ulps.max()


# --- IEEE propagation where NaN is accepted ------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_propagates_through_ieee_ops(dtype):
    x = np.array([np.nan, 1.0], dtype)
    for name in ("relu", "tanh", "exp", "log", "sigmoid", "softplus", "gelu", "silu", "abs"):
        assert np.isnan(fastlib.forward(name, [x])[0]), name
        assert not np.isnan(fastlib.forward(name, [x])[1]), name
    assert np.isnan(fastlib.forward("maximum", [x, np.zeros(2, dtype)])[0])   # as np.maximum
    assert np.isnan(fastlib.forward("maximum", [np.zeros(2, dtype), x])[0])
    assert np.isnan(fastlib.forward("sum", [x]))
    np.testing.assert_array_equal(fastlib.forward("log", [np.array([0.0, -1.0], dtype)]),
                                  [-np.inf, np.nan])
