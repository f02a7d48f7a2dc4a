"""The epoch skeleton every compiled training path runs: the step's guard and its update.

However a compiled path forms a step's gradient, the step ends the same way, written here
once: the pieces' partial gradients summed in piece order, block by block, with float64 sums
of squares (:func:`reduce_region`); the guard, which adds the blocks' sums in block order and
skips a step whose gradient is not finite (:func:`guard`); clipping and the optimizer per
block (:func:`update_block`, :func:`update_region`). The blocks (:func:`block_cuts`) depend on
the parameter count only, so the result is the same for any number of threads; every region
runs with flush-to-zero on. A mixed-precision run (:data:`Precision`) rounds each summed
block to its 16-bit format (and unscales it) before its sum of squares, and each updated
block of masters into the 16-bit weights the next step reads. The story:
docs/architecture.md, "The epoch skeleton".
"""
from __future__ import annotations

import collections
import math

import numpy as np
from numba import njit, prange

from fastlib.kernels import half
from fastlib.kernels import optim as kopt

# clipping modes of the kernels
CLIP_NONE, CLIP_VALUE, CLIP_NORM = range(3)


# NOTE: parameter entries per block of the gradient sum and update. Fixed (a property of the
# results: the sums of squares add per block), large enough that a block costs far more than
# its share of a parallel region's start.
BLOCK = 1 << 14

#: The run's precision, for every compiled epoch: the 16-bit format's ``code``
#: (``half.CODES``; -1: the model's own dtype, nothing rounded), the weights ``w16`` that the
#: forward and backward read (the masters ``w`` rounded to the format; ``w`` itself when
#: ``code`` is -1), and the loss scale: its running state, one-entry arrays updated in place
#: (the ``scale`` as float64, the ``clean`` steps in a row and the ``skips`` as int64), whether
#: the run has one (``scaled``), its ``growth`` and ``backoff`` factors, its growth
#: ``interval`` and whether it is ``dynamic`` (``fastlib.training.loss_scale``).
Precision = collections.namedtuple(
    "Precision", "code w16 scale clean skips scaled growth backoff interval dynamic")


def block_cuts(n):
    """Boundaries of the blocks of :data:`BLOCK` entries (the last shorter) of ``n`` parameter
    entries, as int64."""
    return np.array(list(range(0, n, BLOCK)) + [n], np.int64)


@njit(cache=True, error_model="numpy")
def clip_flat(g, clip_mode, clip, total):
    """Clip ``g`` in place by value, or by the global norm ``sqrt(total)``."""
    if clip_mode == CLIP_VALUE:
        lim = g.dtype.type(clip)
        for i in range(g.shape[0]):
            if g[i] > lim:
                g[i] = lim
            elif g[i] < -lim:
                g[i] = -lim
    elif clip_mode == CLIP_NORM:
        norm = math.sqrt(total)
        if norm > clip:
            s = g.dtype.type(clip / norm)
            for i in range(g.shape[0]):
                g[i] = g[i] * s


@njit(cache=True, error_model="numpy")
def update_block(lo, hi, kind, w, g, a, b, c, clip_mode, clip, total, code, w16):
    """Clip entries ``lo:hi`` of the gradient and apply the optimizer ``kind`` (coefficients
    ``c``: the step's row of the coefficient table, ``table[k:k + 1]``) to the same entries of
    the parameters ``w`` and its state ``a``, ``b``; in a 16-bit format ``code`` (-1: none)
    the updated entries rounded into ``w16``."""
    gp = g[lo:hi]
    clip_flat(gp, clip_mode, clip, total)
    # empty state arrays (optimizers without them) stay empty when sliced
    kopt.update_elements(kind, w[lo:hi], gp, a[lo:hi], b[lo:hi], c)
    half.round_into(code, w[lo:hi], w16[lo:hi])


@njit(cache=True, error_model="numpy")
def reduce_block(k, cuts, n_pieces, part, g, sumsq, code, scaled, unscale):
    """Block ``k`` of the gradient: the pieces' partials ``part[p]`` added in piece order into
    ``g``; in a 16-bit format ``code`` (-1: none) rounded to it and, with a loss scale
    (``scaled``), multiplied by ``unscale``; its float64 sum of squares into ``sumsq[k]``."""
    lo, hi = cuts[k], cuts[k + 1]
    dst = g[lo:hi]
    src = part[0, lo:hi]
    for i in range(hi - lo):
        dst[i] = src[i]
    for p in range(1, n_pieces):
        src = part[p, lo:hi]
        for i in range(hi - lo):
            dst[i] += src[i]
    if scaled:      # rounded and unscaled in one pass
        half.round_scale_in_place(code, dst, unscale)
    else:
        half.round_in_place(code, dst)
    sumsq[k] = kopt._sum_squares(dst)


@njit(cache=True, parallel=True, error_model="numpy")
def reduce_region(threads, cuts, n_pieces, part, g, sumsq, code, scaled, unscale):
    """:func:`reduce_block` of every block, ``threads`` at a time."""
    n_blocks = cuts.shape[0] - 1
    if threads == 1:
        old = kopt.enter_ftz()
        for k in range(n_blocks):
            reduce_block(k, cuts, n_pieces, part, g, sumsq, code, scaled, unscale)
        kopt.leave_ftz(old)
        return
    for t in prange(threads):
        old = kopt.enter_ftz()  # per worker thread: the control word is thread-local
        for k in range(t, n_blocks, threads):
            reduce_block(k, cuts, n_pieces, part, g, sumsq, code, scaled, unscale)
        kopt.leave_ftz(old)


@njit(cache=True, error_model="numpy")
def guard(sumsq, g):
    """``(total, apply)``: the global sum of squares (the blocks' sums added in block order)
    and whether the step is applied (False: the gradient holds NaN or Inf; the step is
    skipped whole)."""
    total = 0.0
    for k in range(sumsq.shape[0]):
        total += sumsq[k]
    # a finite total proves a finite gradient; an infinite one may be an overflow of finite
    # squares, which is applied (clipping by norm then scales it to zero, as the generic path)
    return total, math.isfinite(total) or kopt._all_finite(g)


@njit(cache=True, error_model="numpy")
def scale_after_step(scale, clean, skips, found_inf, growth, backoff, interval, dynamic):
    """``(scale, clean, skips)`` of a mixed-precision run's loss scale after a step, as
    ``torch.amp.GradScaler.update`` moves it: on inf/NaN one more skip, the run of clean steps
    restarted and (``dynamic``) the scale times ``backoff``; else one more clean step, and
    after ``interval`` in a row (``dynamic``) the scale times ``growth`` (a grown scale that is
    not finite is not taken) and the run restarted. Written once: the per-batch path calls it
    as Python (``fastlib.training.loss_scale``), the compiled epochs compiled."""
    if found_inf:
        return (scale * backoff if dynamic else scale), 0, skips + 1
    clean += 1
    if dynamic and clean == interval:
        grown = scale * growth
        return (grown if math.isfinite(grown) else scale), 0, skips
    return scale, clean, skips


@njit(cache=True, parallel=True, error_model="numpy")
def update_region(threads, cuts, kind, w, g, a, b, c, clip_mode, clip, total, code, w16):
    """:func:`update_block` of every block, ``threads`` at a time."""
    n_blocks = cuts.shape[0] - 1
    if threads == 1:
        old = kopt.enter_ftz()
        for k in range(n_blocks):
            update_block(cuts[k], cuts[k + 1], kind, w, g, a, b, c, clip_mode, clip, total,
                         code, w16)
        kopt.leave_ftz(old)
        return
    for t in prange(threads):
        old = kopt.enter_ftz()  # per worker thread: the control word is thread-local
        for k in range(t, n_blocks, threads):
            update_block(cuts[k], cuts[k + 1], kind, w, g, a, b, c, clip_mode, clip, total,
                         code, w16)
        kopt.leave_ftz(old)


@njit(cache=True, error_model="numpy")
def end_step(threads, cuts, n_pieces, part, g, sumsq, kind, w, a, b, c, clip_mode, clip, prec,
             unscale):
    """The end of a step whose pieces each left a partial gradient in ``part``: sum (in the
    run's :data:`Precision` ``prec``: rounded, and times ``unscale`` under a loss scale),
    guard, clip and update (rounding the masters into ``prec.w16``); a loss scale moves after
    the guard (:func:`scale_after_step`). Returns True when the step was applied, False when
    it was skipped."""
    block_threads = min(threads, cuts.shape[0] - 1)
    reduce_region(block_threads, cuts, n_pieces, part, g, sumsq, prec.code, prec.scaled,
                  unscale)
    total, apply = guard(sumsq, g)
    if prec.scaled:
        scale, clean, skips = scale_after_step(prec.scale[0], prec.clean[0], prec.skips[0],
                                               not apply, prec.growth, prec.backoff,
                                               prec.interval, prec.dynamic)
        prec.scale[0], prec.clean[0], prec.skips[0] = scale, clean, skips
    if apply:
        update_region(block_threads, cuts, kind, w, g, a, b, c, clip_mode, clip, total,
                      prec.code, prec.w16)
    return apply


@njit(cache=True, error_model="numpy")
def loss_cotangent_in_format(prec, dz):
    """The loss cotangent ``dz`` (1-D contiguous) as a mixed run's backward starts from it, in
    place: times the loss scale (when ``prec.scaled``), then rounded to the format (nothing
    when ``prec.code`` is -1). Scaling first is the point: it lifts small cotangents out of
    float16's subnormals before the rounding."""
    if prec.code < 0:
        return
    if prec.scaled:
        factor = dz.dtype.type(prec.scale[0])
        for i in range(dz.shape[0]):
            dz[i] = dz[i] * factor
    half.round_in_place(prec.code, dz)


def model_precision(w):
    """The :data:`Precision` of a run in the model's own dtype: nothing rounded, ``w`` read
    as it is, no loss scale."""
    return Precision(-1, w, np.ones(1), np.zeros(1, np.int64), np.zeros(1, np.int64), False,
                     1.0, 1.0, 1, False)
