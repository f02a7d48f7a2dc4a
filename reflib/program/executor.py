"""Runs forward and backward programs on a scope (a dict of variables), in float64 or exact.

Registry ops and their gradient ops are evaluated by ``reflib.forward`` / ``reflib.vjp`` (no
second set of kernels here); the executor itself only adds (``sum`` of several variables),
fills zeros, slices and stacks sequences, all at the precision of ``dps``.

A recurrent op runs its step net once per step in a fresh step scope that sees the outer scope
(``ChainMap``), and keeps the step scopes in its ``StepScopes`` output; its gradient op runs the
backward step net from the last step to the first in scopes that see those step scopes.
"""
from __future__ import annotations

from collections import ChainMap
from collections.abc import MutableMapping

import numpy as np

from reflib.numeric import check_dps, numeric_for
from reflib.ops import forward as ref_forward
from reflib.ops import vjp as ref_vjp
from reflib.program.ir import EMPTY_VAR, GRAD_SUFFIX, NetOp, ProgramError, child_path, grad_var_name
from reflib.program.registry import op_info
from reflib.program.validate import check_program, describe_op

__all__ = ["run", "Executor"]


def run(program, scope=None, dps=None):
    """Run ``program`` on ``scope`` and return the scope, holding every variable written.

    Parameters
    ----------
    program : Operator
        A forward or backward program (a NetOp, or a single op).
    scope : dict, optional
        Variable name -> array: the feeds (inputs, parameters, gradient seeds such as
        ``loss@GRAD``) and, for a backward program, the variables of the forward run. Updated in
        place.
    dps : int or None
        None computes in float64; an int computes exactly with ``mpmath.mpf`` at that many
        decimal digits (values become object arrays of mpf). A numeric object
        (``reflib.running_error.RunningError``) is used as is: the values come back with their
        running error bounds.

    Returns
    -------
    dict
        ``scope``.

    Raises
    ------
    ProgramError
        For a malformed program, or a variable read before anything writes it (not in the scope).
    ValueError, TypeError
        From an op given bad values (shapes, domains, dtypes); the message names the op.
    """
    check_program(program)
    F = numeric_for(dps)  # validates an int dps; a numeric object passes through
    if scope is None:
        scope = {}
    if not isinstance(scope, MutableMapping):
        raise TypeError(f"scope must be a dict of variable name -> array; got {type(scope).__name__}")
    _run(program, scope, F, "#" if isinstance(program, NetOp) else "#0")
    return scope


class Executor:
    """Paddle's handle on ``run``: ``Executor(dps=50).run(program, scope)``.

    Parameters
    ----------
    dps : int or None
        None: float64; an int: exact mpmath arithmetic at that many digits.
    """

    def __init__(self, dps=None):
        self.dps = check_dps(dps)

    def run(self, program, scope=None):
        """``run(program, scope, dps=self.dps)``; returns the scope."""
        return run(program, scope, dps=self.dps)


def _run(op, scope, F, where):
    if isinstance(op, NetOp):
        for i, child in enumerate(op.ops):
            _run(child, scope, F, child_path(where, i))
        return
    _KINDS[op_info(op.type).kind](op, scope, F, where)


def _read(scope, name, op, where, slot):
    try:
        return scope[name]
    except KeyError:
        hint = (f"put the seed {name!r} in the scope (e.g. ones shaped like "
                f"{name[: -len(GRAD_SUFFIX)]!r})" if name.endswith(GRAD_SUFFIX) else
                "feed it in the scope, or run the op that writes it first")
        raise ProgramError(f"{describe_op(op, where)} reads variable {name!r} (slot {slot}) before it "
                           f"is written: {hint}") from None


def _reads(scope, op, slot, where):
    return [_read(scope, v, op, where, slot) for v in op.inputs.get(slot, ())]


def _write(scope, name, value):
    if name != EMPTY_VAR:
        scope[name] = value


def _call(fn, op, where, *args, **kwargs):
    """Call a reflib op; its ValueError / TypeError gets the op's location in front."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError) as e:
        cls = TypeError if isinstance(e, TypeError) else ValueError
        raise cls(f"{describe_op(op, where)}: {e}") from e


def _add_all(values, F):
    """values[0] + values[1] + ... at the working precision."""
    # NOTE: summation order is left to right, the order the gradient producers ran in.
    with F.context():
        total = F.asarray(values[0], "sum input")
        for v in values[1:]:
            total = total + F.asarray(v, "sum input")
    return total


def _summed_input(op, scope, F, where):
    values = _reads(scope, op, "X", where)
    shapes = {np.shape(v) for v in values}
    if len(shapes) > 1:
        raise ValueError(f"{describe_op(op, where)}: adds variables of different shapes "
                         f"{[np.shape(v) for v in values]}; they must have one shape")
    return values[0] if len(values) == 1 else _add_all(values, F)


def _run_forward(op, scope, F, where):
    info = op_info(op.type)
    if info.ref == "sum":
        inputs = [_summed_input(op, scope, F, where)]
    else:
        inputs = [_read(scope, op.inputs[s][0], op, where, s) for s in info.inputs]
    out = _call(ref_forward, op, where, info.ref, inputs, dps=F.dps, **op.attrs)
    _write(scope, op.outputs["Out"][0], out)


def _run_vjp(op, scope, F, where):
    info = op_info(op.type)
    forward_slots = list(op_info(info.ref).inputs)
    if info.ref == "sum":
        inputs = [_summed_input(op, scope, F, where)]
    else:
        inputs = [_read(scope, op.inputs[s][0], op, where, s) for s in forward_slots]
    out_grad = "Out" + GRAD_SUFFIX
    g = _read(scope, op.inputs[out_grad][0], op, where, out_grad)
    grads = _call(ref_vjp, op, where, info.ref, inputs, g, dps=F.dps, **op.attrs)
    if info.ref == "sum":  # each added variable gets the gradient of their sum
        targets = [(name, np.array(grads[0], copy=True)) for name in op.outputs["X" + GRAD_SUFFIX]]
    else:
        targets = [(op.outputs[s + GRAD_SUFFIX][0], gi) for s, gi in zip(forward_slots, grads)
                   if s + GRAD_SUFFIX in op.outputs and gi is not None]
    for name, gi in targets:
        _write(scope, name, gi)


def _run_fill_zeros_like(op, scope, F, where):
    x = _read(scope, op.inputs["X"][0], op, where, "X")
    with F.context():
        _write(scope, op.outputs["Out"][0], F.zeros(np.shape(x)))


def _run_nop(op, scope, F, where):
    return None


def _sequence_length(op, seqs, axis, where):
    lengths = set()
    for name, s in zip(op.inputs["X"], seqs):
        if not -np.ndim(s) <= axis < np.ndim(s):
            raise ValueError(f"{describe_op(op, where)}: sequence {name!r} of shape {np.shape(s)} has no "
                             f"axis {axis}; pass sequences with the time axis at axis={axis}")
        lengths.add(np.shape(s)[axis])
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"{describe_op(op, where)}: sequences {list(op.inputs['X'])} have lengths "
                         f"{[np.shape(s)[axis] for s in seqs]} along axis {axis}; give them one "
                         f"length >= 1")
    return lengths.pop()


def _run_recurrent(op, scope, F, where):
    a = op.attrs
    axis = a["axis"]
    seqs = _reads(scope, op, "X", where)
    steps = _sequence_length(op, seqs, axis, where)
    prev = dict(zip(a["pre_memories"], _reads(scope, op, "Boot", where)))
    step_scopes, stacked = [], {alias: [] for alias in a["outlink_alias"]}
    for t in range(steps):
        local = {alias: np.take(s, t, axis=axis) for alias, s in zip(a["inlink_alias"], seqs)}
        local.update(prev)
        _run(op.step_net, ChainMap(local, scope), F, f"{where} step {t} net #")
        for pre, state in zip(a["pre_memories"], a["memories"]):
            if np.shape(local[state]) != np.shape(prev[pre]):
                raise ValueError(f"{describe_op(op, where)}: memory state {state!r} has shape "
                                 f"{np.shape(local[state])} at step {t} but {pre!r} had "
                                 f"{np.shape(prev[pre])}; a state keeps its boot's shape")
            prev[pre] = local[state]
        for alias in a["outlink_alias"]:
            stacked[alias].append(local[alias])
        step_scopes.append(local)
    for alias, name in zip(a["outlink_alias"], op.outputs["Out"]):
        _write(scope, name, np.stack(stacked[alias], axis=axis))
    _write(scope, op.outputs["StepScopes"][0], step_scopes)


def _zeros_like(value, F):
    with F.context():
        return F.zeros(np.shape(value))


def _run_recurrent_grad(op, scope, F, where):
    a = op.attrs
    axis = a["axis"]
    step_scopes = _read(scope, op.inputs["StepScopes"][0], op, where, "StepScopes")
    if not isinstance(step_scopes, list):
        raise ProgramError(f"{describe_op(op, where)}: {op.inputs['StepScopes'][0]!r} does not hold the "
                           f"step scopes of a recurrent op; run the forward program first")
    out_grads = _reads(scope, op, "Out@GRAD", where)
    params = op.inputs["Params"]
    carried = {state: None for state in a["memories"]}
    seq_grads = [[None] * len(step_scopes) for _ in a["inlink_alias"]]
    param_grads = [None] * len(params)
    for t in range(len(step_scopes) - 1, -1, -1):
        fwd = step_scopes[t]
        local = {grad_var_name(alias): np.take(g, t, axis=axis)
                 for alias, g in zip(a["outlink_alias"], out_grads)}
        for state in a["memories"]:
            name = grad_var_name(state)
            back = _zeros_like(fwd[state], F) if carried[state] is None else carried[state]
            # NOTE: a state that is also an outlink gets (outlink slice) + (carried from t+1).
            local[name] = _add_all([local[name], back], F) if name in local else back
        _run(op.step_net, ChainMap(local, fwd, scope), F, f"{where} step {t} backward net #")
        for pre, state in zip(a["pre_memories"], a["memories"]):
            carried[state] = local.get(grad_var_name(pre))
        for i, alias in enumerate(a["inlink_alias"]):
            seq_grads[i][t] = local.get(grad_var_name(alias))
        for k, p in enumerate(params):
            g = local.get(grad_var_name(p))
            if g is not None:
                # NOTE: parameter gradients are folded from the last step to the first.
                param_grads[k] = g if param_grads[k] is None else _add_all([param_grads[k], g], F)

    seqs = _reads(scope, op, "X", where)
    for i, name in enumerate(op.outputs["X@GRAD"]):
        if name != EMPTY_VAR:
            per_step = [_zeros_like(np.take(seqs[i], t, axis=axis), F) if g is None else g
                        for t, g in enumerate(seq_grads[i])]
            _write(scope, name, np.stack(per_step, axis=axis))
    boots = _reads(scope, op, "Boot", where)
    for name, state, boot in zip(op.outputs["Boot@GRAD"], a["memories"], boots):
        _write(scope, name, _zeros_like(boot, F) if carried[state] is None else carried[state])
    for name, p, g in zip(op.outputs["Params@GRAD"], params, param_grads):
        _write(scope, name, _zeros_like(_read(scope, p, op, where, "Params"), F) if g is None else g)


_KINDS = {
    "forward": _run_forward,
    "vjp": _run_vjp,
    "fill_zeros_like": _run_fill_zeros_like,
    "nop": _run_nop,
    "recurrent": _run_recurrent,
    "recurrent_grad": _run_recurrent_grad,
}
