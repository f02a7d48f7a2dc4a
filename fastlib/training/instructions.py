"""The compiled program's instruction kinds and their named fields, checked when a program is
built.

A program (:mod:`fastlib.training.program`) is a table of int64 rows the Numba
kernels (:mod:`fastlib.kernels.transformer`) read by field index (``F_IN``, ``F_P0``, ...).
Here every instruction kind names what each field it uses holds: an activation slot and its
extent (rows x width per sample), a parameter block and its size, an integer (an op table
code, a column offset, a flag). :func:`check_program` walks a built program and raises
:class:`ProgramError` on any field out of place (a slot or block past its buffer, a field
the kind does not use left non-zero, an op or activation code the kernels do not know)
before a kernel reads it: a wrong offset fails at build time instead of giving wrong
gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from fastlib.kernels import transformer as kt
from fastlib.training import fused_kernels as fk
from optable.parameters import parameter_shapes

# field name -> column of a program row (the kernels' F_* constants, read, never restated)
FIELDS = {name[2:].lower(): getattr(kt, name) for name in dir(kt) if name.startswith("F_")}
if sorted(FIELDS.values()) != list(range(kt.N_FIELDS)):
    raise ImportError("fastlib.kernels.transformer: the F_* fields must number 0..N_FIELDS-1 "
                      "once each")
# the fields every row carries whatever its kind
_COMMON = ("op", "in", "in_w", "out", "out_w", "rows", "grad_a")


@dataclass(frozen=True)
class Instruction:
    """One instruction kind: its name and, per field it uses, what the field holds.

    ``slots`` maps a field to the per-sample extent of the activation slot it points at, a
    function of the row ``(in_w, out_w, rows, steps, ints)`` -> entries; ``ints`` names the
    integer fields it reads. An instruction that runs a layer names its ``layer`` kind (a key
    of ``optable.parameters.LAYER_KINDS``), the kind's ``sizes`` as a function of the row, and
    ``blocks``: per parameter field (``p0``, ``p1``, ... in order) the parameters its block
    holds side by side as column ranges. The blocks' sizes are the kind's declared shapes,
    read, never restated: the builder lays the parameters out from them and the check holds
    every row to them.
    """

    name: str
    slots: dict = field(default_factory=dict)
    ints: tuple = ()
    layer: str | None = None
    sizes: Callable | None = None
    blocks: dict = field(default_factory=dict)

    def block_sizes(self, r) -> dict:
        """``{parameter field: entries}`` of the row ``r`` (a :func:`row_fields` dict)."""
        if not self.blocks:
            return {}
        shapes = parameter_shapes(self.layer, self.sizes(r))
        return {f: sum(math.prod(shapes[n]) for n in names) for f, names in self.blocks.items()}


def _out_rows(r):
    return r["rows"] if r["op"] not in (kt.OP_RNN, kt.OP_LSTM) or r["int1"] else 1


def _recurrent(name, lstm):
    gates = (lambda r: 4 * r["out_w"]) if lstm else (lambda r: r["out_w"])
    return Instruction(name, slots={
        "aux1": lambda r: r["rows"] * gates(r), "aux2": lambda r: r["rows"] * r["out_w"],
        "aux3": lambda r: r["rows"] * r["out_w"], "aux4": lambda r: r["rows"] * r["out_w"],
        "aux5": lambda r: r["rows"] * gates(r)}, ints=("int1",), layer=name,
        sizes=lambda r: {"input_size": r["in_w"], "hidden_size": r["out_w"]},
        blocks={"p0": ("w_ih",), "p1": ("w_hh",), "p2": ("b",)})


INSTRUCTIONS = {
    kt.OP_DENSE: Instruction(
        "Dense", slots={"aux1": lambda r: r["rows"] * r["out_w"]}, ints=("int0",), layer="Dense",
        sizes=lambda r: {"in_features": r["in_w"], "out_features": r["out_w"]},
        blocks={"p0": ("weight",), "p1": ("bias",)}),
    kt.OP_LAYER_NORM: Instruction(
        "LayerNorm", slots={"aux1": lambda r: r["rows"] * r["in_w"], "aux2": lambda r: r["rows"]},
        layer="LayerNorm", sizes=lambda r: {"d": r["in_w"]},
        blocks={"p0": ("weight",), "p1": ("bias",)}),
    kt.OP_RMS_NORM: Instruction(
        "RMSNorm", slots={"aux1": lambda r: r["rows"]}, layer="RMSNorm",
        sizes=lambda r: {"d": r["in_w"]}, blocks={"p0": ("weight",)}),
    kt.OP_SWIGLU: Instruction(
        "SwiGLU", slots={"aux1": lambda r: r["rows"] * 2 * r["int0"],
                         "aux2": lambda r: r["rows"] * r["int0"]}, ints=("int0",),
        layer="SwiGLU", sizes=lambda r: {"d": r["in_w"], "hidden": r["int0"], "out": r["out_w"]},
        blocks={"p0": ("w_gate", "w_up"), "p1": ("w_down",)}),
    kt.OP_ATTENTION: Instruction(
        "MultiHeadAttention",
        slots={"aux1": lambda r: r["rows"] * 3 * r["in_w"], "aux2": lambda r: r["rows"] * r["in_w"],
               "aux3": lambda r: r["int0"] * r["rows"] * r["rows"]}, ints=("int0", "int1"),
        layer="MultiHeadAttention", sizes=lambda r: {"d_model": r["in_w"], "heads": r["int0"]},
        blocks={"p0": ("w_q", "w_k", "w_v"), "p1": ("w_o",), "p2": ("b_q", "b_k", "b_v"),
                "p3": ("b_o",)}),
    kt.OP_EMBEDDING: Instruction(
        "Embedding", ints=("int0",), layer="Embedding",
        sizes=lambda r: {"num": r["int0"], "dim": r["out_w"]}, blocks={"p0": ("weight",)}),
    kt.OP_ADD: Instruction("Add", slots={"aux1": lambda r: r["rows"] * r["in_w"]},
                           ints=("grad_b",)),
    kt.OP_COLUMNS: Instruction("Columns", ints=("int0",)),
    kt.OP_RNN: _recurrent("RNN", False),
    kt.OP_LSTM: _recurrent("LSTM", True),
}
# an instruction kind per layer kind, named as the layer kind is
for _instruction in INSTRUCTIONS.values():
    if _instruction.layer not in (None, _instruction.name):
        raise ImportError(f"instruction {_instruction.name} runs layer kind {_instruction.layer}")


class ProgramError(ValueError):
    """A program row whose fields do not describe its instruction (a builder's bug)."""


def row_fields(row) -> dict:
    """``{field name: value}`` of one program row."""
    return {name: int(row[col]) for name, col in FIELDS.items()}


def check_program(rows, *, act_size, param_size, samples, input_slot) -> None:
    """Raise :class:`ProgramError` unless every row of ``rows`` is a well-formed instruction.

    ``act_size`` is the activation buffer of one piece (``samples`` samples at most),
    ``param_size`` the flat parameter vector's length and ``input_slot`` the model input's
    slot (the only slot no row writes). Checked per row: the op code is a kind of
    :data:`INSTRUCTIONS`; every slot it reads or writes lies inside the buffer at its extent;
    every parameter block inside the parameter vector; a Dense's activation is one the
    kernels apply elementwise (``fused_kernels.FUSED_CODES``, from the op table); the
    cotangent modes are known; a field the kind does not use is zero.
    """
    modes = (kt.GRAD_WRITE, kt.GRAD_ADD, kt.GRAD_SKIP)
    for k, row in enumerate(rows):
        r = row_fields(row)
        kind = INSTRUCTIONS.get(r["op"])
        if kind is None:
            raise ProgramError(f"program row {k}: unknown op code {r['op']}; the kinds are "
                               f"{ {c: i.name for c, i in INSTRUCTIONS.items()} }")
        where = f"program row {k} ({kind.name})"
        # an Embedding reads token ids, one per row: its in_w is the data's (0 for tokens)
        if (r["in_w"] < 1 and r["op"] != kt.OP_EMBEDDING) or r["out_w"] < 1 or r["rows"] < 1:
            raise ProgramError(f"{where}: widths and rows must be >= 1, got in_w={r['in_w']}, "
                               f"out_w={r['out_w']}, rows={r['rows']}")
        extents = {"out": _out_rows(r) * r["out_w"]}
        if r["op"] != kt.OP_EMBEDDING:
            extents["in"] = r["rows"] * r["in_w"]
        extents.update({f: size(r) for f, size in kind.slots.items()})
        for name, extent in extents.items():
            off = r[name]
            if off < 0 or off + samples * extent > act_size:
                raise ProgramError(f"{where}: slot '{name}' at {off} holds {samples} x {extent} "
                                   f"entries, past the activation buffer of {act_size}")
        for name, n in kind.block_sizes(r).items():
            off = r[name]
            if off < 0 or off + n > param_size:
                raise ProgramError(f"{where}: parameter block '{name}' at {off} of {n} entries "
                                   f"is past the parameter vector of {param_size}")
        if r["grad_a"] not in modes or r["grad_b"] not in modes:
            raise ProgramError(f"{where}: unknown cotangent mode {r['grad_a']}/{r['grad_b']}")
        if r["op"] == kt.OP_DENSE and r["int0"] not in fk.FUSED_CODES:
            raise ProgramError(f"{where}: activation code {r['int0']} is not one the kernels "
                               f"apply elementwise ({sorted(fk.FUSED_CODES)})")
        if r["op"] == kt.OP_COLUMNS and not 0 <= r["int0"] <= r["out_w"] - r["in_w"]:
            raise ProgramError(f"{where}: columns {r['int0']}..{r['int0'] + r['in_w']} are "
                               f"outside the output's {r['out_w']}")
        used = set(_COMMON) | set(kind.slots) | set(kind.blocks) | set(kind.ints)
        stray = {f: v for f, v in r.items() if f not in used and v != 0}
        if stray:
            raise ProgramError(f"{where}: fields {stray} are not used by this kind and must be 0")
        if r["out"] == input_slot:
            raise ProgramError(f"{where}: writes the model's input slot")
