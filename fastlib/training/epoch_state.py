"""What every schedule of the compiled program does around its kernel call: the run's parameters and
optimizer state in and out of flat buffers, the epoch's optimizer coefficients and clipping,
its precision and loss scale, BLAS held to the calling thread, and the epoch's statistics.

Each schedule supplies a layout with ``flatten(arrays) -> flat`` and ``unflatten(flat, arrays)``.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import half
from fastlib.kernels import skeleton as sk
from fastlib.kernels.batch_loss import CE
from fastlib.kernels.interpreter import EpochUpdate
from fastlib.training.algorithms import EpochStats
from optable.losses import LOSS_CODES

_BLAS = {}


def single_threaded_blas():
    """A context in which BLAS runs on the calling thread only (our threads run the pieces).

    NOTE: the kernels' products call NumPy's OpenBLAS (``fastlib.kernels.blas``), or SciPy's
    through Numba's ``np.dot``; two of our threads each calling a multi-threaded OpenBLAS took
    100x longer (its workers spin and contend), and OpenBLAS's own split of these small
    products is no faster than ours. The controller limits every BLAS loaded; it is built
    once, after SciPy's is loaded, because building it scans every loaded library (~1 ms).
    """
    if "controller" not in _BLAS:
        import scipy.linalg.cython_blas  # noqa: F401 - load the library Numba's np.dot uses
        from threadpoolctl import ThreadpoolController

        _BLAS["controller"] = ThreadpoolController()
    return _BLAS["controller"].limit(limits=1, user_api="blas")


def epoch_inputs(ctx, y, order, n, dtype, rows=None):
    """``(order, yi, yf)`` as the kernels take them: the epoch's sample order as contiguous
    int64 (``0..n-1`` when None), and the targets: ``cross_entropy``'s class indices in
    ``yi`` (``yf`` empty), else ``yf`` of ``rows`` rows (default ``n``) in ``dtype``."""
    order = np.arange(n, dtype=np.int64) if order is None else np.ascontiguousarray(
        order, dtype=np.int64)
    if LOSS_CODES[ctx.loss_type] == CE:
        return order, np.ascontiguousarray(y, dtype=np.int64).reshape(-1), np.zeros((0, 0), dtype)
    yf = np.ascontiguousarray(y, dtype=dtype).reshape(n if rows is None else rows, -1)
    return order, np.zeros(0, np.int64), yf


def flat_state(ctx, layout, dtype):
    """``(w, [slot0, slot1])``: the parameters and the optimizer's state slots, flattened by
    ``layout`` (an optimizer with fewer than two slots gets empty ones: the kernels take two)."""
    w = layout.flatten(ctx.params)
    slots = [layout.flatten(ctx.opt_state.slots[s]) for s in ctx.optimizer.state_names]
    while len(slots) < 2:
        slots.append(np.zeros(0, dtype))
    return w, slots


def epoch_precision(ctx, w):
    """The epoch's ``skeleton.Precision``: the model's own dtype, or the run's mixed precision
    (``ctx.scratch["mixed_precision"]``): the masters ``w`` rounded to its format, and its loss
    scale's running state taken from the run's algorithm state."""
    mp = ctx.scratch.get("mixed_precision")
    if mp is None:
        return sk.model_precision(w)
    code, w16 = half.CODES[mp.fmt], half.round_float32(w, mp.fmt)
    scale = mp.scale
    if scale is None:     # no loss scale: its fields are never read
        return sk.model_precision(w)._replace(code=code, w16=w16)
    st = ctx.state
    return sk.Precision(code, w16, np.array([float(st["loss_scale"])]),
                        np.array([int(st["loss_scale_clean_steps"])], np.int64),
                        np.array([int(st["loss_scale_skips"])], np.int64), True,
                        float(scale.growth_factor), float(scale.backoff_factor),
                        int(scale.growth_interval), bool(scale.dynamic))


def keep_loss_scale(ctx, prec):
    """The loss scale's running state after the epoch, back into the run's algorithm state
    (a checkpoint holds it there)."""
    if prec.scaled:
        ctx.state.update(loss_scale=float(prec.scale[0]),
                         loss_scale_clean_steps=int(prec.clean[0]),
                         loss_scale_skips=int(prec.skips[0]))


def epoch_update(ctx, n_batches, dtype):
    """The :class:`~fastlib.kernels.interpreter.EpochUpdate` of an epoch of ``n_batches``
    steps: the optimizer's kind, its per-step coefficients (``Optimizer.coefficient_table``)
    and the clipping code and value."""
    coeffs = ctx.optimizer.coefficient_table(ctx.opt_state.t + 1, n_batches, ctx.lr, dtype)
    clip = ctx.config.gradient_clip
    clip_mode = sk.CLIP_NONE if clip == 0 else (sk.CLIP_VALUE if ctx.config.clip_mode == "value"
                                                else sk.CLIP_NORM)
    return EpochUpdate(ctx.optimizer.kind, coeffs, clip_mode, float(clip))


def finish_epoch(ctx, layout, w, slots, out, n, bs, schedule, plan, g, correct_per_row=1.0):
    """Write the epoch's parameters and state back and return its :class:`EpochStats`.

    ``out`` is the kernels' ``(loss_sum, correct, skipped, updates, diverged, bad_loss)``;
    ``diverged`` is the batch that stopped the epoch (-1: none). ``correct_per_row`` divides
    the correct count (a schedule whose rows are time steps reports per-sequence accuracy
    sums). ``schedule`` names the schedule that ran the program and ``plan`` is its
    :class:`~fastlib.training.piece_plan.PiecePlan`, both reported in the stats; ``g`` is the
    flat gradient of the epoch's last step (the stats' ``gradient``).
    """
    loss_sum, correct, skipped, updates, diverged, bad_loss = out
    layout.unflatten(w, ctx.params)
    for s, flat in zip(ctx.optimizer.state_names, slots):
        layout.unflatten(flat, ctx.opt_state.slots[s])
    ctx.opt_state.t += int(updates)
    n_batches = -(-n // bs)
    ctx.step += n_batches if diverged < 0 else diverged + 1
    samples = n if diverged < 0 else diverged * bs
    return EpochStats(loss_sum=float(loss_sum),
                      correct=None if ctx.loss_type == "mse" else float(correct) / correct_per_row,
                      count=samples, skipped=int(skipped), diverged_batch=int(diverged),
                      diverged_loss=float(bad_loss), fused=True, path="program",
                      schedule=schedule, piece_plan=plan.to_dict(), gradient=[g])
