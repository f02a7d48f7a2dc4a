"""The derivative rules of reflib's second order: spec.dual's, over float64 or mpmath numbers.

reflib's forward mode and its recorded backward run reflib's own op code on scalar objects and
state no derivative: every slope (of ``+ - * /``, ``exp``, ``log``, ``sqrt``, ``tanh``, ``erf``,
``abs``) is the tangent of the function applied to ``Dual(x, 1)``, from ``spec.dual``. One list
of rules, in spec, for every consumer. ``dual_scalars(dps)`` is the ``spec.dual.DualBackend``
over mpmath (``dps`` an int) or float64 (``dps=None``); ``base_scalars(dps)`` the plain system.
"""
from __future__ import annotations

import math
import numbers

import mpmath
import numpy as np
from scipy.special import erf as _erf

from spec.backends import MPMATH
from spec.dual import DualBackend


class Float64Scalars:
    """The scalar functions ``spec.dual.DualBackend`` reads from a backend, on float64 numbers."""

    name = "float64"
    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    log1p = staticmethod(np.log1p)
    sqrt = staticmethod(np.sqrt)
    tanh = staticmethod(np.tanh)
    abs = staticmethod(np.abs)
    sign = staticmethod(np.sign)

    @staticmethod
    def erf(x):
        return np.float64(_erf(x))

    @staticmethod
    def gt(a, b):
        return bool(a > b)

    @staticmethod
    def ge(a, b):
        return bool(a >= b)

    @staticmethod
    def where(c, a, b):
        return a if c else b

    pi = math.pi

    @staticmethod
    def num(p, q=1):
        return np.float64(p) / q

    @staticmethod
    def param(value):
        return np.float64(value)

    @staticmethod
    def isfinite(v):
        return bool(np.isfinite(v))

    @staticmethod
    def convert(v):
        """A real scalar as this system's number."""
        return np.float64(v)

    @staticmethod
    def const(value):
        return float(value)


class MpmathScalars:
    """The same on ``mpmath.mpf`` at the ambient precision (``spec.backends.MPMATH`` plus the
    conversions reflib needs)."""

    name = "mpmath"
    log1p = staticmethod(mpmath.log1p)

    @staticmethod
    def isfinite(v):
        return bool(mpmath.isfinite(v))

    @staticmethod
    def convert(v):
        if isinstance(v, np.integer):
            return mpmath.mpf(int(v))
        if isinstance(v, np.floating):
            return mpmath.mpf(float(v))
        return mpmath.mpf(v)

    @staticmethod
    def const(value):
        return mpmath.mpf(value)

    def __getattr__(self, name):     # exp, log, ..., where, pi: spec's mpmath backend
        return getattr(MPMATH, name)


FLOAT64_SCALARS = Float64Scalars()
MPMATH_SCALARS = MpmathScalars()
DUAL_FLOAT64 = DualBackend(FLOAT64_SCALARS)
DUAL_MPMATH = DualBackend(MPMATH)


def base_scalars(dps):
    """The plain scalar system: float64 for ``dps=None``, mpmath for an int."""
    return FLOAT64_SCALARS if dps is None else MPMATH_SCALARS


def dual_scalars(dps):
    """spec.dual's rules over the system of ``dps`` (see :func:`base_scalars`)."""
    return DUAL_FLOAT64 if dps is None else DUAL_MPMATH


def is_real(v):
    """A plain real scalar (not a bool)."""
    return isinstance(v, (numbers.Real, mpmath.mpf)) and not isinstance(v, (bool, np.bool_))


__all__ = ["base_scalars", "dual_scalars", "Float64Scalars", "MpmathScalars", "is_real"]
