"""The derivative rules of reflib's second order: spec.dual's, over float64 or mpmath numbers.

reflib's forward mode and its recorded backward run reflib's own op code on scalar objects and
state no derivative: every slope (of ``+ - * /``, ``exp``, ``log``, ``sqrt``, ``tanh``, ``erf``,
``abs``) is the tangent of the function applied to ``Dual(x, 1)``, from ``spec.dual``. One list
of rules, in spec, for every consumer. ``dual_scalars(dps)`` is the ``spec.dual.DualBackend``
over mpmath (``dps`` an int) or float64 (``dps=None``); ``base_scalars(dps)`` the plain system.
"""
from __future__ import annotations

import contextlib
import math
import numbers

import mpmath
import numpy as np

from reflib.numeric import (GUARD_DIGITS, NumpyFunctions, check_dps, elementwise_method,
                            object_array)
from spec.backends import MPMATH
from spec.dual import Dual, DualBackend


class Float64Scalars(NumpyFunctions):
    """The scalar functions ``spec.dual.DualBackend`` reads from a backend, on float64 numbers."""

    name = "float64"
    abs = staticmethod(np.abs)
    sign = staticmethod(np.sign)

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


class ObjectNumeric:
    """What reflib's two scalar-object numerics share: number system, precision, elementary
    functions by spec.dual's rules. A subclass says how one entry is taken in (``_entry``),
    read (``_value``) and how a rule on duals is applied to it (``_apply``).

    Parameters
    ----------
    dps : int or None
        None: float64 numbers; an int: ``mpmath.mpf`` computed at ``working`` digits.
    working : int or None
        mpmath's working precision inside :meth:`context` (default ``dps + GUARD_DIGITS``).
    """

    dtype = np.dtype(object)

    def __init__(self, dps=None, working=None):
        self.digits = check_dps(dps)
        self.working = None if dps is None else (working or self.digits + GUARD_DIGITS)
        self._base = base_scalars(self.digits)
        self._dual = dual_scalars(self.digits)

    @property
    def dps(self):
        """What to pass as ``dps=`` to select this numeric (``reflib.numeric.numeric_for``)."""
        return self

    def __repr__(self):
        return f"{type(self).__name__}(dps={self.digits!r})"

    def context(self):
        """The mpmath working precision (nothing for float64)."""
        return contextlib.nullcontext() if self.working is None else mpmath.workdps(self.working)

    def asarray(self, value, what="input"):
        """A new object array of this numeric's entries (``_entry`` of each value)."""
        return object_array(value, self._entry, what)

    def result(self, value, what="input"):
        return self.asarray(value, what)

    def const(self, value):
        return self._base.const(value)

    def zeros(self, shape):
        out = np.empty(shape, dtype=object)
        out.fill(self._base.convert(0))
        return out

    def isfinite(self, arr):
        flat = [self._base.isfinite(self._value(v)) for v in np.asarray(arr, dtype=object).flat]
        return np.array(flat, dtype=bool).reshape(np.shape(arr))

    def _map(self, dual_fn, x):
        """``dual_fn`` (or the dual backend's function of that name) on every entry."""
        fn = getattr(self._dual, dual_fn) if isinstance(dual_fn, str) else dual_fn
        return np.asarray(np.frompyfunc(lambda v: self._apply(fn, v), 1, 1)(x), dtype=object)

    exp, log, sqrt, tanh, erf, erfc = map(elementwise_method,
                                          ("exp", "log", "sqrt", "tanh", "erf", "erfc"))

    def log1p(self, x):
        # NOTE: the value by the base's log1p (no 1 + x rounding); the slope log'(1 + x)
        base, log = self._base, self._dual.log

        def one(v):
            if not isinstance(v, Dual):
                return base.log1p(v)
            return Dual(base.log1p(v.value), log(Dual(1 + v.value, v.tangent)).tangent)
        return self._map(one, x)


    def pi(self):
        return self._base.pi if self.digits is None else +mpmath.pi

    def sigmoid(self, x):
        """reflib's float64 form: exp of ``-|x|`` only, then one division."""
        e = self.exp(-self._map(self._dual.abs, x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))
