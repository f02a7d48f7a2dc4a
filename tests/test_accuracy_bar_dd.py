"""The double-double arithmetic of fastlib.kernels.vecmath (the float64 accuracy-first VJPs).

Oracles: exact rational arithmetic (``fractions.Fraction``) for the error-free transformations,
mpmath at 60 digits for the rest. The bounds are the ones the docstrings state, each with the
margin its derivation leaves: a dd operation errs by a few u^2 (u = 2**-53, u^2 = 1.2e-32) of its
result; ``dd_exp`` by ~1e-20 relative (its Taylor terms from r^3 on are float64: below 2e-6 |r|
at |r| <= ln(2)/32, so their rounding is below 3e-22 relative, times 2**4 through the squarings).
"""
from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest

from fastlib.kernels import vecmath as V

mpmath.mp.dps = 60


def _dd(pair):
    return mpmath.mpf(float(pair[0])) + mpmath.mpf(float(pair[1]))


def _random_doubles(rng, n, lo_exp=-30, hi_exp=30):
    return rng.uniform(0.5, 1.0, n) * 2.0 ** rng.integers(lo_exp, hi_exp, n) \
        * rng.choice([-1.0, 1.0], n)


def test_error_free_transformations_are_exact():
    rng = np.random.default_rng(0)
    a = _random_doubles(rng, 400)
    b = _random_doubles(rng, 400)
    for x, y in zip(a, b):
        s, e = V.two_sum(x, y)
        assert Fraction(s) + Fraction(e) == Fraction(x) + Fraction(y)
        assert s == x + y
        p, f = V.two_prod(x, y)
        assert Fraction(p) + Fraction(f) == Fraction(x) * Fraction(y)
        assert p == x * y
        big, small = (x, y) if abs(x) >= abs(y) else (y, x)
        s, e = V.fast_two_sum(big, small)
        assert Fraction(s) + Fraction(e) == Fraction(x) + Fraction(y)


def test_dd_arithmetic_within_a_few_u_squared():
    # Operands are dd numbers (hi + lo, |lo| <= ulp(hi) / 2); the results are compared with the
    # exact operation on the exact operands, relative to the result (the sum: relative to the
    # larger operand, since dd_add is accurate to u^2 of the operands even when they cancel).
    rng = np.random.default_rng(1)
    n = 300
    ah = _random_doubles(rng, n, -20, 20)
    al = ah * rng.uniform(-1, 1, n) * 2.0 ** -54
    bh = _random_doubles(rng, n, -20, 20)
    bh[:50] = -ah[:50] * (1 + rng.uniform(-1e-10, 1e-10, 50))      # heavy cancellation
    bl = bh * rng.uniform(-1, 1, n) * 2.0 ** -54
    bound = 8 * 2.0 ** -106
    for i in range(n):
        a = _dd((ah[i], al[i]))
        b = _dd((bh[i], bl[i]))
        s = _dd(V.dd_add(ah[i], al[i], bh[i], bl[i]))
        assert abs(s - (a + b)) <= bound * max(abs(a), abs(b))
        m = _dd(V.dd_mul(ah[i], al[i], bh[i], bl[i]))
        assert abs(m / (a * b) - 1) <= bound
        q = _dd(V.dd_div(ah[i], al[i], bh[i], bl[i]))
        assert abs(q / (a / b) - 1) <= bound
        md = _dd(V.dd_mul_d(ah[i], al[i], bh[i]))
        assert abs(md / (a * mpmath.mpf(bh[i])) - 1) <= bound
        sd = _dd(V.dd_add_d(ah[i], al[i], bh[i]))
        assert abs(sd - (a + mpmath.mpf(bh[i]))) <= bound * max(abs(a), abs(bh[i]))
        r = _dd(V.dd_sqrt(abs(ah[i]), al[i] * np.sign(ah[i])))
        assert abs(r / mpmath.sqrt(abs(a)) - 1) <= bound


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.0), (-40.0, 40.0), (-745.0, 709.7), (-1e-9, 1e-9)])
def test_dd_exp_relative_error_below_2e_20(lo, hi):
    rng = np.random.default_rng(2)
    xh = rng.uniform(lo, hi, 400)
    xl = xh * rng.uniform(-1, 1, xh.size) * 2.0 ** -54
    worst = 0.0
    for h, l in zip(xh, xl):
        exact = mpmath.exp(mpmath.mpf(h) + mpmath.mpf(l))
        got = _dd(V.dd_exp(h, l))
        if exact > mpmath.mpf(2) ** -960:             # lo parts stay normal
            worst = max(worst, float(abs(got / exact - 1)))
    assert worst <= 2e-20, worst


def test_dd_exp_limits():
    nan = float("nan")
    assert np.isnan(V.dd_exp(nan, 0.0)[0])
    assert V.dd_exp(-np.inf, 0.0) == (0.0, 0.0)
    assert V.dd_exp(np.inf, 0.0)[0] == np.inf
    assert V.dd_exp(710.0, 0.0)[0] == np.inf           # above log(DBL_MAX) = 709.78
    assert V.dd_exp(0.0, 0.0) == (1.0, 0.0)
    assert V.dd_exp(-746.0, 0.0) == (0.0, 0.0)
    # the subnormal range rounds once, like libm's exp
    for x in (-709.0, -720.5, -744.0):
        assert V.dd_exp(x, 0.0)[0] == float(mpmath.exp(x))
    big = V.dd_exp(709.78, 0.0)[0]
    assert np.isfinite(big) and abs(big / float(mpmath.exp(709.78)) - 1) <= 2 ** -52


def test_dd_log_within_2e_20():
    rng = np.random.default_rng(3)
    xh = np.exp(rng.uniform(-700, 700, 300))
    xh[:60] = rng.uniform(0.5, 2.0, 60)                # log near 0: absolute accuracy matters
    xl = xh * rng.uniform(-1, 1, xh.size) * 2.0 ** -54
    for h, l in zip(xh, xl):
        exact = mpmath.log(mpmath.mpf(h) + mpmath.mpf(l))
        got = _dd(V.dd_log(h, l))
        # the Newton step through dd_exp leaves dd_exp's 1e-20 relative error as an absolute one
        assert abs(got - exact) <= 2e-20 * max(1, abs(exact)), (h, l)
