"""Structure ops on the device: transpose, reshape, concat, slice, forward and VJP.

Every one of them is a strided copy. :data:`_gather` reads ``out[i] = src[base + off(i)]`` and
:data:`_scatter` writes ``dst[base + off(i)] = src[i]``, where ``off`` decodes ``i`` over a shape
and multiplies by a stride vector: a transpose permutes the strides, a slice scales one stride by
its step and starts at ``start``, a concat writes each input into its half of the output.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from . import device
from .device import kernel, signatures, strided_offset



def _gather_body(src, out, shape, strides, base):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = src[base + strided_offset(i, shape, strides)]
        i += step


def _scatter_body(src, dst, shape, strides, base):
    # Positions are distinct (strides of a view, steps >= 1), so there are no write races.
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.shape[0]:
        dst[base + strided_offset(i, shape, strides)] = src[i]
        i += step


_SIG = "void({t}[::1], {t}[::1], int64[::1], int64[::1], int64)"
_gather = kernel(*signatures(_SIG))(_gather_body)
_scatter = kernel(*signatures(_SIG))(_scatter_body)


def gather_device(d_src, shape, strides, base=0):
    """A new flat device array of ``shape`` read from ``d_src`` through ``strides`` + ``base``."""
    n = int(np.prod(shape, dtype=np.int64))
    d_out = device.empty(n, d_src.dtype)
    if n:
        d_shape, d_strides = device.index_vectors(shape, strides)
        _gather[device.grid_1d(n)](d_src, d_out, d_shape, d_strides, int(base))
    return d_out


def scatter_device(d_src, d_dst, shape, strides, base=0):
    """Write the flat ``d_src`` of ``shape`` into ``d_dst`` through ``strides`` + ``base``."""
    n = int(np.prod(shape, dtype=np.int64))
    if n:
        d_shape, d_strides = device.index_vectors(shape, strides)
        _scatter[device.grid_1d(n)](d_src, d_dst, d_shape, d_strides, int(base))


# ---------------------------------------------------------------------------------------------
# transpose

def transpose_forward(x, axes):
    """``np.transpose(x, axes)`` (``axes`` a full permutation) by a strided gather."""
    strides = device.contiguous_strides(x.shape)
    out_shape = tuple(x.shape[k] for k in axes)
    d_out = gather_device(device.put(x), out_shape, [strides[k] for k in axes])
    return device.get(d_out, out_shape)


def transpose_vjp(x, grad, axes):
    """The cotangent transposed back: grad read through the inverse permutation."""
    g_strides = device.contiguous_strides(grad.shape)
    inverse = np.argsort(axes)
    d_out = gather_device(device.put(grad), x.shape, [g_strides[k] for k in inverse])
    return (device.get(d_out, x.shape),)


# ---------------------------------------------------------------------------------------------
# reshape

def reshape_forward(x, shape):
    """``np.reshape(x, shape)``: the C-order data unchanged, copied through the device."""
    # NOTE: a reshape of a C-contiguous array moves no element; the device copy is the identity
    # gather, kept so that every op's result really comes from device memory.
    d_out = gather_device(device.put(x), (x.size,), (1,))
    return device.get(d_out, shape)


def reshape_vjp(x, grad, shape):
    """The cotangent reshaped back to ``x``'s shape."""
    d_out = gather_device(device.put(grad), (grad.size,), (1,))
    return (device.get(d_out, x.shape),)


# ---------------------------------------------------------------------------------------------
# concat

def concat_forward(a, b, axis):
    """``np.concatenate([a, b], axis)``: each input scattered into its part of the output."""
    out_shape = list(a.shape)
    out_shape[axis] = a.shape[axis] + b.shape[axis]
    out_strides = device.contiguous_strides(out_shape)
    d_out = device.empty(int(np.prod(out_shape, dtype=np.int64)), a.dtype)
    scatter_device(device.put(a), d_out, a.shape, out_strides, 0)
    scatter_device(device.put(b), d_out, b.shape, out_strides,
                   a.shape[axis] * out_strides[axis])
    return device.get(d_out, out_shape)


def concat_vjp(a, b, grad, axis):
    """The cotangent split along ``axis``: two strided gathers."""
    g_strides = device.contiguous_strides(grad.shape)
    d_g = device.put(grad)
    d_ga = gather_device(d_g, a.shape, g_strides, 0)
    d_gb = gather_device(d_g, b.shape, g_strides, a.shape[axis] * g_strides[axis])
    return device.get(d_ga, a.shape), device.get(d_gb, b.shape)


# ---------------------------------------------------------------------------------------------
# slice

def _slice_view(shape, axis, start, stop, step):
    """(view shape, view strides, base offset) of ``x[..., start:stop:step, ...]`` on ``axis``."""
    start, stop, step = slice(start, stop, step).indices(shape[axis])
    length = len(range(start, stop, step))
    strides = list(device.contiguous_strides(shape))
    base = start * strides[axis]
    strides[axis] *= step
    view = list(shape)
    view[axis] = length
    return tuple(view), strides, base


def slice_forward(x, axis, start, stop, step):
    """``x[..., start:stop:step, ...]`` along ``axis`` (Python slice rules) by a gather."""
    view, strides, base = _slice_view(x.shape, axis, start, stop, step)
    if not x.size or not int(np.prod(view, dtype=np.int64)):
        return np.zeros(view, x.dtype)
    return device.get(gather_device(device.put(x), view, strides, base), view)


def slice_vjp(x, grad, axis, start, stop, step):
    """Zeros of ``x``'s shape with the cotangent scattered into the sliced positions."""
    view, strides, base = _slice_view(x.shape, axis, start, stop, step)
    d_out = device.zeros(x.size, x.dtype)
    if grad.size:
        scatter_device(device.put(grad), d_out, view, strides, base)
    return (device.get(d_out, x.shape),)
