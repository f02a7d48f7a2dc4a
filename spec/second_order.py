"""Exact JVPs and Hessian-vector products of a registry op, at any precision (mpmath).

Both come from the op's single declaration, run on dual numbers (``spec.dual``):

- ``jvp``: the declared forward on ``x + ε·t``; its ε part is ``J t``.
- ``hvp``: the declared (proven) VJP on ``x + ε·t`` with a fixed cotangent ``g``; its ε part is
  ``∇_x <g, J(x) t>``, the VJP of the VJP (for an op of several inputs, ``t`` holds one tangent
  per input and the product is the full Hessian of ``<g, f>`` times the stacked tangent).

``spec.prove_second_order`` proves both equal to what SymPy's ``diff`` gives. The long story:
docs/second-order.md.
"""
from __future__ import annotations

import mpmath
import numpy as np

import optable
from spec.backends import MPMATH
from spec.dual import DualBackend, make_duals, split
from spec.evaluate import (_check_dps, _finite_mask, _first_bad, _mpf_array, _rounded, as_array,
                           lookup, prepare)
from spec.precision import converge

GUARD_DIGITS = 20
DUAL_MPMATH = DualBackend(MPMATH)


def _check_tangents(op, arrays, tangents):
    """The tangents as finite arrays (``optable.check_tangents``: count, shapes, class indices)."""
    checked = optable.check_tangents(op.name, op.inputs,
                                     [n for n in op.inputs if op.vjp.get(n) is None], arrays,
                                     tangents)
    return [None if t is None else _finite(op, f"tangent for {n!r}", t)
            for n, t in zip(op.inputs, checked)]


def _finite(op, what, value):
    arr = as_array(value, f"{op.name}: {what}")
    bad = _first_bad(~_finite_mask(arr))
    if bad is not None:
        raise ValueError(f"{op.name}: the {what} holds {arr[bad]} at index {bad}; it must be "
                         f"finite")
    return arr


def _check_grad(op, grad, out_shape):
    g = _finite(op, "cotangent", grad)
    optable.check_grad(op.name, g.shape, None, out_shape)
    return g


def dual_inputs(op, values, tangents):
    """The inputs as duals ``x + ε·t`` (class indices stay plain integers)."""
    return [v if t is None else make_duals(v, t) for v, t in zip(values, tangents)]


def _prepared(op, inputs, tangents, params, dps):
    dps = _check_dps(dps)
    arrays, resolved, out_shape = prepare(op, inputs, params)
    tangents = _check_tangents(op, arrays, tangents)
    return dps, arrays, resolved, out_shape, tangents


def _mp_values(op, arrays, tangents):
    values = [a if op.domains[n] == "class_index" else _mpf_array(a)
              for n, a in zip(op.inputs, arrays)]
    return values, [None if t is None else _mpf_array(t) for t in tangents]


def jvp(name, inputs, tangents, params=None, dps=50):
    """Forward value and ``J t`` of a registry op, exactly (mpmath at ``dps`` digits).

    Parameters
    ----------
    name, inputs, params, dps
        As for ``spec.evaluate``.
    tangents : list or tuple
        One array per input shaped like it (``None`` for class indices); the direction.

    Returns
    -------
    output, jvp : numpy.ndarray of mpmath.mpf
        The forward value and the directional derivative ``Σ_i J_i t_i``, both shaped like the
        output.

    Raises
    ------
    ValueError, TypeError
        As ``spec.evaluate``; and tangents that ``optable.check_tangents`` refuses, or that
        are not finite.

    Examples
    --------
    >>> import numpy as np
    >>> out, t = jvp("exp", [np.array([0.0])], [np.array([2.0])], dps=20)
    >>> str(t[0])
    '2.0'
    """
    op = lookup(name)
    dps, arrays, resolved, _, tangents = _prepared(op, inputs, tangents, params, dps)

    def compute():
        values, tans = _mp_values(op, arrays, tangents)
        out = op.run_forward(DUAL_MPMATH, dual_inputs(op, values, tans), resolved)
        return split(out, mpmath.mpf(0))

    value, tangent = converge(compute, dps, GUARD_DIGITS)
    with mpmath.workdps(dps):
        value, tangent = _rounded(value), _rounded(tangent)
        at_kinks(op, arrays, tangents, resolved, tangent)
        return value, tangent


def at_kinks(op, arrays, tangents, params, jvp_out):
    """Set the JVP to the registry's convention where an input sits on a declared kink.

    The dual numbers follow whichever branch a formula's comparison picks (relu's
    ``max(x, 0)`` would take slope 1 at 0); the op's ``Kink`` states the convention its VJP
    keeps (relu'(0) = 0), and the JVP must be that VJP's transpose there too.
    """
    from spec.opspec import call_formula

    for kink in op.kinks:
        idx = [op.inputs.index(n) for n in kink.inputs]
        xs = np.broadcast_arrays(*[np.asarray(arrays[i], dtype=object) for i in idx],
                                 np.empty(jvp_out.shape, dtype=object))[:-1]
        ts = np.broadcast_arrays(*[np.asarray(tangents[i], dtype=object) for i in idx],
                                 np.empty(jvp_out.shape, dtype=object))[:-1]
        slopes = call_formula(kink.slopes, dict(params))
        hit = np.asarray((xs[0] == 0) if kink.kind == "zero" else (xs[0] == xs[1]), dtype=bool)
        for pos in (p for p in np.ndindex(*hit.shape) if hit[p]):
            jvp_out[pos] = +sum((mpmath.mpf(slopes[n]) * mpmath.mpf(t[pos])
                                 for n, t in zip(kink.inputs, ts)), mpmath.mpf(0))


def hvp(name, inputs, cotangent, tangents, params=None, dps=50):
    """``∇_x <g, J(x) t>`` of a registry op, per input, exactly (mpmath at ``dps`` digits).

    The VJP of the VJP: the derivative, in direction ``t``, of the stated VJP ``J(x)ᵀ g``.
    For input ``i`` this is ``Σ_j Σ_k g_j ∂²f_j/∂x_i∂x_k t_k`` (k over every input's entries).

    Parameters
    ----------
    name, inputs, params, dps
        As for :func:`jvp`.
    cotangent : array_like
        ``g``, shaped like the output (0-d for losses).
    tangents : list or tuple
        One array per input shaped like it (``None`` for class indices).

    Returns
    -------
    tuple
        One object array of mpf per input shaped like it; ``None`` for a class-index input.

    Examples
    --------
    >>> import numpy as np
    >>> (h,) = hvp("square", [np.array([3.0])], np.array([1.0]), [np.array([1.0])], dps=20)
    >>> str(h[0])
    '2.0'
    """
    op = lookup(name)
    dps, arrays, resolved, out_shape, tangents = _prepared(op, inputs, tangents, params, dps)
    g = _check_grad(op, cotangent, out_shape)

    def compute():
        values, tans = _mp_values(op, arrays, tangents)
        duals = dual_inputs(op, values, tans)
        result = np.asarray(op.run_forward(DUAL_MPMATH, duals, resolved), dtype=object)
        grads = op.run_vjp(DUAL_MPMATH, duals, resolved, result, _mpf_array(g))
        return tuple(None if gi is None else split(gi, mpmath.mpf(0))[1] for gi in grads)

    out = converge(compute, dps, GUARD_DIGITS)
    with mpmath.workdps(dps):
        return tuple(None if h is None else _rounded(h) for h in out)


__all__ = ["jvp", "hvp"]
