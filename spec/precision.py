"""Working precision that grows until the answer stops moving.

NOTE: a fixed number of guard digits is not enough wherever a formula cancels: 1 − tanh(80)²
loses about 70 digits, Φ(−30) written through erf loses about 200, and the result would come
back as 0 or with wrong leading digits. Rather than rewrite every formula for every tail, the
exact paths (``spec.evaluate``, ``reflib`` with ``dps=``) evaluate at a working precision wp,
again at wp + 350 digits, and keep doubling until two successive results agree elementwise to the
requested digits. Cancellation errors shrink by 10^-wp with every doubling, so agreement means
the digits handed back are right. An element whose true value is 0 but which a formula computes
as rounding noise (a sum that cancels exactly) agrees in absolute terms once the noise is far
below anything a binary float can hold (``ABSOLUTE_FLOOR_DIGITS`` below the array's scale).
This module imports no SymPy, so reflib may use it without paying for a computer-algebra import.
"""
from __future__ import annotations

import mpmath
import numpy as np

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


def arrays_agree(a, b, dps):
    """True when ``a`` and ``b`` (arrays of mpf, or None) agree elementwise to ``dps`` digits.

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
    scale = max(abs(mpmath.mpf(v)) for v in fb)
    rel = mpmath.mpf(10) ** -(dps + EXTRA_AGREEMENT_DIGITS)
    floor = scale * mpmath.mpf(10) ** -(dps + ABSOLUTE_FLOOR_DIGITS)
    for x, y in zip(fa, fb):
        d = abs(mpmath.mpf(x) - mpmath.mpf(y))
        if d > rel * abs(y) and d > floor:
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
