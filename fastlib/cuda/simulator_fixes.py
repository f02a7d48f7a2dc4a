"""Two thread-safety gaps of numba's CUDA simulator, closed before any kernel runs under it.

The simulator runs each thread of a block as a Python thread. Two of its helpers share state
between those threads without a lock, and both make a correct kernel give wrong or failing
results now and then (more often on a loaded machine, where threads interleave more):

1. ``FakeCUDAShared.array`` finds a block's shared array by the calling source line with a
   check-then-set on a dict. Two threads that reach the line together can each create their
   own array, so the block's threads no longer share memory: a tree reduction or a staged tile
   then mixes uninitialised values into the result. We saw this as recurrent training runs that
   differed from run to run in the third significant digit.
2. ``swapped_cuda_module`` replaces a module's global ``cuda`` with the fake module around each
   device-function call and puts the real one back on exit. A device function defined in
   another module than its kernel is entered and left by many threads at once; the first to
   leave restores the real module while the others still run, and their next ``cuda.*`` fails
   (``module 'numba.cuda' has no attribute ...``). Upstream numba-cuda fixed this later; the
   simulator bundled with numba 0.68 has it.

:func:`install` replaces both with versions under one lock (the swap reference-counted per
module), once per process, and only when the simulator is on. A GPU never sees this module.
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
