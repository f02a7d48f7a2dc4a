"""Array arithmetic for the reference engine: float64 NumPy, or object arrays of ``mpmath.mpf``.

The reference ops are written once against a small *numeric* object ``F`` that supplies the
transcendental functions and constants; ordinary arithmetic (``+ - * /``, comparisons,
``np.sum``, ``np.matmul``, ``np.where``) works on both float64 arrays and object arrays of mpf,
so the op code reads the same in both precisions.

``numeric_for(dps)`` returns ``FLOAT64`` for ``dps=None``, an ``Exact(dps)`` for an int, and a
numeric object passed as ``dps`` as is (``reflib.running_error.RunningError``, or a caller's own).
Exact work must run inside ``F.context()`` (``mpmath.workdps``), because mpf arithmetic rounds to
the precision of the global mpmath context; ``F.result(value)`` rounds a finished result.
"""
from __future__ import annotations

import contextlib
import numbers

import mpmath
import numpy as np

__all__ = ["Float64", "Exact", "FLOAT64", "numeric_for", "check_dps", "is_real_scalar"]


def _is_numeric(obj):
    """A numeric object rather than a ``dps``: it has the interface the ops use."""
    return all(hasattr(obj, name) for name in ("context", "asarray", "result", "const", "zeros",
                                                "isfinite", "exp", "log", "sqrt", "tanh"))


def check_dps(dps):
    """Validate a ``dps`` argument: None (float64) or a positive int (decimal digits)."""
    if dps is None:
        return None
    if isinstance(dps, bool) or not isinstance(dps, numbers.Integral) or dps < 1:
        raise ValueError(f"dps must be None (float64) or a positive int of decimal digits; got {dps!r}")
    return int(dps)


def is_real_scalar(v):
    """True for the Python / NumPy / mpmath scalars that stand for one real number."""
    return isinstance(v, (numbers.Real, mpmath.mpf)) and not isinstance(v, bool)


def _check_dtype(arr, what):
    # NOTE: complex, string, boolean and other non-number dtypes are refused here, at the
    # boundary, so that no kernel ever sees them (as spec.evaluate does); ints are widened.
    if arr.dtype.kind in "iuf":
        return
    if arr.dtype.kind == "O":
        for v in arr.flat:
            if not is_real_scalar(v) or isinstance(v, np.bool_):
                raise TypeError(f"{what} holds {type(v).__name__} {v!r}; pass real numbers "
                                f"(float, int or mpmath.mpf)")
        return
    if arr.dtype.kind == "b":
        raise TypeError(f"{what} is a boolean array; booleans are not numbers here, pass "
                        f"x.astype(np.float64)")
    raise TypeError(f"{what} has dtype {arr.dtype}; pass a real array (float or int dtype, "
                    f"or an object array of mpmath.mpf)")


def object_array(value, entry, what):
    """A new object array holding ``entry(v, what)`` for each entry ``v`` of ``value``, a real
    or object array (a TypeError naming ``what`` for any other dtype): how the numerics whose
    entries are objects of their own (running-error, dual, recorded) take an array in."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iufO":
        raise TypeError(f"{what} has dtype {arr.dtype}; pass a real array")
    out = np.empty(arr.shape, dtype=object)
    for idx, v in np.ndenumerate(arr):
        out[idx] = entry(v, what)
    return out


def _to_mpf(v):
    if isinstance(v, np.integer):
        return mpmath.mpf(int(v))
    if isinstance(v, np.floating):
        return mpmath.mpf(float(v))
    return mpmath.mpf(v)


class NumpyFunctions:
    """The elementary functions in float64, NumPy's (and SciPy's erf): scalars or arrays."""

    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    log1p = staticmethod(np.log1p)
    sqrt = staticmethod(np.sqrt)
    tanh = staticmethod(np.tanh)

    @staticmethod
    def erf(x):
        import scipy.special
        return np.float64(scipy.special.erf(x))

    @staticmethod
    def erfc(x):
        import scipy.special
        return np.float64(scipy.special.erfc(x))


#: The elementary functions every numeric offers (``F.exp(x)``, ...), in this order.
ELEMENTARY_NAMES = ("exp", "log", "log1p", "sqrt", "tanh", "erf", "erfc")


def elementwise_method(name):
    """The method ``name(self, x)`` of an object-array numeric: ``self._map(name, x)``, the
    numeric's own function ``name`` on every entry."""
    def method(self, x):
        return self._map(name, x)
    method.__name__ = name
    return method


class Float64(NumpyFunctions):
    """float64 NumPy arithmetic (``dps=None``)."""

    dps = None
    dtype = np.dtype(np.float64)

    def context(self):
        """No precision context is needed for float64."""
        return contextlib.nullcontext()

    def asarray(self, value, what="input"):
        """Convert ``value`` to a float64 array (a copy), refusing non-real dtypes."""
        arr = np.asarray(value)
        _check_dtype(arr, what)
        return np.array(arr, dtype=np.float64)

    def result(self, value, what="result"):
        """A finished result as a new float64 array."""
        return self.asarray(value, what)

    def const(self, value):
        """A constant: a Python float or int as is, a decimal string parsed to the nearest float."""
        return float(value)

    def zeros(self, shape):
        return np.zeros(shape, dtype=np.float64)

    def isfinite(self, arr):
        return np.isfinite(arr)


    def pi(self):
        return np.pi

    def sigmoid(self, x):
        """1 / (1 + exp(-x)) without overflow: exp is only taken of -|x|."""
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# NOTE: exact work runs GUARD_DIGITS beyond dps and results are rounded to dps, so that the
# roundings inside one op (a few dozen, or a cancellation such as x - mean(x)) cannot reach the
# digits handed back; spec.evaluate does the same.
GUARD_DIGITS = 10


class Exact:
    """Object arrays of ``mpmath.mpf``: every operation carried out at ``dps`` decimal digits
    (plus ``GUARD_DIGITS``), results rounded to ``dps``."""

    dtype = np.dtype(object)

    def __init__(self, dps):
        self.dps = check_dps(dps)

    def context(self):
        """The mpmath precision every exact computation must run inside."""
        return mpmath.workdps(self.dps + GUARD_DIGITS)

    def result(self, value, what="result"):
        """A finished result as a new object array of mpf rounded to ``dps`` digits."""
        with mpmath.workdps(self.dps):
            return self.asarray(value, what)

    def asarray(self, value, what="input"):
        """Convert ``value`` to a new object array of mpf at the current mpmath precision."""
        arr = np.asarray(value)
        _check_dtype(arr, what)
        out = np.empty(arr.shape, dtype=object)
        for idx, v in np.ndenumerate(arr):
            out[idx] = _to_mpf(v)
        return out

    def const(self, value):
        """A constant at working precision: a float exactly, a string as the decimal it spells."""
        return mpmath.mpf(value)

    def zeros(self, shape):
        out = np.empty(shape, dtype=object)
        out.fill(mpmath.mpf(0))
        return out

    def isfinite(self, arr):
        return np.asarray(np.frompyfunc(mpmath.isfinite, 1, 1)(arr), dtype=bool)

    @staticmethod
    def _map(name, x):
        return np.asarray(np.frompyfunc(getattr(mpmath, name), 1, 1)(x), dtype=object)

    exp, log, log1p, sqrt, tanh, erf, erfc = map(elementwise_method, ELEMENTARY_NAMES)

    def pi(self):
        return +mpmath.pi

    def sigmoid(self, x):
        # mpf has an unbounded exponent range, so the textbook form cannot overflow.
        return 1 / (1 + self.exp(-x))


FLOAT64 = Float64()


def numeric_for(dps):
    """The numeric object for ``dps``: ``FLOAT64`` when None, ``Exact(dps)`` for an int; a
    numeric object itself (``reflib.running_error.RunningError``, whose ``dps`` is itself, or
    another object with this module's interface) is returned as is."""
    if _is_numeric(dps):
        return dps
    dps = check_dps(dps)
    return FLOAT64 if dps is None else Exact(dps)


class ByValue:
    """Comparisons and ``float()`` / ``int()`` by the plain value, so that control flow follows
    the value as in a plain run: mixed into the number systems that carry more than a value (a
    recorded step, a value with its error bound, a dual), each naming its value with
    ``_plain(x)`` (a plain number is its own value)."""

    __slots__ = ()

    def __lt__(self, o):
        return self._plain(self) < self._plain(o)

    def __le__(self, o):
        return self._plain(self) <= self._plain(o)

    def __gt__(self, o):
        return self._plain(self) > self._plain(o)

    def __ge__(self, o):
        return self._plain(self) >= self._plain(o)

    def __eq__(self, o):
        return self._plain(self) == self._plain(o)

    def __ne__(self, o):
        return self._plain(self) != self._plain(o)

    __hash__ = None

    def __float__(self):
        return float(self._plain(self))

    def __int__(self):
        return int(self._plain(self))
