"""spec.precision.arrays_agree gives the plain mpf loop's answers.

``converge`` calls ``arrays_agree`` after every evaluation of the exact referee, so for speed
it passes entries that round alike on their raw ``_mpf_`` tuples; these tests hold every
True/False it returns to ``_plain``, a copy of the original loop, on randomized pairs just
inside and outside the relative bound, noise around exact zeros near the absolute floor, ints,
floats, inf and nan, at several ambient precisions (the arithmetic of both runs at ``mp.prec``
as it is when they are called).
"""
import random

import mpmath
import numpy as np
import pytest

from spec import precision
from spec.precision import ABSOLUTE_FLOOR_DIGITS, EXTRA_AGREEMENT_DIGITS, arrays_agree


def _plain(a, b, dps):
    """The original arrays_agree, kept here as the independent oracle."""
    if a is None or b is None:
        return a is None and b is None
    fa = np.asarray(a, dtype=object).reshape(-1)
    fb = np.asarray(b, dtype=object).reshape(-1)
    if fa.shape != fb.shape:
        return False
    if fa.size == 0:
        return True
    scale = max(abs(mpmath.mpf(v)) for v in fb)
    rel = mpmath.mpf(10) ** -(dps + EXTRA_AGREEMENT_DIGITS)
    floor = scale * mpmath.mpf(10) ** -(dps + ABSOLUTE_FLOOR_DIGITS)
    for x, y in zip(fa, fb):
        d = abs(mpmath.mpf(x) - mpmath.mpf(y))
        if d > rel * abs(y) and d > floor:
            return False
    return True


SPECIALS = [mpmath.inf, -mpmath.inf, mpmath.nan, float("inf"), float("nan")]


def _value(rng, digits):
    kind = rng.random()
    if kind < 0.08:
        return mpmath.mpf(0)
    if kind < 0.14:
        return rng.choice([0, 1, -3, 10**30, -(2**80) - 1, rng.randrange(-10**6, 10**6)])
    if kind < 0.2:
        return rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300)
    with mpmath.workdps(digits):
        m = mpmath.mpf(rng.getrandbits(200) | 1) / 2**200
        return rng.choice([1, -1]) * m * mpmath.mpf(10) ** rng.randint(-40, 40)


def _partner(rng, y, dps, digits, scale):
    """A value agreeing with ``y`` to about dps+2 digits (give or take one), or noise near 0."""
    kind = rng.random()
    with mpmath.workdps(digits):
        y = mpmath.mpf(y)
        if kind < 0.1:
            return y
        if kind < 0.25:         # noise around an exact zero, near the absolute floor
            k = dps + ABSOLUTE_FLOOR_DIGITS + rng.choice([-1, 0, 1])
            return rng.choice([1, -1]) * scale * rng.uniform(0.5, 5) * mpmath.mpf(10) ** -k
        if kind < 0.4:          # on the relative bound itself, as the ambient precision has it
            rel = mpmath.mpf(10) ** -(dps + EXTRA_AGREEMENT_DIGITS)
            return y + rng.choice([1, -1]) * rel * abs(y)
        k = dps + EXTRA_AGREEMENT_DIGITS + rng.choice([-1, 0, 1])
        return y * (1 + rng.choice([1, -1]) * rng.uniform(0.1, 10) * mpmath.mpf(10) ** -k)


def _case(rng):
    dps = rng.choice([3, 8, 12, 15, 20, 50])
    digits = rng.choice([15, 30, 70, 420])
    n = rng.choice([1, 2, 5, 30])
    b = [_value(rng, digits) for _ in range(n)]
    scale = max(abs(mpmath.mpf(v)) for v in b if mpmath.isfinite(v)) or mpmath.mpf(1)
    if rng.random() < 0.3:      # mixed magnitudes: an exact zero beside large values
        b[rng.randrange(n)] = mpmath.mpf(0)
    a = [_partner(rng, y, dps, digits + rng.choice([0, 350]), scale) for y in b]
    if rng.random() < 0.5:      # most of an array agreeing exactly, one element off
        i = rng.randrange(n)
        a = list(b)
        a[i] = _partner(rng, b[i], dps, digits + 350, scale)
    if rng.random() < 0.08:
        (a if rng.random() < 0.5 else b)[rng.randrange(n)] = rng.choice(SPECIALS)
    if rng.random() < 0.5:
        a, b = b, a
    return a, b, dps


@pytest.mark.parametrize("prec", [53, 20, 100, 200, 1500])
def test_random_pairs_give_the_plain_answers(prec):
    rng = random.Random(1234 + prec)
    seen = {True: 0, False: 0}
    with mpmath.workprec(prec):
        for _ in range(600):
            a, b, dps = _case(rng)
            expected = _plain(a, b, dps)
            assert arrays_agree(a, b, dps) is expected, (prec, dps, a, b)
            seen[expected] += 1
    assert min(seen.values()) > 50, seen


@pytest.mark.parametrize("rounding", ["f", "c", "d", "u"])
def test_other_rounding_modes_give_the_plain_answers(rounding):
    rng = random.Random(99)
    with mpmath.workprec(100):
        pr = mpmath.mp._prec_rounding
        pr[1] = rounding
        try:
            for _ in range(150):
                a, b, dps = _case(rng)
                assert arrays_agree(a, b, dps) is _plain(a, b, dps)
        finally:
            pr[1] = "n"


def test_specials_zeros_ints_and_shapes():
    one, third = mpmath.mpf(1), mpmath.mpf(1) / 3
    inf, nan = mpmath.inf, mpmath.nan
    cases = [
        (None, None), (None, [one]), ([one], None), ([], []), (np.zeros((0, 3)), []),
        ([one, one], [one]), (np.array([[one, third]]), [one, third]),
        ([0, 0], [0, mpmath.mpf(0)]), ([1, 2], [1, 2]), ([1, 2], [1, 3]), ([0.5], [0.5]),
        ([mpmath.mpf(0.1)], [0.1]), ([third], [0.25]), (one, [one]), (2**70, 2**70 + 1),
        ([inf], [inf]), ([inf], [-inf]), ([one], [inf]), ([one, 2], [inf, 3]),
        ([one, 2], [3, inf]), ([nan], [nan]), ([one, 2], [nan, 5]), ([one, 2], [5, nan]),
        ([nan, 2], [one, 5]), ([float("inf")], [one]), ([float("nan")], [one]),
        ([mpmath.mpf("1e-400"), one], [0, one]), ([mpmath.mpf("1e-380"), one], [0, one]),
        ([mpmath.mpf("-1e-400")], [0]), ([mpmath.mpf("1e-400")], [mpmath.mpf("-1e-400")]),
    ]
    for prec in (53, 400):
        with mpmath.workprec(prec):
            for a, b in cases:
                for dps in (5, 50):
                    assert arrays_agree(a, b, dps) is _plain(a, b, dps), (prec, a, b, dps)


def test_other_entry_types_take_the_plain_path():
    for a, b in [([np.float64(0.5)], [0.5]), ([True], [1]), (["0.5"], [0.5]),
                 (["2.0000001"], [mpmath.mpf(2)])]:
        assert arrays_agree(a, b, 10) is _plain(a, b, 10)
    assert arrays_agree([1], [1], 10.0) is _plain([1], [1], 10.0)
    for a, b in [([None], [1]), ([1], [{1: 2}])]:
        with pytest.raises(TypeError):
            _plain(a, b, 10)
        with pytest.raises(TypeError):
            arrays_agree(a, b, 10)


def test_entries_that_round_alike_make_no_mpf(monkeypatch):
    # converge's common case, an evaluation at 70 digits against one at 420: every entry
    # rounds to the same 53-bit number, so neither the bounds nor the per-entry arithmetic run
    def refuse(*args):
        raise AssertionError("the per-entry arithmetic ran")

    monkeypatch.setattr(precision, "_bounds", refuse)
    monkeypatch.setattr(precision, "_disagree", refuse)
    xs = [mpmath.mpf(k) / 7 for k in range(-15, 15)] + [mpmath.inf, mpmath.nan]

    def at(digits):
        with mpmath.workdps(digits):
            return [mpmath.exp(x) / 3 for x in xs]
    assert arrays_agree(at(70), at(420), 50) is True


def _coarse_case(rng):
    dps = rng.choice([-2, -1, 0, 1])

    def value():
        kind = rng.random()
        if kind < 0.3:
            return rng.randrange(-5000, 5000)
        if kind < 0.5:
            return rng.randrange(-5000, 5000) / 64
        with mpmath.workprec(60):
            return mpmath.mpf(rng.randrange(-10**6, 10**6)) / rng.randrange(1, 1000)

    def partner(y):
        kind = rng.random()
        if kind < 0.4:          # on the bound as the ambient precision has it, or an ulp off
            rel = mpmath.mpf(10) ** -(dps + EXTRA_AGREEMENT_DIGITS)
            ulp = rng.choice([0, 0, 1, -1]) * mpmath.mpf(2) ** (1 - mpmath.mp.prec)
            return mpmath.mpf(y) + rng.choice([1, -1]) * rel * (1 + ulp) * abs(y)
        if kind < 0.8:
            return y + rng.randrange(-200, 200) / rng.choice([1, 8, 64])
        return value()

    b = [value() for _ in range(rng.choice([1, 2, 3]))]
    return [partner(y) for y in b], b, dps


def test_coarse_precisions_make_last_bit_ties_common():
    # At 2 to 13 bits, d lands on rel*|y| often, so a bound rounded once too often shows.
    rng = random.Random(5)
    seen = {True: 0, False: 0}
    for prec in range(2, 14):
        for rounding in "nfcdu":
            with mpmath.workprec(prec):
                pr = mpmath.mp._prec_rounding
                pr[1] = rounding
                try:
                    for _ in range(80):
                        a, b, dps = _coarse_case(rng)
                        expected = _plain(a, b, dps)
                        assert arrays_agree(a, b, dps) is expected, (prec, rounding, a, b, dps)
                        seen[expected] += 1
                finally:
                    pr[1] = "n"
    assert min(seen.values()) > 500, seen
