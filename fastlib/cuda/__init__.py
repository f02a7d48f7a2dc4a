"""fastlib.cuda: the CUDA engine (numba.cuda), on a GPU or under numba's CUDA simulator.

The same engine protocol as every other engine, for every registry op, float32 and float64.
Usage and the long story: docs/fastlib.md, section ``fastlib/cuda/__init__.py``.
"""
from __future__ import annotations

import importlib

import numpy as np

from . import counters
from .device import CudaUnavailableError, is_available, unavailable_reason, require_device

__all__ = ["is_available", "unavailable_reason", "CudaUnavailableError", "UnknownOpError",
           "forward", "vjp",
           "dense_forward", "dense_backward", "optimizer_init", "optimizer_update",
           "to_device", "to_host", "OPS", "counters"]

# public name -> module that defines it (loaded on first use, like fastlib's own table)
_LAZY = {"OPS": "fastlib.cuda.ops", "ROUNDED_ONCE": "fastlib.cuda.ops", "UnknownOpError": "fastlib.cuda.ops",
         "dense_forward": "fastlib.cuda.dense", "dense_backward": "fastlib.cuda.dense",
         "optimizer_init": "fastlib.cuda.optim", "optimizer_update": "fastlib.cuda.optim"}


def forward(name, inputs, **params):
    """Evaluate registry op ``name`` on the device; see :func:`fastlib.cuda.ops.forward`.

    The call is validated first (bad input gets its ValueError / TypeError anywhere); a valid
    call raises :class:`CudaUnavailableError` (with the reason) where no GPU or simulator exists
    (and before validation where ``import numba.cuda`` itself failed: nothing can run).
    """
    _require_numba_cuda()
    from . import ops
    return ops.forward(name, inputs, **params)


def vjp(name, inputs, grad, **params):
    """One cotangent per input of op ``name``; see :func:`fastlib.cuda.ops.vjp`.

    Validated first, like :func:`forward`; then :class:`CudaUnavailableError` where no GPU or
    simulator exists.
    """
    _require_numba_cuda()
    from . import ops
    return ops.vjp(name, inputs, grad, **params)


def _require_numba_cuda():
    """The kernel modules import numba.cuda: where that import failed, say why instead."""
    from . import device
    if device.cuda is None:
        require_device()


def to_device(array):
    """Copy a NumPy array to the device, for the device-resident training entry points.

    Parameters
    ----------
    array : array_like

    Returns
    -------
    numba device array
        Same shape and dtype, C-contiguous.
    """
    require_device()
    from . import device
    host = np.asarray(array, order="C")
    return device.put(host).reshape(host.shape)


def to_host(d_array):
    """Copy a device array back to the host.

    Parameters
    ----------
    d_array : numba device array

    Returns
    -------
    numpy.ndarray
        Same shape and dtype.
    """
    from . import device
    return device.read(d_array)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fastlib.cuda' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
