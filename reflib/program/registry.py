"""The op registry: one registration per op type gives the op and its gradient op (REGISTER_OP).

Paddle registers ``REGISTER_OP(mul, MulOp, MulOpMaker, mul_grad, MulOpGrad)``: the op's slots and
attributes, and the type of its backward op. Here ``register_op(OpInfo(...))`` does the same and
derives the gradient op's own entry, so each op type is declared exactly once.

The long story: docs/reflib.md, section ``reflib/program/registry.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from reflib._ops_common import REQUIRED
from reflib.program.ir import GRAD_SUFFIX, Operator, ProgramError, RnnGradOp, did_you_mean, grad_var_name

__all__ = ["OpInfo", "REGISTRY", "ONE", "MANY", "ANY", "ZERO_GRAD", "REQUIRED", "register_op", "op_info",
           "registered_types", "make_grad_op", "differentiable_inputs", "differentiable_outputs"]

# Slot arities: how many variables a slot holds (min, max); None means no upper bound.
ONE = (1, 1)
MANY = (1, None)
ANY = (0, None)

ZERO_GRAD = "@ZERO_GRAD@"
"""``OpInfo.grad`` for an op whose output does not depend on its inputs' values (its backward is a NOP)."""

_BINARY_SLOTS = ("X", "Y")


@dataclass(frozen=True)
class OpInfo:
    """One registered op type.

    Attributes
    ----------
    type : str
        The op type.
    kind : str
        How the executor runs it: ``forward`` (``reflib.forward``), ``vjp`` (``reflib.vjp``),
        ``fill_zeros_like``, ``nop``, ``recurrent`` or ``recurrent_grad``.
    inputs, outputs : mapping of slot name to (min, max) arity
        The slots, in order.
    attrs : mapping
        Attribute defaults; ``REQUIRED`` marks one with no default.
    nd_inputs, nd_outputs : frozenset of str
        Slots that carry no gradient (class indices, step scopes).
    grad : str or None
        The gradient op's type; ``ZERO_GRAD`` when the output is constant in the inputs; None
        when the op cannot be differentiated (gradient ops: second order is not supported).
    grad_reads_outputs : tuple of str
        Forward output slots the gradient op reads besides the output gradients.
    grad_maker : callable or None
        ``grad_maker(op, grad_type, inputs, outputs) -> Operator`` builds the gradient op from
        the standard slots (Paddle's GradOpMaker); None builds a plain ``Operator``.
    ref : str or None
        The ``reflib.ops`` name the ``forward`` / ``vjp`` kinds evaluate.
    input_names : tuple of str
        What each input slot is, for messages (``("pred", "target")``).
    """

    type: str
    kind: str
    inputs: dict
    outputs: dict
    attrs: dict = field(default_factory=dict)
    nd_inputs: frozenset = frozenset()
    nd_outputs: frozenset = frozenset()
    grad: str | None = None
    grad_reads_outputs: tuple = ()
    grad_maker: object = None
    ref: str | None = None
    input_names: tuple = ()

    def describe(self):
        """``tanh: inputs X (x); outputs Out; attrs none``, for error messages."""
        names = dict(zip(self.inputs, self.input_names))
        ins = ", ".join(f"{s} ({names[s]})" if s in names else s for s in self.inputs) or "none"
        outs = ", ".join(self.outputs) or "none"
        attrs = ", ".join(f"{k}={'<required>' if v is REQUIRED else repr(v)}"
                          for k, v in self.attrs.items()) or "none"
        return f"{self.type}: input slots {ins}; output slots {outs}; attrs {attrs}"


_REGISTRY: dict[str, OpInfo] = {}


def _add(info):
    if info.type in _REGISTRY:
        raise ValueError(f"op type {info.type!r} is registered twice; each op type has one registration")
    _REGISTRY[info.type] = info


def register_op(info):
    """Register an op type and, when it has one, the gradient op its registration names.

    The gradient op's slots follow Paddle's BuildGradOp: it reads the forward inputs, the
    forward outputs named in ``grad_reads_outputs`` and the gradients of the differentiable
    outputs (slot ``Out@GRAD``), and writes the gradients of the differentiable inputs (slot
    ``X@GRAD``). Its attributes are the forward op's.
    """
    _add(info)
    if info.grad in (None, ZERO_GRAD):
        return info
    grad_inputs = dict(info.inputs)
    grad_inputs.update({s: info.outputs[s] for s in info.grad_reads_outputs})
    grad_inputs.update({s + GRAD_SUFFIX: a for s, a in info.outputs.items() if s not in info.nd_outputs})
    grad_outputs = {s + GRAD_SUFFIX: a for s, a in info.inputs.items() if s not in info.nd_inputs}
    kind = {"forward": "vjp", "recurrent": "recurrent_grad"}[info.kind]
    _add(OpInfo(info.grad, kind, grad_inputs, grad_outputs, dict(info.attrs),
                nd_inputs=frozenset(grad_inputs) - {s + GRAD_SUFFIX for s in info.outputs},
                ref=info.ref, input_names=info.input_names))
    return info


def registered_types():
    """Every registered op type, sorted."""
    return sorted(_REGISTRY)


def op_info(op_type):
    """The registration of ``op_type``; a ProgramError listing close names when there is none."""
    info = _REGISTRY.get(op_type) if isinstance(op_type, str) else None
    if info is None:
        if op_type == "net":
            raise ProgramError("op type 'net' is built with NetOp([...]), not Operator('net', ...)")
        hint = did_you_mean(op_type, _REGISTRY, n=3)
        raise ProgramError(f"unknown op type {op_type!r}; {hint}registered types: "
                           f"{', '.join(t for t in sorted(_REGISTRY) if not t.endswith('_grad'))} "
                           f"(and their '<type>_grad' ops)")
    return info


def differentiable_inputs(op):
    """The variables ``op`` reads through slots that carry a gradient (nets: external reads)."""
    if op.type == "net":
        seen = []
        written = set()
        for child in op.children():
            seen.extend(v for v in differentiable_inputs(child) if v not in written and v not in seen)
            written.update(child.output_names())
        return seen
    info = op_info(op.type)
    return [v for s, names in op.inputs.items() if s not in info.nd_inputs for v in names]


def differentiable_outputs(op):
    """The variables ``op`` writes through slots that carry a gradient (nets: all such writes)."""
    if op.type == "net":
        out = []
        for child in op.children():
            out.extend(v for v in differentiable_outputs(child) if v not in out)
        return out
    info = op_info(op.type)
    return [v for s, names in op.outputs.items() if s not in info.nd_outputs for v in names]


def make_grad_op(op):
    """Build ``op``'s gradient op (Paddle's BuildGradOp) with the standard ``@GRAD`` names.

    The registration's ``grad_maker`` turns the slots into the op. For a ``recurrent`` op the
    result is an ``RnnGradOp`` without a step net: ``backward`` attaches the backward of the
    forward step net.
    """
    info = op_info(op.type)
    if info.grad is None or info.grad == ZERO_GRAD:
        raise ProgramError(f"op type {op.type!r} has no gradient op (second-order gradients are "
                           f"not supported); differentiate the forward program instead")
    inputs = {s: op.inputs.get(s, ()) for s in info.inputs}
    inputs.update({s: op.outputs[s] for s in info.grad_reads_outputs})
    inputs.update({s + GRAD_SUFFIX: [grad_var_name(v) for v in op.outputs.get(s, ())]
                   for s in info.outputs if s not in info.nd_outputs})
    outputs = {s + GRAD_SUFFIX: [grad_var_name(v) for v in op.inputs.get(s, ())]
               for s in info.inputs if s not in info.nd_inputs}
    return (info.grad_maker or _plain_grad_op)(op, info.grad, inputs, outputs)


def _plain_grad_op(op, grad_type, inputs, outputs):
    return Operator(grad_type, inputs, outputs, op.attrs)


def _recurrent_grad_op(op, grad_type, inputs, outputs):
    return RnnGradOp(inputs, outputs, op.attrs)


def _register_reference_ops():
    from reflib.ops import OPS

    for name, d in OPS.items():
        slots = _BINARY_SLOTS[: len(d.inputs)]
        arity = {s: ONE for s in slots}
        if name == "sum":
            # NOTE: Paddle's sum-of-gradients and the registry reduction share the type "sum":
            # X holds one or more variables, added left to right, then reduced over `axis`.
            arity["X"] = MANY
        nd = frozenset(s for s, n in zip(slots, d.inputs) if n in d.class_index)
        register_op(OpInfo(name, "forward", arity, {"Out": ONE}, dict(d.params), nd_inputs=nd,
                           grad=name + "_grad", ref=name, input_names=tuple(d.inputs)))


def _register_structural_ops():
    register_op(OpInfo("fill_zeros_like", "fill_zeros_like", {"X": ONE}, {"Out": ONE},
                       grad=ZERO_GRAD, input_names=("x",)))
    register_op(OpInfo("nop", "nop", {}, {}, grad=ZERO_GRAD))
    register_op(OpInfo(
        "recurrent", "recurrent", {"X": MANY, "Boot": ANY, "Params": ANY},
        {"Out": MANY, "StepScopes": ONE},
        {k: REQUIRED for k in ("inlink_alias", "outlink_alias", "pre_memories", "memories", "axis")},
        nd_outputs=frozenset({"StepScopes"}), grad="recurrent_grad",
        grad_reads_outputs=("StepScopes",), grad_maker=_recurrent_grad_op,
        input_names=("sequences", "initial states", "parameters")))


_register_reference_ops()
_register_structural_ops()
REGISTRY = MappingProxyType(_REGISTRY)
