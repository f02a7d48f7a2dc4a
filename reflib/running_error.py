"""Running error analysis: reflib's own formulas evaluated with a bound on their rounding error.

``RunningError(u)`` is a numeric (see reflib.numeric) whose entries are ``Bounded`` scalars, a
float64 value and a radius. The radius bounds, to first order, how far an evaluation of the
same formula at unit roundoff ``u`` (float32: ``2**-24``) can land from its exact value, each
operation rounded to nearest: inputs' radii carried through ``|derivative|``, plus ``u`` times
the result for every operation that rounds. Pass it where reflib takes ``dps``.

The long story: docs/reflib.md, section ``reflib/running_error.py``.
"""
from __future__ import annotations

import contextlib
import math
import numbers

import mpmath
import numpy as np

from reflib.numeric import ELEMENTARY_NAMES, ByValue, elementwise_method, object_array

__all__ = ["Bounded", "RunningError", "values", "radii"]

# the unit roundoff of the innermost F.context() (None outside one)
_UNIT = [None]


def _u():
    u = _UNIT[0]
    if u is None:
        raise RuntimeError("Bounded arithmetic ran outside RunningError.context(); wrap the "
                           "computation in `with F.context():`")
    return u


def _exact_factor(b):
    """True when multiplying or dividing by the exact constant ``b`` never rounds: 0, or a
    power of two (1 included), barring underflow and overflow."""
    return b == 0.0 or abs(math.frexp(b)[0]) == 0.5


class Bounded(ByValue):
    """A value ``v`` (float) and the radius ``r`` that bounds its rounding error (module doc).

    Comparisons, ``float()`` and ``int()`` (class indices held as floats) use the value
    (``ByValue``), so control flow (``np.where(x > 0, ...)``, ``np.max``) follows the value as
    it does in a float evaluation.
    """

    __slots__ = ("v", "r")

    def __init__(self, v, r=0.0):
        self.v = float(v)
        self.r = float(r)

    def __repr__(self):
        return f"Bounded({self.v!r}, {self.r!r})"

    @staticmethod
    def _plain(o):
        return o.v if isinstance(o, Bounded) else o

    # -- arithmetic
    def __neg__(self):
        return Bounded(-self.v, self.r)

    def __pos__(self):
        return self

    def __abs__(self):
        return Bounded(abs(self.v), self.r)

    def __add__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        v = self.v + ov
        r = self.r + orr
        # NOTE: x + 0 is x exactly; every other sum rounds once
        if not ((ov == 0.0 and orr == 0.0) or (self.v == 0.0 and self.r == 0.0)):
            r += _u() * abs(v)
        return Bounded(v, r)

    __radd__ = __add__

    def __sub__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        return self + Bounded(-ov, orr)

    def __rsub__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        return Bounded(ov, orr) + (-self)

    def __mul__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        v = self.v * ov
        # first order plus the product of the radii (interval arithmetic's bound of |ab - a'b'|)
        r = abs(self.v) * orr + abs(ov) * self.r + self.r * orr
        if not ((orr == 0.0 and _exact_factor(ov)) or (self.r == 0.0 and _exact_factor(self.v))):
            r += _u() * abs(v)
        return Bounded(v, r)

    __rmul__ = __mul__

    def __truediv__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        return _divide(self.v, self.r, ov, orr)

    def __rtruediv__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        return _divide(ov, orr, self.v, self.r)


def _divide(a, ar, b, br):
    v = a / b
    # |a/b - a'/b'| <= (|a - a'| + |a/b| |b - b'|) / |b'|, |b'| >= |b| - br (the interval
    # bound); NOTE: a divisor within its radius of 0 has no finite bound, and the first-order
    # one (|b'| taken as |b| / 2 at worst) is kept rather than an infinity that would excuse
    # any error downstream
    low = max(abs(b) - br, 0.5 * abs(b))
    r = (ar + abs(v) * br) / low
    if not (br == 0.0 and _exact_factor(b)):
        r += _u() * abs(v)
    return Bounded(v, r)


_val = Bounded._plain


def _parts(o):
    """``(value, radius)`` of an operand: a Bounded, or an exact real constant (radius 0)."""
    if isinstance(o, Bounded):
        return o.v, o.r
    if isinstance(o, (numbers.Real, mpmath.mpf)) and not isinstance(o, (bool, np.bool_)):
        return float(o), 0.0
    return None, None


def _unary(f, df, budget=1.0):
    """An elementary function ``f`` with derivative ``df``, rounded once (``budget`` roundings
    of ``u * |result|``) on top of its input's radius carried through ``|f'|``."""
    def apply(x):
        if not isinstance(x, Bounded):
            x = Bounded(x)
        v = f(x.v)
        return Bounded(v, abs(df(x.v, v)) * x.r + budget * _u() * abs(v))
    return apply


_SQRT_PI = math.sqrt(math.pi)

#: the elementary functions reflib's formulas call on a numeric: ``name -> (f, f'(x, f(x)))``,
#: one table for every numeric that bounds their rounding (this one and
#: ``reflib.adjoint_error``)
ELEMENTARY = {
    "exp": (math.exp, lambda x, y: y),
    "log": (math.log, lambda x, y: 1.0 / x),
    "log1p": (math.log1p, lambda x, y: 1.0 / (1.0 + x)),
    "sqrt": (math.sqrt, lambda x, y: 0.5 / y if y > 0 else math.inf),
    "tanh": (math.tanh, lambda x, y: 1.0 - y * y),
    "erf": (math.erf, lambda x, y: 2.0 / _SQRT_PI * math.exp(-x * x)),
    "erfc": (math.erfc, lambda x, y: -2.0 / _SQRT_PI * math.exp(-x * x)),
}


def values(arr):
    """The values of an array of ``Bounded`` (or reals) as float64."""
    return np.vectorize(_val, otypes=[np.float64])(np.asarray(arr, dtype=object)) \
        if np.size(arr) else np.zeros(np.shape(arr))


def radii(arr):
    """The radii of an array of ``Bounded`` (reals count as exact: radius 0) as float64."""
    def radius(o):
        return o.r if isinstance(o, Bounded) else 0.0
    return np.vectorize(radius, otypes=[np.float64])(np.asarray(arr, dtype=object)) \
        if np.size(arr) else np.zeros(np.shape(arr))


class RunningError:
    """The numeric of reflib's formulas with running error bounds at unit roundoff ``u``.

    Pass it where reflib takes ``dps`` (``reflib.Tape(dps=F)``, ``reflib.train.value_and_grad(
    ..., dps=F)``): values and gradients come back as object arrays of :class:`Bounded`, whose
    radii (:func:`radii`) bound the rounding error of the same evaluation at unit roundoff
    ``u`` (module doc).

    Parameters
    ----------
    u : float
        The unit roundoff: ``np.finfo(dtype).eps / 2`` (float32: ``2**-24``).

    Examples
    --------
    >>> import numpy as np
    >>> from reflib.running_error import RunningError, radii
    >>> from reflib.ops import forward
    >>> F = RunningError(2.0 ** -24)
    >>> r = radii(forward("sum", [np.array([1.0, 2.0, 3.0])], dps=F))
    >>> bool(r == 2.0 ** -24 * (3.0 + 6.0))
    True
    """

    dtype = np.dtype(object)

    def __init__(self, u):
        if isinstance(u, bool) or not isinstance(u, numbers.Real) or not 0 < u < 1:
            raise ValueError(f"u must be a unit roundoff in (0, 1), such as "
                             f"np.finfo(np.float32).eps / 2; got {u!r}")
        self.u = float(u)
        # the significand bits of the format whose constants are exact (u = 2**-p)
        self._bits = max(1, round(-math.log2(self.u)))

    @property
    def dps(self):
        """What to pass as ``dps=`` to select this numeric (reflib.numeric.numeric_for)."""
        return self

    def __repr__(self):
        return f"RunningError(u={self.u!r})"

    @contextlib.contextmanager
    def context(self):
        """The unit roundoff every Bounded operation inside uses."""
        saved, _UNIT[0] = _UNIT[0], self.u
        try:
            yield
        finally:
            _UNIT[0] = saved

    def _leaf(self, v, what):
        if isinstance(v, Bounded):
            return v
        if isinstance(v, (numbers.Real, mpmath.mpf)) and not isinstance(v, (bool, np.bool_)):
            return Bounded(float(v))
        raise TypeError(f"{what} holds {type(v).__name__} {v!r}; pass real numbers")

    def asarray(self, value, what="input"):
        """A new object array of ``Bounded``: entries already bounded are kept, real numbers
        become exact leaves (radius 0)."""
        return object_array(value, self._leaf, what)

    def result(self, value, what="result"):
        """A finished result (a new object array of ``Bounded``)."""
        return self.asarray(value, what)

    def const(self, value):
        """A constant as the format holds it: exact when its float64 value has at most the
        format's significand bits, else rounded once (radius ``u * |c|``)."""
        c = float(value)
        if c == 0.0 or not math.isfinite(c):
            return Bounded(c)
        m, _ = math.frexp(c)
        scaled = m * 2.0 ** self._bits
        exact = scaled == int(scaled) and (not isinstance(value, str) or
                                            mpmath.mpf(value) == mpmath.mpf(c))
        return Bounded(c, 0.0 if exact else self.u * abs(c))

    def zeros(self, shape):
        out = np.empty(shape, dtype=object)
        out.fill(Bounded(0.0))
        return out

    def isfinite(self, arr):
        return np.isfinite(values(arr))

    # the elementary functions on this numeric's entries, built from ELEMENTARY by the
    # numeric's own rounding rule (a subclass passes its own)
    _functions = {name: _unary(f, df) for name, (f, df) in ELEMENTARY.items()}

    def _map(self, name, x):
        return np.asarray(np.frompyfunc(self._functions[name], 1, 1)(x), dtype=object)

    exp, log, log1p, sqrt, tanh, erf, erfc = map(elementwise_method, ELEMENTARY_NAMES)

    def pi(self):
        return Bounded(math.pi, self.u * math.pi)   # pi is never a binary float: rounded once

    def sigmoid(self, x):
        """reflib's float64 form: exp of ``-|x|`` only, then one division."""
        e = self.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
