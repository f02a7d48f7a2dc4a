"""Checks of the plain values a run is set up with: ints, flags, numbers.

Each returns the value as the Python type it stands for (NumPy's scalars included, so the run's
state saves as JSON) or raises a TypeError / ValueError naming the argument and what it takes.
Kept apart from ``options`` so that the plateau policy, which ``options`` imports, can use them.
"""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["check_int", "check_flag", "check_number"]


def check_int(value, name, minimum):
    """``value`` as an int, or a TypeError / ValueError naming ``name`` and the bound."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_flag(value, name):
    """``value`` as a bool, or a TypeError naming ``name``.

    Only True and False (NumPy's too) are flags: a string such as ``"False"`` or ``"no"`` is
    truthy, so taking it by truthiness would silently do the opposite of what was written.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_number(value, name, accepted):
    """``value`` as a float, or a TypeError naming ``name`` and what it ``accepted``.

    The range is the caller's to check (its message says what the number means).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {accepted}, got {value!r}")
    return float(value)
