"""Host <-> device movement, availability, lazily compiled kernels and launch geometry.

Every op's host function (in the kernel modules) goes through here to move arrays: inputs are
made C-contiguous on the host and copied to the device flat (1-d), kernels work on flat arrays
with explicit shape / stride vectors, and results come back reshaped. Keeping movement in one
module means one place decides contiguity, dtype and the host/device round trip, and one place
counts it (:mod:`.counters`): every launch, allocation, copy and wait of fastlib.cuda passes here.

Training adds two things (:mod:`.training`): a non-default stream that every launch and copy of
a run uses (:func:`using_stream`), and an :class:`Arena` that hands a training step the same
device buffers every step, so after the first step of a batch shape nothing is allocated.
"""
from __future__ import annotations

import contextlib
import functools
import os

import numpy as np

from . import counters
from . import profile as _PROFILE

try:
    from numba import cuda
    _IMPORT_ERROR = None
except Exception as exc:  # a broken or mismatched CUDA stack: reported, never a crash at import
    cuda = None
    _IMPORT_ERROR = exc

from . import config

#: The one-line reason printed when no device (GPU or simulator) can run the kernels.
NO_GPU_REASON = ("no CUDA GPU found (numba.cuda.is_available() is False); "
                 "set NUMBA_ENABLE_CUDASIM=1 to run the simulator")

#: How to install a CUDA stack that works together (pyproject's ``cuda`` extra).
INSTALL_HINT = "pip install 'verigrad[cuda]'"


class CudaUnavailableError(RuntimeError):
    """Raised when a CUDA op is called where neither a GPU nor the simulator is available."""


def import_failure_reason(exc) -> str:
    """One line naming the package that broke ``import numba.cuda`` and the fix."""
    text = f"{type(exc).__name__}: {exc}"
    if "row_stack" in text:
        return (f"import numba.cuda failed ({text}): NumPy {np.__version__} removed "
                f"numpy.row_stack, which this numba-cuda needs at import (fastlib.cuda bridges "
                f"it only after the import, at the first compile); install a NumPy before 2.5 "
                f"(pip install 'numpy<2.5') or a numba-cuda that imports without it")
    return (f"import numba.cuda failed ({text}); install numba-cuda with a CUDA runtime and a "
            f"NumPy it supports: {INSTALL_HINT}")


def is_available() -> bool:
    """Whether the CUDA engine can run here.

    Returns
    -------
    bool
        True on a CUDA GPU where numba-cuda can build kernels (:func:`unavailable_reason`
        is None), or under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` in the
        environment before numba is imported).
    """
    return unavailable_reason() is None


def _device_present() -> bool:
    """numba's own answer: a GPU it can drive (or the simulator)."""
    if cuda is None:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver install counts as "no GPU", with the reason below
        return False


def _driver_reason() -> str:
    """Why ``cuda.is_available()`` is False: numba's own detection message when it has one."""
    try:
        from numba.cuda.cudadrv import driver
        err = getattr(driver, "driver", None)
        init_error = getattr(err, "initialization_error", None)
        if init_error:
            return f"{NO_GPU_REASON} (CUDA driver: {' '.join(str(init_error).split())})"
    except Exception as exc:
        return f"{NO_GPU_REASON} (CUDA driver: {type(exc).__name__}: {exc})"
    return NO_GPU_REASON


def unavailable_reason() -> str | None:
    """Why the CUDA engine cannot run here.

    Returns
    -------
    str or None
        One human-readable line: the failing package and the fix when ``import numba.cuda``
        fails, or when numba-cuda cannot compile a one-line kernel on the GPU (checked once
        per process, after :func:`.compat.bridge_row_stack`), that no GPU was found (and how
        to get the simulator), or None when kernels can be built and run here.
    """
    if _IMPORT_ERROR is not None:
        return import_failure_reason(_IMPORT_ERROR)
    if _device_present():
        if config.SIMULATOR:
            return None
        from . import compat  # a GPU: can numba-cuda build a kernel with this NumPy?

        return compat.compile_problem(cuda)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0") and not config.SIMULATOR:
        # The variable is read once, when numba is first imported.
        return ("NUMBA_ENABLE_CUDASIM is set but numba was imported before it was; "
                "set it in the environment before the process imports numba")
    return _driver_reason()


def require_device() -> None:
    """Raise :class:`CudaUnavailableError` with the reason when no device can run kernels."""
    reason = unavailable_reason()
    if reason is not None:
        raise CudaUnavailableError(f"fastlib.cuda is unavailable: {reason}")


# ---------------------------------------------------------------------------------------------
# the stream (or CUDA graph builder) that launches and copies go to

_TARGET = [0]


@contextlib.contextmanager
def using_stream(stream):
    """Send every launch and copy of fastlib.cuda inside the block to ``stream``.

    ``stream`` is a numba stream (training uses a non-default one) or a CUDA graph builder
    being recorded; 0 is the default stream.
    """
    before = _TARGET[0]
    _TARGET[0] = stream
    try:
        yield stream
    finally:
        _TARGET[0] = before


def current_stream():
    """The stream launches go to now (0: the default stream)."""
    return _TARGET[0]


class RecordingError(RuntimeError):
    """A copy, wait or allocation asked for while a step is being recorded as a CUDA graph."""


_RECORDING = [False]


@contextlib.contextmanager
def recording(builder):
    """Send every launch inside the block to the CUDA graph ``builder`` being recorded.

    Copies, waits and allocations raise :class:`RecordingError` inside the block: a graph
    records kernels, and a host copy or a wait during stream capture would run outside the
    graph (or invalidate it), so a step that needs one cannot be recorded.
    """
    before = _RECORDING[0]
    _RECORDING[0] = True
    try:
        with using_stream(builder):
            yield builder
    finally:
        _RECORDING[0] = before


def _not_recording(what):
    if _RECORDING[0]:
        raise RecordingError(f"{what} while recording a training step as a CUDA graph: a "
                             f"recorded step may only launch kernels into buffers allocated "
                             f"before it")


def synchronize(stream=None):
    """Wait until ``stream`` (the current one by default) has finished; counted."""
    _not_recording("a synchronisation")
    stream = current_stream() if stream is None else stream
    counters.add("synchronizations")
    if stream:
        _wait(stream)
    else:
        cuda.synchronize()


def _wait(stream):
    # numba's streams have synchronize(), cuda.core's (graph mode) sync()
    (getattr(stream, "synchronize", None) or stream.sync)()


# ---------------------------------------------------------------------------------------------
# kernels compiled on first launch, one signature at a time

#: Every compile of this process: (kernel, signature, seconds), in order (gpu_check reads it).
COMPILES = []

#: Every :class:`LazyKernel` made in this process, in order (the PTX check compiles them all).
KERNELS = []

#: The line a process prints (once, to stderr) when it first compiles on a GPU.
COMPILE_NOTICE = ("fastlib.cuda: compiling GPU kernels at their first launch (only the "
                  "signatures this run uses; kept in numba's on-disk cache for later runs) ...")

_NOTICED = [False]


def _notice():
    """Print :data:`COMPILE_NOTICE` once per process, on a GPU (the simulator compiles nothing)."""
    if _NOTICED[0] or config.SIMULATOR:
        return
    _NOTICED[0] = True
    import sys

    print(COMPILE_NOTICE, file=sys.stderr, flush=True)


def _argument_dtypes(signature):
    """Per argument of a signature (a string, or the types ``optim.coefficient_signatures``
    builds), its array's NumPy dtype (None for a scalar); a record array's is its record."""
    from numba.core import sigutils
    from numba.np.numpy_support import as_dtype

    args, _ = sigutils.normalize_signature(signature)
    return tuple(as_dtype(t.dtype) if hasattr(t, "ndim") else None for t in args)


class LazyKernel:
    """A ``cuda.jit`` kernel with explicit signatures, each compiled at its first launch.

    Compiling eagerly at import would make ``import fastlib.cuda`` pay for every kernel (and
    fail outright where there is no CUDA toolkit); compiling every declared signature at the
    first launch would pay for dtypes a run never uses. So a launch picks its signature from
    its arguments' dtypes (only the argument positions where the signatures differ are read)
    and compiles that one signature once, with numba's on-disk cache where numba-cuda offers
    it (``cache=True``; fastlib's cache guard drops it when a source changes). Each signature
    is its own single-signature dispatcher, the launch path numba-cuda makes cheapest.
    """

    #: True for a kernel with a grid-wide barrier (numba-cuda launches it cooperatively).
    cooperative = False

    def __init__(self, fn, signatures, name=None):
        self.fn = fn
        self.signatures = list(signatures)
        self._by_key = {}
        self._positions = None
        self._keys = None
        self._bound = {}
        default = getattr(fn, "__name__", "kernel").lstrip("_")
        self.__name__ = name or (default[:-5] if default.endswith("_body") else default)
        self.__doc__ = getattr(fn, "__doc__", None)
        KERNELS.append(self)

    def _index(self):
        """The argument positions that tell the signatures apart, and each signature's key."""
        dtypes = [_argument_dtypes(s) for s in self.signatures]
        self._positions = tuple(i for i in range(len(dtypes[0]))
                                if len({d[i] for d in dtypes}) > 1)
        self._keys = [tuple(np.dtype(d[i]) for i in self._positions) for d in dtypes]

    def key(self, args):
        """The dtype key of a launch's arguments (which signature they call)."""
        if self._positions is None:
            self._index()
        return tuple(args[i].dtype for i in self._positions)

    def dispatcher(self, key):
        """The compiled single-signature kernel for ``key``, compiled now if it is new."""
        try:
            return self._by_key[key]
        except KeyError:
            pass
        if self._keys is None:
            self._index()
        if key not in self._keys:
            raise TypeError(f"{self.__name__}: no signature takes arguments of dtypes "
                            f"{[str(d) for d in key]} "
                            f"(at argument positions {self._positions}); it has "
                            f"{self.signatures}")
        signature = self.signatures[self._keys.index(key)]
        self._by_key[key] = compiled = compile_signature(self.fn, signature, self.__name__)
        return compiled

    def cooperative_blocks(self, key, block):
        """The most blocks of ``block`` threads a cooperative launch of signature ``key`` may
        have here (all co-resident on the GPU; 1 on the simulator, whose grid barrier is its
        block barrier). Compiles the signature if it is new."""
        compiled = self.dispatcher(key)
        if config.SIMULATOR:
            return 1
        overload = next(iter(compiled.overloads.values()))
        return int(overload.max_cooperative_grid_blocks(block))

    def compile_all(self):
        """Every declared signature, compiled now (tests and the PTX check; not a run's path)."""
        if self._keys is None:
            self._index()
        return [self.dispatcher(k) for k in self._keys]

    def __getitem__(self, launch):
        if len(launch) == 2 and _TARGET[0]:
            launch = (launch[0], launch[1], _TARGET[0])
        if _RECORDING[0] or config.SIMULATOR:
            # NOTE: not kept: a graph builder lives for one recording; and the simulator's
            # kernel[...] configures the kernel object itself and returns it, so a kept
            # configuration would change when the kernel is next configured otherwise
            return _Launch(self, launch, keep=False)
        # NOTE: configurations are bound once per (grid, block, stream) and reused: a training
        # step asks for the same few every step
        try:
            return self._bound[launch]
        except KeyError:
            if len(self._bound) >= 256:  # keeps no run's stream alive for long
                self._bound.clear()
            bound = self._bound[launch] = _Launch(self, launch, keep=True)
            return bound
        except TypeError:  # an unhashable stream: bind for this call only
            return _Launch(self, launch, keep=False)


def compile_signature(fn, signature, name):
    """``cuda.jit(signature)(fn)``, cached on disk where numba-cuda can, timed in COMPILES."""
    import time

    from . import compat

    if not config.SIMULATOR:
        compat.bridge_row_stack()
        _notice()
    t0 = time.perf_counter()
    compiled = None
    if config.CACHE and not config.SIMULATOR:
        try:
            compiled = cuda.jit(signature, cache=True)(fn)
        except Exception:  # NOTE: no writable cache folder, or a closure the cache cannot
            compiled = None  # key: compile without the cache (a real error repeats below)
    if compiled is None:
        compiled = cuda.jit(signature)(fn)
    COMPILES.append((name, signature, time.perf_counter() - t0))
    return compiled


class _Launch:
    """A configured kernel that counts its launches (:mod:`.counters`) and calls the
    signature its arguments' dtypes select."""

    __slots__ = ("kernel", "launch", "configured")

    def __init__(self, kernel, launch, keep):
        self.kernel = kernel
        self.launch = launch
        self.configured = {} if keep else None

    def __call__(self, *args):
        counters.add("kernel_launches")
        kern = self.kernel
        key = kern.key(args)
        if self.configured is None:
            configured = kern.dispatcher(key)[self.launch]
        else:
            try:
                configured = self.configured[key]
            except KeyError:
                configured = self.configured[key] = kern.dispatcher(key)[self.launch]
        if _PROFILE.active() is not None and not _RECORDING[0]:
            return _PROFILE.launch(kern.__name__, configured, self.launch, args)
        return configured(*args)


def device_function_here(fn, namespace):
    """``fn`` (a plain function) compiled as a device function that reads its globals from
    ``namespace`` (the calling kernel module's ``globals()``): see :func:`.reduce.last_to_arrive`."""
    import types

    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__)
    return cuda.jit(device=True)(copy)


def kernel(*signatures, name=None):
    """Decorator: a :class:`LazyKernel` with the given signature strings (and a ``name`` that
    tells a factory's kernels apart in :data:`COMPILES` and the profile)."""
    def wrap(fn):
        return LazyKernel(fn, signatures, name)
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


def tile_grid(m: int, n: int) -> tuple[int, int]:
    """(x, y) blocks of a tiled GEMM over an ``m`` × ``n`` result, ``config.TILE`` square tiles
    (grid-stride past ``config.MAX_GRID``)."""
    return (max(1, min(config.MAX_GRID, -(-n // config.TILE))),
            max(1, min(config.MAX_GRID, -(-m // config.TILE))))


_SM = []


def sm_count() -> int:
    """Streaming multiprocessors of the current GPU (a fixed 2 on the simulator)."""
    if not _SM:
        if config.SIMULATOR:
            _SM.append(2)
        else:
            _SM.append(int(cuda.get_current_device().MULTIPROCESSOR_COUNT))
    return _SM[0]


def fill_target() -> int:
    """Blocks a launch should have to keep every multiprocessor busy."""
    return config.BLOCKS_PER_SM * sm_count()


_COUNTERS = []


def arrival_counters(n: int):
    """At least ``n`` int64 zeros on the device, for the last-block-finishes reductions.

    The kernels count their blocks' arrivals here and the last block to arrive resets its
    counter to zero, so the buffer stays zero between launches and is allocated (and zeroed)
    once per process; a larger one is added when needed and the smaller ones are kept, since
    recorded CUDA graphs hold their pointers.
    """
    if not _COUNTERS or _COUNTERS[-1].shape[0] < n:
        buf = _allocate(max(int(n), 1024), np.int64)
        fill(buf, 0.0)
        _COUNTERS.append(buf)
    return _COUNTERS[-1]


def row_grid(rows: int) -> int:
    """Blocks of a row kernel (one block per row, grid-stride over the rest)."""
    return max(1, min(config.MAX_GRID, int(rows)))


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
    """Copy a host array to the device, flat and C-contiguous (a new device array)."""
    _not_recording("a host-to-device copy")
    counters.add("allocations")
    counters.add("h2d_copies")
    host = np.ascontiguousarray(a).reshape(-1)
    if _TARGET[0]:
        return cuda.to_device(host, stream=_TARGET[0])
    return cuda.to_device(host)


def upload(d_array, a) -> None:
    """Copy a host array into an existing flat device array of the same size (no allocation)."""
    _not_recording("a host-to-device copy")
    counters.add("h2d_copies")
    host = np.ascontiguousarray(a, dtype=d_array.dtype).reshape(-1)
    if _TARGET[0]:
        d_array.copy_to_device(host, stream=_TARGET[0])
    else:
        d_array.copy_to_device(host)


def read(d_array) -> np.ndarray:
    """Copy a device array back to the host (a blocking readback: a copy and a wait)."""
    _not_recording("a device-to-host copy")
    counters.add("d2h_copies")
    counters.add("synchronizations")
    if _TARGET[0]:
        host = d_array.copy_to_host(stream=_TARGET[0])
        _wait(_TARGET[0])
        return host
    return d_array.copy_to_host()


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
    _not_recording("uploading a layout's index vectors")
    if not shape:
        shape, strides = (1,), (0,)
    counters.add("allocations", 2)
    counters.add("h2d_copies", 2)
    return (cuda.to_device(np.asarray(shape, dtype=np.int64)),
            cuda.to_device(np.asarray(strides, dtype=np.int64)))


def strided_offset(i, shape, strides):
    """Offset of the ``i``-th C-order index of ``shape`` in an array read with ``strides``."""
    offset = 0
    rest = i
    for k in range(shape.shape[0] - 1, -1, -1):
        d = shape[k]
        offset += (rest % d) * strides[k]
        rest //= d
    return offset


if cuda is not None:
    strided_offset = cuda.jit(device=True)(strided_offset)


class Arena:
    """The device buffers of a training step, handed out again at every step of the same shape.

    Inside :meth:`step` (keyed by the batch's size), :func:`empty` returns the plan's next
    buffer instead of allocating: the first step of a key allocates and records, every later
    step gets the same buffers in the same order (a step asks for the same sizes in the same
    order each time). Buffers live as long as the arena, so a recorded CUDA graph's pointers
    stay valid.
    """

    def __init__(self):
        self.plans = {}
        self._active = None

    @contextlib.contextmanager
    def step(self, key):
        plan = self.plans.setdefault(key, [])
        before = _ARENA[0]
        _ARENA[0] = self
        self._active = [plan, 0]
        try:
            yield
        finally:
            _ARENA[0] = before
            self._active = None

    def take(self, n, dtype):
        plan, pos = self._active
        self._active[1] = pos + 1
        if pos < len(plan):
            buf = plan[pos]
            if buf.shape[0] == n and buf.dtype == dtype:
                return buf
            plan[pos] = buf = _allocate(n, dtype)   # the step changed shape: re-record
            return buf
        buf = _allocate(n, dtype)
        plan.append(buf)
        return buf


_ARENA = [None]


def _allocate(n, dtype):
    _not_recording(f"an allocation ({n} x {np.dtype(dtype).name})")
    counters.add("allocations")
    if _TARGET[0]:
        return cuda.device_array(n, dtype=dtype, stream=_TARGET[0])
    return cuda.device_array(n, dtype=dtype)


def empty(n: int, dtype):
    """An uninitialised flat device array of ``n`` elements (from the active :class:`Arena`)."""
    n, dtype = max(int(n), 0), np.dtype(dtype)
    if _ARENA[0] is not None:
        return _ARENA[0].take(n, dtype)
    return _allocate(n, dtype)


def _fill_body(out, value):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = value
        i += step


_fill = kernel("void(float32[::1], float64)", "void(float64[::1], float64)",
               "void(int64[::1], float64)")(_fill_body)


def fill(d_array, value: float) -> None:
    """Set every element of a flat device array to ``value`` (one launch on the device)."""
    if d_array.shape[0]:
        _fill[grid_1d(d_array.shape[0])](d_array, float(value))


def zeros(n: int, dtype):
    """A zero-filled flat device array of ``n`` elements (filled on the device)."""
    out = empty(n, dtype)
    fill(out, 0.0)
    return out


def get(d_array, shape) -> np.ndarray:
    """Copy a flat device array back and give it ``shape``."""
    return read(d_array).reshape(tuple(shape))


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
