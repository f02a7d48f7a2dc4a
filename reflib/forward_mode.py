"""reflib's forward mode: its own op code run on dual numbers, ``reflib.jvp``.

``DualNumeric(dps)`` is a reflib numeric (``reflib.numeric``) whose entries are ``ForwardDual``
numbers (``spec.dual.Dual`` that also compare by value, as reflib's code needs), every slope
spec.dual's. ``reflib.forward`` on ``x + ε·t`` then runs reflib's hand-written forward and its
ε part is ``J t``: a second route to the JVP beside ``spec.jvp`` (spec's formulas, same rules).
At a declared kink the op's ``Kink`` convention sets the JVP, as in spec.

The long story: docs/second-order.md, section ``reflib``.
"""
from __future__ import annotations

import mpmath
import numpy as np

import optable
from reflib.numeric import GUARD_DIGITS, ByValue, check_dps
from reflib.scalar_rules import ObjectNumeric, is_real
from spec.dual import Dual, tangent_of, value_of
from spec.precision import converge

__all__ = ["ForwardDual", "DualNumeric", "jvp"]


class ForwardDual(ByValue, Dual):
    """``spec.dual.Dual`` that compares and converts by its value, as reflib's code needs
    (``x == 0`` in the cross-entropies, ``float(v)`` in target checks)."""

    __slots__ = ()
    _plain = staticmethod(value_of)


def _as_forward(r):
    return ForwardDual(r.value, r.tangent) if isinstance(r, Dual) else r


def _rewrapped(method):
    def apply(self, *args):
        if any(isinstance(a, np.ndarray) for a in args):
            return NotImplemented   # NumPy then applies the operation entry by entry
        return _as_forward(method(self, *args))
    apply.__name__ = method.__name__
    return apply


# spec.dual's arithmetic, its results kept ForwardDual
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__neg__", "__pos__", "__pow__"):
    setattr(ForwardDual, _name, _rewrapped(getattr(Dual, _name)))


class DualNumeric(ObjectNumeric):
    """A reflib numeric of ``ForwardDual`` entries over float64 (``dps=None``) or mpmath.

    Parameters
    ----------
    dps : int or None
        None: the parts are float64; an int: ``mpmath.mpf`` computed at ``working`` digits.
    working : int or None
        mpmath's working precision inside :meth:`context` (default ``dps + GUARD_DIGITS``).
    """

    def _entry(self, v, what):
        if isinstance(v, Dual):
            return v if isinstance(v, ForwardDual) else ForwardDual(v.value, v.tangent)
        if is_real(v):
            return self._base.convert(v)   # a constant: tangent 0
        raise TypeError(f"{what} holds {type(v).__name__} {v!r}; pass real numbers or duals")

    @staticmethod
    def _value(v):
        return value_of(v)

    @staticmethod
    def _apply(dual_fn, v):
        return _as_forward(dual_fn(v))


def split_parts(arr, zero):
    """(values, tangents) of an array of duals and constants."""
    arr = np.asarray(arr, dtype=object)
    values = np.empty(arr.shape, dtype=object)
    tangents = np.empty(arr.shape, dtype=object)
    for idx, v in np.ndenumerate(arr):
        values[idx] = value_of(v)
        tangents[idx] = tangent_of(v, zero)
    return values, tangents


def _finish(values, digits):
    """Results rounded to ``digits`` (object arrays of mpf), or float64 arrays."""
    if digits is None:
        return np.array(np.asarray(values, dtype=object), dtype=np.float64)
    from reflib.numeric import Exact
    return Exact(digits).result(values)


def run_exactly(compute, digits, name="the model"):
    """``compute()`` once in float64, or at growing mpmath precision until stable
    (``spec.precision.converge``, as ``reflib.forward`` does); results rounded at the end.

    A slope that is infinite at the inputs (``sqrt`` at 0, whose forward is defined there) is a
    ValueError naming ``name``, not a ZeroDivisionError from deep inside a rule.
    """
    try:
        if digits is None:
            with np.errstate(divide="raise"):
                return tuple(None if r is None else _finish(r, None) for r in compute())
        out = converge(compute, digits, GUARD_DIGITS)
    except (ZeroDivisionError, FloatingPointError) as exc:
        raise ValueError(f"{name}: a derivative is infinite at these inputs (a slope divides "
                         f"by zero, as sqrt's does at 0); pass inputs where the op is "
                         f"differentiable") from exc
    return tuple(None if r is None else _finish(r, digits) for r in out)


def jvp(name, inputs, tangents, dps=None, **params):
    """Forward value and ``J t`` of registry op ``name``, by reflib's forward on dual numbers.

    Parameters
    ----------
    name : str
        A registry op (``reflib.ops.op_names()``).
    inputs : sequence of array_like
        The op's inputs in the table's order, as for ``reflib.forward``.
    tangents : list or tuple
        One array per input shaped like it (``None`` for class indices): the direction.
    dps : int or None
        None: float64 arithmetic; an int: exact (mpmath), the working precision grown until the
        digits returned stop moving, results rounded to ``dps`` digits.
    **params
        The op's params, as for ``reflib.forward``.

    Returns
    -------
    value, jvp : numpy.ndarray
        float64, or object arrays of ``mpmath.mpf`` when ``dps`` is an int; both shaped like
        the output. ``jvp = Σ_i J_i t_i``; at a declared kink the op's convention (``relu'(0) =
        0``, ``|x|'(0) = 0``, ties of ``maximum`` to the first argument).

    Raises
    ------
    ValueError, TypeError
        As ``reflib.forward``; and a tangent of the wrong shape or count, a non-finite tangent,
        a tangent for a class-index input.

    Examples
    --------
    >>> import numpy as np
    >>> value, jv = jvp("tanh", [np.array([0.0])], [np.array([3.0])], dps=30)
    >>> str(jv[0])
    '3.0'
    """
    from reflib.ops import forward

    sig = optable.lookup(optable.OPS, name)
    digits = check_dps(dps)
    tangents = optable.check_tangents(name, sig.inputs, sig.class_index, inputs, tangents)

    def compute():
        F = DualNumeric(digits, working=None if digits is None else mpmath.mp.dps)
        base = F.zeros(())[()]
        with F.context():
            duals = []
            for iname, x, t in zip(sig.inputs, inputs, tangents):
                if t is None:
                    duals.append(x)
                    continue
                xs, ts = F.asarray(x, f"{name}: input {iname}"), F.asarray(t, f"{name}: tangent")
                if not F.isfinite(ts).all():
                    raise ValueError(f"{name}: the tangent for {iname!r} holds a non-finite "
                                     f"value; pass finite tangents")
                d = np.empty(xs.shape, dtype=object)
                for idx in np.ndindex(*xs.shape):
                    d[idx] = ForwardDual(xs[idx], ts[idx])
                duals.append(d)
        out = forward(name, duals, dps=F, **params)
        return split_parts(out, base)

    value, jv = run_exactly(compute, digits, name)
    _at_kinks(name, inputs, tangents, params, jv, digits)
    return value, jv


def _at_kinks(name, inputs, tangents, params, jv, digits):
    """The op's declared kink convention where an input sits on a kink (spec's own rule)."""
    import spec
    from spec.second_order import at_kinks

    op = spec.OPS[name]
    if not op.kinks:
        return
    sig = optable.lookup(optable.OPS, name)
    merged = optable.resolve_params(name, sig.defaults, params)
    arrays = [np.asarray(x, dtype=object) for x in inputs]
    tans = [None if t is None else np.asarray(t, dtype=object) for t in tangents]
    with mpmath.workdps(digits or 30):
        exact = np.array(jv, dtype=object)
        at_kinks(op, arrays, tans, merged, exact)
    jv[...] = exact if digits is not None else np.array(exact, dtype=np.float64)
