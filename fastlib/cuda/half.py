"""The 16-bit conversions of ``fastlib/kernels/half.py``, compiled as CUDA device functions.

The same plain-Python sources (``half.SOURCES``), compiled with ``@cuda.jit(device=True)``
through ``scalar.compile_sources``: a kernel on the device converts bfloat16 and float16 bit
patterns to float32 bit patterns and back exactly as the CPU does, with no second copy to keep
in step. ``widen_device`` / ``narrow_device`` convert flat device arrays of bit patterns; the
tests hold them bit for bit against ``ml_dtypes`` under the simulator, as the CPU's.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from fastlib.kernels import half as _cpu

from . import device
from .device import kernel
from .scalar import SHIM, compile_sources

__all__ = ["DEVICE", "widen_device", "narrow_device", "round_device", "widen", "narrow"]

#: name -> device function, one per conversion of ``fastlib.kernels.half.SOURCES``
DEVICE = compile_sources(_cpu.SOURCES, SHIM, cuda.jit(device=True))
_bf16_to_f32 = DEVICE["bfloat16_to_float32"]
_f32_to_bf16 = DEVICE["float32_to_bfloat16"]
_f16_to_f32 = DEVICE["float16_to_float32"]
_f32_to_f16 = DEVICE["float32_to_float16"]
_BF16 = _cpu.CODES["bfloat16"]


def _widen_body(code, src, dst):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < dst.shape[0]:
        dst[i] = _bf16_to_f32(src[i]) if code == _BF16 else _f16_to_f32(src[i])
        i += step


def _narrow_body(code, src, dst):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < dst.shape[0]:
        dst[i] = _f32_to_bf16(src[i]) if code == _BF16 else _f32_to_f16(src[i])
        i += step


def _round_body(code, src, dst):
    # float32 bit patterns rounded to the format and widened back: narrow then widen, the
    # CPU's round trip (``half.round_float32``) by the same two conversions
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < dst.shape[0]:
        if code == _BF16:
            dst[i] = _bf16_to_f32(_f32_to_bf16(src[i]))
        else:
            dst[i] = _f16_to_f32(_f32_to_f16(src[i]))
        i += step


_widen = kernel("void(int64, uint16[::1], uint32[::1])")(_widen_body)
_narrow = kernel("void(int64, uint32[::1], uint16[::1])")(_narrow_body)


def widen_device(d_bits, name):
    """float32 bit patterns (a new flat uint32 device array) of the flat uint16 device array
    ``d_bits`` of format ``name`` (``"bfloat16"`` or ``"float16"``)."""
    n = d_bits.shape[0]
    d_out = device.empty(n, "uint32")
    _widen[device.grid_1d(n)](_cpu._code(name), d_bits, d_out)
    return d_out


def narrow_device(d_bits, name):
    """16-bit patterns of format ``name`` (a new flat uint16 device array) of the flat uint32
    device array ``d_bits`` of float32 bit patterns, rounded to nearest even."""
    n = d_bits.shape[0]
    d_out = device.empty(n, "uint16")
    _narrow[device.grid_1d(n)](_cpu._code(name), d_bits, d_out)
    return d_out


_round = kernel("void(int64, uint32[::1], uint32[::1])")(_round_body)


def _bits(d):
    return d if d.dtype == np.uint32 else d.view(np.uint32)


def round_device(d_src, d_dst, name):
    """Round the flat float32 device array ``d_src`` (or its uint32 bit patterns) to format
    ``name`` (nearest even) and write the values, as float32, into ``d_dst`` (which may be
    ``d_src``): one launch."""
    n = d_dst.shape[0]
    if n:
        _round[device.grid_1d(n)](_cpu._code(name), _bits(d_src), _bits(d_dst))


def widen(x):
    """Host function: a bfloat16 or float16 array as float32, widened on the device."""
    x = np.asarray(x)
    d_out = widen_device(device.put(np.ascontiguousarray(x).view(np.uint16)), x.dtype.name)
    return device.get(d_out, x.shape).view(np.float32)


def narrow(x, dtype):
    """Host function: a float32 array rounded to the 16-bit ``dtype`` on the device."""
    x = np.asarray(x, dtype=np.float32)
    dtype = np.dtype(dtype)
    d_out = narrow_device(device.put(np.ascontiguousarray(x).view(np.uint32)), dtype.name)
    return device.get(d_out, x.shape).view(dtype)
