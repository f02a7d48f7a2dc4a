"""fastlib's once-rounded VJP kernels against exact values at adversarial inputs.

Expected values come from exact arithmetic (``fractions.Fraction``, ``math.fsum``) or mpmath
at 60 digits, rounded once; never from fastlib:

- float64 binary VJPs summed back over a long broadcast axis (the terms cancel);
- float64 silu's VJP near its root and at large |x| (its 1 - sigmoid(x) must not cancel);
- float32 exp and tanh VJPs, which are evaluated in float64 and rounded once to float32.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from fastlib.kernels.binary import binary_vjp
from fastlib.kernels.elementwise import unary_vjp


def _ulp64(x):
    return math.ulp(abs(x)) if x != 0 else math.ulp(0.0)


def _cancelling_column(rng, n):
    """n float64 terms whose sum is far smaller than the sum of their magnitudes."""
    big = rng.uniform(1e3, 1e6, size=n // 2)
    small = rng.standard_normal(n - 2 * (n // 2) + n // 2)
    terms = np.concatenate([big, -big * (1 + rng.uniform(-1e-9, 1e-9, size=n // 2)), small])
    return rng.permutation(terms)[:n]


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_float64_add_sub_long_broadcast_sum_is_correctly_rounded(layout):
    rng = np.random.default_rng(11)
    n, k = 4099, 3
    g = np.stack([_cancelling_column(rng, n) for _ in range(k)], axis=1)   # (n, k)
    a = rng.standard_normal((n, k))
    b = rng.standard_normal(k) if layout == "columns" else rng.standard_normal((n, 1))
    if layout == "rows":
        g = np.ascontiguousarray(g)
    for name, sign in (("add", 1.0), ("sub", -1.0)):
        _, gb = binary_vjp(name, a, b, g)
        exact = (math.fsum(col) for col in (g.T if layout == "columns" else g))
        expected = np.array([sign * e for e in exact]).reshape(b.shape)
        np.testing.assert_array_equal(gb, expected)


def test_float64_add_bias_of_ones_minus_cancellation_is_exact():
    # 1e16 + 1 + ... - 1e16: pairwise float64 loses every 1; the exact sum is the count
    g = np.ones((2050, 1))
    g[0, 0] = 1e16
    g[-1, 0] = -1e16
    _, gb = binary_vjp("add", np.zeros((2050, 1)), np.zeros(1), g)
    assert gb[0] == 2048.0


def _exact_sum(terms):
    return float(sum(terms, Fraction(0)))        # Fraction -> float rounds once, correctly


def test_float64_mul_and_maximum_broadcast_sums_are_correctly_rounded():
    rng = np.random.default_rng(5)
    n = 3001
    a = rng.standard_normal((n, 2)) * 10.0 ** rng.integers(-3, 4, size=(n, 2))
    b = rng.standard_normal(2)
    g = np.stack([_cancelling_column(rng, n) for _ in range(2)], axis=1)
    _, gb = binary_vjp("mul", a, b, g)
    for q in range(2):
        assert gb[q] == _exact_sum(Fraction(g[i, q]) * Fraction(a[i, q]) for i in range(n))
    b = rng.standard_normal(2) * 0.1
    ga, gb = binary_vjp("maximum", a, b, g)
    for q in range(2):
        lose = [Fraction(g[i, q]) for i in range(n) if not a[i, q] >= b[q]]
        assert gb[q] == _exact_sum(lose)
    np.testing.assert_array_equal(ga, np.where(a >= b, g, 0.0))


def test_float64_div_broadcast_sum_is_rounded_once():
    rng = np.random.default_rng(7)
    n = 2053
    a = rng.standard_normal((n, 1))
    b = np.array([3.0 + 1.0 / 3.0])                 # not a power of two: every quotient rounds
    g = _cancelling_column(rng, n).reshape(n, 1)
    ga, gb = binary_vjp("div", a, b, g)
    fb = Fraction(b[0])
    exact_b = -sum((Fraction(g[i, 0]) * Fraction(a[i, 0]) / (fb * fb) for i in range(n)),
                   Fraction(0))
    assert abs(Fraction(gb[0]) - exact_b) <= Fraction(_ulp64(float(exact_b))) / 2
    np.testing.assert_array_equal(ga.reshape(-1), g.reshape(-1) / b[0])   # no sum: one rounding


def _silu_vjp_exact(x, g):
    with mpmath.workdps(60):
        xm = mpmath.mpf(x)
        s = 1 / (1 + mpmath.exp(-xm))
        return mpmath.mpf(g) * s * (1 + xm * (1 - s))


@pytest.mark.parametrize("x", [-700.0, -80.0, -40.0, -20.5, -5.25, -2.0, -1.3, -1.2784645,
                               -1.25, -0.75, -1e-8, 0.0, 1e-8, 0.5, 3.0, 20.5, 40.0, 700.0])
def test_float64_silu_vjp_is_rounded_once(x):
    g = 0.7317
    got = float(unary_vjp("silu", np.array([x]), np.array([g]))[0])
    exact = _silu_vjp_exact(x, g)
    # rounded once: half an ulp, plus the double-double's own error (dd_exp's 1e-20 relative,
    # of the terms of 1 + x (1 - s), which cancel by 1e8 at the root near -1.2785: kappa is
    # huge there, and a float64 formula is off by millions of ulps)
    with mpmath.workdps(60):
        s = 1 / (1 + mpmath.exp(-mpmath.mpf(x)))
        scale = abs(g) * s * (1 + abs(x) * (1 - s))
    bound = mpmath.mpf(_ulp64(float(exact))) / 2 + scale * mpmath.mpf(2) ** -66
    assert abs(mpmath.mpf(got) - exact) <= bound


def test_float64_silu_vjp_limits():
    x = np.array([-800.0, -np.inf, 800.0, np.inf, np.nan])
    got = unary_vjp("silu", x, np.full(5, 2.0))
    np.testing.assert_array_equal(got[:4], [0.0, 0.0, 2.0, 2.0])
    assert np.isnan(got[4])


def _round_f32(v):
    """mpf ``v`` rounded once to float32 (normal range), as a float."""
    with mpmath.workprec(24):
        return float(+v)


_F32_EXACT = {
    "exp": lambda x, g: g * mpmath.exp(x),
    "tanh": lambda x, g: g * mpmath.sech(x) ** 2,
}


@pytest.mark.parametrize("name", ["exp", "tanh"])
def test_float32_exp_tanh_vjps_are_correctly_rounded(name):
    rng = np.random.default_rng(3)
    hi = 80.0 if name == "exp" else 40.0
    x = rng.uniform(-hi, hi, size=1500).astype(np.float32)
    x = np.concatenate([x, rng.uniform(-2, 2, size=500).astype(np.float32)])
    g = rng.uniform(-1, 1, size=x.size).astype(np.float32)
    got = unary_vjp(name, x, g)
    assert got.dtype == np.float32
    expected = np.empty(x.size)
    with mpmath.workdps(40):
        for i in range(x.size):
            expected[i] = _round_f32(_F32_EXACT[name](mpmath.mpf(float(x[i])),
                                                       mpmath.mpf(float(g[i]))))
    normal = np.abs(expected) >= np.finfo(np.float32).tiny
    assert normal.sum() > 1000
    np.testing.assert_array_equal(got[normal].astype(np.float64), expected[normal])


def test_float32_exp_vjp_edges():
    x = np.array([88.9, -104.5, np.inf, -np.inf, np.nan, 0.0], np.float32)
    g = np.array([1e-3, 1.0, 0.5, 0.5, 1.0, -0.25], np.float32)
    got = unary_vjp("exp", x, g)
    with mpmath.workdps(40):
        over = _round_f32(mpmath.mpf(float(g[0])) * mpmath.exp(mpmath.mpf(float(x[0]))))
    assert got[0] == np.float32(over)          # finite although exp(88.9) overflows float32
    assert got[1] == 0.0
    assert got[2] == np.inf and got[3] == 0.0 and np.isnan(got[4]) and got[5] == np.float32(-0.25)


def test_float64_summed_vjps_are_new_arrays():
    # a gradient must never alias the cotangent (a tape accumulates into it in place)
    g = np.ones((4, 3))
    for name in ("add", "sub", "mul", "maximum", "div"):
        ga, gb = binary_vjp(name, np.ones((4, 3)), np.ones(3), g)
        assert not np.shares_memory(ga, g) and not np.shares_memory(gb, g)
        assert ga.shape == (4, 3) and gb.shape == (3,)
