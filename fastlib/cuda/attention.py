"""Self-attention's core fused per head: scores, scale, causal mask, softmax and the weighted
sum in one launch forward, two launches backward.

The projections stay Dense GEMMs; these kernels read q, k, v in place, (B, T, d) with head h in
columns ``h*dh .. (h+1)*dh``, so no head is gathered and scattered back. :data:`forward` runs
one thread per query row (scores recomputed per pass, softmax sums in float64, ``p`` kept for
backward); :data:`backward_rows` forms ``dp``, ``ds`` (float64) and ``dq`` per query row;
:data:`backward_cols` forms ``dv`` and ``dk`` per key row. The per-kind launch budget is in
docs/gpu.md.
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
