"""One epoch of a run on the host: its sample order and its batches, one step each.

The order is drawn from the run's Generator (so a checkpoint's Generator state continues it);
the batches cover every sample once, the last one possibly smaller. An algorithm's whole-epoch
path, when it has one, replaces :func:`run_batches` and must compute what it would.
"""
from __future__ import annotations

import math

import numpy as np

from fastlib.training.algorithms import EpochStats

__all__ = ["draw_order", "run_batches"]


def draw_order(rng, n, shuffle):
    """The epoch's sample order: a permutation of ``n`` drawn from ``rng``, or None (in order)."""
    return rng.permutation(n) if shuffle else None


def run_batches(ctx, algo, x, y, order) -> EpochStats:
    """Train one epoch batch by batch with ``algo.train_one_batch``; stop at a non-finite loss.

    Returns the epoch's :class:`EpochStats` (``diverged_batch`` >= 0 when a batch's loss was
    not finite: that batch and the rest of the epoch are not trained).
    """
    stats = EpochStats()
    # NOTE: NaN/Inf are detected and reported by the loop (skipped steps, divergence); the raw
    # NumPy overflow warnings on the way there would only repeat it less clearly.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        bs, n = ctx.config.batch_size, x.shape[0]
        for b, start in enumerate(range(0, n, bs)):
            idx = slice(start, start + bs) if order is None else order[start:start + bs]
            xb = x[idx]
            yb = None if y is None else y[idx]
            res = algo.train_one_batch(ctx, xb, yb)
            ctx.step += 1
            if not math.isfinite(res.loss):
                stats.diverged_batch, stats.diverged_loss = b, float(res.loss)
                break
            stats.add(res, xb.shape[0])
    return stats
