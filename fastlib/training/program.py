"""The program builder: a model compiled to one program of checked instruction records.

Every model a compiled epoch can train is first compiled here, whatever schedule then runs it
(:mod:`fastlib.training.schedules`): one row per layer (and per join of a ``Parallel``), its
fields named by the records of :mod:`fastlib.kernels.instructions`, its slots and parameter
blocks sized from its kind's declaration there and checked when the program is built. A model
holding a layer the program cannot express raises :class:`Unsupported` here, and the generic
per-batch loop trains it.

The long story: docs/fastlib.md, section ``fastlib/training/program.py``.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import instructions as ins
from fastlib.kernels.instructions import INSTRUCTIONS, ProgramError, check_program
from fastlib.layers.activations import ACTIVATIONS, LEAKY_SLOPE, SOFTMAX
from fastlib.training.values import check_flag
from optable.losses import LOSS_CODES
from optable.parameters import kind_of, layer_sizes, parameter_shapes


class Unsupported(Exception):
    """The model holds something the program does not express (the generic loop trains it)."""


# the config keys that hold a layer kind's input width (its declared sizing keys)
_INPUT_WIDTH_KEYS = ("in_features", "d", "d_model", "input_size")
# slot offsets in entries: rows start on 64-byte boundaries for float32
_ALIGN = 16


def declared_shapes(layer):
    """``{parameter name: shape}`` as the layer kind declares it (``optable.parameters``), the
    one declaration the layer, the file loader, reflib and this builder share."""
    return parameter_shapes(kind_of(layer), layer_sizes(layer))


class Program:
    """A model compiled for one sample shape: record tables, buffer sizes, parameter layout.

    Parameters
    ----------
    model : Sequential or Parallel
        The model; :class:`Unsupported` when it holds what the program does not express.
    dtype : numpy.dtype
        The model's dtype.
    steps : int
        Positions per sample (1 for ``(N, d)`` data).
    max_samples : int
        The most samples one piece holds: the slots are sized for it (see :meth:`sized_for`).
    d_in : int
        Feature width per position of the data (0 for token ids).
    tokens : bool
        The data are token ids (the model starts with an Embedding).
    d_in_seq : bool
        The data have a time axis (``(N, T, d)``).

    Attributes
    ----------
    tables : instructions.ProgramTables
        The checked rows, slots and blocks (``fastlib.kernels.instructions``).
    row_names : list of tuple of str
        Per row, the full names of the parameters its blocks hold, in block order.
    layout : dict
        ``name -> (block, col0, col1, shape)``: the block that holds the parameter and its
        columns there.
    rounds : numpy.ndarray or None
        int64 ``(rows, 2)``: per row, the slot whose values a mixed-precision run rounds after
        the row's forward (the last row writing a unit's output) and the slot whose cotangent
        it rounds after the row's backward (the first row reading a unit's input), -1 for
        none: the units are the model's own children when it is a Sequential, else the model
        (``fastlib.training.mixed_precision``). None when the rows cannot say it.
    """

    def __init__(self, model, dtype, steps, max_samples, d_in, tokens, d_in_seq):
        self._args = (model, dtype, steps, d_in, tokens, d_in_seq)
        self.dtype = dtype
        self.steps = steps
        self.max_samples = max_samples
        self.max_rows = max_samples * steps
        self.tokens = tokens
        self._rows, self._slots, self._blocks, self.row_names = [], [], [], []
        self.act_size = 0
        self.param_size = 0
        self.layout = {}
        self._unit_outputs = []
        # the data has a time axis when it is tokens or (N, T, d), not when it is (N, d)
        seq_in = tokens or d_in_seq
        self.input_slot = self._slot(1 if tokens else d_in, steps if seq_in else 1)
        self.output_slot = self._emit(model, (self.input_slot, 1 if tokens else d_in, seq_in),
                                      "")[0]
        self._grad_modes()
        self.tables = ins.ProgramTables(np.array(self._rows, ins.ROW),
                                        np.array(self._slots, ins.SLOT),
                                        np.array(self._blocks, ins.BLOCK))
        # every record checked against its instruction kind before a kernel reads it (a wrong
        # slot or block raises here instead of giving wrong gradients)
        check_program(self.tables, act_size=self.act_size, param_size=self.param_size,
                      samples=max_samples, input_slot=self.input_slot)
        self.scratch = ins.scratch_sizes(self.tables.rows, self.tables.slots, max_samples)
        self.rounds = self._rounding_rows(self._unit_outputs or [self.output_slot])

    def sized_for(self, max_samples):
        """The same model's program with slots for pieces of ``max_samples`` samples (the
        rows' kinds, widths and parameter layout are those of this one)."""
        model, dtype, steps, d_in, tokens, d_in_seq = self._args
        return Program(model, dtype, steps, max_samples, d_in, tokens, d_in_seq)

    def chain(self):
        """The rows when the program is one chain (each row reads the row before it, the
        first the model's input), else None."""
        src = self.input_slot
        for r in self.tables.rows:
            if r["x"] != src:
                return None
            src = r["y"]
        return self.tables.rows

    def kinds(self):
        """The set of the rows' instruction kinds."""
        return {int(op) for op in self.tables.rows["op"]}

    # -- building ------------------------------------------------------------------------------
    def _slot(self, width, steps):
        """A new slot of ``steps`` rows per sample of ``width`` entries; returns its index."""
        self._slots.append((self.act_size, steps, width))
        self.act_size += -(-self.max_samples * steps * width // _ALIGN) * _ALIGN
        return len(self._slots) - 1

    def _param_blocks(self, op, layer, prefix):
        """Lay out ``layer``'s parameters in the blocks its instruction kind names
        (``instructions.INSTRUCTIONS``), each holding its parameters' declared shapes side by
        side; returns ``({block field: block index}, parameter names in block order)``."""
        shapes = declared_shapes(layer)
        out, names = {}, []
        kind = INSTRUCTIONS[op]
        spans = kind.spans(shapes)
        for field, params in kind.blocks.items():
            rows, cols = spans[field]
            self._blocks.append((self.param_size, rows, cols))
            out[field] = len(self._blocks) - 1
            c0 = 0
            for name in params:
                shape = shapes[name]
                width = shape[0] if len(shape) == 1 else int(np.prod(shape[1:]))
                self.layout[prefix + name] = (out[field], c0, c0 + width, shape)
                names.append(prefix + name)
                c0 += width
            self.param_size += rows * cols
        return out, tuple(names)

    def _row(self, op, src, d_out, layer=None, prefix="", shared=None, seq=None, **fields):
        """Append a row of kind ``op`` reading the slot ``src = (index, width, seq)`` (``seq``:
        it has a time axis), with output width ``d_out`` and its integer and real ``fields``:
        its parameter blocks laid out from ``layer`` and each slot it uses new, at the extent
        the kind declares, unless ``shared`` names it (``{field: slot index}``: the join's
        output; -1: the alias the kind allows). Returns its output slot ``(index, width,
        seq)``, ``seq`` the input's unless given."""
        kind = INSTRUCTIONS[op]
        row = np.zeros((), ins.ROW)
        for f in ins.SLOT_FIELDS + ins.BLOCK_FIELDS:
            row[f] = ins.NONE
        blocks, names = self._param_blocks(op, layer, prefix) if kind.blocks else ({}, ())
        for f, v in dict(blocks, **fields).items():
            row[f] = v
        row["op"], row["x"] = op, src[0]
        sizes = {"steps": self.steps if src[2] else 1, "d_in": src[1], "d_out": d_out}
        sizes.update({f: int(row[f]) for f in ins.INT_FIELDS})
        shared = dict(shared or {})
        for f, extent in kind.slots.items():
            if f == "x":
                continue
            if f in shared:
                row[f] = shared[f] if shared[f] >= 0 else row[kind.aliases[f]]
                continue
            steps, width = extent(sizes)
            row[f] = self._slot(width, steps)
        self._rows.append(row)
        self.row_names.append(names)
        return int(row["y"]), d_out, src[2] if seq is None else seq

    def _emit(self, layer, src, prefix):
        """Rows for ``layer`` on the slot ``src = (index, width, seq)``; returns its output
        slot the same way."""
        from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention,
                                    Parallel, RMSNorm, Sequential, SwiGLU)

        kind = type(layer)
        if kind is Sequential:
            for i, child in enumerate(layer.layers):
                src = self._emit(child, src, f"{prefix}{i}.")
                if layer is self._args[0]:     # the model's own children: its units
                    self._unit_outputs.append(src[0])
            return src
        if kind is Parallel:
            return self._parallel(layer, src, prefix)
        at_input = src[0] == self.input_slot
        if self.tokens and at_input and kind is not Embedding:
            raise Unsupported
        if kind is Embedding:
            if not (self.tokens and at_input):
                raise Unsupported
            return self._row(ins.EMBEDDING, src, layer.dim, layer, prefix, num=layer.num)
        d, seq = src[1], src[2]
        cfg = layer.get_config()
        if next((cfg[k] for k in _INPUT_WIDTH_KEYS if k in cfg), d) != d:
            raise Unsupported   # a width mismatch: the generic path names it
        if kind is Dense:
            code = ACTIVATIONS[layer.activation]
            if code == SOFTMAX:
                raise Unsupported
            linear = code == ACTIVATIONS["linear"]
            # a linear Dense's pre-activation is its output (the kind allows the alias)
            return self._row(ins.DENSE, src, layer.out_features, layer, prefix,
                             shared={"pre": -1} if linear else None, activation=code,
                             slope=LEAKY_SLOPE)
        if kind is LayerNorm:
            return self._row(ins.LAYER_NORM, src, d, layer, prefix, eps=layer.eps)
        if kind is RMSNorm:
            return self._row(ins.RMS_NORM, src, d, layer, prefix, eps=layer.eps)
        if kind is SwiGLU:
            return self._row(ins.SWIGLU, src, layer.out, layer, prefix, hidden=layer.hidden)
        if kind in (RNN, LSTM):
            if not seq or layer.input_size != d:
                raise Unsupported   # no time axis, or a width mismatch: the generic path says so
            # an RNN's states overwrite its gates (the kind allows the alias)
            every = bool(layer.return_sequences)
            return self._row(ins.LSTM if kind is LSTM else ins.RNN, src, layer.hidden_size,
                             layer, prefix, shared=None if kind is LSTM else {"states": -1},
                             seq=every, every_state=int(every))
        if kind is MultiHeadAttention:
            if not seq:
                raise Unsupported   # attention needs (batch, seq, d): the generic path says so
            scale = float(self.dtype.type(1.0 / np.sqrt(d // layer.heads)))
            return self._row(ins.ATTENTION, src, d, layer, prefix, heads=layer.heads,
                             causal=int(layer.causal), scale=scale)
        raise Unsupported

    def _parallel(self, layer, src, prefix):
        outs = [self._emit(child, src, f"{prefix}{i}.") for i, child in enumerate(layer.layers)]
        from fastlib.layers import Embedding

        if any(type(c) is Embedding for c in layer.layers) and len(outs) > 1:
            raise Unsupported  # two lookups of one index slot: left to the generic path
        if any(o[2] != outs[0][2] for o in outs):
            raise Unsupported  # a branch with a time axis and one without: the generic path's
        if layer.combine == "add":
            if any(o[1] != outs[0][1] for o in outs):
                raise Unsupported
            if len(outs) == 1:
                return self._row(ins.COLUMNS, outs[0], outs[0][1])
            # summed left to right, as the layer does
            acc = outs[0]
            for nxt in outs[1:]:
                acc = self._row(ins.ADD, acc, acc[1], shared={"x2": nxt[0]})
            return acc
        total = sum(o[1] for o in outs)
        out = None
        c0 = 0
        for o in outs:
            # the first branch's row makes the join's output; the others write into it
            out = self._row(ins.COLUMNS, o, total, shared=None if out is None else {"y": out[0]},
                            col0=c0)
            c0 += o[1]
        return out

    def _rounding_rows(self, unit_outputs):
        """:attr:`rounds` for the units whose output slots are ``unit_outputs``, in order."""
        rows = self.tables.rows
        rounds = np.full((len(rows), 2), -1, np.int64)
        for s in unit_outputs:
            if s == self.input_slot:
                continue           # a unit without rows: the input is rounded on the way in
            writers = [k for k in range(len(rows)) if rows[k]["y"] == s]
            rounds[writers[-1], 0] = s
            if s == self.output_slot:
                continue           # the loss cotangent is rounded where it is formed
            k = next((k for k in range(len(rows)) if s in (rows[k]["x"], rows[k]["x2"])), None)
            if k is None or rounds[k, 1] not in (-1, s):
                return None
            rounds[k, 1] = s
        return rounds

    def _grad_modes(self):
        """Per row and input: write the cotangent, add it (a later reader, in forward order,
        wrote first in the backward) or skip it (the model's input)."""
        written = set()
        for row in reversed(self._rows):
            if row["op"] == ins.EMBEDDING:
                continue
            operands = [("x", "grad_x")] + ([("x2", "grad_x2")] if row["op"] == ins.ADD else [])
            for field, mode in operands:
                slot = int(row[field])
                if slot == self.input_slot:
                    row[mode] = ins.GRAD_SKIP
                elif slot in written:
                    row[mode] = ins.GRAD_ADD
                else:
                    row[mode] = ins.GRAD_WRITE
                    written.add(slot)

    # -- parameters ----------------------------------------------------------------------------
    def _views(self, flat):
        blocks = self.tables.blocks
        for name, (b, c0, c1, shape) in self.layout.items():
            off, rows, cols = (int(v) for v in blocks[b])
            yield name, flat[off:off + rows * cols].reshape(rows, cols)[:, c0:c1].reshape(shape)

    def flatten(self, arrays):
        """The arrays of :attr:`layout` as one flat vector of the model's dtype."""
        flat = np.zeros(self.param_size, self.dtype)
        for name, view in self._views(flat):
            view[...] = arrays[name]
        return flat

    def unflatten(self, flat, arrays):
        """Copy the flat vector back into the arrays of :attr:`layout`, in place."""
        for name, view in self._views(flat):
            np.copyto(arrays[name], view)


def _model_steps(x, tokens):
    """(positions per sample, feature width per position) of the data ``x``."""
    if tokens:
        return (x.shape[1], 0) if x.ndim == 2 else (None, None)
    if x.ndim == 3:
        return x.shape[1], x.shape[2]
    if x.ndim == 2:
        return 1, x.shape[1]
    return None, None


def program_for(ctx, x):
    """The run's :class:`Program` for data ``x`` (built once per run and sample shape, with
    slots for one sample: a schedule sizes it for its pieces), or None when the run or the
    model is outside the program (the generic loop trains it)."""
    key = ("program", x.shape[1:], x.dtype.kind)
    if key not in ctx.scratch:
        ctx.scratch[key] = _make_program(ctx, x)
    return ctx.scratch[key]


def fused_option(config) -> bool:
    """The run's ``fused`` option of ``"bp"`` (default True: compiled paths allowed), checked.

    Raises
    ------
    TypeError
        Anything but True or False (a string such as ``"no"`` is truthy).
    """
    return check_flag(config.extra.get("fused", True), "fused")


def _make_program(ctx, x):
    from fastlib.layers import Parallel, Sequential

    model, cfg = ctx.model, ctx.config
    if not fused_option(cfg) or cfg.device != "cpu" or cfg.algorithm != "bp":
        return None
    if ctx.loss_type not in LOSS_CODES or type(model) not in (Sequential, Parallel):
        return None
    tokens = bool(model.takes_indices)
    steps, d_in = _model_steps(x, tokens)
    if steps is None or steps < 1:
        return None
    try:
        prog = Program(model, np.dtype(model.dtype), steps, 1, d_in, tokens, x.ndim == 3)
    except Unsupported:
        return None
    if set(prog.layout) != set(ctx.params):
        return None
    return prog
