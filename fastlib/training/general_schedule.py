"""The general schedule: the program's rows interpreted by one Numba epoch
(:func:`fastlib.kernels.transformer.epoch`), a batch cut into pieces of samples.

It runs every program the specialised schedules (:mod:`fastlib.training.mlp_schedule`,
:mod:`fastlib.training.recurrent_schedule`) decline: attention, norms, SwiGLU, ``Parallel``
joins, recurrent layers among them. The long story: docs/fastlib.md, section
``fastlib/training/general_schedule.py``.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import transformer as kt
from fastlib.training import fused_kernels as fk
from fastlib.training import piece_plan
from fastlib.training import skeleton as sk
from fastlib.training.epoch_state import (epoch_inputs, epoch_settings, finish_epoch, flat_state,
                                          single_threaded_blas)
from fastlib.training.piece_plan import piece_threads
from fastlib.training.schedules import register_schedule

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

# instruction kinds of a chain the generic loop keeps when the specialised schedules decline
# it (see plan_from_program)
_CHAIN_KINDS = frozenset((kt.OP_DENSE, kt.OP_EMBEDDING))


def plan_from_program(ctx, program, x):
    """The program sized for this run's pieces, with its piece plan and update chunks; None
    for a program of Dense and Embedding rows only.

    NOTE: such a program reaches here only when the MLP and recurrent schedules declined it: a
    Dense chain on ``(N, T, d)`` data, or a sequence output under a loss the recurrent schedule
    does not take. The interpreter's loss reads the output as one row per sample, while the
    generic loop's losses read it per position, so these stay the generic loop's.
    """
    if all(r["op"] in _CHAIN_KINDS for r in program.fields()):
        return None
    bs = ctx.config.batch_size
    steps = program.steps
    plan = piece_plan.resolve(ctx, lambda cores: machine_pieces(bs, steps, cores))
    # sized for the largest piece of any batch
    sized = program.sized_for(-(-bs // plan.pieces))
    sized.piece_plan = plan
    sized.pieces = min(plan.pieces, bs)
    sized.chunks = max(1, min(sized.pieces, sized.param_size // CHUNK_MIN_PARAMS))
    sized.cuts = sk.even_cuts(sized.param_size, sized.chunks)
    return sized


def machine_pieces(batch, steps, cores):
    """The pieces this schedule chooses for batches of ``batch`` samples of ``steps``
    positions on ``cores`` usable cores (see the NOTE at :data:`MIN_PIECE_ROWS`)."""
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
    return finish_epoch(ctx, prog, w, slots, out, n, bs, "general", prog.piece_plan)


def _first_embedding(model):
    while hasattr(model, "layers"):
        model = model.layers[0]
    return model


def _buffers(ctx, prog, bs):
    """Every buffer of the epoch, allocated once per run and shape."""
    key = ("general_buffers", id(prog), bs)
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


register_schedule("general", plan_from_program, run)
