"""The entrywise bound of the ``jvp2`` and ``hvp`` rows: a running-error bound of the registry's
own rule, evaluated at the draw.

spec's JVP is its forward on dual numbers, its HVP the stated VJP on them (``spec.dual``); here
the same formulas run on duals whose parts are :class:`Err` numbers, an exact value with a
first-order bound on what a floating-point evaluation of it accumulates (Wilkinson's running
error analysis: ``e(a + b) = e(a) + e(b) + |a + b|``, ``e(ab) = |a|e(b) + |b|e(a) + |ab|``, ...,
in units of u). The rows allow ``K · u · E`` per entry. The rules and their derivation:
docs/second-order.md, section "The bound".
"""
from __future__ import annotations

import mpmath
import numpy as np

from spec.backends import _Backend
from spec.dual import DualBackend, make_duals, split

__all__ = ["Err", "ERR", "running_error", "K"]

#: the safety factor on the first-order running-error bound (module docstring)
K = 16
#: digits of the exact values the bound is evaluated with: magnitudes need few digits, but a
#: cancellation (1 - tanh(x)² near saturation) must still show its small value
DPS = 30
#: a library function (exp, log, tanh, erf, sqrt) is within this many units of roundoff
LIBRARY = 2


class Err:
    """An exact value and the running bound ``e`` on a float evaluation's error (units of u)."""

    __slots__ = ("v", "e")

    def __init__(self, v, e):
        self.v = v
        self.e = e

    def __repr__(self):
        return f"Err({self.v}, ±{self.e}u)"

    @staticmethod
    def of(x):
        """A plain number as an :class:`Err`: exact (an input's entry or an integer)."""
        return x if isinstance(x, Err) else Err(mpmath.mpf(x), mpmath.mpf(0))

    def __add__(self, other):
        if not isinstance(other, _NUMBERS):
            return NotImplemented
        o = Err.of(other)
        v = self.v + o.v
        return Err(v, self.e + o.e + abs(v))

    __radd__ = __add__

    def __sub__(self, other):
        if not isinstance(other, _NUMBERS):
            return NotImplemented
        o = Err.of(other)
        v = self.v - o.v
        return Err(v, self.e + o.e + abs(v))

    def __rsub__(self, other):
        if not isinstance(other, _NUMBERS):
            return NotImplemented
        return Err.of(other) - self

    def __neg__(self):
        return Err(-self.v, self.e)

    def __pos__(self):
        return self

    def __mul__(self, other):
        if not isinstance(other, _NUMBERS):
            return NotImplemented
        o = Err.of(other)
        v = self.v * o.v
        return Err(v, abs(self.v) * o.e + abs(o.v) * self.e + abs(v))

    __rmul__ = __mul__

    def __truediv__(self, other):
        if not isinstance(other, _NUMBERS):
            return NotImplemented
        o = Err.of(other)
        q = self.v / o.v
        return Err(q, (self.e + abs(q) * o.e) / abs(o.v) + abs(q))

    def __rtruediv__(self, other):
        if not isinstance(other, _NUMBERS):
            return NotImplemented
        return Err.of(other) / self

    def __pow__(self, n):
        if isinstance(n, Err):
            raise TypeError("Err ** Err is not used by any registry formula")
        v = self.v ** n
        slope = abs(n * self.v ** (n - 1)) if n != 0 else 0
        steps = abs(n) - 1 if float(n).is_integer() else LIBRARY
        return Err(v, slope * self.e + max(steps, 0) * abs(v))

    # comparisons look at the value (the branch taken at the point)
    def __gt__(self, other):
        return self.v > Err.of(other).v

    def __ge__(self, other):
        return self.v >= Err.of(other).v

    def __lt__(self, other):
        return self.v < Err.of(other).v

    def __le__(self, other):
        return self.v <= Err.of(other).v

    def __eq__(self, other):
        return self.v == Err.of(other).v

    def __hash__(self):
        return hash(self.v)


_NUMBERS = (Err, int, float, np.number, type(mpmath.mpf(0)))


def _function(fn, slope):
    """A library function of an :class:`Err`: propagated error plus ``LIBRARY`` ulps."""
    def apply(a):
        a = Err.of(a)
        v = fn(a.v)
        return Err(v, abs(slope(a.v, v)) * a.e + LIBRARY * abs(v))
    return apply


class ErrBackend(_Backend):
    """The scalar functions of ``spec.backends`` on :class:`Err` numbers (mpmath values)."""

    name = "running-error"

    def __init__(self):
        def where(c, a, b):
            return a if c else b

        def maximum(a, b):
            return a if Err.of(a).v >= Err.of(b).v else b

        self._install(dict(
            exp=_function(mpmath.exp, lambda x, v: v),
            log=_function(mpmath.log, lambda x, v: 1 / x),
            sqrt=_function(mpmath.sqrt, lambda x, v: 1 / (2 * v) if v else 0),
            tanh=_function(mpmath.tanh, lambda x, v: 1 - v * v),
            erf=_function(mpmath.erf, lambda x, v: 2 * mpmath.exp(-x * x) / mpmath.sqrt(mpmath.pi)),
            erfc=_function(mpmath.erfc,
                           lambda x, v: -2 * mpmath.exp(-x * x) / mpmath.sqrt(mpmath.pi)),
            abs=lambda a: Err(abs(Err.of(a).v), Err.of(a).e),
            sign=lambda a: Err(mpmath.sign(Err.of(a).v), mpmath.mpf(0)),
            maximum=maximum,
            gt=lambda a, b: bool(Err.of(a).v > Err.of(b).v),
            ge=lambda a, b: bool(Err.of(a).v >= Err.of(b).v),
            where=where))

    @property
    def pi(self):
        v = +mpmath.pi
        return Err(v, abs(v))

    def num(self, p, q=1):
        v = mpmath.mpf(p) / q
        # an integer is exact; a fraction (1/3) is rounded once
        return Err(v, mpmath.mpf(0) if v == int(v) else abs(v))

    def param(self, value):
        if isinstance(value, (bool, np.bool_, int, np.integer)):
            return Err(mpmath.mpf(int(value)), mpmath.mpf(0))
        v = mpmath.mpf(value)
        return Err(v, abs(v))


ERR = ErrBackend()
DUAL_ERR = DualBackend(ERR)


def _errs(values):
    """An object array of exact :class:`Err` numbers (inputs are exact in their dtype)."""
    values = np.asarray(values, dtype=np.float64)
    out = np.empty(values.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(values.reshape(-1)):
        flat[i] = Err(mpmath.mpf(float(v)), mpmath.mpf(0))
    return out


def _bounds(x, shape):
    """The ``e`` parts of an array of :class:`Err` (or plain numbers) as float64."""
    x = np.broadcast_to(np.asarray(x, dtype=object), shape)
    out = np.empty(shape, dtype=np.float64)
    for idx in np.ndindex(*shape):
        item = x[idx]
        out[idx] = float(item.e) if isinstance(item, Err) else 0.0
    return out


def _jvp_from_vjp(op, values, tangents, params, out):
    """The running error of ``J t`` computed from the stated first derivative, as engines do
    (``f'`` from the rounded output: ``σ(1 - σ)``, ``exp(x - lse)``), for the ops whose
    Jacobian the VJP gives entry by entry: elementwise ops (``J t = f' · t``) and the
    reductions (``J t = Σ_group VJP(1) · t`` over each reduced group)."""
    result, _ = split(out, Err.of(0))
    ones = np.empty(result.shape, dtype=object)
    ones.fill(Err.of(1))
    (slopes,) = op.run_vjp(ERR, values, params, result, ones)
    terms = np.asarray(slopes, dtype=object) * _errs(tangents[0])
    if op.category == "unary":
        return _bounds(terms, result.shape)
    axis, keepdims = params.get("axis"), params.get("keepdims", False)
    reduced = ERR.sum(terms, axis, keepdims) if axis != () else terms
    return _bounds(reduced, result.shape)


def _with_tangent_errors(out, errors):
    """The dual output ``out`` with each tangent's error raised to ``errors`` (units of u)."""
    from spec.dual import Dual

    fixed = np.empty(out.shape, dtype=object)
    for idx in np.ndindex(*out.shape):
        d = out[idx]
        if isinstance(d, Dual):
            t = Err.of(d.tangent)
            d = Dual(d.value, Err(t.v, max(t.e, mpmath.mpf(float(errors[idx])))))
        fixed[idx] = d
    return fixed


def running_error(name, inputs, cotangent, tangents, params=None):
    """Running-error bounds of op ``name``'s JVP and HVP at a draw, in units of u.

    Parameters
    ----------
    name : str
        A registry op.
    inputs : sequence of array_like
        The inputs (floats in the dtype under test, class indices as integers).
    cotangent : array_like
        ``g`` (the output's shape).
    tangents : sequence
        One array per input (None for class indices).
    params : dict, optional

    Returns
    -------
    (numpy.ndarray, list)
        ``E`` of the JVP (the output's shape) and of each input's HVP (None for class indices),
        float64, to be scaled by ``K · u``.
    """
    import spec

    op = spec.OPS[name]
    arrays = [np.asarray(x) for x in inputs]
    resolved = op.resolve_params(params)
    with mpmath.workdps(DPS):
        values = [a.astype(np.int64) if op.domains[n] == "class_index" else _errs(a)
                  for n, a in zip(op.inputs, arrays)]
        duals = [v if t is None else make_duals(v, _errs(t))
                 for v, t in zip(values, tangents)]
        with np.errstate(all="ignore"):
            out = np.asarray(op.run_forward(DUAL_ERR, duals, resolved), dtype=object)
            _, jt = split(out, Err.of(0))
            jvp_e = _bounds(jt, out.shape)
            if op.category in ("unary", "reduction"):
                jvp_e = np.maximum(jvp_e, _jvp_from_vjp(op, values, tangents, resolved, out))
                # the HVP differentiates the stated VJP, whose ``result`` moves by J t: an
                # engine takes that J t from the stated derivative too (σ' = σ(1 - σ) from
                # the rounded σ), so the result's tangent carries the larger of the two errors
                out = _with_tangent_errors(out, jvp_e)
            g = _errs(cotangent)
            grads = op.run_vjp(DUAL_ERR, duals, resolved, out, g)
        hvp_e = []
        for a, gi in zip(arrays, grads):
            if gi is None:
                hvp_e.append(None)
                continue
            _, ht = split(np.broadcast_to(np.asarray(gi, dtype=object), a.shape), Err.of(0))
            hvp_e.append(_bounds(ht, a.shape))
    return jvp_e, hvp_e
