"""Scaled dot-product attention over contiguous head slices, forward and backward.

For each (batch, head) block the kernel forms the scores ``q_h k_h^T * scale`` of that block
only, applies the causal mask, the row softmax (through the row maximum) and the weighted sum of
values, and keeps just the per-row log-sum-exp. The full ``(B, heads, T, T)`` probability
tensor is never stored: the backward recomputes each block's probabilities from the saved
log-sum-exp (the flash-attention scheme), so memory stays ``O(B T d)``.

Arrays are C-contiguous ``(B, T, d)`` of one float dtype; ``lse`` is ``(B, heads, T)``. The
MultiHeadAttention layer allocates everything and is the only caller.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from fastlib.config import FASTMATH
from fastlib.kernels.vecmath import fexp

_FASTMATH = set(FASTMATH)  # numba takes a set (config holds a frozenset)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH, inline="always")
def _gather(src, b, start, out):
    """``out[:] = src[b, :, start:start + out.shape[1]]`` (a contiguous copy for BLAS)."""
    steps, width = out.shape
    for t in range(steps):
        for j in range(width):
            out[t, j] = src[b, t, start + j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH, inline="always")
def _scatter(block, b, start, dst):
    """``dst[b, :, start:start + block.shape[1]] = block``."""
    steps, width = block.shape
    for t in range(steps):
        for j in range(width):
            dst[b, t, start + j] = block[t, j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def attention_forward(q, k, v, heads, scale, causal, out, lse):
    """``out[b, :, head] = softmax(q_h k_h^T * scale [+ causal mask]) v_h`` per block.

    NOTE: masked keys (j > i when causal) are left out of the softmax outright (weight exactly
    0), as reflib slices them away, rather than given a large negative score.
    """
    batch, steps, d = q.shape
    dh = d // heads
    qh = np.empty((steps, dh), dtype=q.dtype)
    kh = np.empty((steps, dh), dtype=q.dtype)
    vh = np.empty((steps, dh), dtype=q.dtype)
    scores = np.empty((steps, steps), dtype=q.dtype)
    oh = np.empty((steps, dh), dtype=q.dtype)
    for b in range(batch):
        for h in range(heads):
            start = h * dh
            _gather(q, b, start, qh)
            _gather(k, b, start, kh)
            _gather(v, b, start, vh)
            np.dot(qh, kh.T, scores)
            for i in range(steps):
                last = i + 1 if causal else steps
                m = scores[i, 0] * scale
                for j in range(1, last):
                    s = scores[i, j] * scale
                    if s > m:
                        m = s
                total = 0.0
                for j in range(last):
                    e = fexp(scores[i, j] * scale - m)
                    scores[i, j] = e
                    total += e
                inv = 1.0 / total
                for j in range(last):
                    scores[i, j] *= inv
                for j in range(last, steps):
                    scores[i, j] = 0.0
                lse[b, h, i] = m + np.log(total)
            np.dot(scores, vh, oh)
            _scatter(oh, b, start, out)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def attention_backward(q, k, v, out, dout, lse, heads, scale, causal, dq, dk, dv):
    """Cotangents of q, k, v from ``dout``, recomputing each block's probabilities from ``lse``.

    With P the block's probabilities: ``dv = P^T do``, ``dP = do v^T``,
    ``dS = P * (dP - rowsum(do * o))`` (rowsum(dP * P) = rowsum(do * o)), ``dq = dS k * scale``,
    ``dk = dS^T q * scale``.
    """
    batch, steps, d = q.shape
    dh = d // heads
    qh = np.empty((steps, dh), dtype=q.dtype)
    kh = np.empty((steps, dh), dtype=q.dtype)
    vh = np.empty((steps, dh), dtype=q.dtype)
    oh = np.empty((steps, dh), dtype=q.dtype)
    doh = np.empty((steps, dh), dtype=q.dtype)
    p = np.empty((steps, steps), dtype=q.dtype)
    dp = np.empty((steps, steps), dtype=q.dtype)
    block = np.empty((steps, dh), dtype=q.dtype)
    for b in range(batch):
        for h in range(heads):
            start = h * dh
            _gather(q, b, start, qh)
            _gather(k, b, start, kh)
            _gather(v, b, start, vh)
            _gather(out, b, start, oh)
            _gather(dout, b, start, doh)
            np.dot(qh, kh.T, p)
            for i in range(steps):
                last = i + 1 if causal else steps
                for j in range(last):
                    p[i, j] = fexp(p[i, j] * scale - lse[b, h, i])
                for j in range(last, steps):
                    p[i, j] = 0.0
            np.dot(p.T, doh, block)
            _scatter(block, b, start, dv)
            np.dot(doh, vh.T, dp)
            for i in range(steps):
                row = 0.0
                for j in range(dh):
                    row += doh[i, j] * oh[i, j]
                for j in range(steps):
                    dp[i, j] = p[i, j] * (dp[i, j] - row) * scale
            np.dot(dp, kh, block)
            _scatter(block, b, start, dq)
            np.dot(dp.T, qh, block)
            _scatter(block, b, start, dk)
