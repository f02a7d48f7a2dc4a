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

import functools

import mpmath
import numpy as np
from mpmath.libmp import (from_float, from_int, mpf_abs, mpf_gt, mpf_mul, mpf_mul_int, mpf_pos,
                          mpf_pow_int, mpf_sub, normalize)

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


# NOTE: speed. ``converge`` calls ``arrays_agree`` after every evaluation of the exact referee
# (about 30,000 calls in one ``verigrad conform`` run), so it works on the raw ``_mpf_`` tuples
# with the same mpmath.libmp calls, precisions and roundings that ``mpf`` arithmetic would make
# at the ambient precision, instead of creating an mpf for every intermediate value. The answers
# are the same as the plain loop in ``_arrays_agree_plain``, which still serves any entry that
# is not an mpf, int or float.
_MPF = mpmath.mpf
_FAST_TYPES = frozenset((_MPF, int, float))


@functools.lru_cache(maxsize=256)
def _power_of_ten(prec, rounding, exponent):
    """``mpf(10) ** exponent`` as a raw tuple, computed as mpmath does at ``prec``/``rounding``."""
    ten = mpf_pos(from_int(10), prec, rounding)
    return mpf_pow_int(ten, exponent, prec, rounding)


def _rounded(v, prec, rounding):
    """The raw tuple of ``mpmath.mpf(v)`` at ``prec``/``rounding`` (v an mpf, int or float)."""
    t = type(v)
    if t is _MPF:
        val = v._mpf_
        sign, man, exp, bc = val
        if not man and exp:       # inf, -inf, nan: mpf() hands them back unchanged
            return val
        return normalize(sign, man, exp, bc, prec, rounding)
    if t is int:
        return mpf_pos(from_int(v), prec, rounding)
    return mpf_pos(from_float(v), prec, rounding)


def _relative_bound(rel, y, prec, rounding):
    """The raw tuple of ``rel * abs(y)`` as mpf arithmetic computes it for y's type."""
    t = type(y)
    if t is _MPF:
        return mpf_mul(rel, mpf_abs(y._mpf_, prec, rounding), prec, rounding)
    if t is int:
        return mpf_mul_int(rel, abs(y), prec, rounding)
    return mpf_mul(rel, from_float(abs(y)), prec, rounding)


def _arrays_agree_plain(fa, fb, dps):
    scale = max(abs(mpmath.mpf(v)) for v in fb)
    rel = mpmath.mpf(10) ** -(dps + EXTRA_AGREEMENT_DIGITS)
    floor = scale * mpmath.mpf(10) ** -(dps + ABSOLUTE_FLOOR_DIGITS)
    for x, y in zip(fa, fb):
        d = abs(mpmath.mpf(x) - mpmath.mpf(y))
        if d > rel * abs(y) and d > floor:
            return False
    return True


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
    la, lb = fa.tolist(), fb.tolist()
    types = set(map(type, la))
    types.update(map(type, lb))
    if type(dps) is not int or not types <= _FAST_TYPES:
        return _arrays_agree_plain(fa, fb, dps)
    prec, rounding = mpmath.mp._prec_rounding
    rel = floor = None
    for x, y in zip(la, lb):
        if type(x) is _MPF and type(y) is _MPF:
            rx, ry = x._mpf_, y._mpf_
            if rx == ry:
                continue          # d is 0 (or nan): never above a bound
            # mpf(v): inf, -inf and nan come back unchanged, anything else is rounded
            if rx[1] or not rx[2]:
                rx = normalize(*rx, prec, rounding)
            if ry[1] or not ry[2]:
                ry = normalize(*ry, prec, rounding)
        else:
            rx, ry = _rounded(x, prec, rounding), _rounded(y, prec, rounding)
        if rx == ry:
            continue
        d = mpf_abs(mpf_sub(rx, ry, prec, rounding), prec, rounding)
        if rel is None:
            rel = _power_of_ten(prec, rounding, -(dps + EXTRA_AGREEMENT_DIGITS))
        if not mpf_gt(d, _relative_bound(rel, y, prec, rounding)):
            continue
        if floor is None:
            # max(|mpf(v)|) as Python's max takes it: the first item, replaced only by a larger
            scale = None
            for v in lb:
                m = mpf_abs(_rounded(v, prec, rounding), prec, rounding)
                if scale is None or mpf_gt(m, scale):
                    scale = m
            tiny = _power_of_ten(prec, rounding, -(dps + ABSOLUTE_FLOOR_DIGITS))
            floor = mpf_mul(scale, tiny, prec, rounding)
        if mpf_gt(d, floor):
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
