"""Self-attention's core on the device, flash-style: one launch forward, one backward, one
block per (batch, head), and no ``T x T`` matrix in global memory.

q, k, v are read in place, rows ``ld`` apart (``3 d``: the one projection GEMM of the program's
``w_qkv`` block), head h in columns ``h*dh ..``; the output and its cotangent are (B, T, d).
:data:`forward`: each thread owns query rows; a first pass over the keys gives the row's
log-sum-exp by an online maximum (float64), the second adds ``exp(s - lse) v`` in float64; only
the log-sum-exp is kept. :data:`backward` recomputes the probabilities from it: threads own
query rows (``D_i``, ``dq``), then, after a barrier, key rows (``dk``, ``dv``), each sum in a
fixed order (bits independent of timing); masked keys are left out, as on the CPU. Launch
budgets and parallelism: docs/gpu.md.
"""
from __future__ import annotations

import math

from numba import cuda, float64

from .config import ATTENTION_MAX_HEAD_DIM
from .device import kernel, signatures

_MAX_DH = ATTENTION_MAX_HEAD_DIM


@cuda.jit(device=True)
def _score(q, k, qi, kj, dh, scale):
    s = 0.0
    for c in range(dh):
        s += float64(q[qi + c]) * float64(k[kj + c])
    return s * scale


@cuda.jit(device=True)
def _p_dp(q, k, v, do, qi, oi, kj, dh, scale, row_lse):
    """(p_ij, dp_ij = do_i . v_j) of query row ``qi`` (its output row ``oi``) and key row
    ``kj``, p recomputed from the row's log-sum-exp."""
    p = math.exp(_score(q, k, qi, kj, dh, scale) - row_lse)
    dp = 0.0
    for c in range(dh):
        dp += float64(do[oi + c]) * float64(v[kj + c])
    return p, dp


def _forward_body(q, k, v, o, lse, batch, steps, heads, dh, ld, scale, causal):
    acc = cuda.local.array(_MAX_DH, float64)
    d = heads * dh
    blk = cuda.blockIdx.x
    while blk < batch * heads:
        b = blk // heads
        h = blk - b * heads
        i = cuda.threadIdx.x
        while i < steps:
            qi = (b * steps + i) * ld + h * dh
            last = i + 1 if causal else steps
            m = -math.inf
            total = 0.0
            for j in range(last):
                s = _score(q, k, qi, (b * steps + j) * ld + h * dh, dh, scale)
                if s > m:
                    total = total * math.exp(m - s) + 1.0
                    m = s
                else:
                    total += math.exp(s - m)
            row_lse = m + math.log(total)
            lse[blk * steps + i] = row_lse
            for c in range(dh):
                acc[c] = 0.0
            for j in range(last):
                kj = (b * steps + j) * ld + h * dh
                p = math.exp(_score(q, k, qi, kj, dh, scale) - row_lse)
                for c in range(dh):
                    acc[c] += p * float64(v[kj + c])
            oi = (b * steps + i) * d + h * dh
            for c in range(dh):
                o[oi + c] = acc[c]
            i += cuda.blockDim.x
        blk += cuda.gridDim.x


forward = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], float64[::1], int64, int64, int64, int64, "
    "int64, float64, int64)"), name="attention_forward")(_forward_body)


def _backward_body(q, k, v, do, lse, delta, dq, dk, dv, batch, steps, heads, dh, ld, scale,
                   causal):
    # ds_ij = p_ij (dp_ij - D_i) scale, dp_ij = do_i . v_j, D_i = sum_j p_ij dp_ij (in float64,
    # from the probabilities, not from the stored output o, which a float32 model rounded);
    # dq_i = sum_j ds_ij k_j, dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij do_i
    acc = cuda.local.array(_MAX_DH, float64)
    acc2 = cuda.local.array(_MAX_DH, float64)
    d = heads * dh
    blk = cuda.blockIdx.x
    while blk < batch * heads:  # uniform per block: the barrier inside is safe
        b = blk // heads
        h = blk - b * heads
        i = cuda.threadIdx.x
        while i < steps:  # query rows: D_i, dq_i
            qi = (b * steps + i) * ld + h * dh
            oi = (b * steps + i) * d + h * dh
            last = i + 1 if causal else steps
            row_lse = lse[blk * steps + i]
            dlt = 0.0
            for j in range(last):
                p, dp = _p_dp(q, k, v, do, qi, oi, (b * steps + j) * ld + h * dh, dh, scale,
                              row_lse)
                dlt += p * dp
            delta[blk * steps + i] = dlt
            for c in range(dh):
                acc[c] = 0.0
            for j in range(last):
                kj = (b * steps + j) * ld + h * dh
                p, dp = _p_dp(q, k, v, do, qi, oi, kj, dh, scale, row_lse)
                ds = p * (dp - dlt) * scale
                for c in range(dh):
                    acc[c] += ds * float64(k[kj + c])
            for c in range(dh):
                dq[qi + c] = acc[c]
            i += cuda.blockDim.x
        cuda.syncthreads()  # every D_i of the block written (and visible to it)
        j = cuda.threadIdx.x
        while j < steps:  # key rows: dk_j, dv_j
            kj = (b * steps + j) * ld + h * dh
            first = j if causal else 0
            for c in range(dh):
                acc[c] = 0.0
                acc2[c] = 0.0
            for i in range(first, steps):
                qi = (b * steps + i) * ld + h * dh
                oi = (b * steps + i) * d + h * dh
                p, dp = _p_dp(q, k, v, do, qi, oi, kj, dh, scale, lse[blk * steps + i])
                ds = p * (dp - delta[blk * steps + i]) * scale
                for c in range(dh):
                    acc[c] += ds * float64(q[qi + c])
                    acc2[c] += p * float64(do[oi + c])
            for c in range(dh):
                dk[kj + c] = acc[c]
                dv[kj + c] = acc2[c]
            j += cuda.blockDim.x
        cuda.syncthreads()  # the block's next (batch, head) reuses nothing, but keep it uniform
        blk += cuda.gridDim.x


backward = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], float64[::1], float64[::1], {t}[::1], "
    "{t}[::1], {t}[::1], int64, int64, int64, int64, int64, float64, int64)"),
    name="attention_backward")(_backward_body)
