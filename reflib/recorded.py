"""A recording numeric: every arithmetic step of reflib's op code kept, for a second backward.

``RecordingNumeric(dps)`` is a reflib numeric whose entries are ``Recorded`` scalars: a value,
the scalars it came from and the step's partials (spec.dual's rules, ``reflib.scalar_rules``).
A ``reflib.Tape`` on it runs unchanged, and its first backward (every op's own VJP, every fold)
is recorded step by step; :func:`gradient`, a reverse sweep over the recorded steps, then
differentiates the gradients again (reverse over reverse). Every real number entering an array
becomes a parentless leaf, so a tape leaf's entries are what :func:`gradient` differentiates by.

The long story: docs/second-order.md, section ``reflib``.
"""
from __future__ import annotations

import itertools
import operator

import mpmath
import numpy as np

from reflib.numeric import ByValue
from reflib.scalar_rules import ObjectNumeric, dual_scalars, is_real
from spec.dual import Dual

__all__ = ["Recorded", "RecordingNumeric", "gradient", "values_of"]

# creation order: a step is always created after the scalars it reads, so visiting the recorded
# steps from the newest down is a reverse topological order
_ORDER = itertools.count()


def _val(x):
    return x.value if isinstance(x, Recorded) else x


class Recorded(ByValue):
    """A scalar with the steps that produced it: ``parents`` and ``partials`` (∂self/∂parent);
    it compares and converts by its value (``ByValue``)."""

    __slots__ = ("value", "parents", "partials", "order")
    _plain = staticmethod(_val)

    def __init__(self, value, parents=(), partials=()):
        self.value = value
        self.parents = parents
        self.partials = partials
        self.order = next(_ORDER)

    def __repr__(self):
        return f"Recorded({self.value!r}, {len(self.parents)} parents)"

    # arithmetic: each step recorded with its partials from spec.dual
    def __add__(self, o):
        return _binary(operator.add, self, o)

    def __radd__(self, o):
        return _binary(operator.add, o, self)

    def __sub__(self, o):
        return _binary(operator.sub, self, o)

    def __rsub__(self, o):
        return _binary(operator.sub, o, self)

    def __mul__(self, o):
        return _binary(operator.mul, self, o)

    def __rmul__(self, o):
        return _binary(operator.mul, o, self)

    def __truediv__(self, o):
        return _binary(operator.truediv, self, o)

    def __rtruediv__(self, o):
        return _binary(operator.truediv, o, self)

    def __neg__(self):
        return unary(operator.neg, self)

    def __pos__(self):
        return self

    def __pow__(self, n):
        if isinstance(n, Recorded):
            raise TypeError("Recorded ** Recorded is not used by any reflib formula")
        return unary(lambda d: d ** n, self)

    def __abs__(self):
        rules = dual_scalars(None if not isinstance(self.value, mpmath.mpf) else 1)
        return unary(rules.abs, self)


def _one(v):
    """1 in the number system of ``v`` (an int 1 would make ``Dual(x, 1) / 3`` a float)."""
    return v * 0 + 1


def _binary(fn, a, b):
    """``fn(a, b)`` recorded: for each recorded operand, the step on ``Dual(operand, 1)``."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return NotImplemented       # NumPy then applies the step entry by entry
    av, bv = _val(a), _val(b)
    parents, partials, value = [], [], None
    if isinstance(a, Recorded):
        r = fn(Dual(av, _one(av)), bv)
        value = r.value
        parents.append(a)
        partials.append(r.tangent)
    if isinstance(b, Recorded):
        r = fn(av, Dual(bv, _one(bv)))
        value = r.value
        parents.append(b)
        partials.append(r.tangent)
    return Recorded(value, tuple(parents), tuple(partials))


def unary(dual_fn, x):
    """``f(x)`` recorded, ``dual_fn`` being f on duals (spec.dual's rule)."""
    if not isinstance(x, Recorded):
        return dual_fn(x)
    r = dual_fn(Dual(x.value, _one(x.value)))
    return Recorded(r.value, (x,), (r.tangent,))


def gradient(output, wrt):
    """Reverse sweep over the recorded steps: ``∂output/∂w`` for each scalar ``w`` of ``wrt``.

    Parameters
    ----------
    output : Recorded or real
        A scalar computed from recorded steps (a plain number: every derivative is 0).
    wrt : iterable of Recorded
        The scalars to differentiate with respect to (a tape leaf's entries).

    Returns
    -------
    list
        One number per entry of ``wrt`` (0 where ``output`` does not depend on it).
    """
    wrt = list(wrt)
    if not isinstance(output, Recorded):
        return [0 * _val(w) for w in wrt]
    seen, stack, nodes = {id(output)}, [output], []
    while stack:      # every step output depends on
        node = stack.pop()
        nodes.append(node)
        for p in node.parents:
            if id(p) not in seen:
                seen.add(id(p))
                stack.append(p)
    nodes.sort(key=lambda n: n.order, reverse=True)
    adjoint = {id(output): 1}
    for node in nodes:
        a = adjoint.get(id(node))
        if a is None:
            continue
        for p, d in zip(node.parents, node.partials):
            contribution = a * d
            adjoint[id(p)] = adjoint[id(p)] + contribution if id(p) in adjoint else contribution
    return [adjoint.get(id(w), 0 * _val(w)) for w in wrt]


def values_of(arr):
    """The values of an array of ``Recorded`` (and plain numbers), as an object array."""
    arr = np.asarray(arr, dtype=object)
    out = np.empty(arr.shape, dtype=object)
    for idx, v in np.ndenumerate(arr):
        out[idx] = _val(v)
    return out


class RecordingNumeric(ObjectNumeric):
    """A reflib numeric of ``Recorded`` entries over float64 (``dps=None``) or mpmath.

    Pass it where reflib takes ``dps`` (``reflib.Tape(dps=F)``). See the module docstring.

    Parameters
    ----------
    dps : int or None
        None: values and partials are float64; an int: ``mpmath.mpf`` at ``working`` digits.
    working : int or None
        mpmath's working precision inside :meth:`context` (default ``dps + GUARD_DIGITS``).
    """

    def leaf(self, v):
        """A parentless recorded scalar holding ``v`` in this number system."""
        return Recorded(self._base.convert(v))

    def _entry(self, v, what):
        # recorded scalars kept, real numbers as new leaves
        if isinstance(v, Recorded):
            return v
        if is_real(v):
            return self.leaf(v)
        raise TypeError(f"{what} holds {type(v).__name__} {v!r}; pass real numbers")

    @staticmethod
    def _value(v):
        return _val(v)

    @staticmethod
    def _apply(dual_fn, v):
        return unary(dual_fn, v)
