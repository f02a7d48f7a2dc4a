"""Reductions on the device: block-level tree sums and maxima, ``sum`` / ``mean`` / ``logsumexp``
and the sum of a broadcast cotangent back to an input's shape.

One block reduces one output element (grid-stride over outputs): its threads stride over the
reduced index space, each keeping a private float64 partial, and the partials meet in a
shared-memory binary tree (:func:`block_sum`, :func:`block_max`). Which elements belong to an
output is index math on shape / stride vectors, so any set of axes, and any broadcast pattern,
is one kernel.

The long story: docs/fastlib.md, section ``fastlib/cuda/reduce.py``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64

from . import config, device
from .device import kernel, signatures, strided_offset

_RB = config.REDUCE_BLOCK

# mode codes of the reduction kernel
SUM, LSE = 0, 1


def block_sum_body(shared, value):
    """Sum ``value`` over the threads of the block (tree in ``shared``); every thread gets it.

    ``blockDim.x`` must be a power of two no larger than ``shared``'s length. A plain function:
    :data:`block_sum` is it compiled here; a kernel module that calls it from many threads
    compiles its own copy (:func:`.device.device_function_here`, as for :func:`last_to_arrive`).
    """
    tid = cuda.threadIdx.x
    shared[tid] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if tid < step:
            shared[tid] += shared[tid + step]
        cuda.syncthreads()
        step //= 2
    total = shared[0]
    cuda.syncthreads()  # everyone has read shared[0] before the caller reuses shared
    return total


block_sum = cuda.jit(device=True)(block_sum_body)


def last_to_arrive(arrivals, slot, expected, flag):
    """True (in every thread of the block) when this block is the ``expected``-th to arrive at
    counter ``slot``: the end of a split reduction, whose last block adds the partials in a
    fixed order. The block's partials are fenced before it counts itself; the last block
    resets the counter to zero for the next launch. ``flag`` is a 1-entry shared array; the
    caller passes a barrier before calling again. Called by every thread (it holds barriers).

    NOTE: a plain function: each kernel module compiles its own copy
    (:func:`.device.device_function_here`), since numba's simulator swaps a device function's
    module global ``cuda`` around each call, and a copy living in another module than its
    kernel races there (a thread reads the real ``numba.cuda``, which has no ``threadfence``).
    """
    cuda.threadfence()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0:
        arrived = cuda.atomic.add(arrivals, slot, 1)
        flag[0] = 1.0 if arrived == expected - 1 else 0.0
        if arrived == expected - 1:
            arrivals[slot] = 0
    cuda.syncthreads()
    last = flag[0] != 0.0
    if last:
        cuda.threadfence()
    return last


@cuda.jit(device=True)
def compensated_add(acc, comp, value):
    """One step of Neumaier summation: returns the new (sum, compensation).

    The rounding error of ``acc + value`` is recovered exactly (Fast2Sum on the operands
    ordered by magnitude) and collected in ``comp``; the sum is ``acc + comp`` at the end.
    NOTE: needs IEEE arithmetic without reassociation (no fastmath on these kernels).
    """
    t = acc + value
    if abs(acc) >= abs(value):
        comp += (acc - t) + value
    else:
        comp += (value - t) + acc
    return t, comp


@cuda.jit(device=True)
def block_max(shared, value):
    """Maximum of ``value`` over the threads of the block; every thread gets it."""
    tid = cuda.threadIdx.x
    shared[tid] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if tid < step:
            other = shared[tid + step]
            if other > shared[tid]:
                shared[tid] = other
        cuda.syncthreads()
        step //= 2
    best = shared[0]
    cuda.syncthreads()
    return best


def _reduce_body(src, out, keep_shape, keep_strides, red_shape, red_strides, n_out, n_red,
                 mode, divisor):
    # out[j] = sum_r src[base(j) + off(r)] / divisor          (mode SUM; a division, as the CPU
    #          computes mean: a reciprocal then a product would round twice)
    # out[j] = m + log(sum_r exp(src[...] - m)), m = max      (mode LSE)
    shared = cuda.shared.array(_RB, float64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    j = cuda.blockIdx.x
    while j < n_out:  # uniform per block, so the barriers inside are safe
        base = strided_offset(j, keep_shape, keep_strides)
        shift = 0.0
        if mode == LSE:
            m = -math.inf
            r = tid
            while r < n_red:
                v = float64(src[base + strided_offset(r, red_shape, red_strides)])
                if v > m:
                    m = v
                r += threads
            shift = block_max(shared, m)
        acc = 0.0
        comp = 0.0
        r = tid
        while r < n_red:
            v = float64(src[base + strided_offset(r, red_shape, red_strides)])
            if mode == LSE:
                v = math.exp(v - shift)
            acc, comp = compensated_add(acc, comp, v)
            r += threads
        total = block_sum(shared, acc + comp)
        if tid == 0:
            if mode == LSE:
                out[j] = shift + math.log(total)
            else:
                out[j] = total / divisor
        j += cuda.gridDim.x


_SIG_REDUCE = "void({t}[::1], float64[::1], int64[::1], int64[::1], int64[::1], int64[::1], " \
              "int64, int64, int64, float64)"
_reduce = kernel(*signatures(_SIG_REDUCE))(_reduce_body)

# NOTE (a promise the conformance suite holds fastlib-cuda to): in these dtypes sum and mean
# are the exact value rounded once, up to float64 rounding: the terms are added in float64
# (compensated, no products, so the device's FMA contraction cannot touch them), divided by the count in
# float64 and rounded to the dtype once by the host function.
ROUNDED_ONCE_FORWARD_DTYPES = ("float32",)


def reduce_device(d_src, shape, axes, mode=SUM, divisor=1.0):
    """Reduce a flat C-contiguous device array of ``shape`` over ``axes`` into float64.

    Returns a flat float64 device array whose C order is that of the kept axes.
    """
    shape = tuple(int(d) for d in shape)
    strides = device.contiguous_strides(shape)
    keep = [k for k in range(len(shape)) if k not in axes]
    red = [k for k in range(len(shape)) if k in axes]
    n_out = int(np.prod([shape[k] for k in keep], dtype=np.int64))
    n_red = int(np.prod([shape[k] for k in red], dtype=np.int64))
    d_keep = device.index_vectors([shape[k] for k in keep], [strides[k] for k in keep])
    d_red = device.index_vectors([shape[k] for k in red], [strides[k] for k in red])
    d_out = device.empty(n_out, np.float64)
    blocks = max(1, min(config.MAX_GRID, n_out))
    _reduce[blocks, device.reduce_block(n_red)](d_src, d_out, d_keep[0], d_keep[1], d_red[0],
                                               d_red[1], n_out, n_red, mode, float(divisor))
    return d_out


def sum_to_shape_device(d_src, src_shape, shape):
    """Sum a flat device array of the broadcast shape ``src_shape`` back to ``shape`` (float64).

    The axes summed are the leading axes ``shape`` lacks and the axes where it has size 1 but
    ``src_shape`` does not: the VJP of NumPy broadcasting.
    """
    padded = (1,) * (len(src_shape) - len(shape)) + tuple(shape)
    axes = tuple(k for k, (d, s) in enumerate(zip(padded, src_shape)) if d == 1 and s != 1)
    return reduce_device(d_src, src_shape, axes)


# ---------------------------------------------------------------------------------------------
# VJP: spread the cotangent back over the reduced axes

def _spread_body(x, g, lse, out, shape, g_strides, mode, divisor):
    # out[i] = g[o(i)] / divisor               (sum, mean: divided, as the CPU does)
    # out[i] = g[o(i)] * exp(x[i] - lse[o(i)]) (logsumexp: the softmax weights)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.shape[0]:
        o = strided_offset(i, shape, g_strides)
        if mode == LSE:
            out[i] = g[o] * math.exp(float64(x[i]) - lse[o])
        else:
            out[i] = g[o] / divisor
        i += step


_SIG_SPREAD = "void({t}[::1], {t}[::1], float64[::1], {t}[::1], int64[::1], int64[::1], int64, " \
              "float64)"
_spread = kernel(*signatures(_SIG_SPREAD))(_spread_body)


# ---------------------------------------------------------------------------------------------
# host functions (validated NumPy in, NumPy out)

def _kept_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if k in axes else d for k, d in enumerate(shape))
    return tuple(d for k, d in enumerate(shape) if k not in axes)


def _count(shape, axes):
    return int(np.prod([shape[k] for k in axes], dtype=np.int64))


def _forward(x, axes, keepdims, mode, divisor):
    d_out = reduce_device(device.put(x), x.shape, axes, mode, divisor)
    return device.get(d_out, _kept_shape(x.shape, axes, keepdims)).astype(x.dtype)


def sum_forward(x, axes, keepdims):
    """``np.sum(x, axes, keepdims=keepdims)`` on the device (``axes`` a normalised tuple)."""
    return _forward(x, axes, keepdims, SUM, 1.0)


def mean_forward(x, axes, keepdims):
    """``np.mean`` over ``axes``: the float64 sum divided by the count, rounded once."""
    return _forward(x, axes, keepdims, SUM, float(_count(x.shape, axes)))


def logsumexp_forward(x, axes, keepdims):
    """log(sum(exp(x))) over ``axes``, shifted by the maximum so it is finite for finite x."""
    return _forward(x, axes, keepdims, LSE, 1.0)


def _vjp(x, grad, axes, mode, divisor):
    d_x = device.put(x)
    g_shape = tuple(1 if k in axes else d for k, d in enumerate(x.shape))
    d_g = device.put(grad)
    d_lse = reduce_device(d_x, x.shape, axes, LSE) if mode == LSE else device.empty(1, np.float64)
    d_shape, d_gs = device.index_vectors(x.shape, device.broadcast_strides(g_shape, x.shape))
    d_out = device.empty(x.size, x.dtype)
    _spread[device.grid_1d(x.size)](d_x, d_g, d_lse, d_out, d_shape, d_gs, mode, float(divisor))
    return device.get(d_out, x.shape)


def sum_vjp(x, grad, axes):
    """The cotangent broadcast back over the summed axes."""
    return (_vjp(x, grad, axes, SUM, 1.0),)


def mean_vjp(x, grad, axes):
    """The cotangent broadcast back over the averaged axes, divided by their count."""
    return (_vjp(x, grad, axes, SUM, float(_count(x.shape, axes))),)


def logsumexp_vjp(x, grad, axes):
    """grad * softmax(x) over the reduced axes (exp(x - lse), lse recomputed in float64)."""
    return (_vjp(x, grad, axes, LSE, 1.0),)
