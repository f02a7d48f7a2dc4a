"""Dual numbers over a backend: the registry's own formulas, differentiated in one direction.

``Dual(value, tangent)`` is ``value + tangent·ε`` (ε² = 0); ``DualBackend(M)`` supplies the scalar
functions of ``spec.backends`` on duals over backend ``M`` (mpmath or SymPy), each derivative rule
stated once here. The declared forward on ``x + ε·t`` gives the JVP; the declared VJP on it gives
the HVP (forward over reverse). At a kink the tangent follows the branch the value takes.

The long story: docs/second-order.md.
"""
from __future__ import annotations

import numpy as np

from spec.backends import SCALAR_FUNCTIONS, _Backend


class Dual:
    """``value + tangent·ε`` (ε² = 0); the parts are numbers of one backend."""

    __slots__ = ("value", "tangent")

    def __init__(self, value, tangent):
        self.value = value
        self.tangent = tangent

    def __repr__(self):
        return f"Dual({self.value!r}, {self.tangent!r})"

    # arithmetic: a plain number is a constant (tangent 0)
    def __add__(self, other):
        if isinstance(other, Dual):
            return Dual(self.value + other.value, self.tangent + other.tangent)
        return Dual(self.value + other, self.tangent)

    __radd__ = __add__

    def __neg__(self):
        return Dual(-self.value, -self.tangent)

    def __pos__(self):
        return Dual(+self.value, +self.tangent)

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        if isinstance(other, Dual):
            return Dual(self.value * other.value,
                        self.tangent * other.value + self.value * other.tangent)
        return Dual(self.value * other, self.tangent * other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, Dual):
            q = self.value / other.value
            return Dual(q, (self.tangent - q * other.tangent) / other.value)
        return Dual(self.value / other, self.tangent / other)

    def __rtruediv__(self, other):
        q = other / self.value
        return Dual(q, -q * self.tangent / self.value)

    def __pow__(self, n):
        if isinstance(n, Dual):
            raise TypeError("Dual ** Dual is not used by any registry formula")
        return Dual(self.value ** n, n * self.value ** (n - 1) * self.tangent)

    # comparisons look at the value only (the branch taken at the point)
    def __gt__(self, other):
        return self.value > value_of(other)

    def __ge__(self, other):
        return self.value >= value_of(other)

    def __lt__(self, other):
        return self.value < value_of(other)

    def __le__(self, other):
        return self.value <= value_of(other)


def value_of(x):
    """The value part of a dual (a plain number is its own value)."""
    return x.value if isinstance(x, Dual) else x


def tangent_of(x, zero=0):
    """The tangent part of a dual (``zero`` for a plain number: a constant)."""
    return x.tangent if isinstance(x, Dual) else zero


def _unary(value_fn, slope_fn):
    """A scalar function of a dual from its value and its slope at the value."""
    def fn(x):
        if not isinstance(x, Dual):
            return value_fn(x)
        v = value_fn(x.value)
        return Dual(v, slope_fn(x.value, v) * x.tangent)
    return fn


class DualBackend(_Backend):
    """The scalar functions of ``spec.backends`` on duals over backend ``base``."""

    def __init__(self, base):
        self.base = base
        self.name = f"dual[{base.name}]"
        b = base
        # NOTE: SymPy's backend installs its functions on first use of .sp
        if hasattr(b, "sp"):
            b.sp  # noqa: B018
        exp, log, sqrt, tanh, erf, erfc = b.exp, b.log, b.sqrt, b.tanh, b.erf, b.erfc

        def where(c, x, y):
            if not (isinstance(x, Dual) or isinstance(y, Dual)):
                return b.where(c, x, y)
            zero = b.num(0)
            return Dual(b.where(c, value_of(x), value_of(y)),
                        b.where(c, tangent_of(x, zero), tangent_of(y, zero)))

        def ge(x, y):
            return b.ge(value_of(x), value_of(y))

        def maximum(x, y):
            # ties go to the first argument, as the registry's maximum VJP states
            return where(ge(x, y), x, y)

        self._install(dict(
            exp=_unary(exp, lambda x, v: v),
            log=_unary(log, lambda x, v: 1 / x),
            sqrt=_unary(sqrt, lambda x, v: 1 / (2 * v)),
            tanh=_unary(tanh, lambda x, v: 1 - v**2),
            erf=_unary(erf, lambda x, v: 2 * exp(-x**2) / sqrt(b.pi)),
            erfc=_unary(erfc, lambda x, v: -2 * exp(-x**2) / sqrt(b.pi)),
            # abs'(x) = sign(x), sign(0) = 0: the registry's convention for abs. Numerically
            # (not in the proofs, which exclude the point) abs at exactly 0 takes its right
            # derivative, as maximum's tie rule takes max(x, 0)'s: bce_with_logits' smooth
            # max(z, 0) + log(1 + exp(-|z|)) needs the two one-sided choices to agree at z = 0
            # (abs's own JVP there is its kink convention, spec.second_order.at_kinks)
            abs=_unary(b.abs, (lambda x, v: b.sign(x)) if b.name == "sympy" else
                       (lambda x, v: b.num(1) if b.ge(x, b.num(0)) else b.num(-1))),
            sign=lambda x: b.sign(value_of(x)),
            maximum=maximum,
            gt=lambda x, y: b.gt(value_of(x), value_of(y)),
            ge=ge,
            where=where))
        missing = set(SCALAR_FUNCTIONS) - set(self.__dict__)
        if missing:   # a scalar function added to spec.backends needs its derivative rule here
            raise NotImplementedError(f"spec.dual: no derivative rule for {sorted(missing)}")

    @property
    def pi(self):
        return self.base.pi

    def num(self, p, q=1):
        return self.base.num(p, q)

    def param(self, value):
        return self.base.param(value)

    def zeros(self, shape):
        return self.base.zeros(shape)


def make_duals(values, tangents):
    """An object array of ``Dual(v, t)`` (``values`` and ``tangents`` shaped alike)."""
    values = np.asarray(values, dtype=object)
    tangents = np.asarray(tangents, dtype=object)
    out = np.empty(values.shape, dtype=object)
    flat = out.reshape(-1)
    for i, (v, t) in enumerate(zip(values.reshape(-1), tangents.reshape(-1))):
        flat[i] = Dual(v, t)
    return out


def split(x, zero):
    """(values, tangents) of an array that may hold duals and plain numbers."""
    x = np.asarray(x, dtype=object)
    values = np.empty(x.shape, dtype=object)
    tangents = np.empty(x.shape, dtype=object)
    for idx in np.ndindex(*x.shape):
        values[idx] = value_of(x[idx])
        tangents[idx] = tangent_of(x[idx], zero)
    return values, tangents


__all__ = ["Dual", "DualBackend", "make_duals", "split", "value_of", "tangent_of"]
