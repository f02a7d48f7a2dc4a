"""The whole-epoch compiled path for recurrent models: RNN, LSTM, Embedding and Dense in a
``Sequential``, trained by back-propagation on the CPU.

The long story: docs/fastlib.md, section ``fastlib/training/compiled_recurrent.py``.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels.recurrent_pieces import PIECE
from fastlib.layers.activations import ACTIVATIONS, LEAKY_SLOPE
from fastlib.training import fused_kernels as fk
from fastlib.training import recurrent_kernels as rk
from fastlib.training import piece_plan
from fastlib.training.compiled_paths import register_compiled_path
from fastlib.training.epoch_state import (epoch_inputs, epoch_settings, finish_epoch, flat_state,
                                          single_threaded_blas)
from fastlib.training.piece_plan import piece_threads

_ALIGN = 16  # buffer offsets in entries: 64-byte rows for float32


def _chain(model, prefix=""):
    """``[(layer, name prefix)]`` of a Sequential read as one chain, or None."""
    from fastlib.layers import Sequential

    if type(model) is not Sequential:
        return None
    out = []
    for i, layer in enumerate(model.layers):
        if type(layer) is Sequential:
            inner = _chain(layer, f"{prefix}{i}.")
            if inner is None:
                return None
            out += inner
        else:
            out.append((layer, f"{prefix}{i}."))
    return out


class _Plan:
    """The model as a table of layers (``recurrent_kernels.meta`` without buffer offsets),
    the flat parameter layout, and the loss."""

    def __init__(self, chain, dtype, loss_code):
        from fastlib.layers import LSTM, Dense, Embedding

        self.dtype = dtype
        self.loss_code = loss_code
        self.tokens = type(chain[0][0]) is Embedding
        rows = []
        seq = True
        self.names = []
        self.shapes = []
        for layer, prefix in chain:
            m = np.zeros(rk.N_META, np.int64)
            m[rk.SEQ_IN] = seq
            if type(layer) is Embedding:
                m[rk.KIND], m[rk.DIN], m[rk.DOUT] = rk.EMBEDDING, layer.num, layer.dim
                names = ["weight"]
            elif type(layer) is Dense:
                m[rk.KIND], m[rk.DIN], m[rk.DOUT] = rk.DENSE, layer.in_features, \
                    layer.out_features
                m[rk.ACT] = ACTIVATIONS[layer.activation]
                names = ["weight", "bias"]
            else:
                m[rk.KIND] = rk.LSTM if type(layer) is LSTM else rk.RNN
                m[rk.DIN], m[rk.DOUT] = layer.input_size, layer.hidden_size
                seq = layer.return_sequences
                names = ["w_ih", "w_hh", "b"]
            m[rk.SEQ_OUT] = seq
            params = layer.parameters()
            for n in names:
                self.names.append(prefix + n)
                self.shapes.append(params[n].shape)
            rows.append(m)
        self.meta = np.array(rows, np.int64)
        self.seq_out = bool(seq)
        sizes = [int(np.prod(s)) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.size = int(self.offsets[-1])
        k = 0
        for row, (layer, _) in zip(self.meta, chain):
            n = 1 if row[rk.KIND] == rk.EMBEDDING else (2 if row[rk.KIND] == rk.DENSE else 3)
            row[rk.W_OFF] = self.offsets[k]
            row[rk.W2_OFF] = self.offsets[k + 1] if n == 3 else -1
            row[rk.B_OFF] = self.offsets[k + n - 1] if n > 1 else -1
            k += n
        blocks = list(range(0, self.size, rk.BLOCK)) + [self.size]
        self.blk = np.array(blocks, np.int64)
        self._buffers = None

    def flatten(self, arrays):
        """The arrays of ``names`` as one flat vector of the model's dtype."""
        return np.concatenate([np.asarray(arrays[n]).reshape(-1) for n in self.names]).astype(
            self.dtype, copy=False)

    def unflatten(self, flat, arrays):
        """Copy the flat vector back into the arrays of ``names``, in place."""
        for i, n in enumerate(self.names):
            lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
            np.copyto(arrays[n], flat[lo:hi].reshape(arrays[n].shape))

    def buffers(self, batch, steps, piece):
        """Workspaces for batches of ``batch`` sequences of ``steps`` steps in pieces of
        ``piece`` sequences (planned once per shape, kept for the run): the per-piece rows,
        offsets and scratch."""
        key = (batch, steps, piece)
        if self._buffers is not None and self._buffers[0] == key:
            return self._buffers[1]
        meta = self.meta
        off = [0]

        def take(n):
            start = off[0]
            off[0] += -(-int(n) // _ALIGN) * _ALIGN
            return start

        cap_t = steps * piece
        widths = [int(r[rk.DOUT]) * (4 if r[rk.KIND] == rk.LSTM else 1) for r in meta]
        hidden = max([int(r[rk.DOUT]) for r in meta] + [1])
        scratch = np.zeros(rk.N_SCRATCH, np.int64)
        scratch[rk.S_IN] = take(0 if self.tokens else cap_t * meta[0, rk.DIN])
        scratch[rk.S_Z] = take(piece * max(widths))
        scratch[rk.S_DH] = take(piece * hidden)
        scratch[rk.S_DC] = take(piece * hidden)
        wide64 = max(widths)
        for r in meta:
            kind, dout = r[rk.KIND], r[rk.DOUT]
            rows_in = cap_t if r[rk.SEQ_IN] else piece
            rows_out = cap_t if r[rk.SEQ_OUT] else piece
            if kind == rk.EMBEDDING:
                r[rk.O_OUT] = take(cap_t * dout)
                wide64 = max(wide64, int(r[rk.DIN] * dout))
            elif kind == rk.DENSE:
                r[rk.O_PRE] = take(rows_in * dout)
                r[rk.O_OUT] = take(rows_out * dout)
            else:
                width = dout * (4 if kind == rk.LSTM else 1)
                r[rk.O_PRE] = take(cap_t * width)
                if kind == rk.LSTM:
                    r[rk.O_HS] = take(cap_t * dout)
                    r[rk.O_C] = take(cap_t * dout)
                    r[rk.O_TC] = take(cap_t * dout)
                else:
                    r[rk.O_HS] = r[rk.O_PRE]
                r[rk.O_OUT] = r[rk.O_HS] if r[rk.SEQ_OUT] else take(piece * dout)
                r[rk.O_DZ] = take(cap_t * width)
            r[rk.O_GOUT] = take(rows_out * dout)
        pieces = -(-batch // piece)
        bufs = {"meta": meta, "scratch": scratch,
                "ws": np.zeros((pieces, off[0]), self.dtype),
                "ws64": np.zeros((pieces, wide64), np.float64),
                "gp": np.zeros((pieces, self.size), self.dtype),
                "g": np.zeros(self.size, self.dtype),
                "rows": np.zeros((pieces, cap_t), np.int64)}
        self._buffers = (key, bufs)
        return bufs


def plan_for(ctx):
    """A :class:`_Plan` when the recurrent path applies to this run's model, else None
    (decided once per run)."""
    if "recurrent_plan" not in ctx.scratch:
        ctx.scratch["recurrent_plan"] = _make_plan(ctx)
    return ctx.scratch["recurrent_plan"]


def _make_plan(ctx):
    from fastlib.layers import LSTM, RNN, Dense, Embedding

    model, cfg = ctx.model, ctx.config
    if not cfg.extra.get("fused", True) or cfg.device != "cpu" or cfg.algorithm != "bp":
        return None
    if ctx.loss_type not in fk.LOSS_CODES:
        return None
    chain = _chain(model)
    if not chain:
        return None
    kinds = [type(layer) for layer, _ in chain]
    if not any(k in (RNN, LSTM, Embedding) for k in kinds):
        return None                      # a plain MLP: the MLP path's (or the generic) model
    if any(k not in (RNN, LSTM, Dense, Embedding) for k in kinds) or Embedding in kinds[1:]:
        return None
    seq = True
    for layer, _ in chain:
        if type(layer) in (RNN, LSTM):
            if not seq:
                return None              # the generic path will say why (a 2-D input)
            seq = layer.return_sequences
        elif type(layer) is Dense and ACTIVATIONS[layer.activation] not in fk.FUSED_CODES:
            return None
    if seq and ctx.loss_type not in ("mse", "binary_cross_entropy_with_logits"):
        return None
    plan = _Plan(chain, np.dtype(model.dtype), fk.LOSS_CODES[ctx.loss_type])
    if list(ctx.params) != plan.names:
        return None
    return plan


def run_epoch(ctx, x, y, order):
    """Train one epoch in the compiled kernel; None when the model or run does not fit it.

    The contract of every compiled path (``compiled_paths.register_compiled_path``): the run's
    context ``ctx``, the targets ``y`` and the epoch's ``order``; ``x`` holds inputs ``(N, T,
    features)`` in the model's dtype, or ``(N, T)`` token ids for a model that starts with an
    Embedding (validated by ``train``; ids are range-checked here). Returns the epoch's
    ``EpochStats``, or None having changed nothing.
    """
    plan = plan_for(ctx)
    if plan is None:
        return None
    if plan.tokens:
        if x.ndim != 2:
            return None
        # NOTE: the kernel indexes the table without checks: the layer's own validation
        # (whole numbers in [0, num)) runs first, with its message
        idx = _indices(ctx.model, x)
        x3 = np.zeros((0, 0, 0), plan.dtype)
    else:
        if x.ndim != 3 or x.shape[2] != plan.meta[0, rk.DIN]:
            return None
        x3 = np.ascontiguousarray(x, dtype=plan.dtype)
        idx = np.zeros((0, 0), np.int64)
    n, steps = x.shape[0], x.shape[1]
    if steps < 1 or n < 1:
        return None
    dtype = plan.dtype
    bs = min(ctx.config.batch_size, n)
    order, yi, yf = epoch_inputs(ctx, y, order, n, dtype, n * steps if plan.seq_out else n)
    pieces = piece_plan.resolve(ctx, lambda cores: machine_pieces(bs, cores))
    # sequences per piece: the plan's P pieces of the batch (the last ones shorter); a plan
    # of more pieces than sequences gives pieces of one sequence
    piece = -(-bs // pieces.pieces)
    bufs = plan.buffers(bs, steps, piece)
    opt = ctx.optimizer
    w, slots = flat_state(ctx, plan, dtype)
    coeffs, clip_mode, clip = epoch_settings(ctx, -(-n // bs), dtype)
    threads = piece_threads(-(-bs // piece))
    args = (x3, idx, yi, yf, order, bs, steps, piece, threads, bufs["meta"], bufs["scratch"],
            dtype.type(LEAKY_SLOPE), plan.loss_code, opt.kind, coeffs, clip_mode, float(clip),
            w, slots[0], slots[1], bufs["g"], bufs["gp"], bufs["ws"], bufs["ws64"],
            bufs["rows"], plan.blk)
    # NOTE: BLAS on the calling thread only, whatever our thread count: the products inside a
    # piece are small (8 x 128 @ 128 x 512 per step), and a multi-threaded OpenBLAS splits them
    # anyway; on a loaded machine its workers' hand-offs made a batch-32 epoch 2.3x slower than
    # the generic path (measured, load 14: 13.8 s against 5.9 s), and in parallel pieces they
    # contend with our threads (fused_mlp's NOTE)
    with single_threaded_blas():
        out = rk.epoch(*args)
    # per-step rows: the generic path's accuracy counts a sequence's steps as one row each
    return finish_epoch(ctx, plan, w, slots, out, n, bs, "recurrent", pieces,
                        steps if plan.seq_out else 1.0)


def machine_pieces(batch, cores):
    """The pieces this schedule chooses for batches of ``batch`` sequences on ``cores``
    usable cores: at least one per core (down to pieces of one sequence), and pieces of at
    most :data:`~fastlib.kernels.recurrent_pieces.PIECE` sequences, the per-step product's
    best shape."""
    return max(min(cores, batch), -(-batch // PIECE))


def _indices(model, x):
    """``x`` as checked int64 token ids of the model's first (Embedding) layer."""
    from fastlib.layers import Sequential

    first = model
    while type(first) is Sequential:
        first = first.layers[0]
    return np.ascontiguousarray(first.indices(x))


register_compiled_path("recurrent", run_epoch)
