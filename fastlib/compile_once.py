"""Compile a large kernel in one process at a time: the others wait and load it from the cache.

Numba compiles a kernel in each process that calls it before its machine code is on disk. Two
processes that reach the epoch kernel together (the workers of ``verigrad conform``, the test
workers, a training run beside a test) both spend the minute it takes. ``compiled_for`` takes a
lock file named after the kernel, its signature and its cache folder while it compiles or
loads: the second process waits, then loads what the first one saved, and the freed core runs
other work. Inside ``deferring()`` it does not wait: it raises ``CompileBusy``, so a conform
worker can put the task back and run another one meanwhile.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

__all__ = ["CompileBusy", "call_typed", "compiled_for", "deferring", "native_entry",
           "read_only"]

_DEFER = [False]   # inside deferring(): a busy lock raises instead of waiting
#: (dispatcher, the arguments' type key) -> the machine code's entry point (:func:`call_typed`)
_ENTRIES = {}


class CompileBusy(BaseException):
    """Another process is compiling this kernel now (raised only inside ``deferring()``).

    A ``BaseException``, like ``KeyboardInterrupt``: a check that reports any ``Exception`` of
    the code it runs as a failure must let it through to the worker that put the task back.
    """


def read_only(a):
    """A read-only view of ``a`` (``a`` itself keeps its flags).

    NOTE: Numba types a read-only array apart from a writable one, so a kernel called with
    both (the tape's values are read-only, a user's arrays are not; a broadcast operand is
    read-only) was compiled twice per dtype. The launchers pass every input as a read-only
    view: one signature per dtype, and a kernel cannot write to its inputs.
    """
    view = a.view()
    view.flags.writeable = False
    return view


def _signature(dispatcher, args):
    from numba.core.typing.typeof import Purpose, typeof

    return tuple(typeof(a, Purpose.argument) for a in args)


def _lock_path(dispatcher, sig):
    cache = getattr(dispatcher, "_cache", None)
    where = str(getattr(cache, "_cache_path", "") or "")
    key = hashlib.sha1(f"{where}|{sig}".encode()).hexdigest()[:12]
    name = getattr(dispatcher.py_func, "__qualname__", "kernel")
    module = getattr(dispatcher.py_func, "__module__", "fastlib")
    folder = os.path.join(tempfile.gettempdir(), f"verigrad-compile-{os.getuid()}"
                          if hasattr(os, "getuid") else "verigrad-compile")
    return os.path.join(folder, f"{module}.{name}-{key}.lock")


@contextlib.contextmanager
def deferring():
    """Inside: ``compiled_for`` raises ``CompileBusy`` where it would wait for another process."""
    before, _DEFER[0] = _DEFER[0], True
    try:
        yield
    finally:
        _DEFER[0] = before


@contextlib.contextmanager
def _exclusive(path, what="kernel"):
    try:
        import fcntl
    except ImportError:      # no advisory locks here (Windows): compile without one
        yield
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a+b")
    except OSError:          # no writable temporary folder: compile without a lock
        yield
        return
    with handle:
        if _DEFER[0]:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CompileBusy(f"another process is compiling {what}") from None
        else:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def compiled_for(dispatcher, *args):
    """Make sure ``dispatcher`` has machine code for ``args``' types, one process at a time.

    Parameters
    ----------
    dispatcher : numba.core.registry.CPUDispatcher
        A ``cache=True`` kernel.
    *args
        The arguments of the coming call (only their types matter).

    Returns
    -------
    dispatcher
        The same kernel, now holding the overload (compiled here, or loaded from the cache a
        process beside this one wrote while this one waited).

    Raises
    ------
    CompileBusy
        Inside ``deferring()``, when another process holds the kernel's lock.
    """
    return _compiled(dispatcher, _signature(dispatcher, args))


def _type_key(a):
    """What decides Numba's type of the argument ``a``, read without typing it: an array's
    dtype, rank, layout flags and writability; a tuple's class and items; else the class
    (a Python int, float or bool, or a NumPy scalar, types by its class alone)."""
    import numpy as np

    if isinstance(a, np.ndarray):
        f = a.flags
        return (a.dtype, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned)
    if isinstance(a, tuple):
        return (type(a), *map(_type_key, a))
    return type(a)


def call_typed(dispatcher, *args):
    """``dispatcher(*args)`` through :func:`compiled_for`, typing the arguments once per kind.

    NOTE: Numba types every argument on every call; an epoch kernel's (named tuples of some
    thirty arrays, record tables among them) took about 1 ms to type twice (once here, once
    in the dispatcher): a fifth of a small epoch. The arguments' :func:`_type_key` (tens of
    microseconds) finds the entry point of the overload their types chose the first time.
    """
    key = (dispatcher, tuple(map(_type_key, args)))
    entry = _ENTRIES.get(key)
    if entry is None:
        sig = _signature(dispatcher, args)
        _compiled(dispatcher, sig)
        entry = _ENTRIES[key] = dispatcher.overloads[sig].entry_point
    return entry(*args)


def _compiled(dispatcher, sig):
    if sig in dispatcher.overloads:  # this process has it already: no lock, no file
        return dispatcher
    with _exclusive(_lock_path(dispatcher, sig), dispatcher.py_func.__qualname__):
        dispatcher.compile(sig)      # loads from the cache when a process beside us wrote it
    return dispatcher


def native_entry(dispatcher, *args):
    """The ``(address, key)`` of ``dispatcher``'s machine code for ``args``' types, compiled
    (or loaded) through :func:`compiled_for`, for ``fastlib.kernels.native_call.call_compiled``.

    Parameters
    ----------
    dispatcher : numba.core.registry.CPUDispatcher
        A ``cache=True`` kernel that returns nothing.
    *args
        Arguments of the types the caller will pass (only their types matter).

    Returns
    -------
    tuple of numpy.int64
        The native entry point's address and the key of the argument types.
    """
    import numpy as np
    from numba.core import types

    from fastlib.kernels.native_call import types_key

    sig = _signature(dispatcher, args)
    result = _compiled(dispatcher, sig).overloads[sig]
    if result.signature.return_type != types.none:
        raise TypeError(f"native_entry: {dispatcher.py_func.__qualname__} returns "
                        f"{result.signature.return_type}; call_compiled calls kernels that "
                        "return nothing")
    address = result.library.get_pointer_to_function(result.fndesc.llvm_func_name)
    return np.int64(address), np.int64(types_key(sig))
