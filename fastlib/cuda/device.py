"""Host <-> device movement, availability, lazily compiled kernels and launch geometry.

Every op's host function (in the kernel modules) goes through here to move arrays: inputs are
made C-contiguous on the host and copied to the device flat (1-d), kernels work on flat arrays
with explicit shape / stride vectors, and results come back reshaped. Keeping movement in one
module means one place decides contiguity, dtype and the host/device round trip.
"""
from __future__ import annotations

import functools
import os

import numpy as np
from numba import cuda

from . import config

#: The one-line reason printed when no device (GPU or simulator) can run the kernels.
NO_GPU_REASON = ("no CUDA GPU found (numba.cuda.is_available() is False); "
                 "set NUMBA_ENABLE_CUDASIM=1 to run the simulator")


class CudaUnavailableError(RuntimeError):
    """Raised when a CUDA op is called where neither a GPU nor the simulator is available."""


def is_available() -> bool:
    """Whether the CUDA engine can run here.

    Returns
    -------
    bool
        True on a CUDA GPU that numba can drive, or under numba's CUDA simulator
        (``NUMBA_ENABLE_CUDASIM=1`` in the environment before numba is imported).
    """
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver install counts as "no GPU", with the reason below
        return False


def unavailable_reason() -> str | None:
    """Why the CUDA engine cannot run here.

    Returns
    -------
    str or None
        One human-readable line (what is missing and how to get the simulator), or None when
        :func:`is_available` is True.
    """
    if is_available():
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0") and not config.SIMULATOR:
        # The variable is read once, when numba is first imported.
        return ("NUMBA_ENABLE_CUDASIM is set but numba was imported before it was; "
                "set it in the environment before the process imports numba")
    return NO_GPU_REASON


def require_device() -> None:
    """Raise :class:`CudaUnavailableError` with the reason when no device can run kernels."""
    reason = unavailable_reason()
    if reason is not None:
        raise CudaUnavailableError(f"fastlib.cuda is unavailable: {reason}")


# ---------------------------------------------------------------------------------------------
# kernels compiled on first launch

class LazyKernel:
    """A ``cuda.jit`` kernel with explicit signatures, compiled at its first launch.

    Compiling eagerly at import would make ``import fastlib.cuda`` pay for every kernel (and
    fail outright where there is no CUDA toolkit); compiling at first use keeps import free and
    still gives each kernel fixed, explicit argument types.
    """

    def __init__(self, fn, signatures):
        self.fn = fn
        self.signatures = list(signatures)
        self._compiled = None
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    @property
    def compiled(self):
        if self._compiled is None:
            self._compiled = cuda.jit(self.signatures)(self.fn)
        return self._compiled

    def __getitem__(self, launch):
        return self.compiled[launch]


def kernel(*signatures):
    """Decorator: a :class:`LazyKernel` with the given signature strings."""
    def wrap(fn):
        return LazyKernel(fn, signatures)
    return wrap


#: The dtypes every kernel is compiled for.
DTYPES = ("float32", "float64")


def signatures(template: str) -> list[str]:
    """One signature per dtype: ``template`` with ``{t}`` replaced by float32 and float64."""
    return [template.format(t=t) for t in DTYPES]


# ---------------------------------------------------------------------------------------------
# launch geometry

def grid_1d(n: int, block: int = config.BLOCK) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride loop over ``n`` items."""
    blocks = max(1, min(config.MAX_GRID, (n + block - 1) // block))
    return blocks, block


def reduce_block(n: int) -> int:
    """Power-of-two threads per block for a tree reduction over ``n`` items each."""
    threads = 1
    while threads < n and threads < config.REDUCE_BLOCK:
        threads *= 2
    return threads


def contiguous_strides(shape) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for d in reversed(tuple(shape)):
        strides.append(step)
        step *= int(d)
    return tuple(reversed(strides))


def broadcast_strides(shape, out_shape) -> tuple[int, ...]:
    """Element strides that read a C-contiguous ``shape`` array at each index of ``out_shape``.

    Leading missing axes and size-1 axes get stride 0 (NumPy broadcasting as index math).
    """
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    own = contiguous_strides(shape)
    return tuple(0 if d == 1 and o != 1 else s for d, o, s in zip(shape, out_shape, own))


# ---------------------------------------------------------------------------------------------
# movement

def is_device_array(a) -> bool:
    """True for a numba device array (real or simulated: both have ``copy_to_host``)."""
    return not isinstance(a, np.ndarray) and callable(getattr(a, "copy_to_host", None))


def put(a: np.ndarray):
    """Copy a host array to the device, flat and C-contiguous."""
    return cuda.to_device(np.ascontiguousarray(a).reshape(-1))


def index_vectors(shape, strides):
    """Device int64 vectors of a shape and its element strides, for :func:`strided_offset`.

    A 0-d shape becomes ``[1]`` / ``[0]`` so kernels always receive a non-empty vector and the
    single index 0 decodes to offset 0.

    NOTE: cached per (shape, strides): kernels only read these vectors, and a training step
    repeats the same layouts every step, so after the first step its gathers upload nothing
    (a host-to-device copy from pageable memory would also wait for the queued kernels).
    """
    return _index_vectors(tuple(int(d) for d in shape), tuple(int(s) for s in strides))


@functools.lru_cache(maxsize=4096)
def _index_vectors(shape, strides):
    if not shape:
        shape, strides = (1,), (0,)
    return (cuda.to_device(np.asarray(shape, dtype=np.int64)),
            cuda.to_device(np.asarray(strides, dtype=np.int64)))


@cuda.jit(device=True)
def strided_offset(i, shape, strides):
    """Offset of the ``i``-th C-order index of ``shape`` in an array read with ``strides``."""
    offset = 0
    rest = i
    for k in range(shape.shape[0] - 1, -1, -1):
        d = shape[k]
        offset += (rest % d) * strides[k]
        rest //= d
    return offset


def empty(n: int, dtype):
    """An uninitialised flat device array of ``n`` elements."""
    return cuda.device_array(max(int(n), 0), dtype=np.dtype(dtype))


def _fill_body(out, value):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = value
        i += step


_fill = kernel("void(float32[::1], float64)", "void(float64[::1], float64)")(_fill_body)


def zeros(n: int, dtype):
    """A zero-filled flat device array of ``n`` elements (filled on the device)."""
    out = empty(n, dtype)
    if out.shape[0]:
        _fill[grid_1d(out.shape[0])](out, 0.0)
    return out


def get(d_array, shape) -> np.ndarray:
    """Copy a flat device array back and give it ``shape``."""
    return d_array.copy_to_host().reshape(tuple(shape))


def _cast_body(src, out):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = src[i]
        i += step


_cast = kernel("void(float64[::1], float32[::1])", "void(float64[::1], float64[::1])")(_cast_body)


def cast(d_src, dtype):
    """A float64 flat device array (a reduction's result) rounded to ``dtype`` on the device."""
    if np.dtype(dtype) == np.float64:
        return d_src
    out = empty(d_src.shape[0], dtype)
    if out.shape[0]:
        _cast[grid_1d(out.shape[0])](d_src, out)
    return out
