"""Matrix products on the device: a tiled shared-memory GEMM, 2-D and batched, and ``matmul``'s
forward and VJP.

The long story: docs/fastlib.md, section ``fastlib/cuda/linalg.py``.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, float64

from . import config, device
from .device import kernel

_TILE = config.TILE
_NB_TYPES = {"float32": float32, "float64": float64}

_SIG_GEMM = ("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64, "
             "int64, int64, int64, int64, int64, int64, int64, float64)")


@cuda.jit(device=True)
def store_plain(c, out, bias, index, col, acc, param):
    """Plain GEMM epilogue: C = acc."""
    c[index] = acc


@functools.lru_cache(maxsize=None)
def gemm_kernel(dtype_name, epilogue=store_plain):
    """The tiled GEMM kernel for one dtype and one epilogue, compiled at first launch.

    The shared tiles need a fixed element type, hence one kernel per dtype. ``epilogue(c, out,
    bias, index, col, acc, param)`` stores the finished dot product ``acc`` of element ``index``
    (column ``col``): :func:`store_plain` for matmul, a bias + activation store for Dense
    (:mod:`.dense`), so the product is computed by this one body either way.
    """
    nbtype = _NB_TYPES[dtype_name]

    def gemm(a, b, c, out, bias, batch, m, n, k, sa_z, sa_r, sa_c, sb_z, sb_r, sb_c, param):
        tile_a = cuda.shared.array((_TILE, _TILE), nbtype)
        tile_b = cuda.shared.array((_TILE, _TILE), nbtype)
        tx = cuda.threadIdx.x  # column inside the tile
        ty = cuda.threadIdx.y  # row inside the tile
        z = cuda.blockIdx.z
        while z < batch:  # the loops below are uniform per block: barriers are safe
            tr = cuda.blockIdx.y
            while tr * _TILE < m:
                tc = cuda.blockIdx.x
                while tc * _TILE < n:
                    row = tr * _TILE + ty
                    col = tc * _TILE + tx
                    acc = nbtype(0.0)
                    for p0 in range(0, k, _TILE):
                        if row < m and p0 + tx < k:
                            tile_a[ty, tx] = a[z * sa_z + row * sa_r + (p0 + tx) * sa_c]
                        else:
                            tile_a[ty, tx] = 0.0
                        if p0 + ty < k and col < n:
                            tile_b[ty, tx] = b[z * sb_z + (p0 + ty) * sb_r + col * sb_c]
                        else:
                            tile_b[ty, tx] = 0.0
                        cuda.syncthreads()
                        for q in range(_TILE):
                            acc += tile_a[ty, q] * tile_b[q, tx]
                        cuda.syncthreads()
                    if row < m and col < n:
                        epilogue(c, out, bias, (z * m + row) * n + col, col, acc, param)
                    tc += cuda.gridDim.x
                tr += cuda.gridDim.y
            z += cuda.gridDim.z

    return kernel(_SIG_GEMM.format(t=dtype_name))(gemm)


def gemm_device(d_a, a_strides, d_b, b_strides, batch, m, n, k, dtype, epilogue=store_plain,
                d_out=None, d_bias=None, param=0.0, d_c=None):
    """``C[z] = A[z] @ B[z]`` for z < batch; a flat C-contiguous (batch, m, n) device array
    (``d_c`` when given, e.g. a view of a training run's flat gradient buffer; else a new one).

    ``a_strides`` / ``b_strides`` are (batch, row, column) element strides of the operands.
    With an ``epilogue`` other than :func:`store_plain`, ``d_out`` and ``d_bias`` are passed
    to it (Dense: C holds the pre-activation, ``d_out`` the activation).
    """
    if d_c is None:
        d_c = device.empty(batch * m * n, dtype)
    d_out = d_c if d_out is None else d_out
    d_bias = d_c if d_bias is None else d_bias
    grid = device.tile_grid(m, n) + (max(1, min(config.MAX_GRID, batch)),)
    gemm_kernel(np.dtype(dtype).name, epilogue)[grid, (_TILE, _TILE)](
        d_a, d_b, d_c, d_out, d_bias, batch, m, n, k, *[int(s) for s in a_strides],
        *[int(s) for s in b_strides], float(param))
    return d_c


def _layout(a_shape, b_shape):
    """(batch, m, k, n, b_shared) of ``a @ b`` for validated shapes."""
    m, k = a_shape[-2:]
    n = b_shape[-1]
    batch = int(np.prod(a_shape[:-2], dtype=np.int64))
    return batch, m, k, n, len(b_shape) == 2


def matmul_forward(a, b):
    """``a @ b``: 2-D, batched with equal batch shapes, or batched ``a`` with a shared 2-D ``b``."""
    batch, m, k, n, shared = _layout(a.shape, b.shape)
    d_c = gemm_device(device.put(a), (m * k, k, 1), device.put(b),
                      (0 if shared else k * n, n, 1), batch, m, n, k, a.dtype)
    return device.get(d_c, a.shape[:-1] + (n,))


def matmul_vjp(a, b, grad):
    """(grad @ b^T, a^T @ grad), the second summed over the batch when ``b`` is shared."""
    batch, m, k, n, shared = _layout(a.shape, b.shape)
    d_a, d_b, d_g = device.put(a), device.put(b), device.put(grad)
    # grad of a: G (m, n) @ B^T (n, k); B^T is B read with row stride 1 and column stride n.
    d_ga = gemm_device(d_g, (m * n, n, 1), d_b, (0 if shared else k * n, 1, n),
                       batch, m, k, n, a.dtype)
    if shared:
        # sum_z A_z^T G_z = A_all^T G_all: A_all (batch*m, k) read transposed, one product.
        d_gb = gemm_device(d_a, (0, 1, k), d_g, (0, n, 1), 1, k, n, batch * m, a.dtype)
    else:
        d_gb = gemm_device(d_a, (m * k, 1, k), d_g, (m * n, n, 1), batch, k, n, m, a.dtype)
    return device.get(d_ga, a.shape), device.get(d_gb, b.shape)
