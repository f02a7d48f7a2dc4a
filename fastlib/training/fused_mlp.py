"""The whole-epoch compiled path for MLPs: ``Sequential`` of ``Dense`` layers, back-propagation.

The long story: docs/fastlib.md, section ``fastlib/training/fused_mlp.py``.
"""
from __future__ import annotations

import numpy as np

from fastlib.layers.activations import ACTIVATIONS
from fastlib.training import fused_kernels as fk
from fastlib.training import piece_plan
from fastlib.training.compiled_paths import register_compiled_path
from fastlib.training.epoch_state import (epoch_inputs, epoch_settings, finish_epoch, flat_state,
                                          single_threaded_blas)
from fastlib.training.fused_kernels import FUSED_ACTIVATIONS, LOSS_CODES  # noqa: F401 - public
from fastlib.training.piece_plan import piece_threads

# NOTE (speed): every layer pair is cut into the run's piece plan's P pieces (model
# parallelism inside one step, see fused_kernels and fastlib.training.piece_plan): each thread
# forms its pieces' activations, gradients and update from its own contiguous parameter block,
# which stays in its core's cache, and BLAS runs single-threaded inside each piece. The
# machine's choice: one piece below SPLIT_MIN_PARAMS parameters (a parallel region costs
# ~4 us, more than a tiny step), else one per usable core, but never pieces of fewer than
# MIN_PIECE_PARAMS parameters (smaller GEMMs stop paying for their hand-off).
SPLIT_MIN_PARAMS = 1 << 15
MIN_PIECE_PARAMS = 1 << 14


class _Plan:
    """Flat layout of one model: dims, activation codes, pieces and parameter offsets.

    Layer ``l`` is a COL layer (cut by output columns) when ``l`` is even and a ROW layer (cut
    by input rows, along the previous layer's column cuts) when odd; ``cols[l]`` cuts layer
    ``l``'s outputs (a ROW layer's bias) into near-equal pieces, some empty when the layer is
    narrower than the number of pieces. Piece ``p``'s block holds, layer by layer, the weight
    slice (``w_off``) then the bias slice (``b_off``).
    """

    def __init__(self, dense_layers, dtype, loss_code, n_pieces):
        self.dims = np.array([dense_layers[0].in_features] +
                             [d.out_features for d in dense_layers], np.int64)
        self.codes = np.array([ACTIVATIONS[d.activation] for d in dense_layers], np.int64)
        self.dtype = dtype
        self.loss_code = loss_code
        n_layers = len(dense_layers)
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
        """The run's ``{i.weight, i.bias}`` arrays in the pieces' flat layout."""
        parts = []
        for p in range(self.n_pieces):
            for layer in range(len(self.codes)):
                rows, cols, bias = self._slices(layer, p)
                parts += [arrays[f"{layer}.weight"][rows, cols].reshape(-1),
                          arrays[f"{layer}.bias"][bias]]
        return np.concatenate(parts).astype(self.dtype, copy=False)

    def unflatten(self, flat, arrays):
        """Copy the flat layout back into the ``{i.weight, i.bias}`` arrays, in place."""
        for p in range(self.n_pieces):
            for layer in range(len(self.codes)):
                rows, cols, bias = self._slices(layer, p)
                weight = arrays[f"{layer}.weight"][rows, cols]
                ow, ob = int(self.w_off[layer, p]), int(self.b_off[layer, p])
                np.copyto(weight, flat[ow:ow + weight.size].reshape(weight.shape))
                np.copyto(arrays[f"{layer}.bias"][bias],
                          flat[ob:ob + bias.stop - bias.start])


def plan_for(ctx):
    """A :class:`_Plan` when the fused path applies to this run, else None (cached per run)."""
    if "fused_plan" in ctx.scratch:
        return ctx.scratch["fused_plan"]
    ctx.scratch["fused_plan"] = plan = _make_plan(ctx)
    return plan


def _make_plan(ctx):
    from fastlib.layers import Dense, Sequential
    from fastlib.layers.activations import LEAKY_SLOPE

    model, cfg = ctx.model, ctx.config
    if not cfg.extra.get("fused", True) or cfg.device != "cpu" or cfg.algorithm != "bp":
        return None
    if type(model) is not Sequential or ctx.loss_type not in LOSS_CODES:
        return None
    layers = list(model.layers)
    if not layers or any(type(d) is not Dense or ACTIVATIONS[d.activation] not in fk.FUSED_CODES
                         for d in layers):
        return None
    names = []
    for i, d in enumerate(layers):
        names += [f"{i}.weight", f"{i}.bias"]
    if list(ctx.params) != names:
        return None
    n_params = sum(int(v.size) for v in model.parameters().values())
    pieces = piece_plan.resolve(ctx, lambda cores: machine_pieces(n_params, cores))
    plan = _Plan(layers, np.dtype(model.dtype), LOSS_CODES[ctx.loss_type], pieces.pieces)
    plan.slope = LEAKY_SLOPE
    plan.piece_plan = pieces
    return plan


def machine_pieces(n_params, cores):
    """The pieces this schedule chooses for a model of ``n_params`` parameters on ``cores``
    usable cores (see the NOTE at :data:`SPLIT_MIN_PARAMS`)."""
    if n_params < SPLIT_MIN_PARAMS:
        return 1
    return max(1, min(cores, n_params // MIN_PIECE_PARAMS))


def run_epoch(ctx, x, y, order):
    """Train one epoch in the compiled kernel; None when the model or run does not fit it.

    The contract of every compiled path (``compiled_paths.register_compiled_path``): the run's
    context ``ctx``, the targets ``y`` and the epoch's ``order``; ``x`` holds inputs ``[N, D]``
    in the model's dtype (validated by ``train``). Returns the epoch's ``EpochStats``, or None
    having changed nothing.
    """
    plan = plan_for(ctx)
    if plan is None or x.ndim != 2:
        return None
    dtype = plan.dtype
    n = x.shape[0]
    bs = ctx.config.batch_size
    order, yi, yf = epoch_inputs(ctx, y, order, n, dtype)
    opt = ctx.optimizer
    w, slots = flat_state(ctx, plan, dtype)
    g = np.zeros_like(w)
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
    a_in = np.zeros(2 * bs * int(dims[0]), dtype)  # this batch and the next
    post, pre, gout = (np.zeros(act_size, dtype) for _ in range(3))
    part = np.zeros(sum(part_sizes), dtype)
    logits, dz = np.zeros(bs * int(dims[-1]), dtype), np.zeros(bs * int(dims[-1]), dtype)
    acc64 = np.zeros((n_pieces + 1, int(dims.max())), np.float64)  # bias-gradient sums
    coeffs, clip_mode, clip = epoch_settings(ctx, -(-n // bs), dtype)
    threads = piece_threads(n_pieces)
    args = (x, yi, yf, order, bs, threads, dims, plan.cols,
            plan.w_off, plan.b_off, plan.blk, act_off, part_off, plan.codes,
            dtype.type(plan.slope), plan.loss_code, opt.kind, coeffs, clip_mode, float(clip), w,
            slots[0], slots[1], g, a_in, post, pre, gout, part, logits, dz, acc64)
    # one piece too: a multi-threaded BLAS under one piece could use cores the plan leaves
    # idle, and its hand-offs made the small products slower with more threads
    with single_threaded_blas():
        out = fk.epoch(*args)
    return finish_epoch(ctx, plan, w, slots, out, n, bs, "mlp", plan.piece_plan)


register_compiled_path("mlp", run_epoch)
