"""SwiGLU on the device in few launches: ``y = (silu(x W_gate) * (x W_up)) W_down`` and its VJP.

Forward is two launches (:func:`gate_up_kernel`: both input products from one shared tile of
``x``, storing ``a``, ``u`` and ``h = silu(a) * u``; then ``y = h W_down``). Backward is four,
three without an input gradient: ``g W_down^T`` with the gate's VJP in its epilogue
(:func:`gate_vjp_epilogue`, ``dh`` never stored); ``grad W_down``; ``grad W_gate`` and
``grad W_up`` as one GEMM into the program's ``w_gate_up`` block; ``grad x`` as one GEMM
over ``2 * hidden``. Rounding is the unfused path's: products accumulate in
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
def gate_vjp_epilogue(c, out, bias, index, col, acc, param):
    """Epilogue of ``dh = g W_down^T`` (rows, hidden): ``c = dz = [da | du]`` (rows, 2 hidden),
    the ``w_gate_up`` block's columns; ``param`` is ``hidden`` (where ``du`` starts in a row);
    ``bias`` holds ``a`` then ``u`` (the forward's history, length ``c``'s)."""
    n = c.shape[0] // 2
    a = float64(bias[index])
    dh = float64(acc)  # acc is already the dtype's value: the unfused path's stored dh
    at = 2 * index - col  # row r, column j of dz: r * 2 hidden + j, with index = r hidden + j
    c[at] = dh * float64(bias[n + index]) * silu_df(a)
    c[at + int(param)] = dh * silu_f(a)


_SIG_GATE_UP = "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64)"


@functools.lru_cache(maxsize=None)
def gate_up_kernel(dtype_name):
    """``au[0] = x W_gate``, ``au[1] = x W_up`` and ``h = silu(au[0]) * au[1]`` in one launch.

    ``x`` (rows, d), ``wgu`` the ``w_gate_up`` block (d, 2 hidden: ``W_gate`` then ``W_up``
    in each row), ``au`` (2, rows, hidden), ``h`` (rows, hidden).
    """
    nbtype = _NB_TYPES[dtype_name]

    def body(x, wgu, au, h, rows, d, hidden):
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
                        tile_g[ty, tx] = wgu[(p0 + ty) * 2 * hidden + col]
                        tile_u[ty, tx] = wgu[(p0 + ty) * 2 * hidden + hidden + col]
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


def swiglu_forward_device(d_x, d_wgu, d_wd, rows, d, hidden, out, dtype):
    """(y, au, h) flat device arrays: the output and the history backward reads. 2 launches.
    ``d_wgu`` is the ``w_gate_up`` block (d, 2 hidden), ``d_wd`` ``w_down`` (hidden, out)."""
    name = np.dtype(dtype).name
    au = device.empty(2 * rows * hidden, dtype)
    h = device.empty(rows * hidden, dtype)
    gate_up_kernel(name)[device.tile_grid(rows, hidden), (_TILE, _TILE)](
        d_x, d_wgu, au, h, rows, d, hidden)
    y = gemm_device(h, (0, hidden, 1), d_wd, (0, out, 1), 1, rows, out, hidden, dtype)
    return y, au, h


def swiglu_backward_device(d_g, d_x, d_wgu, d_wd, au, h, rows, d, hidden, out, dtype,
                           d_gwgu, d_gwd, d_gx=None):
    """Write the blocks' gradients into ``d_gwgu`` (d, 2 hidden) and ``d_gwd``, and grad x
    into ``d_gx`` when given. 4 launches, 3 without the input gradient."""
    k = 2 * hidden
    dz = device.empty(rows * k, dtype)
    # dh = g W_down^T (g (rows, out), W_down (hidden, out) read transposed), gate VJP stored
    gemm_device(d_g, (0, out, 1), d_wd, (0, 1, out), 1, rows, hidden, out, dtype,
                epilogue=gate_vjp_epilogue, d_bias=au, d_c=dz, param=float(hidden))
    # grad W_down = h^T g: h (rows, hidden) read transposed
    gemm_device(h, (0, 1, hidden), d_g, (0, out, 1), 1, hidden, out, rows, dtype, d_c=d_gwd)
    # grad [W_gate | W_up] = x^T dz: one GEMM into the block
    gemm_device(d_x, (0, 1, d), dz, (0, k, 1), 1, d, k, rows, dtype, d_c=d_gwgu)
    if d_gx is not None:
        # grad x = dz [W_gate | W_up]^T: the block read transposed, inner index over 2 hidden
        gemm_device(dz, (0, k, 1), d_wgu, (0, 1, k), 1, rows, d, k, dtype, d_c=d_gx)
