"""The MLP schedule of the program: a chain of Dense rows on ``(N, d)`` data, run as whole
epochs by the column epoch (:mod:`fastlib.kernels.dense_columns`), each layer pair cut into
pieces of columns and rows.

The plan is read from the program's rows (:mod:`fastlib.training.program`): widths from their
``x`` and ``y`` slots, activation codes from ``activation``, parameter names from the rows'
blocks. It also runs a mixed-precision run's epochs (``fastlib.training.mixed_precision``):
16-bit weights, outputs and cotangents over float32 masters, with the run's loss scale. Why
it is kept beside the general schedule: docs/architecture.md, "Training".
"""
from __future__ import annotations

import numpy as np

from fastlib.compile_once import call_typed
from fastlib.kernels import dense_columns as kc
from fastlib.kernels import instructions as ins
from fastlib.kernels.interpreter import EpochData, EpochState
from fastlib.layers.activations import LEAKY_SLOPE
from fastlib.training import piece_plan
from fastlib.training.epoch_state import (epoch_inputs, epoch_precision, epoch_update,
                                          finish_epoch, flat_state, keep_loss_scale,
                                          single_threaded_blas)
from fastlib.training.piece_plan import piece_threads
from fastlib.training.schedules import ScheduleError, register_schedule
from optable.losses import LOSS_CODES

# NOTE (speed): every layer pair is cut into the run's piece plan's P pieces (model
# parallelism inside one step, see dense_columns and fastlib.training.piece_plan): each thread
# forms its pieces' activations, gradients and update from its own contiguous parameter block,
# which stays in its core's cache, and BLAS runs single-threaded inside each piece. The
# machine's choice: one piece below SPLIT_MIN_PARAMS parameters (a parallel region costs
# ~4 us, more than a tiny step), else one per usable core, but never pieces of fewer than
# MIN_PIECE_PARAMS parameters (smaller GEMMs stop paying for their hand-off).
SPLIT_MIN_PARAMS = 1 << 15
MIN_PIECE_PARAMS = 1 << 14


class _Plan:
    """Flat layout of one model: dims, activation codes, pieces and parameter offsets.

    ``dims`` are the widths (the input's, then each layer's output's), ``codes`` the layers'
    activation codes and ``names`` each layer's ``(weight, bias)`` parameter names.

    Layer ``l`` is a COL layer (cut by output columns) when ``l`` is even and a ROW layer (cut
    by input rows, along the previous layer's column cuts) when odd; ``cols[l]`` cuts layer
    ``l``'s outputs (a ROW layer's bias) into near-equal pieces, some empty when the layer is
    narrower than the number of pieces. Piece ``p``'s block holds, layer by layer, the weight
    slice (``w_off``) then the bias slice (``b_off``).
    """

    def __init__(self, dims, codes, names, dtype, loss_code, n_pieces):
        self.dims = np.array(dims, np.int64)
        self.codes = np.array(codes, np.int64)
        self.names = [tuple(pair) for pair in names]
        self.dtype = dtype
        self.loss_code = loss_code
        n_layers = len(self.codes)
        self.cols = np.array([[(k * int(d)) // n_pieces for k in range(n_pieces + 1)]
                              for d in self.dims[1:]], np.int64)
        self.w_off = np.zeros((n_layers, n_pieces), np.int64)
        self.b_off = np.zeros((n_layers, n_pieces), np.int64)
        self.blk = np.zeros(n_pieces + 1, np.int64)
        off = 0
        for p in range(n_pieces):
            self.blk[p] = off
            for layer in range(n_layers):
                rows, cols, bias = self._slices(layer, p)
                self.w_off[layer, p] = off
                off += (rows.stop - rows.start) * (cols.stop - cols.start)
                self.b_off[layer, p] = off
                off += bias.stop - bias.start
        self.blk[n_pieces] = off
        self.size = off

    @property
    def n_pieces(self):
        return self.blk.shape[0] - 1

    def _slices(self, layer, p):
        """(weight rows, weight columns, bias columns) of piece ``p`` of ``layer``."""
        cuts = self.cols[layer]
        bias = slice(int(cuts[p]), int(cuts[p + 1]))
        if layer % 2 == 0:
            return slice(0, int(self.dims[layer])), bias, bias
        prev = self.cols[layer - 1]
        return slice(int(prev[p]), int(prev[p + 1])), slice(0, int(self.dims[layer + 1])), bias

    def flatten(self, arrays):
        """The run's weight and bias arrays (by :attr:`names`) in the pieces' flat layout."""
        parts = []
        for p in range(self.n_pieces):
            for layer, (weight, bias_name) in enumerate(self.names):
                rows, cols, bias = self._slices(layer, p)
                parts += [arrays[weight][rows, cols].reshape(-1), arrays[bias_name][bias]]
        return np.concatenate(parts).astype(self.dtype, copy=False)

    def unflatten(self, flat, arrays):
        """Copy the flat layout back into the weight and bias arrays, in place."""
        for p in range(self.n_pieces):
            for layer, (weight_name, bias_name) in enumerate(self.names):
                rows, cols, bias = self._slices(layer, p)
                weight = arrays[weight_name][rows, cols]
                ow, ob = int(self.w_off[layer, p]), int(self.b_off[layer, p])
                np.copyto(weight, flat[ow:ow + weight.size].reshape(weight.shape))
                np.copyto(arrays[bias_name][bias], flat[ob:ob + bias.stop - bias.start])


def takes(program):
    """The program's rows when they are this schedule's: one chain of Dense rows on data
    without a time axis; else None."""
    rows = program.chain()
    if rows is None or not len(rows) or program.tokens or program.steps != 1 or \
            any(r["op"] != ins.DENSE for r in rows):
        return None
    return rows


def plan_from_rows(tables, row_names, dtype, loss_code, n_pieces):
    """A :class:`_Plan` of ``n_pieces`` pieces read from a chain's ``tables``
    (``instructions.ProgramTables``) and its rows' parameter names; a
    :class:`~fastlib.training.schedules.ScheduleError` on a row of another kind or an
    activation the kernel does not apply."""
    rows, slots = tables.rows, tables.slots
    for k, r in enumerate(rows):
        if r["op"] != ins.DENSE or r["activation"] not in ins.ELEMENTWISE_CODES:
            raise ScheduleError(f"the mlp schedule runs Dense rows with an elementwise "
                                f"activation; row {k} is op {r['op']} with code "
                                f"{r['activation']}")
    dims = [int(slots[rows[0]["x"]]["width"])] + [int(slots[r["y"]]["width"]) for r in rows]
    return _Plan(dims, [int(r["activation"]) for r in rows], row_names, dtype, loss_code,
                 n_pieces)


def plan_from_program(ctx, program, x):
    """The run's :class:`_Plan` when the program's rows are this schedule's (:func:`takes`),
    else None; resolves and records the run's piece plan."""
    rows = takes(program)
    if rows is None or x.ndim != 2:
        return None
    pieces = piece_plan.resolve(ctx, lambda cores: machine_pieces(program.param_size, cores))
    plan = plan_from_rows(program.tables, program.row_names, program.dtype,
                          LOSS_CODES[ctx.loss_type], pieces.pieces)
    plan.slope = LEAKY_SLOPE
    plan.piece_plan = pieces
    return plan


def machine_pieces(n_params, cores):
    """The pieces this schedule chooses for a model of ``n_params`` parameters on ``cores``
    usable cores (see the NOTE at :data:`SPLIT_MIN_PARAMS`)."""
    if n_params < SPLIT_MIN_PARAMS:
        return 1
    return max(1, min(cores, n_params // MIN_PIECE_PARAMS))


def run(ctx, plan, x, y, order):
    """Train one epoch of ``plan`` (:func:`plan_from_program`) in the column epoch.

    ``x`` holds inputs ``[N, D]`` in the model's dtype (validated by ``train``), ``y`` the
    targets as ``fastlib.losses.validate_targets`` normalised them, ``order`` the epoch's
    sample order (None for 0..N-1). Returns the epoch's ``EpochStats``.
    """
    dtype = plan.dtype
    n = x.shape[0]
    bs = ctx.config.batch_size
    order, classes, values = epoch_inputs(ctx, y, order, n, dtype)
    w, slots = flat_state(ctx, plan, dtype)
    dims = plan.dims
    n_pieces = plan.n_pieces
    n_layers = len(plan.codes)
    # per layer bs x width of pre-activations, outputs and cotangents
    act_off = np.concatenate([[0], np.cumsum(bs * dims[1:])[:-1]]).astype(np.int64)
    act_size = bs * int(dims[1:].sum())
    # per layer, n_pieces partials of bs x width: a ROW layer's products (its output width), a
    # COL layer's input cotangents (its input width; none for the first layer)
    part_sizes = [n_pieces * bs * int(dims[layer + 1] if layer % 2 else
                                      (dims[layer] if layer else 0))
                  for layer in range(n_layers)]
    part_off = np.concatenate([[0], np.cumsum(part_sizes)[:-1]]).astype(np.int64)
    post, pre, gout = (np.zeros(act_size, dtype) for _ in range(3))
    bufs = kc.ColumnBuffers(
        a_in=np.zeros(2 * bs * int(dims[0]), dtype),  # this batch and the next
        post=post, pre=pre, gout=gout, part=np.zeros(sum(part_sizes), dtype),
        logits=np.zeros(bs * int(dims[-1]), dtype), dz=np.zeros(bs * int(dims[-1]), dtype),
        acc64=np.zeros((n_pieces + 1, int(dims.max())), np.float64),  # bias-gradient sums
        sumsq=np.zeros(n_pieces, np.float64))
    cplan = kc.ColumnPlan(dims, plan.codes, plan.cols, plan.w_off, plan.b_off, plan.blk,
                          act_off, part_off, dtype.type(plan.slope), bs,
                          piece_threads(n_pieces), plan.loss_code)
    data = EpochData(np.ascontiguousarray(x), np.zeros((0, 0), np.int64), classes, values,
                     order)
    state = EpochState(w, slots[0], slots[1], np.zeros_like(w))
    prec = epoch_precision(ctx, w)
    # one piece too: a multi-threaded BLAS under one piece could use cores the plan leaves
    # idle, and its hand-offs made the small products slower with more threads
    update = epoch_update(ctx, -(-n // bs), dtype)
    # the piece work's native entry, found once per run and shape: typing the arguments again
    # took a millisecond, a third of a small epoch (the entry's key still checks them)
    key = ("mlp_piece_entry", id(plan), bs)
    if key not in ctx.scratch:
        ctx.scratch[key] = kc.piece_work_entry(cplan, state, bufs, update, prec)
    args = (cplan, data, state, bufs, update, prec, ctx.scratch[key])
    with single_threaded_blas():
        out = call_typed(kc.epoch, *args)
    keep_loss_scale(ctx, prec)
    return finish_epoch(ctx, plan, w, slots, out, n, bs, "mlp", plan.piece_plan, state.g)


register_schedule("mlp", plan_from_program, run)
