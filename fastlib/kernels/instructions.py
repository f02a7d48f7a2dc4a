"""The compiled program's instruction set: named records that the builder writes, the checker
reads and the Numba kernels (CPU and ``numba.cuda``) read by field name.

A program is three record tables: :data:`ROW` (one instruction: its kind and, by name, the
slots, parameter blocks, integers and reals it uses), :data:`SLOT` (an activation slot of one
piece: offset, rows per sample, width) and :data:`BLOCK` (a parameter block: offset, rows,
columns). Each kind declares here, once, the extent of every slot it uses and the parameters
its blocks hold (:data:`INSTRUCTIONS`): the builder sizes the tables from the declaration,
:func:`check_program` holds a built program to it, and a kernel's view of a slot or block is
the extent its table entry records (:func:`slot_view`, :func:`block_matrix`). Imports NumPy,
Numba and optable only. The story: docs/architecture.md, "The program's records".
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from numba import njit

import optable
from optable.parameters import parameter_shapes

# -- instruction kinds (a row's ``op``) ----------------------------------------------------------
DENSE, LAYER_NORM, RMS_NORM, SWIGLU, ATTENTION, EMBEDDING, ADD, COLUMNS, RNN, LSTM = range(10)
# what the backward does with an input's cotangent (``grad_x``, ``grad_x2``): write it, add it
# to what a later reader (in forward order) wrote, or skip it (the model's input)
GRAD_WRITE, GRAD_ADD, GRAD_SKIP = range(3)
# a slot or block field the kind does not use
NONE = -1

_I, _F = np.int64, np.float64
# the slot fields of a row: indices into the slot table
SLOT_FIELDS = ("x", "y", "pre", "xhat", "rstd", "rrms", "gate_up", "gated", "qkv", "att",
               "probs", "gates", "states", "cells", "cell_tanh", "x2")
# the parameter-block fields of a row: indices into the block table
BLOCK_FIELDS = ("weight", "bias", "w_gate_up", "w_down", "w_qkv", "b_qkv", "w_o", "b_o", "w_ih",
                "w_hh")
INT_FIELDS = ("grad_x", "grad_x2", "activation", "heads", "causal", "hidden", "num", "col0",
              "every_state")
REAL_FIELDS = ("slope", "eps", "scale")
#: One instruction. Slot and block fields hold an index into the slot or block table (NONE
#: when unused); what each holds per kind is declared in :data:`INSTRUCTIONS`.
ROW = np.dtype([("op", _I)] + [(f, _I) for f in SLOT_FIELDS + BLOCK_FIELDS + INT_FIELDS]
               + [(f, _F) for f in REAL_FIELDS], align=True)
#: An activation slot of one piece of ``samples`` samples: ``samples * steps`` rows of
#: ``width`` entries from ``offset`` (rows in the piece's layout, :func:`row_index`).
SLOT = np.dtype([("offset", _I), ("steps", _I), ("width", _I)], align=True)
#: A parameter block: a ``rows x cols`` row-major matrix from ``offset`` of the flat vector.
BLOCK = np.dtype([("offset", _I), ("rows", _I), ("cols", _I)], align=True)

#: A built program's tables, as the kernels take them (a NumPy record array each).
ProgramTables = collections.namedtuple("ProgramTables", "rows slots blocks")

# Dense activations the kernels apply elementwise: the op table's unary activations
ELEMENTWISE_ACTIVATIONS = tuple(a.name for a in optable.ACTIVATIONS.values()
                                if optable.OPS[a.op].category == "unary")
ELEMENTWISE_CODES = frozenset(optable.activation_codes()[a] for a in ELEMENTWISE_ACTIVATIONS)


# -- what a kernel reads ----------------------------------------------------------------------
@njit(inline="always")
def slot_view(buf, slot, samples):
    """The ``(samples * slot.steps, slot.width)`` view of ``slot`` in a piece's buffer."""
    rows = samples * slot.steps
    return buf[slot.offset:slot.offset + rows * slot.width].reshape((rows, slot.width))


@njit(inline="always")
def slot_column(buf, slot, samples):
    """The ``(samples * slot.steps,)`` entries of a one-wide slot (a row statistic)."""
    return buf[slot.offset:slot.offset + samples * slot.steps]


@njit(inline="always")
def block_matrix(w, block):
    """The ``(block.rows, block.cols)`` view of ``block`` in the flat parameter vector."""
    return w[block.offset:block.offset + block.rows * block.cols].reshape((block.rows,
                                                                           block.cols))


@njit(inline="always")
def block_vector(w, block):
    """The ``block.rows * block.cols`` entries of ``block`` (a bias: one row)."""
    return w[block.offset:block.offset + block.rows * block.cols]


@njit(inline="always")
def row_index(s, t, samples, steps, group):
    """The row of sample ``s``, position ``t`` among ``samples`` samples of ``steps`` positions
    laid out time-major in groups of ``group`` samples (1: sample-major, ``samples``: wholly
    time-major, row ``t * samples + s``)."""
    g0 = (s // group) * group
    return g0 * steps + t * min(group, samples - g0) + (s - g0)


# -- the declarations --------------------------------------------------------------------------
def _seq(width):
    """An extent of every position of the input: (steps, width(s))."""
    return lambda s: (s["steps"], width(s))


_D_IN, _D_OUT = (lambda s: s["d_in"]), (lambda s: s["d_out"])


@dataclass(frozen=True)
class Instruction:
    """One instruction kind: per field it uses, what the field holds.

    ``slots`` maps each slot field to its extent per sample, ``(rows, width)`` as a function
    of the row's sizes ``s`` (``steps``, ``d_in``, ``d_out``: the rows and width of ``x`` and
    the width of ``y``, and the kind's integer fields); ``aliases`` names the slot fields that
    may be the slot of another field (``{"pre": "y"}``: a linear Dense's pre-activation is its
    output). ``blocks`` maps each parameter-block field to the parameters it holds side by
    side as column ranges; their shapes are the layer kind's (``layer``, sized by ``sizes(s)``
    from ``optable.parameters``), read, never restated. ``ints`` and ``reals`` name the
    integer and real fields it reads. ``scratch(s)`` is the per-piece scratch its kernels need
    (``acc`` float64, ``tmp`` and ``sc`` of the model's dtype), ``s["rows"]`` the piece's rows.
    """

    name: str
    slots: dict
    ints: tuple = ()
    reals: tuple = ()
    layer: str | None = None
    sizes: Callable | None = None
    blocks: dict = field(default_factory=dict)
    aliases: dict = field(default_factory=dict)
    scratch: Callable = lambda s: {}

    def block_shapes(self, s) -> dict:
        """``{block field: (rows, cols)}`` for the row sizes ``s``."""
        return self.spans(parameter_shapes(self.layer, self.sizes(s))) if self.blocks else {}

    def spans(self, shapes) -> dict:
        """``{block field: (rows, cols)}`` of the parameters of ``shapes`` (name -> shape):
        each block's parameters side by side, a vector as one row."""
        out = {}
        for name, params in self.blocks.items():
            spans = [(1, shapes[p][0]) if len(shapes[p]) == 1 else
                     (shapes[p][0], math.prod(shapes[p][1:])) for p in params]
            if any(r != spans[0][0] for r, _ in spans):
                raise ProgramError(f"{self.name}: the parameters {params} of block '{name}' do "
                                   f"not share a row count ({spans})")
            out[name] = (spans[0][0], sum(c for _, c in spans))
        return out


def _recurrent(name, gates):
    width = lambda s: gates * s["d_out"]  # noqa: E731 - the gates' columns
    slots = {"x": _seq(_D_IN), "y": lambda s: (s["steps"] if s["every_state"] else 1,
                                              s["d_out"]),
             "gates": _seq(width), "states": _seq(_D_OUT)}
    if gates > 1:
        slots.update(cells=_seq(_D_OUT), cell_tanh=_seq(_D_OUT))
    return Instruction(
        name, slots, ints=("every_state",), layer=name,
        sizes=lambda s: {"input_size": s["d_in"], "hidden_size": s["d_out"]},
        blocks={"w_ih": ("w_ih",), "w_hh": ("w_hh",), "bias": ("b",)},
        # an RNN's states overwrite its gates in place
        aliases={} if gates > 1 else {"states": "gates"},
        scratch=lambda s: {"acc": width(s), "tmp": s["d_out"] * width(s),
                           "sc": s["rows"] // s["steps"] * max(width(s), 2 * s["d_out"])})


#: Every instruction kind by its code.
INSTRUCTIONS = {
    DENSE: Instruction(
        "Dense", {"x": _seq(_D_IN), "y": _seq(_D_OUT), "pre": _seq(_D_OUT)},
        ints=("activation",), reals=("slope",), layer="Dense",
        sizes=lambda s: {"in_features": s["d_in"], "out_features": s["d_out"]},
        blocks={"weight": ("weight",), "bias": ("bias",)}, aliases={"pre": "y"},
        scratch=lambda s: {"acc": s["d_out"]}),
    LAYER_NORM: Instruction(
        "LayerNorm", {"x": _seq(_D_IN), "y": _seq(_D_IN), "xhat": _seq(_D_IN),
                      "rstd": _seq(lambda s: 1)},
        reals=("eps",), layer="LayerNorm", sizes=lambda s: {"d": s["d_in"]},
        blocks={"weight": ("weight",), "bias": ("bias",)},
        scratch=lambda s: {"acc": 2 * s["d_in"]}),
    RMS_NORM: Instruction(
        "RMSNorm", {"x": _seq(_D_IN), "y": _seq(_D_IN), "rrms": _seq(lambda s: 1)},
        reals=("eps",), layer="RMSNorm", sizes=lambda s: {"d": s["d_in"]},
        blocks={"weight": ("weight",)}, scratch=lambda s: {"acc": s["d_in"]}),
    SWIGLU: Instruction(
        "SwiGLU", {"x": _seq(_D_IN), "y": _seq(_D_OUT),
                   "gate_up": _seq(lambda s: 2 * s["hidden"]), "gated": _seq(lambda s: s["hidden"])},
        ints=("hidden",), layer="SwiGLU",
        sizes=lambda s: {"d": s["d_in"], "hidden": s["hidden"], "out": s["d_out"]},
        blocks={"w_gate_up": ("w_gate", "w_up"), "w_down": ("w_down",)}),
    ATTENTION: Instruction(
        "MultiHeadAttention",
        {"x": _seq(_D_IN), "y": _seq(_D_IN), "qkv": _seq(lambda s: 3 * s["d_in"]),
         "att": _seq(_D_IN), "probs": lambda s: (s["heads"] * s["steps"], s["steps"])},
        ints=("heads", "causal"), reals=("scale",), layer="MultiHeadAttention",
        sizes=lambda s: {"d_model": s["d_in"], "heads": s["heads"]},
        blocks={"w_qkv": ("w_q", "w_k", "w_v"), "w_o": ("w_o",), "b_qkv": ("b_q", "b_k", "b_v"),
                "b_o": ("b_o",)},
        scratch=lambda s: {"acc": 3 * s["d_in"],
                           "sc": 4 * s["d_in"] // s["heads"] * s["steps"] + s["steps"] ** 2}),
    # an Embedding's input is the token ids (one per row, in the piece's token buffer)
    EMBEDDING: Instruction(
        "Embedding", {"x": _seq(lambda s: 1), "y": _seq(_D_OUT)}, ints=("num",),
        layer="Embedding", sizes=lambda s: {"num": s["num"], "dim": s["d_out"]},
        blocks={"weight": ("weight",)}, scratch=lambda s: {"acc": s["num"] * s["d_out"]}),
    ADD: Instruction("Add", {"x": _seq(_D_IN), "y": _seq(_D_IN), "x2": _seq(_D_IN)},
                     ints=("grad_x2",)),
    # x placed at columns col0.. of y (y is shared by the Columns rows of one join)
    COLUMNS: Instruction("Columns", {"x": _seq(_D_IN), "y": _seq(_D_OUT)}, ints=("col0",)),
    RNN: _recurrent("RNN", 1),
    LSTM: _recurrent("LSTM", 4),
}
# every kind's x is its input; grad_x is read by every kind but Embedding (token ids)
_COMMON_INTS = ("grad_x",)


class ProgramError(ValueError):
    """A program whose records do not describe its instructions (a builder's bug)."""


def row_sizes(row, slots) -> dict:
    """The sizes a row's declarations read: ``steps``, ``d_in``, ``d_out`` from its ``x`` and
    ``y`` slots, and its integer fields."""
    x, y = slots[row["x"]], slots[row["y"]]
    sizes = {"steps": int(x["steps"]), "d_in": int(x["width"]), "d_out": int(y["width"])}
    sizes.update({f: int(row[f]) for f in INT_FIELDS})
    return sizes


def scratch_sizes(rows, slots, samples) -> dict:
    """``{"acc", "tmp", "sc"}``: the entries of per-piece scratch the rows' kernels need for
    pieces of ``samples`` samples (``tmp`` at least one input's cotangent, for adding)."""
    need = {"acc": 1, "tmp": 1, "sc": 1}
    for row in rows:
        s = row_sizes(row, slots)
        s["rows"] = samples * s["steps"]
        need["tmp"] = max(need["tmp"], s["rows"] * s["d_in"])
        for key, n in INSTRUCTIONS[int(row["op"])].scratch(s).items():
            need[key] = max(need[key], int(n))
    return need


def _span_problem(table, what, size):
    """A message when an entry of ``table`` lies outside ``[0, size)`` or two entries
    overlap, else None. ``size(entry)`` is an entry's extent."""
    spans = sorted((int(e["offset"]), int(e["offset"]) + size(e), i) for i, e in enumerate(table))
    for lo, hi, i in spans:
        if lo < 0 or hi < lo:
            return f"{what} {i} spans [{lo}, {hi})"
    for (lo, hi, i), (lo2, hi2, j) in zip(spans, spans[1:]):
        if lo2 < hi and hi > lo and hi2 > lo2:
            return f"{what}s {i} [{lo}, {hi}) and {j} [{lo2}, {hi2}) overlap"
    return None


def check_program(tables: ProgramTables, *, act_size, param_size, samples, input_slot) -> None:
    """Raise :class:`ProgramError` unless ``tables`` describe well-formed instructions.

    ``act_size`` is the activation buffer of one piece of ``samples`` samples, ``param_size``
    the flat parameter vector's length, ``input_slot`` the model input's slot. Checked: every
    slot inside the buffer and no two slots overlapping; every block inside the parameter
    vector, no two overlapping, each read by one row; per row, the op a kind of
    :data:`INSTRUCTIONS`; each slot field the kind uses naming a slot of the declared extent,
    no two of its fields sharing a slot unless declared (``aliases``); a slot private to a
    row (not its ``x`` or ``y``) used by no other row; ``x`` written by an earlier row or the
    input; the input never written; each block of the declared shape; a Dense activation one
    the kernels apply elementwise; cotangent modes known; a field the kind does not use
    ``NONE`` (slots, blocks) or 0.
    """
    rows, slots, blocks = tables
    problem = (_span_problem(slots, "slot", lambda e: samples * int(e["steps"]) * int(e["width"]))
               or _span_problem(blocks, "block", lambda e: int(e["rows"]) * int(e["cols"])))
    if problem:
        raise ProgramError(f"program tables: {problem}")
    for name, table, size in (("slot", slots, act_size), ("block", blocks, param_size)):
        ends = [int(e["offset"]) + (samples * int(e["steps"]) * int(e["width"]) if name == "slot"
                                    else int(e["rows"]) * int(e["cols"])) for e in table]
        if ends and max(ends) > size:
            raise ProgramError(f"program tables: a {name} ends at {max(ends)}, past the buffer of "
                               f"{size}")
    written, private, owned = {input_slot}, {}, {}
    for k, row in enumerate(rows):
        kind = INSTRUCTIONS.get(int(row["op"]))
        if kind is None:
            raise ProgramError(f"program row {k}: unknown op code {int(row['op'])}; the kinds are "
                               f"{ {c: i.name for c, i in INSTRUCTIONS.items()} }")
        where = f"program row {k} ({kind.name})"
        _check_fields(where, row, kind, len(slots), len(blocks))
        s = row_sizes(row, slots)
        _check_slots(where, row, kind, slots, s, samples)
        for f, (r, c) in kind.block_shapes(s).items():
            b = blocks[row[f]]
            if (int(b["rows"]), int(b["cols"])) != (r, c):
                raise ProgramError(f"{where}: block '{f}' is {int(b['rows'])} x {int(b['cols'])}; "
                                   f"{kind.name} declares {r} x {c}")
            if int(row[f]) in owned:
                raise ProgramError(f"{where}: block '{f}' is also read by row {owned[row[f]]}")
            owned[int(row[f])] = k
        if int(row["x"]) not in written:
            raise ProgramError(f"{where}: reads slot {int(row['x'])} before any row writes it")
        if int(row["y"]) == input_slot:
            raise ProgramError(f"{where}: writes the model's input slot")
        for f in kind.slots:
            i = int(row[f])
            if f not in ("x", "y", "x2") and private.setdefault(i, k) != k:
                raise ProgramError(f"{where}: slot '{f}' ({i}) is also used by row {private[i]}")
        written.update(int(row[f]) for f in kind.slots if f != "x")
        _check_values(where, row, s)


def _check_fields(where, row, kind, n_slots, n_blocks):
    used = set(kind.slots) | set(kind.blocks) | set(kind.ints) | set(kind.reals)
    used.update(_COMMON_INTS if kind.name != "Embedding" else ())
    for f in SLOT_FIELDS + BLOCK_FIELDS:
        v, n = int(row[f]), (n_slots if f in SLOT_FIELDS else n_blocks)
        if f in used and not 0 <= v < n:
            raise ProgramError(f"{where}: field '{f}' = {v} names no entry of the "
                               f"{'slot' if f in SLOT_FIELDS else 'block'} table (0..{n - 1})")
        if f not in used and v != NONE:
            raise ProgramError(f"{where}: field '{f}' = {v} is not used by this kind and must "
                               f"be NONE ({NONE})")
    stray = {f: row[f].item() for f in INT_FIELDS + REAL_FIELDS if f not in used and row[f] != 0}
    if stray:
        raise ProgramError(f"{where}: fields {stray} are not used by this kind and must be 0")


def _check_slots(where, row, kind, slots, s, samples):
    seen = {}
    for f, extent in kind.slots.items():
        slot = slots[row[f]]
        want = tuple(int(v) for v in extent(s))
        got = (int(slot["steps"]), int(slot["width"]))
        if got != want:
            raise ProgramError(f"{where}: slot '{f}' ({int(row[f])}) holds {got[0]} x {got[1]} "
                               f"per sample; {kind.name} declares {want[0]} x {want[1]}")
        other = seen.get(int(row[f]))
        if other is not None and kind.aliases.get(f) != other and kind.aliases.get(other) != f:
            raise ProgramError(f"{where}: fields '{other}' and '{f}' name one slot "
                               f"({int(row[f])}) and may not")
        seen[int(row[f])] = f


def _check_values(where, row, s):
    op = int(row["op"])
    modes = (GRAD_WRITE, GRAD_ADD, GRAD_SKIP)
    if op != EMBEDDING and int(row["grad_x"]) not in modes or \
            op == ADD and int(row["grad_x2"]) not in modes:
        raise ProgramError(f"{where}: unknown cotangent mode {int(row['grad_x'])}/"
                           f"{int(row['grad_x2'])}")
    if op == DENSE and int(row["activation"]) not in ELEMENTWISE_CODES:
        raise ProgramError(f"{where}: activation code {int(row['activation'])} is not one the "
                           f"kernels apply elementwise ({sorted(ELEMENTWISE_CODES)})")
    if op == DENSE and (int(row["pre"]) == int(row["y"])) != (
            int(row["activation"]) == optable.activation_codes()["linear"]):
        raise ProgramError(f"{where}: the pre-activation shares the output's slot exactly when "
                           "the activation is linear")
    if op == COLUMNS and not 0 <= int(row["col0"]) <= s["d_out"] - s["d_in"]:
        raise ProgramError(f"{where}: columns {int(row['col0'])}..{int(row['col0']) + s['d_in']} "
                           f"are outside the output's {s['d_out']}")
    if op == ATTENTION and (s["heads"] < 1 or s["d_in"] % s["heads"] or s["causal"] not in (0, 1)
                            or not row["scale"] > 0):
        raise ProgramError(f"{where}: {s['heads']} heads over {s['d_in']} columns, causal "
                           f"{s['causal']}, scale {float(row['scale'])}")
    if op in (RNN, LSTM) and s["every_state"] not in (0, 1):
        raise ProgramError(f"{where}: every_state must be 0 or 1, got {s['every_state']}")
    if op in (LAYER_NORM, RMS_NORM) and not row["eps"] > 0:
        raise ProgramError(f"{where}: eps must be > 0, got {float(row['eps'])}")
