"""Working precision that grows until the answer stops moving.

NOTE: fixed guard digits fail wherever a formula cancels (1 − tanh(80)² loses about 70 digits,
Φ(−30) through erf about 200). The exact paths (``spec.evaluate``, ``reflib`` with ``dps=``)
evaluate at a working precision wp, again at wp + 350 digits, then keep doubling until two
successive results agree elementwise after rounding to mpmath's ambient precision (53 bits,
about 16 digits). A formula that cancels L digits loses L at every precision, so agreement
shows L < wp - 16, and the later result, at least 350 digits more precise, holds the requested
digits. An element whose true value is 0 but which a formula computes as rounding noise agrees
in absolute terms far below anything a float holds (``ABSOLUTE_FLOOR_DIGITS`` under the array's
scale). No SymPy import here: reflib may use it without paying for a computer-algebra import.
"""
from __future__ import annotations

import mpmath
import numpy as np
from mpmath.libmp import normalize

# Doublings after the first evaluation: with dps=50 and 20 guard digits, 70 -> 1120 digits.
MAX_DOUBLINGS = 4
# The second evaluation's extra digits: enough that a result swallowed by cancellation at the
# first precision reappears, for anything a binary float can hold (10^-324 relative to terms of
# order one).
FIRST_JUMP_DIGITS = 350
# Agreement required between successive evaluations, in digits beyond the requested ones.
EXTRA_AGREEMENT_DIGITS = 2
# Below the largest |value| of an array by this many digits (past float64's 10^-324 from 1),
# a difference is noise around an exact zero.
ABSOLUTE_FLOOR_DIGITS = 340


def _as_objects(x):
    return np.asarray(x, dtype=object).reshape(-1)


_MPF = mpmath.mpf


def _rounded(value, prec, rounding):
    """``mpmath.mpf(value)._mpf_`` for an mpf ``value`` (rounded to ``prec`` bits), without
    making the object: inf, -inf and nan come back unchanged, as ``mpf()`` hands them back."""
    sign, man, exp, bc = raw = value._mpf_
    if not man and exp:
        return raw
    return normalize(sign, man, exp, bc, prec, rounding)


def _bounds(fb, dps):
    """The relative bound's factor and the absolute floor of ``arrays_agree``."""
    scale = max(abs(mpmath.mpf(v)) for v in fb)
    rel = mpmath.mpf(10) ** -(dps + EXTRA_AGREEMENT_DIGITS)
    return rel, scale * mpmath.mpf(10) ** -(dps + ABSOLUTE_FLOOR_DIGITS)


def _disagree(x, y, rel, floor):
    """True when the entries ``x`` and ``y`` differ by more than both bounds."""
    d = abs(mpmath.mpf(x) - mpmath.mpf(y))
    return d > rel * abs(y) and d > floor


def arrays_agree(a, b, dps):
    """True when ``a`` and ``b`` (arrays of mpf, or None) agree elementwise, each entry rounded
    to mpmath's ambient precision (``mp.prec`` when called, 53 bits outside a ``workdps``).

    NOTE: the test asks ``|a - b| <= 10^-(dps + 2) |b|`` of the rounded entries, so at the
    ambient 53 bits it says "the same to about 16 digits", not "to ``dps`` digits": enough for
    ``converge`` (module NOTE), which hands back the later, far more precise evaluation.

    Parameters
    ----------
    a, b : array_like of mpmath.mpf, or None
    dps : int
        The digits the caller will hand back.
    """
    if a is None or b is None:
        return a is None and b is None
    fa, fb = _as_objects(a), _as_objects(b)
    if fa.shape != fb.shape:
        return False
    if fa.size == 0:
        return True
    prec, rounding = mpmath.mp._prec_rounding
    bounds = None
    for x, y in zip(fa.tolist(), fb.tolist()):
        # NOTE: speed. ``converge`` calls this after every evaluation of the exact referee
        # (about 30,000 calls in one ``verigrad conform`` run), and most entries agree: two mpf
        # entries that round to the same number differ by 0 (or are two nans), never by more
        # than a bound, so they are passed on their raw tuples, with no mpf made (5x faster)
        if type(x) is _MPF and type(y) is _MPF and (
                _rounded(x, prec, rounding) == _rounded(y, prec, rounding)):
            continue
        if bounds is None:
            bounds = _bounds(fb, dps)
        if _disagree(x, y, *bounds):
            return False
    return True


def converge(compute, dps, guard):
    """Run ``compute()`` at growing working precision until its results stop moving.

    Parameters
    ----------
    compute : callable
        Takes no argument, works at mpmath's ambient precision (it must not set its own), and
        returns a tuple of arrays of mpf (entries may be None).
    dps : int
        Digits the caller will round the results to.
    guard : int
        Guard digits for the first evaluation (working precision ``dps + guard``).

    Returns
    -------
    tuple
        The results of the last evaluation, unrounded (the caller rounds them to ``dps``).
    """
    wp = dps + guard
    with mpmath.workdps(wp):
        previous = compute()
    for step in range(MAX_DOUBLINGS):
        # NOTE: the first check jumps by FIRST_JUMP_DIGITS, not by a doubling: a cancellation
        # that swallows the whole result (Φ(−30) via erf is 0 at 70 and at 140 digits) would
        # otherwise look converged, two zeros agreeing.
        wp = wp + FIRST_JUMP_DIGITS if step == 0 else 2 * wp
        with mpmath.workdps(wp):
            current = compute()
        if all(arrays_agree(p, c, dps) for p, c in zip(previous, current)):
            return current
        previous = current
    return current
