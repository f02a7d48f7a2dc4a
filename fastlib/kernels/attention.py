"""Multi-head self-attention, forward and backward: the layer and the compiled program's rows
call these same kernels.

One GEMM forms q, k, v for every row (``[w_q | w_k | w_v]`` is one ``(d, 3d)`` block); then per
(sample, head) block the scores ``q_h k_h^T * scale``, the causal mask, the row softmax
(through the row maximum, its sum in float64), kept as the block's ``(T, T)`` probabilities,
and their product with ``v_h``; one GEMM forms the output. The backward reads the kept
probabilities (no recomputation). Rows are in any layout of ``instructions.row_index``
(``group``: 1 for the layer's ``(batch, seq)`` rows, the piece's samples in the program).
The long story: docs/fastlib.md, section ``fastlib/kernels/attention.py``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from fastlib.config import FASTMATH
from fastlib.kernels.blas import dot_into
from fastlib.kernels.dense import add_bias, column_sums_into, input_grad
from fastlib.kernels.instructions import row_index
from fastlib.kernels.reduce import _block_sum
from fastlib.kernels.vecmath import fexp

_FM = set(FASTMATH)  # numba takes a set (config holds a frozenset)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _gather_cols(src, s, c0, samples, group, out):
    """``out[t] = src[row of (s, t), c0:c0 + out.shape[1]]`` (contiguous, for BLAS)."""
    steps, width = out.shape
    for t in range(steps):
        r = src[row_index(s, t, samples, steps, group)]
        o = out[t]
        for j in range(width):
            o[j] = r[c0 + j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _scatter_cols(block, s, c0, samples, group, dst):
    steps, width = block.shape
    for t in range(steps):
        b = block[t]
        o = dst[row_index(s, t, samples, steps, group)]
        for j in range(width):
            o[c0 + j] = b[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _head_block(qkv, s, c0, d, samples, group, steps, sc):
    """The block's q, k, v gathered into the scratch ``sc`` of four (T, dh) arrays, and the
    fourth array (the output, or the output's cotangent)."""
    dh = sc.shape[0] // (4 * steps)
    qh = sc[:steps * dh].reshape((steps, dh))
    kh = sc[steps * dh:2 * steps * dh].reshape((steps, dh))
    vh = sc[2 * steps * dh:3 * steps * dh].reshape((steps, dh))
    _gather_cols(qkv, s, c0, samples, group, qh)
    _gather_cols(qkv, s, d + c0, samples, group, kh)
    _gather_cols(qkv, s, 2 * d + c0, samples, group, vh)
    return qh, kh, vh, sc[3 * steps * dh:4 * steps * dh].reshape((steps, dh))


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _block_forward(qkv, s, c0, d, samples, group, scale, causal, p, att, lse, sc):
    """Block (sample s, head columns c0..): ``p = softmax(q k^T scale [causal])`` kept in
    ``p`` (T, T), ``att[rows, head] = p v``, each score row's log-sum-exp into ``lse`` when it
    is not empty. Masked keys are left out of the softmax (weight exactly 0), as reflib
    slices them away."""
    steps = p.shape[0]
    qh, kh, vh, oh = _head_block(qkv, s, c0, d, samples, group, steps, sc)
    dot_into(qh, kh.T, p)
    for i in range(steps):
        last = i + 1 if causal else steps
        full = p[i]
        row = full[:last]
        for j in range(last):
            row[j] = row[j] * scale
        m = row[0]
        for j in range(1, last):
            m = max(m, row[j])
        for j in range(last):
            row[j] = fexp(row[j] - m)
        total = _block_sum(row, 0, last)     # float64
        inv = 1.0 / total
        for j in range(last):
            row[j] = row[j] * inv
        for j in range(last, steps):
            full[j] = 0.0
        if lse.shape[0] > 0:
            lse[i] = m + np.log(total)
    dot_into(p, vh, oh)
    _scatter_cols(oh, s, c0, samples, group, att)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _block_backward(qkv, s, c0, d, samples, group, scale, causal, p, gatt, dqkv, dp, sc):
    """Cotangents of the block's q, k, v into ``dqkv`` from ``gatt`` and the kept ``p``:
    ``dv = p^T do``, ``dP = do v^T``, ``dS = p (dP - sum_j p dP) scale``, ``dq = dS k``,
    ``dk = dS^T q``.

    NOTE: the row term ``sum_j p_ij dP_ij`` is taken from the block's own ``p`` and ``dP``
    in float64, not as ``sum(do * o)`` from the rounded output (equal in exact arithmetic):
    ``dP - sum`` cancels, and the output's rounding made the query and key gradients tens of
    times less accurate than the value gradients.
    """
    steps = p.shape[0]
    qh, kh, vh, doh = _head_block(qkv, s, c0, d, samples, group, steps, sc)
    _gather_cols(gatt, s, c0, samples, group, doh)
    dot_into(p.T, doh, vh)                      # vh now holds dv
    _scatter_cols(vh, s, 2 * d + c0, samples, group, dqkv)
    _gather_cols(qkv, s, 2 * d + c0, samples, group, vh)     # v again
    dot_into(doh, vh.T, dp)
    for i in range(steps):
        last = i + 1 if causal else steps
        pr = p[i]
        dr = dp[i]
        total = 0.0
        for j in range(last):
            total += np.float64(pr[j]) * np.float64(dr[j])
        for j in range(last):
            dr[j] = pr[j] * (dr[j] - total) * scale
        for j in range(last, steps):
            dr[j] = 0.0
    dot_into(dp, kh, doh)                       # dq
    _scatter_cols(doh, s, c0, samples, group, dqkv)
    dot_into(dp.T, qh, doh)                     # dk
    _scatter_cols(doh, s, d + c0, samples, group, dqkv)


@njit(inline="always")
def _probs(probs, s, h, heads, steps):
    o = (s * heads + h) * steps
    return probs[o:o + steps]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def attention_forward(x, w_qkv, b_qkv, w_o, b_o, qkv, att, probs, lse, y, samples, steps, heads,
                      scale, causal, group, sc):
    """``y = concat_h(softmax(q_h k_h^T scale) v_h) @ w_o + b_o`` over ``samples`` samples of
    ``steps`` rows (layout ``group``). Kept for the backward: ``qkv`` (rows, 3d), ``att``
    (rows, d), ``probs`` (samples * heads * T, T); ``lse`` (samples * heads * T, or empty)
    the score rows' log-sum-exps. ``sc``: 4 T dh entries of scratch."""
    dot_into(x, w_qkv, qkv)
    add_bias(qkv, b_qkv)
    d = att.shape[1]
    dh = d // heads
    for s in range(samples):
        for h in range(heads):
            o = (s * heads + h) * steps
            _block_forward(qkv, s, h * dh, d, samples, group, scale, causal,
                           _probs(probs, s, h, heads, steps), att,
                           lse[o:o + steps] if lse.shape[0] > 0 else lse, sc[:4 * steps * dh])
    dot_into(att, w_o, y)
    add_bias(y, b_o)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def attention_backward(x, w_qkv, w_o, qkv, att, probs, g, gatt, dqkv, gw_qkv, gb_qkv, gw_o, gb_o,
                       acc, gx, mode, tmp, samples, steps, heads, scale, causal, group, sc):
    """The parameters' gradients and the input's cotangent (by ``mode``) of
    :func:`attention_forward` from the output's cotangent ``g``; ``gatt``, ``dqkv`` receive
    the heads' and the projections' cotangents; ``acc`` is float64 (3d); ``sc`` holds
    4 T dh + T^2 entries."""
    dot_into(att.T, g, gw_o)
    column_sums_into(g, gb_o, acc)
    dot_into(g, w_o.T, gatt)
    d = att.shape[1]
    dh = d // heads
    dp = sc[4 * steps * dh:4 * steps * dh + steps * steps].reshape((steps, steps))
    for s in range(samples):
        for h in range(heads):
            _block_backward(qkv, s, h * dh, d, samples, group, scale, causal,
                            _probs(probs, s, h, heads, steps), gatt, dqkv, dp,
                            sc[:4 * steps * dh])
    dot_into(x.T, dqkv, gw_qkv)
    column_sums_into(dqkv, gb_qkv, acc)
    input_grad(dqkv, w_qkv.T, gx, mode, tmp)
