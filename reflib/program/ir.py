"""The static program IR, as PaddlePaddle's framework has it (docs/semantics.md).

An *operator* has a type, named input and output *slots* each holding a list of variable names,
and attributes: ``Operator("matmul", {"X": ["x"], "Y": ["w"]}, {"Out": ["h"]})``. Two operators
hold others: ``NetOp`` runs a list of ops in order (a net is itself an op, so nets nest), and
``RnnOp`` runs a *step net* once per time step, slicing its sequence inputs along an axis,
carrying memories (states) from one step to the next and stacking its outputs.

The long story: docs/reflib.md, section ``reflib/program/ir.py``.
"""
from __future__ import annotations

import builtins
import difflib
from collections.abc import Mapping, Sequence

__all__ = [
    "GRAD_SUFFIX", "ZERO_SUFFIX", "RENAME_INFIX", "EMPTY_VAR", "ProgramError", "did_you_mean",
    "grad_var_name", "is_grad_var", "forward_var_name", "Operator", "NetOp", "Memory", "RnnOp",
    "RnnGradOp", "NOP", "leaf_ops", "child_path",
]

GRAD_SUFFIX = "@GRAD"
ZERO_SUFFIX = "@ZERO"
RENAME_INFIX = "@RENAME@"
EMPTY_VAR = "@EMPTY@"


class ProgramError(ValueError):
    """A malformed program: unknown op type, wrong slots or attributes, bad data flow."""


def did_you_mean(word, choices, n=1):
    """``"did you mean 'X'? "`` for the closest of ``choices`` (case-insensitive), else ``""``."""
    by_lower = {}
    for c in choices:
        by_lower.setdefault(str(c).lower(), c)
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=n, cutoff=0.5)
    return f"did you mean {', '.join(repr(by_lower[c]) for c in close)}? " if close else ""


def grad_var_name(name):
    """The name of the gradient variable of ``name`` (Paddle's ``GradVarName``): ``x`` -> ``x@GRAD``."""
    return name + GRAD_SUFFIX


def is_grad_var(name):
    """True for a final gradient name (``x@GRAD``); renamed partials and ``@ZERO`` names are not."""
    return name.endswith(GRAD_SUFFIX)


def forward_var_name(grad_name):
    """``x@GRAD`` -> ``x``."""
    if not is_grad_var(grad_name):
        raise ProgramError(f"{grad_name!r} is not a gradient variable name (it must end in {GRAD_SUFFIX})")
    return grad_name[: -len(GRAD_SUFFIX)]


def _var_list(value, where):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, (bytes, bytearray)):
        raise TypeError(f"{where} must be a variable name or a list of names; got "
                        f"{type(value).__name__}")
    names = tuple(value)
    for n in names:
        if not isinstance(n, str) or not n:
            raise TypeError(f"{where} holds {n!r}; variable names are non-empty strings")
    return names


def _slot_map(mapping, what, op_type):
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{op_type}: {what} must be a dict slot -> variable names, e.g. "
                        f"{{'X': ['x']}}; got {type(mapping).__name__}")
    slots = {}
    for slot, value in mapping.items():
        if not isinstance(slot, str) or not slot:
            raise TypeError(f"{op_type}: {what} slot names are non-empty strings; got {slot!r}")
        slots[slot] = _var_list(value, f"{op_type}: {what} slot {slot!r}")
    return slots


def _renamed_slots(slots, old, new):
    return {s: tuple(new if v == old else v for v in names) for s, names in slots.items()}


def _flat(slots):
    return [v for names in slots.values() for v in names]


class Operator:
    """One operation of a program: ``type``, input slots, output slots, attributes.

    Parameters
    ----------
    type : str
        The registered op type (``"tanh"``, ``"matmul"``, ``"sum"``, ``"tanh_grad"``, ...).
    inputs, outputs : dict of str to (str or list of str)
        Slot name -> variable name(s). Registry ops read slots ``X`` (and ``Y``) and write ``Out``.
    attrs : dict, optional
        The op's parameters (``axis``, ``keepdims``, ``eps``, ...).

    Examples
    --------
    >>> op = Operator("matmul", {"X": ["x"], "Y": ["w"]}, {"Out": ["h"]})
    >>> op.input_names(), op.output_names()
    (['x', 'w'], ['h'])
    """

    __slots__ = ("type", "inputs", "outputs", "attrs")

    def __init__(self, type, inputs=None, outputs=None, attrs=None):
        if not isinstance(type, str) or not type:
            raise TypeError(f"an op type is a non-empty string such as 'tanh'; got {type!r}")
        if attrs is not None and not isinstance(attrs, Mapping):
            raise TypeError(f"{type}: attrs must be a dict of parameters; got "
                            f"{builtins.type(attrs).__name__}")
        self.type = type
        self.inputs = _slot_map(inputs, "inputs", type)
        self.outputs = _slot_map(outputs, "outputs", type)
        self.attrs = dict(attrs or {})

    # -- reading -------------------------------------------------------------------------

    def input_names(self):
        """Every variable read, slot by slot (a name read twice appears twice)."""
        return _flat(self.inputs)

    def output_names(self):
        """Every variable written, slot by slot."""
        return _flat(self.outputs)

    def children(self):
        """Ops held inside this one that run in the same scope (a net's ops); none for an op."""
        return ()

    # -- rewriting -----------------------------------------------------------------------

    def with_slots(self, inputs=None, outputs=None):
        """A copy with some slots replaced (``{slot: names}``); other slots are kept."""
        return self._rebuild({**self.inputs, **(inputs or {})}, {**self.outputs, **(outputs or {})})

    def renamed(self, old, new):
        """A copy with every occurrence of variable ``old`` replaced by ``new`` (Paddle's Rename)."""
        return self._rebuild(_renamed_slots(self.inputs, old, new), _renamed_slots(self.outputs, old, new))

    def _rebuild(self, inputs, outputs):
        return Operator(self.type, inputs, outputs, self.attrs)

    # -- comparing and printing ----------------------------------------------------------

    def _key(self):
        return (type(self).__name__, self.type, _freeze(self.inputs), _freeze(self.outputs), _freeze(self.attrs))

    def __eq__(self, other):
        return isinstance(other, Operator) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return self.to_text()

    def to_text(self, indent=0):
        """A readable one-line form: ``matmul(X=[x], Y=[w]) -> Out=[h] {attrs}``."""
        def slots(s):
            return ", ".join(f"{k}=[{', '.join(v)}]" for k, v in s.items())
        attrs = f" {self.attrs}" if self.attrs else ""
        return f"{' ' * indent}{self.type}({slots(self.inputs)}) -> {slots(self.outputs)}{attrs}"


def _freeze(value):
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


NOP = Operator("nop")
"""The op that does nothing; the backward of an op none of whose gradients are wanted."""


class NetOp(Operator):
    """A list of ops run in order on one scope; itself an op, so nets nest (Paddle's NetOp).

    Its inputs are the variables its ops read before any of them writes them (slot ``X``); its
    outputs are every variable its ops write (slot ``Out``), as Paddle's ``CompleteAddOp``.
    """

    __slots__ = ("ops",)

    def __init__(self, ops):
        if isinstance(ops, Operator) or not isinstance(ops, Sequence):
            raise TypeError(f"NetOp takes a list of ops, e.g. NetOp([op1, op2]); got "
                            f"{type(ops).__name__}")
        for i, op in enumerate(ops):
            if not isinstance(op, Operator):
                raise TypeError(f"NetOp: item {i} is a {type(op).__name__}, not an Operator")
        self.ops = tuple(ops)
        reads, writes = [], []
        for op in self.ops:
            reads.extend(v for v in op.input_names() if v not in writes and v not in reads)
            writes.extend(v for v in op.output_names() if v not in writes)
        super().__init__("net", {"X": reads}, {"Out": writes})

    def children(self):
        return self.ops

    def renamed(self, old, new):
        return NetOp([op.renamed(old, new) for op in self.ops])

    def with_slots(self, inputs=None, outputs=None):
        raise ProgramError("a net's slots are derived from its ops; rename variables instead")

    def _key(self):
        return ("NetOp", tuple(op._key() for op in self.ops))

    def to_text(self, indent=0):
        lines = [f"{' ' * indent}net {{"]
        lines += [op.to_text(indent + 2) for op in self.ops]
        lines.append(f"{' ' * indent}}}")
        return "\n".join(lines)


class Memory:
    """A recurrent state: the step net reads ``pre`` (the previous state) and writes ``state``.

    At step 0 ``pre`` holds the outer variable ``boot``; at step t > 0 it holds step t-1's
    ``state``.
    """

    __slots__ = ("pre", "state", "boot")

    def __init__(self, pre, state, boot):
        for what, v in (("pre", pre), ("state", state), ("boot", boot)):
            if not isinstance(v, str) or not v:
                raise TypeError(f"Memory: {what} is a variable name; got {v!r}")
        self.pre, self.state, self.boot = pre, state, boot

    def __repr__(self):
        return f"Memory(pre={self.pre!r}, state={self.state!r}, boot={self.boot!r})"


def _pairs(mapping, what):
    if not isinstance(mapping, Mapping) or not mapping:
        raise ProgramError(f"RnnOp: {what} must be a non-empty dict, e.g. {{'xs': 'x_t'}}; got {mapping!r}")
    for k, v in mapping.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or not v:
            raise TypeError(f"RnnOp: {what} maps variable names to variable names; got {k!r}: {v!r}")
    return list(mapping.items())


def _memories(memories):
    out = []
    for m in memories:
        if isinstance(m, Memory):
            out.append(m)
        elif isinstance(m, Sequence) and not isinstance(m, str) and len(m) == 3:
            out.append(Memory(*m))
        else:
            raise TypeError(f"RnnOp: a memory is Memory(pre, state, boot) or a (pre, state, boot) "
                            f"tuple; got {m!r}")
    return out


class RnnOp(Operator):
    """A recurrent op with a step net (Paddle's RecurrentOp).

    Parameters
    ----------
    step_net : NetOp
        The ops of one time step. They read the step inputs, the previous states and any outer
        variable (a parameter such as a weight), and write the states and step outputs. Step-net
        variables live in a per-step scope; outer variables are visible through it.
    inlinks : dict of str to str
        Outer sequence variable -> the step-net name of its slice. Each sequence is sliced
        along ``axis``; all must have the same length T >= 1.
    outlinks : dict of str to str
        Step-net variable -> the outer variable its T values are stacked into along ``axis``.
    memories : sequence of Memory or (pre, state, boot) tuples
        The states carried from one step to the next.
    axis : int
        The sequence axis (0: time major).
    step_scopes : str, optional
        The outer variable that keeps the step scopes for the backward pass
        (default ``<first outlink>@STEP_SCOPES``).

    Slots: inputs ``X`` (sequences), ``Boot`` (initial states), ``Params`` (outer variables the
    step net reads, found automatically); outputs ``Out`` (stacked) and ``StepScopes``.
    """

    __slots__ = ("step_net",)

    def __init__(self, step_net, inlinks, outlinks, memories=(), axis=0, step_scopes=None):
        if step_net is None:
            raise ProgramError("recurrent op has no step net: pass step_net=NetOp([...]) holding "
                               "the ops of one time step")
        if not isinstance(step_net, NetOp):
            raise TypeError(f"RnnOp: step_net must be a NetOp; got {type(step_net).__name__} "
                            f"(wrap a single op: NetOp([op]))")
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(f"RnnOp: axis must be an int; got {axis!r}")
        ins, outs, mems = _pairs(inlinks, "inlinks"), _pairs(outlinks, "outlinks"), _memories(memories)
        if step_scopes is None:
            step_scopes = outs[0][1] + "@STEP_SCOPES"
        local = {a for _, a in ins} | {m.pre for m in mems}
        params = [v for v in step_net.input_names() if v not in local]
        self.step_net = step_net
        super().__init__(
            "recurrent",
            {"X": [o for o, _ in ins], "Boot": [m.boot for m in mems], "Params": params},
            {"Out": [o for _, o in outs], "StepScopes": [step_scopes]},
            {"inlink_alias": tuple(a for _, a in ins), "outlink_alias": tuple(a for a, _ in outs),
             "pre_memories": tuple(m.pre for m in mems), "memories": tuple(m.state for m in mems),
             "axis": axis})

    @property
    def memories(self):
        """The memories as ``Memory`` records (boot names as currently in slot ``Boot``)."""
        a = self.attrs
        return [Memory(p, s, b) for p, s, b in zip(a["pre_memories"], a["memories"], self.inputs["Boot"])]

    def renamed(self, old, new):
        # Params are outer variables the step net reads by the same name: rename them inside too.
        step = self.step_net.renamed(old, new) if old in self.inputs["Params"] else self.step_net
        a = self.attrs
        rn = _renamed_slots(self.inputs, old, new)
        out = _renamed_slots(self.outputs, old, new)
        return RnnOp(step, dict(zip(rn["X"], a["inlink_alias"])), dict(zip(a["outlink_alias"], out["Out"])),
                     [Memory(p, s, b) for p, s, b in zip(a["pre_memories"], a["memories"], rn["Boot"])],
                     a["axis"], out["StepScopes"][0])

    def with_slots(self, inputs=None, outputs=None):
        raise ProgramError("a recurrent op's slots come from its links; build a new RnnOp instead")

    def _key(self):
        return ("RnnOp",) + super()._key()[1:] + (self.step_net._key(),)

    def to_text(self, indent=0):
        head = super().to_text(indent)
        return head + " step_net:\n" + self.step_net.to_text(indent + 4)


class RnnGradOp(Operator):
    """The gradient of an RnnOp: runs the backward step net from step T-1 down to 0.

    Inputs ``X``, ``Boot``, ``Params``, ``StepScopes`` (the forward's) and ``Out@GRAD``; outputs
    ``X@GRAD``, ``Boot@GRAD``, ``Params@GRAD``. Attributes name the step-net variables, so that
    renaming outer variables never touches the step namespace. ``step_net`` is the backward of
    the forward step net (built by ``backward``).
    """

    __slots__ = ("step_net",)

    def __init__(self, inputs, outputs, attrs, step_net=None):
        if step_net is not None and not isinstance(step_net, Operator):
            raise TypeError(f"RnnGradOp: step_net must be an op; got {type(step_net).__name__}")
        self.step_net = step_net
        super().__init__("recurrent_grad", inputs, outputs, attrs)

    def with_step_net(self, step_net):
        """A copy whose backward step net is ``step_net``."""
        return RnnGradOp(self.inputs, self.outputs, self.attrs, step_net)

    def _rebuild(self, inputs, outputs):
        return RnnGradOp(inputs, outputs, self.attrs, self.step_net)

    def renamed(self, old, new):
        op = super().renamed(old, new)
        if old in self.inputs.get("Params", ()) and self.step_net is not None:
            op = op.with_step_net(self.step_net.renamed(old, new))
        return op

    def _key(self):
        step = None if self.step_net is None else self.step_net._key()
        return ("RnnGradOp",) + super()._key()[1:] + (step,)

    def to_text(self, indent=0):
        head = super().to_text(indent)
        if self.step_net is None:
            return head + " step_net: None"
        return head + " step_net:\n" + self.step_net.to_text(indent + 4)


def leaf_ops(program, where="#"):
    """``(path, op)`` for the ops a program runs, in order, nets flattened (step nets not entered).

    Paths name an op by its index in each enclosing net: ``#2``, ``#1.0`` (op 0 of the net that
    is op 1); a program that is a single op is ``#0``.
    """
    if isinstance(program, NetOp):
        for i, op in enumerate(program.ops):
            yield from leaf_ops(op, child_path(where, i))
    else:
        yield (child_path(where, 0) if where.endswith("#") else where), program


def child_path(where, i):
    """The path of op ``i`` inside the net at ``where``: ``#`` -> ``#3``, ``#1`` -> ``#1.3``."""
    return f"{where}{i}" if where.endswith("#") else f"{where}.{i}"
