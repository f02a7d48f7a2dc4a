"""Checks that a program is well formed, with messages that say which op is wrong and how to fix it.

``check_program`` (run by the executor and by ``backward``): every op type is registered, its
slots are the registered ones with the right number of variables, its attributes are known and
the required ones given, recurrent ops have a step net whose links make sense.
``check_forward_dataflow`` (run by ``backward``): each variable is written once per namespace (the
program, or one step net), no op reads a variable before the op that writes it, and names do not
use the ``@`` reserved for gradient variables.
"""
from __future__ import annotations

from reflib.program.ir import NetOp, Operator, ProgramError, RnnGradOp, RnnOp, child_path, did_you_mean, leaf_ops
from reflib.program.registry import REQUIRED, differentiable_outputs, op_info

__all__ = ["check_program", "check_forward_dataflow", "describe_op"]


def describe_op(op, where):
    """``op #2 (tanh)``: how messages name an op."""
    return f"op {where} ({op.type})"


def _check_slots(op, info, where):
    for kind, given, expected in (("input", op.inputs, info.inputs), ("output", op.outputs, info.outputs)):
        for slot in given:
            if slot not in expected:
                raise ProgramError(f"{describe_op(op, where)}: unknown {kind} slot {slot!r}; "
                                   f"{did_you_mean(slot, expected)}{info.describe()}")
        for slot, (lo, hi) in expected.items():
            n = len(given.get(slot, ()))
            if n < lo or (hi is not None and n > hi):
                want = f"exactly {lo}" if lo == hi else f"at least {lo}"
                raise ProgramError(f"{describe_op(op, where)}: {kind} slot {slot!r} holds {n} "
                                   f"variable(s) but takes {want}; {info.describe()}")


def _check_attrs(op, info, where):
    for name in op.attrs:
        if name not in info.attrs:
            raise ProgramError(f"{describe_op(op, where)}: unknown attribute {name!r}; "
                               f"{did_you_mean(name, info.attrs)}{info.describe()}")
    for name, default in info.attrs.items():
        if default is REQUIRED and name not in op.attrs:
            raise ProgramError(f"{describe_op(op, where)}: attribute {name!r} is required; "
                               f"{info.describe()}")


def _check_rnn_links(op, where):
    """The step net must write every state and outlink, and never write a step input."""
    a = op.attrs
    writes = set(op.step_net.output_names())
    inputs = list(a["inlink_alias"]) + list(a["pre_memories"])
    for group, names in (("step input (inlink alias / pre memory)", inputs),
                         ("memory state", a["memories"]), ("outlink", a["outlink_alias"])):
        dup = {n for n in names if list(names).count(n) > 1}
        if dup:
            raise ProgramError(f"{describe_op(op, where)}: {group} name {sorted(dup)[0]!r} is used twice; "
                               f"give each its own step-net name")
    for name in inputs:
        if name in writes:
            raise ProgramError(f"{describe_op(op, where)}: the step net writes {name!r}, which is a step "
                               f"input; write the new value to another name")
    for group, names in (("memory state", a["memories"]), ("outlink", a["outlink_alias"])):
        for name in names:
            if name not in writes:
                raise ProgramError(f"{describe_op(op, where)}: {group} {name!r} is not written by the "
                                   f"step net; step-net outputs are {sorted(writes)} (add an identity op "
                                   f"to pass an input through)")


def _check_op(op, where):
    if not isinstance(op, Operator):
        raise TypeError(f"op {where} is a {type(op).__name__}, not an Operator")
    if isinstance(op, NetOp):
        for i, child in enumerate(op.ops):
            _check_op(child, child_path(where, i))
        return
    try:
        info = op_info(op.type)
    except ProgramError as e:
        raise ProgramError(f"op {where}: {e}") from None
    if info.kind == "recurrent" and not isinstance(op, RnnOp):
        raise ProgramError(f"{describe_op(op, where)}: recurrent op has no step net; build it with "
                           f"RnnOp(step_net=NetOp([...]), inlinks=..., outlinks=...)")
    if info.kind == "recurrent_grad" and (not isinstance(op, RnnGradOp) or op.step_net is None):
        raise ProgramError(f"{describe_op(op, where)}: recurrent_grad op has no backward step net; "
                           f"build it with backward(program)")
    _check_slots(op, info, where)
    _check_attrs(op, info, where)
    if isinstance(op, RnnOp):
        _check_rnn_links(op, where)
    if isinstance(op, (RnnOp, RnnGradOp)):
        _check_op(op.step_net, f"{where} step net #")


def check_program(program):
    """Raise ProgramError (TypeError for non-ops) unless ``program`` is structurally well formed.

    Parameters
    ----------
    program : Operator
        A single op or a NetOp (nested nets, recurrent ops and their step nets are checked too).
    """
    _check_op(program, "#" if isinstance(program, NetOp) else "#0")


def _check_namespace(program, prefix):
    """Single assignment and read-after-write over the ops of one namespace, in run order."""
    ops = list(leaf_ops(program, prefix))
    writer = {}
    for i, (where, op) in enumerate(ops):
        for v in op.output_names():
            if v in writer:
                raise ProgramError(f"variable {v!r} is written twice, by {describe_op(writer[v][1], writer[v][2])} "
                                   f"and by {describe_op(op, where)}; backward programs need each "
                                   f"variable written once: give the second value a new name")
            writer[v] = (i, op, where)
        for v in differentiable_outputs(op):
            if "@" in v:
                raise ProgramError(f"variable {v!r} written by {describe_op(op, where)} uses '@', which "
                                   f"is reserved for gradient names (x@GRAD); rename it")
    for i, (where, op) in enumerate(ops):
        for v in op.input_names():
            if v in writer and writer[v][0] >= i:
                who = ("it writes it itself" if writer[v][0] == i else
                       f"{describe_op(writer[v][1], writer[v][2])} writes it later")
                raise ProgramError(f"variable {v!r} is read by {describe_op(op, where)} before it is "
                                   f"written ({who}); reorder the ops so that a variable is written "
                                   f"before it is read")
            if "@" in v and v not in writer:
                raise ProgramError(f"variable {v!r} read by {describe_op(op, where)} uses '@', which is "
                                   f"reserved for gradient names (x@GRAD); rename it")
        if isinstance(op, RnnOp):
            _check_namespace(op.step_net, f"{where} step net #")


def check_forward_dataflow(program):
    """Raise ProgramError unless ``program`` can be differentiated by name (see module docstring)."""
    _check_namespace(program, "#")
