"""The general schedule: the program's rows interpreted by the one compiled epoch
(:func:`fastlib.kernels.interpreter.epoch`), each batch cut into pieces of samples.

It runs every program the MLP schedule (:mod:`fastlib.training.mlp_schedule`) declines:
recurrent chains, attention, norms, SwiGLU, ``Parallel`` joins, Dense chains on ``(N, T, d)``
data, in the model's dtype or in mixed precision (16-bit weights, unit outputs, cotangents
and gradients over float32 masters, rounded where the per-batch path rounds them). The long
story: docs/architecture.md, "Training".
"""
from __future__ import annotations

import numpy as np

from fastlib.compile_once import call_typed
from fastlib.kernels import instructions as ins
from fastlib.kernels import interpreter as ki
from fastlib.kernels import skeleton as sk
from fastlib.kernels.recurrent import PIECE
from fastlib.training import piece_plan
from fastlib.training.epoch_state import (epoch_inputs, epoch_precision, epoch_update,
                                          finish_epoch, flat_state, keep_loss_scale,
                                          single_threaded_blas)
from fastlib.training.piece_plan import piece_threads
from fastlib.training.schedules import register_schedule
from optable.losses import LOSS_CODES

# NOTE (speed): a batch is cut into the run's piece plan's P pieces of ceil(batch / P) samples
# (fastlib.training.piece_plan), each on its own thread. The machine's choice: one piece per
# usable core from MIN_PIECE_ROWS rows (samples x positions) per batch up, one piece below (a
# parallel region costs a few microseconds); with a recurrent row, pieces of at most
# recurrent.PIECE sequences, the per-step product's best shape. The pieces depend on the plan
# and the batch's shape only, never on the cores idle now, so a run's result is the same
# whatever the machine's load.
MIN_PIECE_ROWS = 64
_RECURRENT = frozenset((ins.RNN, ins.LSTM))


def plan_from_program(ctx, program, x):
    """The program sized for this run's pieces, with its piece plan; it takes every program,
    and in mixed precision every one whose rows say where its units end (``Program.rounds``)."""
    if ctx.scratch.get("mixed_precision") is not None and program.rounds is None:
        return None
    bs = min(ctx.config.batch_size, x.shape[0])
    steps = program.steps
    recurrent = bool(program.kinds() & _RECURRENT)
    plan = piece_plan.resolve(ctx, lambda cores: machine_pieces(bs, steps, recurrent, cores))
    # sized for the largest piece of any batch
    sized = program.sized_for(-(-bs // plan.pieces))
    sized.piece_plan = plan
    return sized


def machine_pieces(batch, steps, recurrent, cores):
    """The pieces this schedule chooses for batches of ``batch`` samples of ``steps``
    positions on ``cores`` usable cores (see the NOTE at :data:`MIN_PIECE_ROWS`)."""
    if recurrent:
        return max(min(cores, batch), -(-batch // PIECE))
    if batch * steps < MIN_PIECE_ROWS:
        return 1
    return max(1, min(cores, batch))


def run(ctx, prog, x, y, order):
    """Train one epoch of the sized program ``prog`` (:func:`plan_from_program`).

    ``x`` holds inputs ``(N, T, d)`` or ``(N, d)`` in the model's dtype, or token indices
    ``(N, T)`` for a model that starts with an Embedding; ``y`` the targets as
    ``fastlib.losses.validate_targets`` normalised them; ``order`` the epoch's sample order
    (None for 0..N-1). Returns the epoch's ``EpochStats``.
    """
    dtype = prog.dtype
    n = x.shape[0]
    bs = min(ctx.config.batch_size, n)
    if prog.tokens:
        # NOTE: the kernel indexes the table without checks: the layer's own validation
        # (whole numbers in [0, num)) runs first, with its message
        tokens = np.ascontiguousarray(_first_embedding(ctx.model).indices(x))
        features = np.zeros((0, 0), dtype)
    else:
        tokens = np.zeros((0, 0), np.int64)
        features = np.ascontiguousarray(x, dtype=dtype).reshape(n, -1)
    out = prog.tables.slots[prog.output_slot]
    out_steps = int(out["steps"])
    order, classes, values = epoch_inputs(ctx, y, order, n, dtype, n * out_steps)
    w, slots = flat_state(ctx, prog, dtype)
    piece = prog.max_samples
    plan = ki.EpochPlan(prog.tables, prog.input_slot, prog.output_slot, prog.steps, bs, piece,
                        piece_threads(-(-bs // piece)), LOSS_CODES[ctx.loss_type],
                        sk.block_cuts(prog.param_size), prog.tokens, prog.rounds)
    part, bufs = _buffers(ctx, prog, bs, plan.cuts)
    state = ki.EpochState(w, slots[0], slots[1], part)
    data = ki.EpochData(features, tokens, classes, values, order)
    prec = epoch_precision(ctx, w)
    args = (plan, data, state, bufs, epoch_update(ctx, -(-n // bs), dtype), prec,
            *_entries(ctx, prog, bs, plan, data, state, bufs, prec))
    with single_threaded_blas():
        stats = call_typed(ki.epoch, *args)
    keep_loss_scale(ctx, prec)
    # a sequence output's rows are its positions: the accuracy counts each sample once
    return finish_epoch(ctx, prog, w, slots, stats, n, bs, "general", prog.piece_plan, part,
                        out_steps)


def _entries(ctx, prog, bs, plan, data, state, bufs, prec):
    """The piece kernel's native entry and its row kernels' table, found once per run and
    shape: typing the arguments again took a millisecond, a third of a small epoch (the
    entries' keys still check them)."""
    key = ("general_piece_entry", id(prog), bs)
    if key not in ctx.scratch:
        kernels = ki.row_kernels(plan, bufs)
        ctx.scratch[key] = (ki.piece_entry(plan, data, state, bufs, prec, kernels), kernels)
    return ctx.scratch[key]


def _first_embedding(model):
    while hasattr(model, "layers"):
        model = model.layers[0]
    return model


def _buffers(ctx, prog, bs, cuts):
    """The summed gradient and every buffer of the epoch, allocated once per run and shape."""
    key = ("general_buffers", id(prog), bs)
    if key not in ctx.scratch:
        dtype = prog.dtype
        pieces = -(-bs // prog.max_samples)
        rows = prog.max_rows
        out_rows = prog.max_samples * int(prog.tables.slots[prog.output_slot]["steps"])
        need = prog.scratch
        bufs = ki.EpochBuffers(
            part=np.zeros((pieces, prog.param_size), dtype),
            act=np.zeros((pieces, max(prog.act_size, 1)), dtype),
            gact=np.zeros((pieces, max(prog.act_size, 1)), dtype),
            tok=np.zeros((pieces, max(rows, 1)), np.int64),
            acc=np.zeros((pieces, need["acc"]), np.float64),
            tmp=np.zeros((pieces, need["tmp"]), dtype),
            sc=np.zeros((pieces, need["sc"]), dtype),
            target_rows=np.zeros((pieces, out_rows), np.int64),
            totals=np.zeros(pieces, np.float64), corrects=np.zeros(pieces, np.float64),
            sumsq=np.zeros(cuts.shape[0] - 1, np.float64))
        ctx.scratch[key] = (np.zeros(prog.param_size, dtype), bufs)
    return ctx.scratch[key]


register_schedule("general", plan_from_program, run)
