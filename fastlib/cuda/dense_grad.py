"""Dense's backward as two tiled GEMMs with the activation's derivative fused into their loads.

For ``out = f(x @ W + b)`` and cotangent ``g``, ``gpre = g * f'(pre)`` is never stored: each
kernel forms it while loading its tile, rounded to the dtype exactly where the unfused path
stored it. :func:`grad_w_kernel` gives ``grad_W = x^T gpre`` and, in the same launch, ``grad_b``
(column sums accumulated in float64 in row order, rounded once); :func:`grad_x_kernel` gives
``grad_x = gpre W^T``. So a Dense backward is two launches (one for the first layer); tiles are
:data:`config.TILE` square (docs/gpu.md).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, float64

from . import config, device
from .device import kernel
from .scalar import ACTIVATIONS, WITH_PARAM

_TILE = config.TILE
_NB_TYPES = {"float32": float32, "float64": float64}


@functools.lru_cache(maxsize=None)
def gpre_loader(scalar):
    """Device function ``load(g, pre, i, param)``: ``g[i] * f'(pre[i])`` for the activation
    ``scalar`` (a name of :data:`.scalar.ACTIVATIONS`), or ``g[i]`` for ``None`` (linear)."""
    if scalar is None:
        @cuda.jit(device=True)
        def load(g, pre, i, param):
            return g[i]
    elif scalar in WITH_PARAM:
        df = ACTIVATIONS[scalar][1]

        @cuda.jit(device=True)
        def load(g, pre, i, param):
            return g[i] * df(float64(pre[i]), param)
    else:
        df = ACTIVATIONS[scalar][1]

        @cuda.jit(device=True)
        def load(g, pre, i, param):
            return g[i] * df(float64(pre[i]))
    return load


_SIG_W = ("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64, float64, "
          "int64)")
_SIG_X = "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64, float64)"


@functools.lru_cache(maxsize=None)
def grad_w_kernel(dtype_name, scalar):
    """``gw = x^T (g * f'(pre))`` (n_in, n_out) and ``gb`` (n_out,) in one launch."""
    nbtype = _NB_TYPES[dtype_name]
    load = gpre_loader(scalar)

    def body(x, g, pre, gw, gb, rows, n_in, n_out, param, with_bias):
        tile_a = cuda.shared.array((_TILE, _TILE), nbtype)
        tile_b = cuda.shared.array((_TILE, _TILE), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tr = cuda.blockIdx.y
        while tr * _TILE < n_in:  # uniform per block: the barriers inside are safe
            tc = cuda.blockIdx.x
            while tc * _TILE < n_out:
                row = tr * _TILE + ty      # input unit i
                col = tc * _TILE + tx      # output unit j
                acc = nbtype(0.0)
                bias = 0.0
                for p0 in range(0, rows, _TILE):
                    # A = x^T: A[i, r] = x[r, i];  B = gpre: B[r, j]
                    if row < n_in and p0 + tx < rows:
                        tile_a[ty, tx] = x[(p0 + tx) * n_in + row]
                    else:
                        tile_a[ty, tx] = 0.0
                    if p0 + ty < rows and col < n_out:
                        tile_b[ty, tx] = load(g, pre, (p0 + ty) * n_out + col, param)
                    else:
                        tile_b[ty, tx] = 0.0
                    cuda.syncthreads()
                    for q in range(_TILE):
                        acc += tile_a[ty, q] * tile_b[q, tx]
                    if with_bias and row == 0:
                        for q in range(_TILE):
                            bias += float64(tile_b[q, tx])
                    cuda.syncthreads()
                if row < n_in and col < n_out:
                    gw[row * n_out + col] = acc
                    if with_bias and row == 0:
                        gb[col] = bias
                tc += cuda.gridDim.x
            tr += cuda.gridDim.y

    return kernel(_SIG_W.format(t=dtype_name))(body)


@functools.lru_cache(maxsize=None)
def grad_x_kernel(dtype_name, scalar):
    """``gx = (g * f'(pre)) W^T`` (rows, n_in) in one launch."""
    nbtype = _NB_TYPES[dtype_name]
    load = gpre_loader(scalar)

    def body(g, pre, w, gx, rows, n_in, n_out, param):
        tile_a = cuda.shared.array((_TILE, _TILE), nbtype)
        tile_b = cuda.shared.array((_TILE, _TILE), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tr = cuda.blockIdx.y
        while tr * _TILE < rows:
            tc = cuda.blockIdx.x
            while tc * _TILE < n_in:
                row = tr * _TILE + ty      # sample r
                col = tc * _TILE + tx      # input unit i
                acc = nbtype(0.0)
                for p0 in range(0, n_out, _TILE):
                    # A = gpre: A[r, j];  B = W^T: B[j, i] = W[i, j]
                    if row < rows and p0 + tx < n_out:
                        tile_a[ty, tx] = load(g, pre, row * n_out + p0 + tx, param)
                    else:
                        tile_a[ty, tx] = 0.0
                    if p0 + ty < n_out and col < n_in:
                        tile_b[ty, tx] = w[col * n_out + p0 + ty]
                    else:
                        tile_b[ty, tx] = 0.0
                    cuda.syncthreads()
                    for q in range(_TILE):
                        acc += tile_a[ty, q] * tile_b[q, tx]
                    cuda.syncthreads()
                if row < rows and col < n_in:
                    gx[row * n_in + col] = acc
                tc += cuda.gridDim.x
            tr += cuda.gridDim.y

    return kernel(_SIG_X.format(t=dtype_name))(body)


def dense_grads(d_g, d_x, d_w, d_pre, rows, n_in, n_out, scalar, param, d_gw, d_gb, d_gx=None):
    """Write ``grad_W`` into ``d_gw``, ``grad_b`` into ``d_gb`` (None: no bias) and, when
    ``d_gx`` is given, ``grad_x`` into it; ``scalar`` the activation (None: linear).

    Two launches at most; nothing allocated."""
    name = np.dtype(d_x.dtype).name
    with_bias = d_gb is not None
    grad_w_kernel(name, scalar)[device.tile_grid(n_in, n_out), (_TILE, _TILE)](
        d_x, d_g, d_pre, d_gw, d_gb if with_bias else d_gw, rows, n_in, n_out, float(param),
        int(with_bias))
    if d_gx is not None:
        grad_x_kernel(name, scalar)[device.tile_grid(rows, n_in), (_TILE, _TILE)](
            d_g, d_pre, d_w, d_gx, rows, n_in, n_out, float(param))
