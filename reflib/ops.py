"""The reference engine protocol: ``forward(name, inputs, ...)`` and ``vjp(name, inputs, grad, ...)``.

Every registry op has one hand-written forward and one hand-written VJP in the ``reflib._ops_*``
modules (elementwise, binary, reduce, structure, norm, loss). This module joins them with the
op table's signatures (``optable``) and does what every op needs at the boundary, with the
checks and messages every engine shares (``optable.boundary``): look the name up, check the
inputs (count, dtype, finiteness), the params (names, defaults) and the cotangent's shape, pick
the precision, and hand back fresh arrays: float64 for ``dps=None``, object arrays of
``mpmath.mpf`` otherwise.
"""
from __future__ import annotations

import numpy as np

import optable
from optable import UnknownOpError
from reflib import _ops_binary, _ops_elementwise, _ops_loss, _ops_norm, _ops_reduce, _ops_structure
from reflib._ops_common import OpDef
from reflib.numeric import GUARD_DIGITS, Exact, numeric_for
from spec.precision import converge

__all__ = ["forward", "vjp", "vjp_from_output", "OPS", "UnknownOpError", "op_names"]


def _build_table():
    """``{name: OpDef}``: each module's ``{name: (forward, vjp)}`` joined with the op table's
    signature (inputs, params and defaults, class-index inputs), so those are written once."""
    impls = {}
    for module in (_ops_elementwise, _ops_binary, _ops_reduce, _ops_structure, _ops_norm,
                   _ops_loss):
        impls.update(module.OPS)
    table = {}
    for name, (fwd, bwd) in impls.items():
        sig = optable.lookup(optable.OPS, name)
        table[name] = OpDef(sig.inputs, fwd, bwd, sig.defaults, sig.class_index)
    return table


OPS: dict[str, OpDef] = _build_table()


def op_names():
    """The names of every reference op, sorted."""
    return sorted(OPS)


def _lookup(name):
    return optable.lookup(OPS, name)


def _params(name, op, params):
    return optable.resolve_params(name, op.params, params)


def _inputs(name, op, inputs, F):
    optable.check_input_list(name, op.inputs, inputs)
    arrays = []
    for iname, value in zip(op.inputs, inputs):
        what = f"{name}: input {iname}"
        if iname in op.class_index:
            arr = np.asarray(value)  # kept as given; the op validates the indices
            optable.check_class_index(what, arr, kinds="iufO")
        else:
            arr = F.asarray(value, what)
            finite = F.isfinite(arr)
            if not finite.all():
                idx = tuple(int(i) for i in np.argwhere(~finite)[0])
                raise ValueError(f"{what} holds a non-finite value {arr[idx]} at index {idx}; "
                                 f"the reference ops take finite numbers")
        arrays.append(arr)
    return arrays


def _result(F, value, what):
    """A fresh array of the engine's dtype (object arrays hold only mpf, rounded to dps)."""
    return F.result(value, what)


def forward(name, inputs, dps=None, **params):
    """Evaluate registry op ``name`` on ``inputs``.

    Parameters
    ----------
    name : str
        An op of docs/CONTRACTS.md's table (``"tanh"``, ``"matmul"``, ``"cross_entropy"``, ...).
    inputs : sequence of array_like
        The op's inputs in the table's order (``[x]``, ``[a, b]``, ``[logits, target]``).
    dps : int or None
        None computes in float64; an int computes with ``mpmath.mpf`` at that many decimal digits.
    **params
        The op's params (``axis=``, ``keepdims=``, ``eps=``, ...); omitted ones take the defaults.

    Returns
    -------
    numpy.ndarray
        float64, or an object array of mpf when ``dps`` is an int. Losses give shape ``()``.

    Raises
    ------
    UnknownOpError
        For a name not in the table (a KeyError; the message lists close names).
    ValueError
        For a wrong input count, shapes that do not fit, an unknown or bad param, a non-finite
        input or an input outside the op's domain.
    TypeError
        For inputs of a non-real dtype.
    """
    op = _lookup(name)
    F = numeric_for(dps)
    merged = _params(name, op, params)

    def compute():
        arrays = _inputs(name, op, inputs, F)
        return (op.forward(F, *arrays, **merged),)

    (out,) = _at_converged_precision(F, compute)
    return _result(F, out, f"{name}: output")


def _at_converged_precision(F, compute):
    """Run ``compute`` once in float64, or, exactly, at a working precision that grows until
    its results stop moving (spec.precision: saturated tails such as 1 - tanh(80)^2 cancel at
    any fixed number of guard digits)."""
    if not isinstance(F, Exact):   # float64, or running error bounds (reflib.running_error)
        with F.context():
            return compute()
    return converge(compute, F.dps, GUARD_DIGITS)


def vjp(name, inputs, grad, dps=None, **params):
    """Vector-Jacobian product of registry op ``name``: one cotangent per input.

    Parameters
    ----------
    name, inputs, dps, **params
        As for :func:`forward`.
    grad : array_like
        The cotangent of the output; its shape must equal the output's (``()`` for losses).

    Returns
    -------
    tuple of (numpy.ndarray or None)
        One array per input, of that input's shape; None for a class-index input
        (``cross_entropy``'s target), which is not differentiable.

    Raises
    ------
    UnknownOpError, ValueError, TypeError
        As for :func:`forward`; a ValueError also when ``grad``'s shape differs from the output's.
    """
    return _vjp(name, inputs, None, grad, dps, params)


def vjp_from_output(name, inputs, output, grad, dps=None, **params):
    """:func:`vjp` given the forward's ``output`` (as ``forward`` returned it), not recomputed.

    For tapes, which keep every node's value: the backward pass then costs one VJP, not a
    forward and a VJP. The caller vouches that ``output == forward(name, inputs, dps, **params)``.
    """
    return _vjp(name, inputs, output, grad, dps, params)


def _vjp(name, inputs, output, grad, dps, params):
    op = _lookup(name)
    F = numeric_for(dps)
    merged = _params(name, op, params)
    # NOTE: exactly, a given output is not used: it was rounded to dps digits, and formulas such
    # as tanh's 1 - result^2 would cancel in it; the forward is recomputed at working precision.
    use_output = output is not None and not isinstance(F, Exact)

    def compute():
        arrays = _inputs(name, op, inputs, F)
        if use_output:
            out = F.asarray(output, f"{name}: output")
        else:
            out = np.asarray(op.forward(F, *arrays, **merged), dtype=F.dtype)
        g = F.asarray(grad, f"{name}: grad")
        optable.check_grad(name, g.shape, None, out.shape)
        finite = F.isfinite(g)
        if not finite.all():
            idx = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise ValueError(f"{name}: grad holds a non-finite value {g[idx]} at index {idx}; "
                             f"pass finite cotangents")
        grads = op.vjp(F, *arrays, out, g, **merged)
        return tuple(None if iname in op.class_index else gi
                     for iname, gi in zip(op.inputs, grads))

    result = []
    for iname, arr_shape, gi in zip(op.inputs, _input_shapes(inputs), _at_converged_precision(F, compute)):
        if gi is None:
            result.append(None)
            continue
        gi = _result(F, gi, f"{name}: VJP for {iname}")
        if gi.shape != arr_shape:  # an internal invariant: every VJP is shaped like its input
            raise AssertionError(f"{name}: VJP for {iname} has shape {gi.shape}, input {arr_shape}")
        result.append(gi)
    return tuple(result)


def _input_shapes(inputs):
    return [np.shape(x) for x in inputs]
