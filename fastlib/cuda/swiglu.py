"""SwiGLU on the device in few launches: ``y = (silu(x W_gate) * (x W_up)) W_down`` and its VJP.

Forward is two launches (:func:`gate_up_kernel`: both input products from one shared tile of
``x``, storing ``a``, ``u`` and ``h = silu(a) * u``; then ``y = h W_down``). Backward is four,
three without an input gradient: ``g W_down^T`` with the gate's VJP in its epilogue
(:func:`gate_vjp_epilogue`, ``dh`` never stored); ``grad W_down``; ``grad W_gate`` and
``grad W_up`` as one batched GEMM sharing ``x`` (:func:`store_pair`); ``grad x`` as one GEMM
over ``2 * hidden`` (:func:`dx_kernel`). Rounding is the unfused path's: products accumulate in
the dtype, the gate and its VJP are formed in float64 and rounded once. The launch budgets:
docs/gpu.md.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, float64

from . import config, device
from .device import kernel
from .linalg import gemm_device
from .scalar import silu_df, silu_f

_TILE = config.TILE
_NB_TYPES = {"float32": float32, "float64": float64}


@cuda.jit(device=True)
def store_pair(c, out, bias, index, col, acc, param):
    """Epilogue of a batch of two products: the first into ``c``, the second into ``out``
    (two separate arrays, e.g. two parameters' views of the flat gradient buffer)."""
    n = c.shape[0]
    if index < n:
        c[index] = acc
    else:
        out[index - n] = acc


@cuda.jit(device=True)
def gate_vjp_epilogue(c, out, bias, index, col, acc, param):
    """Epilogue of ``dh = g W_down^T``: ``c = da``, ``out = du``; ``bias`` holds ``a`` then
    ``u`` (the forward's history, length twice ``c``'s)."""
    n = c.shape[0]
    a = float64(bias[index])
    dh = float64(acc)  # acc is already the dtype's value: the unfused path's stored dh
    c[index] = dh * float64(bias[n + index]) * silu_df(a)
    out[index] = dh * silu_f(a)


_SIG_GATE_UP = "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64)"
_SIG_DX = "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64)"


@functools.lru_cache(maxsize=None)
def gate_up_kernel(dtype_name):
    """``au[0] = x W_gate``, ``au[1] = x W_up`` and ``h = silu(au[0]) * au[1]`` in one launch.

    ``x`` (rows, d), both weights (d, hidden), ``au`` (2, rows, hidden), ``h`` (rows, hidden).
    """
    nbtype = _NB_TYPES[dtype_name]

    def body(x, wg, wu, au, h, rows, d, hidden):
        tile_x = cuda.shared.array((_TILE, _TILE), nbtype)
        tile_g = cuda.shared.array((_TILE, _TILE), nbtype)
        tile_u = cuda.shared.array((_TILE, _TILE), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        n = rows * hidden
        tr = cuda.blockIdx.y
        while tr * _TILE < rows:  # uniform per block: the barriers inside are safe
            tc = cuda.blockIdx.x
            while tc * _TILE < hidden:
                row = tr * _TILE + ty
                col = tc * _TILE + tx
                acc_g = nbtype(0.0)
                acc_u = nbtype(0.0)
                for p0 in range(0, d, _TILE):
                    if row < rows and p0 + tx < d:
                        tile_x[ty, tx] = x[row * d + p0 + tx]
                    else:
                        tile_x[ty, tx] = 0.0
                    if p0 + ty < d and col < hidden:
                        tile_g[ty, tx] = wg[(p0 + ty) * hidden + col]
                        tile_u[ty, tx] = wu[(p0 + ty) * hidden + col]
                    else:
                        tile_g[ty, tx] = 0.0
                        tile_u[ty, tx] = 0.0
                    cuda.syncthreads()
                    for q in range(_TILE):
                        acc_g += tile_x[ty, q] * tile_g[q, tx]
                        acc_u += tile_x[ty, q] * tile_u[q, tx]
                    cuda.syncthreads()
                if row < rows and col < hidden:
                    i = row * hidden + col
                    au[i] = acc_g
                    au[n + i] = acc_u
                    h[i] = silu_f(float64(acc_g)) * float64(acc_u)
                tc += cuda.gridDim.x
            tr += cuda.gridDim.y

    return kernel(_SIG_GATE_UP.format(t=dtype_name), name=f"swiglu_gate_up[{dtype_name}]")(body)


@functools.lru_cache(maxsize=None)
def dx_kernel(dtype_name):
    """``dx = dz[0] W_gate^T + dz[1] W_up^T`` (rows, d) in one launch: one GEMM whose inner
    index runs over both halves (``dz`` (2, rows, hidden), both weights (d, hidden))."""
    nbtype = _NB_TYPES[dtype_name]

    def body(dz, wg, wu, dx, rows, d, hidden):
        tile_a = cuda.shared.array((_TILE, _TILE), nbtype)
        tile_b = cuda.shared.array((_TILE, _TILE), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        n = rows * hidden
        k = 2 * hidden
        tr = cuda.blockIdx.y
        while tr * _TILE < rows:
            tc = cuda.blockIdx.x
            while tc * _TILE < d:
                row = tr * _TILE + ty      # sample r
                col = tc * _TILE + tx      # input unit i
                acc = nbtype(0.0)
                for p0 in range(0, k, _TILE):
                    # A[r, j] = dz[j // hidden][r, j % hidden]
                    j = p0 + tx
                    if row < rows and j < k:
                        if j < hidden:
                            tile_a[ty, tx] = dz[row * hidden + j]
                        else:
                            tile_a[ty, tx] = dz[n + row * hidden + j - hidden]
                    else:
                        tile_a[ty, tx] = 0.0
                    # B[j, i] = W_gate[i, j] for j < hidden, W_up[i, j - hidden] after
                    j = p0 + ty
                    if j < k and col < d:
                        if j < hidden:
                            tile_b[ty, tx] = wg[col * hidden + j]
                        else:
                            tile_b[ty, tx] = wu[col * hidden + j - hidden]
                    else:
                        tile_b[ty, tx] = 0.0
                    cuda.syncthreads()
                    for q in range(_TILE):
                        acc += tile_a[ty, q] * tile_b[q, tx]
                    cuda.syncthreads()
                if row < rows and col < d:
                    dx[row * d + col] = acc
                tc += cuda.gridDim.x
            tr += cuda.gridDim.y

    return kernel(_SIG_DX.format(t=dtype_name), name=f"swiglu_dx[{dtype_name}]")(body)


def swiglu_forward_device(d_x, d_wg, d_wu, d_wd, rows, d, hidden, out, dtype):
    """(y, au, h) flat device arrays: the output and the history backward reads. 2 launches."""
    name = np.dtype(dtype).name
    au = device.empty(2 * rows * hidden, dtype)
    h = device.empty(rows * hidden, dtype)
    gate_up_kernel(name)[device.tile_grid(rows, hidden), (_TILE, _TILE)](
        d_x, d_wg, d_wu, au, h, rows, d, hidden)
    y = gemm_device(h, (0, hidden, 1), d_wd, (0, out, 1), 1, rows, out, hidden, dtype)
    return y, au, h


def swiglu_backward_device(d_g, d_x, d_wg, d_wu, d_wd, au, h, rows, d, hidden, out, dtype,
                           d_gwg, d_gwu, d_gwd, need_input_grad):
    """Write the three weight gradients into ``d_gwg``, ``d_gwu``, ``d_gwd``; return grad x
    (a new flat array) or None. 4 launches, 3 without the input gradient."""
    n = rows * hidden
    dz = device.empty(2 * n, dtype)
    # dh = g W_down^T (g (rows, out), W_down (hidden, out) read transposed), gate VJP stored
    gemm_device(d_g, (0, out, 1), d_wd, (0, 1, out), 1, rows, hidden, out, dtype,
                epilogue=gate_vjp_epilogue, d_out=dz[n:], d_bias=au, d_c=dz[:n])
    # grad W_down = h^T g: h (rows, hidden) read transposed
    gemm_device(h, (0, 1, hidden), d_g, (0, out, 1), 1, hidden, out, rows, dtype, d_c=d_gwd)
    # grad W_gate, grad W_up = x^T dz[z]: one x shared by the batch of two
    gemm_device(d_x, (0, 1, d), dz, (n, hidden, 1), 2, d, hidden, rows, dtype,
                epilogue=store_pair, d_out=d_gwu, d_c=d_gwg)
    if not need_input_grad:
        return None
    dx = device.empty(rows * d, dtype)
    dx_kernel(np.dtype(dtype).name)[device.tile_grid(rows, d), (_TILE, _TILE)](
        dz, d_wg, d_wu, dx, rows, d, hidden)
    return dx
