"""The compiled training path for attention models: whole epochs of back-propagation in Numba.

The long story: docs/fastlib.md, section ``fastlib/training/compiled_attention.py``.
"""
from __future__ import annotations

import math

import numpy as np

from fastlib.kernels import transformer as kt
from fastlib.kernels.recurrent_pieces import PIECE
from fastlib.training import fused_kernels as fk
from fastlib.training import skeleton as sk
from fastlib.training.epoch_state import (epoch_inputs, epoch_settings, finish_epoch, flat_state,
                                          single_threaded_blas)
from fastlib.training import piece_plan
from fastlib.training.compiled_paths import register_compiled_path
from fastlib.training.instructions import INSTRUCTIONS, ProgramError, check_program
from fastlib.training.piece_plan import piece_threads
from optable.parameters import kind_of, layer_sizes, parameter_shapes

# NOTE (speed): a batch is cut into the run's piece plan's P pieces of samples
# (fastlib.training.piece_plan; a batch of fewer samples into one piece per sample), each on
# its own thread. The machine's choice: one piece per usable core from MIN_PIECE_ROWS rows
# (samples x positions) per batch up, one piece below (a parallel region costs a few
# microseconds). The pieces depend on the plan and the batch's shape only, never on the cores
# idle now, so a run's result is the same whatever the machine's load.
MIN_PIECE_ROWS = 64
# the gradient is added up and the optimizer applied in chunks of at least CHUNK_MIN_PARAMS
# parameters, at most one per piece (the chunks fix the sum of squares' order: a function of
# the plan and the parameter count)
CHUNK_MIN_PARAMS = 1 << 14



class _Unsupported(Exception):
    """The model holds something this path does not compile (the generic path trains it)."""


# the config keys that hold a layer kind's input width (its declared sizing keys)
_INPUT_WIDTH_KEYS = ("in_features", "d", "d_model", "input_size")


def declared_shapes(layer):
    """``{parameter name: shape}`` as the layer kind declares it (``optable.parameters``), the
    one declaration the layer, the file loader, reflib and this builder share."""
    return parameter_shapes(kind_of(layer), layer_sizes(layer))


def _as_matrix(shape):
    """The (rows, columns) a parameter of ``shape`` spans in a block: a vector is one row."""
    return (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))


class _Program:
    """A model compiled for one batch shape: program rows, buffer sizes, parameter layout."""

    def __init__(self, model, dtype, steps, max_samples, d_in, tokens, d_in_seq):
        self.dtype = dtype
        self.steps = steps
        self.max_rows = max_samples * steps
        self.max_samples = max_samples
        self.rows, self.fpar = [], []
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

    # -- building ------------------------------------------------------------------------------
    def _slot(self, width, seq=True):
        off = self.act_size
        self.act_size += self.max_samples * (self.steps if seq else 1) * width
        return off

    def _blocks(self, op, layer, prefix):
        """Lay out ``layer``'s parameters in the blocks its instruction kind names (``p0``,
        ``p1``, ... in order; ``instructions.INSTRUCTIONS``), each block holding its
        parameters' declared shapes side by side as column ranges. Returns the four
        parameter fields' offsets."""
        shapes = declared_shapes(layer)
        offsets = [0, 0, 0, 0]
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
                c0 += width
            offsets[int(field[1:])] = off
        return tuple(offsets)

    def _row(self, op, src, out, out_w, aux=(0, 0, 0), params=(0, 0, 0, 0), ints=(0, 0),
             fpar=0.0, src_b=-1, aux_more=(0, 0)):
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
            raise _Unsupported
        if kind is Embedding:
            if not (self.tokens and src[0] == self.input_slot):
                raise _Unsupported
            params = self._blocks(kt.OP_EMBEDDING, layer, prefix)
            out = self._slot(layer.dim)
            self._row(kt.OP_EMBEDDING, src, out, layer.dim, params=params, ints=(layer.num, 0))
            self.acc_size = max(self.acc_size, layer.num * layer.dim)
            return out, layer.dim, True
        d, seq = src[1], src[2]
        cfg = layer.get_config()
        width_in = next((cfg[k] for k in _INPUT_WIDTH_KEYS if k in cfg), d)
        if width_in != d:
            raise _Unsupported   # a width mismatch: the generic path names it
        if kind is Dense:
            code = ACTIVATIONS[layer.activation]
            if code == SOFTMAX:
                raise _Unsupported
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
                raise _Unsupported   # attention needs (batch, seq, d): the generic path says so
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
        raise _Unsupported

    def _recurrent(self, layer, lstm, src, prefix):
        """An RNN or LSTM: its parameters (``w_ih``, ``w_hh``, ``b``), the time-major slots of
        its gates, states and cells, and its output (every state, or the last)."""
        d = src[1]
        if not src[2] or layer.input_size != d:
            raise _Unsupported   # no time axis, or a width mismatch: the generic path says so
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
        self._row(op, src, out, h, aux=(gates, hs, cs), params=params, ints=(0, int(seq)), aux_more=(tcs, work))
        self.acc_size = max(self.acc_size, width)
        self.sc_size = max(self.sc_size, PIECE * max(width, 2 * h))
        self.tmp_size = max(self.tmp_size, h * width)
        return out, h, seq

    def _parallel(self, layer, src, prefix):
        outs = [self._emit(child, src, f"{prefix}{i}.") for i, child in enumerate(layer.layers)]
        from fastlib.layers import Embedding

        if any(type(c) is Embedding for c in layer.layers) and len(outs) > 1:
            raise _Unsupported  # two lookups of one index slot: left to the generic path
        seq = outs[0][2]
        if any(o[2] != seq for o in outs):
            raise _Unsupported  # a branch with a time axis and one without: the generic path's
        if layer.combine == "add":
            if any(o[1] != outs[0][1] for o in outs):
                raise _Unsupported
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


def _contains(layer, kinds):
    if isinstance(layer, kinds):
        return True
    return any(_contains(c, kinds) for c in getattr(layer, "layers", ()))


def _own_kinds():
    """The layers that bring a model to this path (Dense / Embedding chains, and chains of
    RNN / LSTM / Dense / Embedding, are other paths' models; tried first, they keep them)."""
    from fastlib.layers import LSTM, RNN, LayerNorm, MultiHeadAttention, Parallel, RMSNorm, SwiGLU

    return MultiHeadAttention, LayerNorm, RMSNorm, SwiGLU, RNN, LSTM, Parallel


def program_for(ctx, x):
    """The run's :class:`_Program` for data ``x`` (cached per run and shape), or None when the
    model or run is outside this path."""
    key = ("attention_program", x.shape[1:], x.dtype.kind)
    if key in ctx.scratch:
        return ctx.scratch[key]
    ctx.scratch[key] = prog = _make_program(ctx, x)
    return prog


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
    if not _contains(model, _own_kinds()):
        return None   # Dense / Embedding models alone belong to other paths
    bs = ctx.config.batch_size
    plan = piece_plan.resolve(ctx, lambda cores: machine_pieces(bs, steps, cores), record=False)
    # the largest piece of any batch
    max_samples = -(-bs // plan.pieces)
    try:
        prog = _Program(model, np.dtype(model.dtype), steps, max_samples, d_in, tokens,
                        x.ndim == 3)
    except _Unsupported:
        return None
    if set(prog.layout) != set(ctx.params):
        return None
    piece_plan.record_plan(ctx, plan)
    prog.piece_plan = plan
    prog.pieces = min(plan.pieces, bs)
    prog.chunks = max(1, min(prog.pieces, prog.param_size // CHUNK_MIN_PARAMS))
    prog.cuts = sk.even_cuts(prog.param_size, prog.chunks)
    return prog


def machine_pieces(batch, steps, cores):
    """The pieces this schedule chooses for batches of ``batch`` samples of ``steps``
    positions on ``cores`` usable cores (see the NOTE at :data:`MIN_PIECE_ROWS`)."""
    if batch * steps < MIN_PIECE_ROWS:
        return 1
    return max(1, min(cores, batch))


def run_epoch(ctx, x, y, order):
    """Train one epoch in compiled code; None when the model or run does not fit this path.

    The contract of every compiled path (``compiled_paths.register_compiled_path``): the run's
    context ``ctx``, the targets ``y`` and the epoch's ``order``; ``x`` holds inputs ``(N, T,
    d)`` or ``(N, d)`` in the model's dtype, or token indices ``(N, T)`` for a model that
    starts with an Embedding. Returns the epoch's ``EpochStats``, or None having changed
    nothing.
    """
    prog = program_for(ctx, x)
    if prog is None:
        return None
    dtype = prog.dtype
    n = x.shape[0]
    bs = ctx.config.batch_size
    steps = prog.steps
    if prog.tokens:
        xi = _first_embedding(ctx.model).indices(x)   # the layer's own checks and errors
        xf = np.zeros((1, 1), dtype)
    else:
        xi = np.zeros((1, 1), np.int64)
        xf = np.ascontiguousarray(x, dtype=dtype).reshape(n, -1)
    code = fk.LOSS_CODES[ctx.loss_type]
    order, yi, yf = epoch_inputs(ctx, y, order, n, dtype)
    opt = ctx.optimizer
    w, slots = flat_state(ctx, prog, dtype)
    buffers = _buffers(ctx, prog, bs)
    coeffs, clip_mode, clip = epoch_settings(ctx, -(-n // bs), dtype)
    threads = piece_threads(prog.pieces)
    args = (xf, xi, prog.tokens, yi, yf, order, bs, steps, threads, prog.pieces, prog.cuts,
            prog.prog, prog.fpar_arr, prog.out_slot, prog.out_w, code, opt.kind, coeffs,
            clip_mode, float(clip), w, slots[0], slots[1], *buffers)
    with single_threaded_blas():
        out = kt.epoch(*args)
    return finish_epoch(ctx, prog, w, slots, out, n, bs, "attention", prog.piece_plan)


def _first_embedding(model):
    while hasattr(model, "layers"):
        model = model.layers[0]
    return model


def _buffers(ctx, prog, bs):
    """Every buffer of the epoch, allocated once per run and shape."""
    key = ("attention_buffers", id(prog), bs)
    if key in ctx.scratch:
        return ctx.scratch[key]
    dtype = prog.dtype
    pieces = prog.pieces
    g = np.zeros(prog.param_size, dtype)
    part = np.zeros((pieces, prog.param_size), dtype)
    act = np.zeros((pieces, max(prog.act_size, 1)), dtype)
    gact = np.zeros((pieces, max(prog.act_size, 1)), dtype)
    tok = np.zeros((pieces, max(prog.max_rows, 1)), np.int64)
    acc = np.zeros((pieces, max(prog.acc_size, 1)), np.float64)
    tmp = np.zeros((pieces, max(prog.tmp_size, 1)), dtype)
    sc = np.zeros((pieces, max(prog.sc_size, 1)), dtype)
    width = prog.out_w
    out_all = np.zeros(bs * width, dtype)
    dz_all = np.zeros(bs * width, dtype)
    sumsq = np.zeros(prog.chunks, np.float64)
    ctx.scratch[key] = buffers = (g, part, act, gact, tok, acc, tmp, sc, out_all, dz_all, sumsq)
    return buffers


register_compiled_path("attention", run_epoch)
