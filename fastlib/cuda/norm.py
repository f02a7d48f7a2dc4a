"""Row-wise normalisations on the device: softmax, log_softmax (any axis), layer_norm and
rms_norm (last axis, no affine), forward and VJP.

One block owns one row (grid-stride over rows). A row along ``axis`` of a C-contiguous array is
``outer x n x inner`` index math: row ``j`` starts at ``(j // inner) * n * inner + j % inner``
and steps by ``inner``. The row statistics (maximum, sums) are block tree reductions in float64
(:func:`.reduce.block_sum` / :func:`.reduce.block_max`), then every thread writes its elements.

The long story: docs/fastlib.md, section ``fastlib/cuda/norm.py``.
"""
from __future__ import annotations

import math

from numba import cuda, float64

from . import config, device
from .device import kernel, signatures
from .reduce import block_max, block_sum, compensated_add

_RB = config.REDUCE_BLOCK

SOFTMAX, LOG_SOFTMAX, LAYER_NORM, RMS_NORM = range(4)
MODES = {"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX, "layer_norm": LAYER_NORM,
         "rms_norm": RMS_NORM}


@cuda.jit(device=True)
def row_max_sum(shared, x, base, n, inner):
    """(m, s) of one row in float64, m its maximum and s = sum exp(x - m) >= 1, for every
    thread of the block: softmax = exp(x - m) / s, log-sum-exp = m + log(s)."""
    tid = cuda.threadIdx.x
    m = -math.inf
    r = tid
    while r < n:
        v = float64(x[base + r * inner])
        if v > m:
            m = v
        r += cuda.blockDim.x
    m = block_max(shared, m)
    acc = 0.0
    r = tid
    while r < n:
        acc += math.exp(float64(x[base + r * inner]) - m)
        r += cuda.blockDim.x
    return m, block_sum(shared, acc)


@cuda.jit(device=True)
def row_moments(shared, x, base, n, inner, mode, eps):
    """(center, scale) of one row: layer_norm (mean, 1/sqrt(var+eps)); rms (0, 1/sqrt(ms+eps))."""
    tid = cuda.threadIdx.x
    center = 0.0
    if mode == LAYER_NORM:
        acc = 0.0
        comp = 0.0
        r = tid
        while r < n:
            acc, comp = compensated_add(acc, comp, float64(x[base + r * inner]))
            r += cuda.blockDim.x
        center = block_sum(shared, acc + comp) / n
    acc = 0.0
    comp = 0.0
    r = tid
    while r < n:
        d = float64(x[base + r * inner]) - center
        acc, comp = compensated_add(acc, comp, d * d)
        r += cuda.blockDim.x
    return center, 1.0 / math.sqrt(block_sum(shared, acc + comp) / n + eps)


def _forward_body(x, out, rows, n, inner, mode, eps):
    shared = cuda.shared.array(_RB, float64)
    tid = cuda.threadIdx.x
    row = cuda.blockIdx.x
    while row < rows:  # uniform per block
        base = (row // inner) * n * inner + row % inner
        if mode == SOFTMAX or mode == LOG_SOFTMAX:
            m, s = row_max_sum(shared, x, base, n, inner)
            log_s = math.log(s)
            r = tid
            while r < n:
                v = float64(x[base + r * inner]) - m
                out[base + r * inner] = math.exp(v) / s if mode == SOFTMAX else v - log_s
                r += cuda.blockDim.x
        else:
            center, scale = row_moments(shared, x, base, n, inner, mode, eps)
            r = tid
            while r < n:
                out[base + r * inner] = (float64(x[base + r * inner]) - center) * scale
                r += cuda.blockDim.x
        row += cuda.gridDim.x


def _vjp_body(x, g, out, rows, n, inner, mode, eps):
    # softmax:     gx = y (g - sum g y)               y = exp(x - m) / s
    # log_softmax: gx = g - y sum g
    # layer_norm:  gx = s (g - mean g - xhat mean(g xhat)),  xhat = (x - mu) s
    # rms_norm:    gx = s g - x s^3 mean(g x)
    shared = cuda.shared.array(_RB, float64)
    tid = cuda.threadIdx.x
    row = cuda.blockIdx.x
    while row < rows:
        base = (row // inner) * n * inner + row % inner
        if mode == SOFTMAX or mode == LOG_SOFTMAX:
            m, s = row_max_sum(shared, x, base, n, inner)
            acc = 0.0
            r = tid
            while r < n:
                gv = float64(g[base + r * inner])
                if mode == SOFTMAX:
                    acc += gv * (math.exp(float64(x[base + r * inner]) - m) / s)
                else:
                    acc += gv
                r += cuda.blockDim.x
            total = block_sum(shared, acc)
            r = tid
            while r < n:
                k = base + r * inner
                y = math.exp(float64(x[k]) - m) / s
                if mode == SOFTMAX:
                    out[k] = y * (float64(g[k]) - total)
                else:
                    out[k] = float64(g[k]) - y * total
                r += cuda.blockDim.x
        else:
            center, scale = row_moments(shared, x, base, n, inner, mode, eps)
            acc_g = 0.0
            acc_gx = 0.0
            r = tid
            while r < n:
                k = base + r * inner
                gv = float64(g[k])
                acc_g += gv
                acc_gx += gv * (float64(x[k]) - center)
                r += cuda.blockDim.x
            mean_g = block_sum(shared, acc_g) / n
            mean_gx = block_sum(shared, acc_gx) / n
            r = tid
            while r < n:
                k = base + r * inner
                d = float64(x[k]) - center
                if mode == LAYER_NORM:
                    out[k] = scale * (float64(g[k]) - mean_g - d * scale * scale * mean_gx)
                else:
                    out[k] = scale * float64(g[k]) - d * scale * scale * scale * mean_gx
                r += cuda.blockDim.x
        row += cuda.gridDim.x


_forward = kernel(*signatures("void({t}[::1], {t}[::1], int64, int64, int64, int64, float64)"))(
    _forward_body)
_vjp = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], int64, int64, int64, int64, float64)"))(_vjp_body)


def _rows(shape, axis):
    """(rows, n, inner) of the rows along ``axis`` of a C-contiguous ``shape``."""
    n = int(shape[axis])
    inner = 1
    for d in shape[axis + 1:]:
        inner *= int(d)
    total = 1
    for d in shape:
        total *= int(d)
    return total // n, n, inner


def _launch(rows):
    return max(1, min(config.MAX_GRID, rows))


def rows_forward_device(mode, d_x, shape, axis, eps=0.0):
    """Forward of a row op (a :data:`MODES` code) on a flat device array; a new flat array."""
    rows, n, inner = _rows(shape, axis)
    d_out = device.empty(d_x.shape[0], d_x.dtype)
    _forward[_launch(rows), device.reduce_block(n)](d_x, d_out, rows, n, inner, mode, float(eps))
    return d_out


def rows_vjp_device(mode, d_x, d_g, shape, axis, eps=0.0):
    """VJP of a row op on flat device arrays (statistics recomputed from ``x``)."""
    rows, n, inner = _rows(shape, axis)
    d_out = device.empty(d_x.shape[0], d_x.dtype)
    _vjp[_launch(rows), device.reduce_block(n)](d_x, d_g, d_out, rows, n, inner, mode,
                                                float(eps))
    return d_out


def norm_forward(name, x, axis, eps=0.0):
    """Host function: softmax / log_softmax along ``axis``, layer_norm / rms_norm (last axis)."""
    d_out = rows_forward_device(MODES[name], device.put(x), x.shape, axis, eps)
    return device.get(d_out, x.shape)


def norm_vjp(name, x, grad, axis, eps=0.0):
    """Host function: the VJP of :func:`norm_forward` for the cotangent ``grad``."""
    d_out = rows_vjp_device(MODES[name], device.put(x), device.put(grad), x.shape,
                            axis, eps)
    return (device.get(d_out, x.shape),)
