"""The accuracy bar for the unary VJPs that missed it: float32 sigmoid and silu, float64 gelu and
gelu_tanh.

Oracles: the derivatives' closed forms in mpmath at 60 digits (sigmoid' = e / (1 + e)^2 with
e = exp(-|x|), silu' = s (1 + x (1 - s)), gelu' = Phi(x) + x phi(x), gelu_tanh' from the spec's
exact constants sqrt(2/pi) and 44715/10^6), never fastlib. The float32 reference is the exact
value correctly rounded to float32 (``reports.accuracy.float32_nearest`` of the exact hi + lo,
which avoids the double rounding of float64 -> float32).

- float32 sigmoid, silu: fastlib evaluates g * f'(x) in float64 (``_exp64``: relative error
  < 1e-14; four more roundings of 1.1e-16) and rounds once, so the result is the correctly
  rounded value unless the float64 value lies within ~1.2e-14 relative (2e-7 float32 ULP) of a
  rounding boundary: max error <= 0.5 + 1e-6 ULP, and correctly rounded on (nearly) every
  element. silu' cancels near its root (x ~ -1.2785): the float64 error grows by the
  cancellation factor (1 + |x s(-x)|) / |1 + x s(-x)|, so the bound is checked where that factor
  is <= 1e4 (float64 error <= 1.2e-10 relative = 2e-3 ULP).
- float64 gelu, gelu_tanh: double-double, rounded once (``scalar._gelu_vjp64``): within
  0.5 + 0.01 ULP where kappa <= 8; asserted <= 1 ULP. kappa = 1 + |x f''(x) / f'(x)| (x's share,
  the cotangent's is 1), by hand; f'' from mpmath.diff.
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest

import fastlib
from reports import accuracy as A

mpmath.mp.dps = 60
C = mpmath.sqrt(2 / mpmath.pi)
A_GELU = mpmath.mpf(44715) / 10 ** 6


def _sigmoid(x):
    return 1 / (1 + mpmath.exp(-x))


DERIVATIVES = {
    "sigmoid": lambda x: _sigmoid(x) * _sigmoid(-x),
    "silu": lambda x: _sigmoid(x) * (1 + x * _sigmoid(-x)),
    "gelu": lambda x: mpmath.ncdf(x) + x * mpmath.npdf(x),
    "gelu_tanh": lambda x: (1 + mpmath.tanh(C * (x + A_GELU * x ** 3))) / 2
    + x * (1 - mpmath.tanh(C * (x + A_GELU * x ** 3)) ** 2) * C * (1 + 3 * A_GELU * x ** 2) / 2,
}


def _exact_vjp(name, x, g):
    """hi, lo (float64 pair) of g f'(x), elementwise."""
    df = DERIVATIVES[name]
    vals = [mpmath.mpf(float(gi)) * df(mpmath.mpf(float(xi))) for xi, gi in zip(x, g)]
    hi = np.array([float(v) for v in vals])
    lo = np.array([float(v - mpmath.mpf(h)) for v, h in zip(vals, hi)])
    return hi, lo


def _ulps(values, hi, lo, dtype):
    err = np.abs((np.asarray(values, np.float64) - hi) - lo)
    return err / A.spacing(hi, dtype)


def _grid32(rng, lo, hi, n):
    x = np.concatenate([np.linspace(lo, hi, n), rng.uniform(lo, hi, n)]).astype(np.float32)
    g = rng.uniform(-1, 1, x.size).astype(np.float32)
    g[:: 7] = 1.0                                            # the derivative itself, too
    return x, g


@pytest.mark.parametrize("name", ["sigmoid", "silu"])
def test_float32_vjp_correctly_rounded(name):
    rng = np.random.default_rng(8)
    x, g = _grid32(rng, -30.0, 30.0, 2500)
    hi, lo = _exact_vjp(name, x, g)
    (got,) = fastlib.vjp(name, [x], g)
    assert got.dtype == np.float32
    ulps = _ulps(got, hi, lo, "float32")
    keep = np.ones(x.size, bool)
    if name == "silu":
        xd = x.astype(np.float64)
        sm = 1 / (1 + np.exp(xd))
        keep = (1 + np.abs(xd * sm)) / np.abs(1 + xd * sm) <= 1e4
        assert keep.mean() > 0.99
    assert np.max(ulps[keep]) <= 0.5 + 1e-6, np.max(ulps[keep])
    correct = got.astype(np.float64) == A.float32_nearest(hi, lo)
    assert correct[keep].mean() >= 0.999, correct[keep].mean()
    # the figure the bar compares with PyTorch: the median (PyTorch float32: 0.47 ULP)
    assert np.median(ulps) <= 0.3


@pytest.mark.parametrize("name", ["sigmoid", "silu"])
def test_float32_vjp_limits(name):
    # saturation and the infinities keep the float32 formulas' values: the limits 0 and 1, no
    # NaN from 0 * inf at -inf; NaN at silu'(+inf), as before and as PyTorch (1 + inf * 0)
    x = np.array([-np.inf, -1e30, -200.0, -90.0, 0.0, 90.0, 1e30, np.inf, np.nan], np.float32)
    g = np.ones_like(x)
    (got,) = fastlib.vjp(name, [x], g)
    expect = {"sigmoid": [0, 0, 0, float(DERIVATIVES["sigmoid"](-90)), 0.25,
                          float(DERIVATIVES["sigmoid"](90)), 0, 0, np.nan],
              "silu": [0, 0, 0, float(DERIVATIVES["silu"](-90)), 0.5, 1, 1, np.nan,
                       np.nan]}[name]
    np.testing.assert_array_equal(got, np.array(expect, np.float32))


def _kappa(name, x):
    df = DERIVATIVES[name]
    out = []
    for xi in x:
        v = mpmath.mpf(float(xi))
        d1 = df(v)
        d2 = mpmath.diff(df, v)
        out.append(float(1 + abs(v * d2 / d1)) if d1 != 0 else np.inf)
    return np.array(out)


@pytest.mark.parametrize("name,lo,hi", [("gelu", -3.5, 3.5), ("gelu_tanh", -6.0, 6.0)])
def test_float64_vjp_within_one_ulp_where_well_conditioned(name, lo, hi):
    # x < 0 is where Phi(x) + x phi(x) (and s (1 + x (1 - s) 2u')) cancel: the plain float64
    # formulas were 4.2 and 5.7 ULPs off at kappa <= 8.
    rng = np.random.default_rng(9)
    x = np.concatenate([np.linspace(lo, hi, 701), rng.uniform(lo, hi, 300)])
    x = x.astype(np.float32).astype(np.float64)
    g = rng.uniform(-1, 1, x.size).astype(np.float32).astype(np.float64)
    hi_, lo_ = _exact_vjp(name, x, g)
    (got,) = fastlib.vjp(name, [x], g)
    ulps = _ulps(got, hi_, lo_, "float64")
    well = _kappa(name, x) <= A.KAPPA_WELL
    assert well.sum() > 600
    assert np.max(ulps[well]) <= 1.0, (np.max(ulps[well]), x[well][np.argmax(ulps[well])])


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh"])
def test_float64_vjp_tails_and_specials(name):
    # beyond the double-double range (|x| > 3 for gelu, > 30 for gelu_tanh) the float64 formula
    # takes over: no NaN, the limits 0 and 1 exactly, subnormal-free tails of the right sign
    x = np.array([-1e150, -700.0, -40.0, -30.5, -8.0, -3.0, -0.0, 3.0, 8.0, 31.0, 700.0, 1e150])
    (got,) = fastlib.vjp(name, [x], np.ones_like(x))
    assert np.all(np.isfinite(got))
    hi, lo = _exact_vjp(name, x, np.ones_like(x))
    ulps = _ulps(got, hi, lo, "float64")
    moderate = np.abs(x) <= 8
    assert np.max(ulps[moderate]) <= 4.0, ulps      # kappa <= 8 only near |x| <= 3 (see above)
    assert got[0] == 0 and got[-1] == 1 and got[-2] == 1
