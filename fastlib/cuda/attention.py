"""Self-attention's core fused per head: scores, scale, causal mask, softmax and the weighted
sum in one launch forward, two launches backward.

The projections stay Dense GEMMs; these kernels read q, k, v where the projections wrote them,
(B, T, d) with head h in columns ``h*dh .. (h+1)*dh``, and write their results in that layout
too, so no head is ever gathered into (B, heads, T, dh) and back.

- :data:`forward`: one thread per query row of a head: the row's scores ``q_i . k_j * scale``
  (masked after i when causal), their maximum and the sum of ``exp(s - max)`` in float64 (the
  scores recomputed per pass instead of stored, so nothing is rounded to the dtype before the
  softmax), the probabilities ``p`` (kept for backward) and ``o_i = sum_j p_ij v_j``.
- :data:`backward_rows`: one thread per query row: ``dp_ij = dO_i . v_j``,
  ``ds_ij = p_ij (dp_ij - sum_j p_ij dp_ij) * scale`` (kept in float64) and
  ``dq_i = sum_j ds_ij k_j``.
- :data:`backward_cols`: one thread per key row: ``dv_j = sum_i p_ij dO_i`` and
  ``dk_j = sum_i ds_ij q_i``.
"""
from __future__ import annotations

import math

from numba import float64

from numba import cuda

from .device import kernel, signatures


def _forward_body(q, k, v, p, o, batch, steps, heads, dh, scale, causal):
    idx = cuda.grid(1)
    stride = cuda.gridsize(1)
    d = heads * dh
    while idx < batch * heads * steps:
        i = idx % steps
        h = (idx // steps) % heads
        b = idx // (steps * heads)
        qi = (b * steps + i) * d + h * dh
        last = i + 1 if causal else steps
        m = -math.inf
        for j in range(last):
            kj = (b * steps + j) * d + h * dh
            s = 0.0
            for c in range(dh):
                s += float64(q[qi + c]) * float64(k[kj + c])
            s *= scale
            if s > m:
                m = s
        total = 0.0
        for j in range(last):
            kj = (b * steps + j) * d + h * dh
            s = 0.0
            for c in range(dh):
                s += float64(q[qi + c]) * float64(k[kj + c])
            total += math.exp(s * scale - m)
        prow = idx * steps
        for j in range(steps):
            if j < last:
                kj = (b * steps + j) * d + h * dh
                s = 0.0
                for c in range(dh):
                    s += float64(q[qi + c]) * float64(k[kj + c])
                p[prow + j] = math.exp(s * scale - m) / total
            else:
                p[prow + j] = 0.0
        for c in range(dh):
            acc = 0.0
            for j in range(last):
                acc += float64(p[prow + j]) * float64(v[(b * steps + j) * d + h * dh + c])
            o[qi + c] = acc
        idx += stride


forward = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64, int64, "
    "float64, int64)"))(_forward_body)


def _backward_rows_body(q, k, v, p, do, ds, dq, batch, steps, heads, dh, scale):
    idx = cuda.grid(1)
    stride = cuda.gridsize(1)
    d = heads * dh
    while idx < batch * heads * steps:
        i = idx % steps
        h = (idx // steps) % heads
        b = idx // (steps * heads)
        qi = (b * steps + i) * d + h * dh
        prow = idx * steps
        delta = 0.0
        for j in range(steps):
            vj = (b * steps + j) * d + h * dh
            dp = 0.0
            for c in range(dh):
                dp += float64(do[qi + c]) * float64(v[vj + c])
            ds[prow + j] = dp            # dp for now; ds below, once delta is known
            delta += float64(p[prow + j]) * dp
        for j in range(steps):
            ds[prow + j] = float64(p[prow + j]) * (ds[prow + j] - delta) * scale
        for c in range(dh):
            acc = 0.0
            for j in range(steps):
                acc += ds[prow + j] * float64(k[(b * steps + j) * d + h * dh + c])
            dq[qi + c] = acc
        idx += stride


backward_rows = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], float64[::1], {t}[::1], int64, "
    "int64, int64, int64, float64)"))(_backward_rows_body)


def _backward_cols_body(q, p, do, ds, dk, dv, batch, steps, heads, dh):
    idx = cuda.grid(1)
    stride = cuda.gridsize(1)
    d = heads * dh
    while idx < batch * heads * steps:
        j = idx % steps
        h = (idx // steps) % heads
        b = idx // (steps * heads)
        kj = (b * steps + j) * d + h * dh
        head = idx - j                   # (b, h, 0)'s row index: rows i of this head follow
        for c in range(dh):
            acc_v = 0.0
            acc_k = 0.0
            for i in range(steps):
                at = (head + i) * steps + j
                qi = (b * steps + i) * d + h * dh + c
                acc_v += float64(p[at]) * float64(do[qi])
                acc_k += ds[at] * float64(q[qi])
            dv[kj + c] = acc_v
            dk[kj + c] = acc_k
        idx += stride


backward_cols = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], float64[::1], {t}[::1], {t}[::1], int64, int64, int64, "
    "int64)"))(_backward_cols_body)
