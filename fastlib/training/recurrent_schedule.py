"""The recurrent schedule of the program: a chain of Embedding (first) / RNN / LSTM / Dense
rows, run as whole epochs by the recurrent kernels (:mod:`fastlib.training.recurrent_kernels`),
each batch cut into pieces of sequences.

The plan is read from the program's rows (:mod:`fastlib.training.program`): widths from
``in_w`` / ``out_w``, an Embedding's table size and a Dense's activation from ``int0``, a
recurrent layer's ``return_sequences`` from ``int1``, parameter names and shapes from the
program's layout. The long story: docs/fastlib.md, section
``fastlib/training/recurrent_schedule.py``.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import transformer as kt
from fastlib.kernels.recurrent_pieces import PIECE
from fastlib.layers.activations import LEAKY_SLOPE
from fastlib.training import fused_kernels as fk
from fastlib.training import recurrent_kernels as rk
from fastlib.training import piece_plan
from fastlib.training.epoch_state import (epoch_inputs, epoch_settings, finish_epoch, flat_state,
                                          single_threaded_blas)
from fastlib.training.piece_plan import piece_threads
from fastlib.training.schedules import ScheduleError, register_schedule

_ALIGN = 16  # buffer offsets in entries: 64-byte rows for float32


# instruction kind -> the recurrent kernels' layer kind
_KINDS = {kt.OP_EMBEDDING: rk.EMBEDDING, kt.OP_DENSE: rk.DENSE, kt.OP_RNN: rk.RNN,
          kt.OP_LSTM: rk.LSTM}


class _Plan:
    """The model as a table of layers (``recurrent_kernels.meta`` without buffer offsets),
    the flat parameter layout, and the loss, read from the program's rows.

    ``rows`` are the chain's ``row_fields`` dicts, ``row_names`` each row's parameter names
    in block order, ``shapes`` the parameters' shapes by name.
    """

    def __init__(self, rows, row_names, shapes, dtype, loss_code):
        self.dtype = dtype
        self.loss_code = loss_code
        self.tokens = rows[0]["op"] == kt.OP_EMBEDDING
        meta = []
        seq = True
        self.names = []
        self.shapes = []
        for k, (r, names) in enumerate(zip(rows, row_names)):
            kind = _KINDS.get(r["op"])
            if kind is None or (kind == rk.EMBEDDING and k > 0):
                raise ScheduleError(f"the recurrent schedule runs a chain of Embedding (first), "
                                    f"RNN, LSTM and Dense rows; row {k} is op {r['op']}")
            m = np.zeros(rk.N_META, np.int64)
            m[rk.SEQ_IN] = seq
            m[rk.KIND], m[rk.DOUT] = kind, r["out_w"]
            if kind == rk.EMBEDDING:
                m[rk.DIN] = r["int0"]            # the table's rows
            else:
                m[rk.DIN] = r["in_w"]
            if kind == rk.DENSE:
                if r["int0"] not in fk.FUSED_CODES:
                    raise ScheduleError(f"row {k}: activation code {r['int0']} is not one the "
                                        "recurrent kernels apply")
                m[rk.ACT] = r["int0"]
            elif kind in (rk.RNN, rk.LSTM):
                seq = bool(r["int1"])            # return_sequences
            m[rk.SEQ_OUT] = seq
            for n in names:
                self.names.append(n)
                self.shapes.append(tuple(shapes[n]))
            meta.append(m)
        self.meta = np.array(meta, np.int64)
        self.seq_out = bool(seq)
        sizes = [int(np.prod(s)) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.size = int(self.offsets[-1])
        k = 0
        for row in self.meta:
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


def takes(program):
    """The program's rows when they are this schedule's: one chain of Embedding (first) /
    RNN / LSTM / Dense rows holding at least one Embedding or recurrent row; else None."""
    rows = program.chain()
    if not rows or any(r["op"] not in _KINDS for r in rows):
        return None
    if not any(r["op"] != kt.OP_DENSE for r in rows):
        return None                      # a plain MLP: the MLP schedule's (or the generic) model
    if any(r["op"] == kt.OP_EMBEDDING for r in rows[1:]):
        return None
    return rows


def plan_from_program(ctx, program, x):
    """The run's :class:`_Plan` when the program's rows are this schedule's (:func:`takes`)
    and the loss one its kernels take, else None; resolves and records the run's piece plan
    (batches of ``min(batch_size, N)`` sequences)."""
    rows = takes(program)
    n = x.shape[0]
    if rows is None or n < 1 or program.steps < 1:
        return None
    if rows[0]["op"] == kt.OP_EMBEDDING:
        if x.ndim != 2:
            return None
    elif x.ndim != 3:
        return None
    shapes = {name: entry[5] for name, entry in program.layout.items()}
    plan = _Plan(rows, program.row_names, shapes, program.dtype, fk.LOSS_CODES[ctx.loss_type])
    if plan.seq_out and ctx.loss_type not in ("mse", "binary_cross_entropy_with_logits"):
        return None
    bs = min(ctx.config.batch_size, n)
    plan.piece_plan = piece_plan.resolve(ctx, lambda cores: machine_pieces(bs, cores))
    return plan


def run(ctx, plan, x, y, order):
    """Train one epoch of ``plan`` (:func:`plan_from_program`) in the recurrent kernels.

    ``x`` holds inputs ``(N, T, features)`` in the model's dtype, or ``(N, T)`` token ids for
    a model that starts with an Embedding (validated by ``train``; ids are range-checked
    here); ``y`` the targets as ``fastlib.losses.validate_targets`` normalised them; ``order``
    the epoch's sample order (None for 0..N-1). Returns the epoch's ``EpochStats``.
    """
    if plan.tokens:
        # NOTE: the kernel indexes the table without checks: the layer's own validation
        # (whole numbers in [0, num)) runs first, with its message
        idx = _indices(ctx.model, x)
        x3 = np.zeros((0, 0, 0), plan.dtype)
    else:
        x3 = np.ascontiguousarray(x, dtype=plan.dtype)
        idx = np.zeros((0, 0), np.int64)
    n, steps = x.shape[0], x.shape[1]
    dtype = plan.dtype
    bs = min(ctx.config.batch_size, n)
    order, yi, yf = epoch_inputs(ctx, y, order, n, dtype, n * steps if plan.seq_out else n)
    pieces = plan.piece_plan
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
    # contend with our threads (mlp_schedule's NOTE)
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


register_schedule("recurrent", plan_from_program, run)
