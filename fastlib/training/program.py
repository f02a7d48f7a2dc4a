"""The program builder: a model compiled to one program of checked instruction rows.

Every model a compiled epoch can train is first compiled here, whatever schedule then runs it
(:mod:`fastlib.training.schedules`): one row per layer (and per join of a ``Parallel``), the
row's fields named by its instruction kind (:mod:`fastlib.training.instructions`) and checked
when the program is built, the parameters laid out in the blocks the kinds declare. A model
holding a layer the program cannot express raises :class:`Unsupported` here, and the generic
per-batch loop trains it.

The long story: docs/fastlib.md, section ``fastlib/training/program.py``.
"""
from __future__ import annotations

import math

import numpy as np

from fastlib.kernels import transformer as kt
from fastlib.kernels.recurrent_pieces import PIECE
from fastlib.training import fused_kernels as fk
from fastlib.training.instructions import (INSTRUCTIONS, ProgramError, check_program,
                                          row_fields)
from optable.parameters import kind_of, layer_sizes, parameter_shapes


class Unsupported(Exception):
    """The model holds something the program does not express (the generic loop trains it)."""


# the config keys that hold a layer kind's input width (its declared sizing keys)
_INPUT_WIDTH_KEYS = ("in_features", "d", "d_model", "input_size")


def declared_shapes(layer):
    """``{parameter name: shape}`` as the layer kind declares it (``optable.parameters``), the
    one declaration the layer, the file loader, reflib and this builder share."""
    return parameter_shapes(kind_of(layer), layer_sizes(layer))


def _as_matrix(shape):
    """The (rows, columns) a parameter of ``shape`` spans in a block: a vector is one row."""
    return (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))


class Program:
    """A model compiled for one sample shape: program rows, buffer sizes, parameter layout.

    Parameters
    ----------
    model : Sequential or Parallel
        The model; :class:`Unsupported` when it holds what the program does not express.
    dtype : numpy.dtype
        The model's dtype.
    steps : int
        Positions per sample (1 for ``(N, d)`` data).
    max_samples : int
        The most samples one piece holds: the activation slots are sized for it (a schedule
        that runs the rows in pieces builds the program at its piece size, see
        :meth:`sized_for`).
    d_in : int
        Feature width per position of the data (0 for token ids).
    tokens : bool
        The data are token ids (the model starts with an Embedding).
    d_in_seq : bool
        The data have a time axis (``(N, T, d)``).

    Attributes
    ----------
    prog : ndarray of int64, shape (rows, N_FIELDS)
        The checked instruction rows (:func:`~fastlib.training.instructions.row_fields` names
        their fields).
    row_names : list of tuple of str
        Per row, the full names of the parameters its blocks hold, in block order.
    layout : dict
        ``name -> (offset, block rows, block cols, col0, col1, shape)`` in the flat vector.
    """

    def __init__(self, model, dtype, steps, max_samples, d_in, tokens, d_in_seq):
        self._args = (model, dtype, steps, d_in, tokens, d_in_seq)
        self.dtype = dtype
        self.steps = steps
        self.max_rows = max_samples * steps
        self.max_samples = max_samples
        self.rows, self.fpar, self.row_names = [], [], []
        self.act_size = 0
        self.tmp_size = 0
        self.acc_size = 0
        self.sc_size = 0
        self.param_size = 0
        self.layout = {}     # name -> (offset, block rows, block cols, col0, col1, shape)
        self.tokens = tokens
        # a slot is (offset, width, whether it has a time axis); the data has one when it is
        # tokens or (N, T, d), not when it is (N, d)
        seq_in = tokens or d_in_seq
        self.input_slot = self._slot(1 if tokens else d_in, seq_in)
        out, width, seq = self._emit(model, (self.input_slot, d_in, seq_in), "")
        self.out_slot = out
        # the output's width per sample: every position's features, or the last state's
        self.out_w = width * (steps if seq else 1)
        self._grad_modes()
        self.prog = np.array(self.rows, np.int64).reshape(-1, kt.N_FIELDS)
        # every field of every row checked against its instruction kind before a kernel
        # reads it (a wrong offset raises here instead of giving wrong gradients)
        check_program(self.prog, act_size=self.act_size, param_size=self.param_size,
                      samples=max_samples, input_slot=self.input_slot)
        self.fpar_arr = np.array(self.fpar, np.float64)

    def sized_for(self, max_samples):
        """The same model's program with slots for pieces of ``max_samples`` samples (the
        rows' kinds, widths and parameter layout are those of this one)."""
        model, dtype, steps, d_in, tokens, d_in_seq = self._args
        return Program(model, dtype, steps, max_samples, d_in, tokens, d_in_seq)

    # -- reading the rows ----------------------------------------------------------------------
    def fields(self):
        """Per row, ``{field name: value}`` (:func:`~fastlib.training.instructions.row_fields`)."""
        return [row_fields(row) for row in self.prog]

    def chain(self):
        """The rows' fields when the program is one chain (each row reads the row before it,
        the first the model's input), else None: the shape the MLP and recurrent schedules
        run."""
        rows = self.fields()
        src = self.input_slot
        for r in rows:
            if r["in"] != src:
                return None
            src = r["out"]
        return rows

    # -- building ------------------------------------------------------------------------------
    def _slot(self, width, seq=True):
        off = self.act_size
        self.act_size += self.max_samples * (self.steps if seq else 1) * width
        return off

    def _blocks(self, op, layer, prefix):
        """Lay out ``layer``'s parameters in the blocks its instruction kind names (``p0``,
        ``p1``, ... in order; ``instructions.INSTRUCTIONS``), each block holding its
        parameters' declared shapes side by side as column ranges. Returns the four
        parameter fields' offsets and the parameters' full names in block order."""
        shapes = declared_shapes(layer)
        offsets = [0, 0, 0, 0]
        full = []
        for field, names in INSTRUCTIONS[op].blocks.items():
            spans = [_as_matrix(shapes[n]) for n in names]
            rows = spans[0][0]
            if any(r != rows for r, _ in spans):
                raise ProgramError(f"{type(layer).__name__}: the parameters {names} of block "
                                   f"'{field}' do not share a row count ({spans})")
            cols = sum(c for _, c in spans)
            off = self.param_size
            self.param_size += rows * cols
            c0 = 0
            for name, (_, width) in zip(names, spans):
                self.layout[prefix + name] = (off, rows, cols, c0, c0 + width, shapes[name])
                full.append(prefix + name)
                c0 += width
            offsets[int(field[1:])] = off
        return tuple(offsets), tuple(full)

    def _row(self, op, src, out, out_w, aux=(0, 0, 0), params=((0, 0, 0, 0), ()), ints=(0, 0),
             fpar=0.0, src_b=-1, aux_more=(0, 0)):
        params, names = params
        row = [0] * kt.N_FIELDS
        row[kt.F_OP] = op
        row[kt.F_IN], row[kt.F_IN_W], seq = src
        row[kt.F_ROWS] = self.steps if seq else 1
        row[kt.F_AUX4], row[kt.F_AUX5] = aux_more
        row[kt.F_OUT], row[kt.F_OUT_W] = out, out_w
        row[kt.F_AUX1], row[kt.F_AUX2], row[kt.F_AUX3] = aux
        row[kt.F_P0], row[kt.F_P1], row[kt.F_P2], row[kt.F_P3] = params
        row[kt.F_INT0], row[kt.F_INT1] = ints
        if src_b >= 0:
            row[kt.F_AUX1] = src_b
        self.rows.append(row)
        self.row_names.append(names)
        self.fpar.append(float(fpar))
        self.tmp_size = max(self.tmp_size, self.max_rows * src[1])

    def _emit(self, layer, src, prefix):
        """Rows for ``layer`` on the slot ``src = (offset, width, seq)``; returns its output
        slot."""
        from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention,
                                    Parallel, RMSNorm, Sequential, SwiGLU)
        from fastlib.layers.activations import ACTIVATIONS, LEAKY_SLOPE, SOFTMAX

        kind = type(layer)
        if kind is Sequential:
            for i, child in enumerate(layer.layers):
                src = self._emit(child, src, f"{prefix}{i}.")
            return src
        if kind is Parallel:
            return self._parallel(layer, src, prefix)
        if self.tokens and src[0] == self.input_slot and kind is not Embedding:
            raise Unsupported
        if kind is Embedding:
            if not (self.tokens and src[0] == self.input_slot):
                raise Unsupported
            params = self._blocks(kt.OP_EMBEDDING, layer, prefix)
            out = self._slot(layer.dim)
            self._row(kt.OP_EMBEDDING, src, out, layer.dim, params=params, ints=(layer.num, 0))
            self.acc_size = max(self.acc_size, layer.num * layer.dim)
            return out, layer.dim, True
        d, seq = src[1], src[2]
        cfg = layer.get_config()
        width_in = next((cfg[k] for k in _INPUT_WIDTH_KEYS if k in cfg), d)
        if width_in != d:
            raise Unsupported   # a width mismatch: the generic path names it
        if kind is Dense:
            code = ACTIVATIONS[layer.activation]
            if code == SOFTMAX:
                raise Unsupported
            dout = layer.out_features
            params = self._blocks(kt.OP_DENSE, layer, prefix)
            out = self._slot(dout, seq)
            pre = out if code == 0 else self._slot(dout, seq)
            self._row(kt.OP_DENSE, src, out, dout, aux=(pre, 0, 0), params=params,
                      ints=(code, 0), fpar=LEAKY_SLOPE)
            self.acc_size = max(self.acc_size, dout)
            return out, dout, seq
        if kind is LayerNorm:
            params = self._blocks(kt.OP_LAYER_NORM, layer, prefix)
            xhat, rstd, out = self._slot(d, seq), self._slot(1, seq), self._slot(d, seq)
            self._row(kt.OP_LAYER_NORM, src, out, d, aux=(xhat, rstd, 0), params=params,
                      fpar=layer.eps)
            self.acc_size = max(self.acc_size, 2 * d)
            return out, d, seq
        if kind is RMSNorm:
            params = self._blocks(kt.OP_RMS_NORM, layer, prefix)
            rinv, out = self._slot(1, seq), self._slot(d, seq)
            self._row(kt.OP_RMS_NORM, src, out, d, aux=(rinv, 0, 0), params=params,
                      fpar=layer.eps)
            self.acc_size = max(self.acc_size, d)
            return out, d, seq
        if kind is SwiGLU:
            h, dout = layer.hidden, layer.out
            params = self._blocks(kt.OP_SWIGLU, layer, prefix)
            au, hidden, out = self._slot(2 * h, seq), self._slot(h, seq), self._slot(dout, seq)
            self._row(kt.OP_SWIGLU, src, out, dout, aux=(au, hidden, 0), params=params,
                      ints=(h, 0))
            return out, dout, seq
        if kind in (RNN, LSTM):
            return self._recurrent(layer, kind is LSTM, src, prefix)
        if kind is MultiHeadAttention:
            if not seq:
                raise Unsupported   # attention needs (batch, seq, d): the generic path says so
            heads, dh = layer.heads, d // layer.heads
            params = self._blocks(kt.OP_ATTENTION, layer, prefix)
            qkv, att, out = self._slot(3 * d), self._slot(d), self._slot(d)
            probs = self.act_size   # per sample and head a (T, T) block
            self.act_size += self.max_samples * heads * self.steps * self.steps
            scale = float(self.dtype.type(1.0 / np.sqrt(dh)))
            self._row(kt.OP_ATTENTION, src, out, d, aux=(qkv, att, probs),
                      params=params, ints=(heads, int(layer.causal)),
                      fpar=scale)
            self.acc_size = max(self.acc_size, 3 * d)
            self.sc_size = max(self.sc_size, 4 * self.steps * dh + self.steps * self.steps)
            self.tmp_size = max(self.tmp_size, self.max_rows * d)
            return out, d, True
        raise Unsupported

    def _recurrent(self, layer, lstm, src, prefix):
        """An RNN or LSTM: its parameters (``w_ih``, ``w_hh``, ``b``), the time-major slots of
        its gates, states and cells, and its output (every state, or the last)."""
        d = src[1]
        if not src[2] or layer.input_size != d:
            raise Unsupported   # no time axis, or a width mismatch: the generic path says so
        h = layer.hidden_size
        op = kt.OP_LSTM if lstm else kt.OP_RNN
        params = self._blocks(op, layer, prefix)
        width = declared_shapes(layer)["b"][0]      # the gates' columns (LSTM: 4 per unit)
        gates = self._slot(width)
        hs = self._slot(h) if lstm else gates      # an RNN's states overwrite its gates
        cs = self._slot(h)                         # an RNN's holds its output's cotangent only
        tcs = self._slot(h) if lstm else cs
        work = self._slot(width)
        seq = bool(layer.return_sequences)
        out = self._slot(h, seq)
        self._row(op, src, out, h, aux=(gates, hs, cs), params=params, ints=(0, int(seq)),
                  aux_more=(tcs, work))
        self.acc_size = max(self.acc_size, width)
        self.sc_size = max(self.sc_size, PIECE * max(width, 2 * h))
        self.tmp_size = max(self.tmp_size, h * width)
        return out, h, seq

    def _parallel(self, layer, src, prefix):
        outs = [self._emit(child, src, f"{prefix}{i}.") for i, child in enumerate(layer.layers)]
        from fastlib.layers import Embedding

        if any(type(c) is Embedding for c in layer.layers) and len(outs) > 1:
            raise Unsupported  # two lookups of one index slot: left to the generic path
        seq = outs[0][2]
        if any(o[2] != seq for o in outs):
            raise Unsupported  # a branch with a time axis and one without: the generic path's
        if layer.combine == "add":
            if any(o[1] != outs[0][1] for o in outs):
                raise Unsupported
            # summed left to right, as the layer does
            acc = outs[0]
            if len(outs) == 1:
                out = self._slot(acc[1], seq)
                self._row(kt.OP_COLUMNS, acc, out, acc[1])
                return out, acc[1], seq
            for nxt in outs[1:]:
                out = self._slot(acc[1], seq)
                self._row(kt.OP_ADD, acc, out, acc[1], src_b=nxt[0])
                acc = (out, acc[1], seq)
            return acc
        total = sum(o[1] for o in outs)
        out = self._slot(total, seq)
        c0 = 0
        for o in outs:
            self._row(kt.OP_COLUMNS, o, out, total, ints=(c0, 0))
            c0 += o[1]
        return out, total, seq

    def _grad_modes(self):
        """Per row and input: write the cotangent, add it (a later consumer, in forward
        order, wrote first in the backward) or skip it (the model's input)."""
        written = set()
        for row in reversed(self.rows):
            if row[kt.F_OP] == kt.OP_EMBEDDING:
                continue
            operands = [(kt.F_IN, kt.F_GRAD_A)]
            if row[kt.F_OP] == kt.OP_ADD:
                operands.append((kt.F_AUX1, kt.F_GRAD_B))
            for field, mode in operands:
                slot = row[field]
                if slot == self.input_slot:
                    row[mode] = kt.GRAD_SKIP
                elif slot in written:
                    row[mode] = kt.GRAD_ADD
                else:
                    row[mode] = kt.GRAD_WRITE
                    written.add(slot)

    # -- parameters ----------------------------------------------------------------------------
    def _views(self, flat):
        for name, (off, rows, cols, c0, c1, shape) in self.layout.items():
            yield name, flat[off:off + rows * cols].reshape(rows, cols)[:, c0:c1].reshape(shape)

    def flatten(self, arrays):
        flat = np.zeros(self.param_size, self.dtype)
        for name, view in self._views(flat):
            view[...] = arrays[name]
        return flat

    def unflatten(self, flat, arrays):
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


def _make_program(ctx, x):
    from fastlib.layers import Parallel, Sequential

    model, cfg = ctx.model, ctx.config
    if not cfg.extra.get("fused", True) or cfg.device != "cpu" or cfg.algorithm != "bp":
        return None
    if ctx.loss_type not in fk.LOSS_CODES or type(model) not in (Sequential, Parallel):
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
