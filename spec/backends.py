"""The two number systems every formula in the registry runs on.

The long story: docs/spec.md, section ``spec/backends.py``.
"""
from __future__ import annotations

import numpy as np
import mpmath


def _lift(fn, nin=1):
    """Apply a scalar function elementwise to object arrays (or directly to scalars)."""
    ufunc = np.frompyfunc(fn, nin, 1)

    def apply(*args):
        if any(isinstance(a, np.ndarray) for a in args):
            return np.asarray(ufunc(*args), dtype=object)
        return fn(*args)

    return apply


# The scalar functions every backend supplies, with their number of arguments.
SCALAR_FUNCTIONS = {"exp": 1, "log": 1, "sqrt": 1, "tanh": 1, "erf": 1, "erfc": 1, "abs": 1,
                    "sign": 1, "maximum": 2, "gt": 2, "ge": 2, "where": 3}


class _Backend:
    """Shared array helpers; subclasses supply the scalar functions."""

    name = "abstract"

    def sum(self, x, axis=None, keepdims=False):
        """``np.sum`` on an object array that always returns an object array (0-d included)."""
        x = np.asarray(x, dtype=object)
        out = np.sum(x, axis=axis, keepdims=keepdims)
        out = np.asarray(out, dtype=object)
        if out.size and x.size == 0:
            out = self.zeros(out.shape)
        return out

    def zeros(self, shape):
        """An object array of exact zeros."""
        out = np.empty(shape, dtype=object)
        out.fill(self.num(0))
        return out

    def full(self, shape, value):
        """An object array filled with ``value``."""
        out = np.empty(shape, dtype=object)
        out.fill(value)
        return out

    def _install(self, scalars):
        """Set ``self.<name>`` to the elementwise version of ``scalars[name]``."""
        for name, nin in SCALAR_FUNCTIONS.items():
            setattr(self, name, _lift(scalars[name], nin))


class MpmathBackend(_Backend):
    """Numbers are ``mpmath.mpf`` at the ambient ``mpmath.mp`` precision."""

    name = "mpmath"

    def __init__(self):
        self._install(dict(
            exp=mpmath.exp, log=mpmath.log, sqrt=mpmath.sqrt, tanh=mpmath.tanh, erf=mpmath.erf,
            erfc=mpmath.erfc,
            abs=mpmath.fabs, sign=mpmath.sign,
            maximum=lambda a, b: a if a >= b else b,
            gt=lambda a, b: bool(a > b), ge=lambda a, b: bool(a >= b),
            where=lambda c, a, b: a if c else b))

    @property
    def pi(self):
        return +mpmath.pi

    def num(self, p, q=1):
        """The exact rational ``p / q`` (rounded once to the working precision)."""
        return mpmath.mpf(p) / q

    def param(self, value):
        """A float parameter, converted exactly (engines receive the same binary value)."""
        return mpmath.mpf(value)


class SympyBackend(_Backend):
    """Numbers are SymPy expressions; comparisons stay symbolic (``Piecewise``)."""

    name = "sympy"

    def __init__(self):
        self._sp = None

    @property
    def sp(self):
        if self._sp is None:
            import sympy

            self._sp = sympy
            self._install(dict(
                exp=sympy.exp, log=sympy.log, sqrt=sympy.sqrt, tanh=sympy.tanh, erf=sympy.erf,
                erfc=sympy.erfc,
                abs=sympy.Abs, sign=sympy.sign, maximum=sympy.Max,
                gt=sympy.StrictGreaterThan, ge=sympy.GreaterThan,
                where=lambda c, a, b: sympy.Piecewise((a, c), (b, True))))
        return self._sp

    def __getattr__(self, attr):
        # First use of any scalar function imports SymPy and installs the functions.
        if attr in SCALAR_FUNCTIONS:
            self.sp  # noqa: B018 - installs the attributes
            return self.__dict__[attr]
        raise AttributeError(attr)

    @property
    def pi(self):
        return self.sp.pi

    def num(self, p, q=1):
        """The exact rational ``p / q``."""
        return self.sp.Rational(p, q)

    def param(self, value):
        """A float parameter as the short exact rational it was typed as (1e-5 -> 1/100000).

        NOTE: the proof does not depend on the parameter's value, only on the algebra, so the
        decimal reading keeps the expressions small; evaluation uses the exact binary value.
        """
        if isinstance(value, (bool, np.bool_)):
            return self.sp.Integer(int(value))
        if isinstance(value, (int, np.integer)):
            return self.sp.Integer(int(value))
        return self.sp.Rational(repr(float(value)))


MPMATH = MpmathBackend()
SYMPY = SympyBackend()


# ---------------------------------------------------------------------------------------------
# Shape helpers shared by the VJP formulas (backend-independent: they only move and add).


def sum_to_shape(M, g, shape):
    """Sum a broadcast cotangent ``g`` back to ``shape`` (the inverse of NumPy broadcasting)."""
    g = np.asarray(g, dtype=object)
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    if lead > 0:
        g = M.sum(g, axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = M.sum(g, axis=axes, keepdims=True)
    return np.asarray(g, dtype=object).reshape(shape)


def normalize_axes(axis, ndim):
    """``axis`` (None, int or tuple) as a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(sorted(int(a) % ndim if ndim else int(a) for a in axis))


def expand_reduced(r, shape, axes, keepdims):
    """Broadcast a reduced array ``r`` (reduced over ``axes``) back to ``shape``."""
    r = np.asarray(r, dtype=object)
    if not keepdims:
        keep_shape = tuple(1 if i in axes else n for i, n in enumerate(shape))
        r = r.reshape(keep_shape)
    return np.broadcast_to(r, shape)
