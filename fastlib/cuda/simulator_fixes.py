"""Two thread-safety gaps of numba's CUDA simulator, closed before any kernel runs under it.

The simulator runs a block's threads as Python threads. ``FakeCUDAShared.array`` finds a
block's shared array with an unlocked check-then-set, so two threads can each get a private
"shared" array; ``swapped_cuda_module`` puts the real ``numba.cuda`` back when the first of
several threads leaves a device function of another module, and the others then fail. Both
made correct kernels give wrong numbers or errors now and then on a loaded machine.
:func:`install` replaces both with locked versions, once, under the simulator only; a GPU
never sees this module. The story: docs/gpu.md, "Verified here, without a GPU".
"""
from __future__ import annotations

import contextlib
import sys
import threading

_LOCK = threading.Lock()
_SWAPS: dict[int, list] = {}   # id(module globals) -> [active callers, original bindings]
INSTALLED = [False]


def _shared_array(self, shape, dtype):
    """``FakeCUDAShared.array`` with the lookup and the creation under one lock."""
    import numpy as np
    from numba.core import types
    from numba.np import numpy_support

    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:  # dynamic shared memory: one buffer, no lookup
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    caller = sys._getframe(1)
    key = (caller.f_code.co_filename, caller.f_lineno)  # the simulator's own key
    with _LOCK:
        res = self._allocations.get(key)
        if res is None:
            res = self._allocations[key] = np.empty(shape, dtype)
    return res


@contextlib.contextmanager
def _swapped_cuda_module(fn, fake_cuda_module):
    """The simulator's module swap, counted: the first caller in swaps, the last out restores."""
    from numba import cuda

    globs = fn.__globals__
    with _LOCK:
        entry = _SWAPS.get(id(globs))
        if entry is None:
            orig = {k: v for k, v in globs.items() if v is cuda}
            globs.update({k: fake_cuda_module for k in orig})
            entry = _SWAPS[id(globs)] = [0, orig]
        entry[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                globs.update(entry[1])
                del _SWAPS[id(globs)]


def install() -> bool:
    """Patch the simulator (once per process); False where the simulator is not in use."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        return False
    if not INSTALLED[0]:
        from numba.cuda.simulator import kernel, kernelapi

        kernelapi.FakeCUDAShared.array = _shared_array
        kernelapi.swapped_cuda_module = _swapped_cuda_module
        kernel.swapped_cuda_module = _swapped_cuda_module  # imported there by name
        INSTALLED[0] = True
    return True
