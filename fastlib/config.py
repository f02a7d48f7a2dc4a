"""Tunables of fastlib's kernels, in one place.

Everything here is read when a wrapper runs (thresholds, threads) or when a kernel module is
imported (``FASTMATH``). Change ``FASTMATH`` only before importing ``fastlib.kernels``, and clear
the Numba cache (``fastlib/**/__pycache__/*.nbi|*.nbc``) afterwards: Numba's cache key does not
include compiler flags.
"""
from __future__ import annotations

import os
import time

# NOTE: the only fast-math flag is "contract" (fused multiply-add). Contraction never makes a
# result less accurate than the separate multiply and add, and the kernels contain no
# error-free transformations that it could break. Reassociation ("reassoc"), "nnan" and "ninf"
# stay off: the kernels rely on IEEE NaN/Inf propagation and on exact sequences such as
# (1 + u) - 1 in log1p, which reassociation would fold away.
FASTMATH = {"contract"}

# Elementwise and row-wise kernels run their ``prange`` over chunks; below this many elements
# one chunk is used (one thread): a thread hand-off costs a few microseconds, about the time
# of 2**14 float32 activations.
PARALLEL_MIN_SIZE = int(os.environ.get("VERIGRAD_PARALLEL_MIN_SIZE", 1 << 15))

# Smallest chunk handed to a thread once the kernel runs in parallel.
PARALLEL_MIN_CHUNK = 1 << 14

# NOTE: a long row of a sum is cut into at most this many pieces (each at least
# PARALLEL_MIN_CHUNK long) whatever the thread count, so that the summation order, and with it
# every bit of the result, does not depend on how many cores were idle at call time.
SUM_ROW_PIECES = 8

# NOTE: how many pieces a compiled training step is cut into (fastlib.training.piece_plan).
# None lets the run choose from the cores this process may use and the model's size; a whole
# number fixes the plan, and with it every bit of the result, on any machine. Read from
# VERIGRAD_PIECES at import; set it here (or pass ``pieces=`` to ``train``) to override.
PIECES = os.environ.get("VERIGRAD_PIECES") or None

# The compiled training schedules fastlib may use, by name, in fastlib.training.schedules'
# order; None allows every one. ("general",) runs every program in the one interpreter: the
# schedule benchmark (docs/architecture.md) measures each specialised schedule against it.
SCHEDULES = None

# Threads for parallel kernels; None means Numba's default (all cores), reduced to the cores
# that are idle right now when ADAPTIVE_THREADS is on.
THREADS = int(os.environ["VERIGRAD_THREADS"]) if os.environ.get("VERIGRAD_THREADS") else None

# NOTE: a parallel region waits for its slowest worker. On a machine whose cores are busy with
# other processes a worker waits a scheduler time slice before it runs: kernels of 0.3 ms took
# 8-12 ms with two threads on this two-core machine under load, against 0.5 ms serial. So the
# kernels only go parallel onto cores that are idle: the number of runnable tasks in
# /proc/loadavg (an instantaneous count, ours included) is checked at most every
# LOAD_CHECK_SECONDS. Set VERIGRAD_ADAPTIVE_THREADS=0 (or THREADS) to turn this off.
ADAPTIVE_THREADS = os.environ.get("VERIGRAD_ADAPTIVE_THREADS", "1") != "0"
LOAD_CHECK_SECONDS = 0.25
_idle = {"checked": -1.0, "cores": 1}


def _own_running_threads() -> int:
    """Threads of this process in state R (running or runnable); at least 1, the caller."""
    running = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                # the state follows the parenthesised command name, which may contain spaces
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        running += state == "R"
    return max(1, running)


def _idle_cores() -> int:
    """Cores not running another task right now (>= 1); all cores where unknown."""
    now = time.monotonic()
    if now - _idle["checked"] >= LOAD_CHECK_SECONDS:
        cores = os.cpu_count() or 1
        try:
            with open("/proc/loadavg") as fh:
                running = int(fh.read().split()[3].split("/")[0])
            # Our own runnable threads are not competition: the calling thread is one, and
            # OpenMP workers spin for a while after a parallel region, so counting them made
            # the second of two back-to-back kernels think the other core was busy.
            running_elsewhere = max(0, running - _own_running_threads())
            _idle["cores"] = max(1, min(cores, cores - running_elsewhere))
        except (OSError, ValueError, IndexError):
            _idle["cores"] = cores
        _idle["checked"] = now
    return _idle["cores"]


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def num_threads() -> int:
    """Threads a parallel kernel may use: ``THREADS``, or Numba's configured number limited
    to the idle cores (``ADAPTIVE_THREADS``)."""
    if THREADS is not None:
        return max(1, THREADS)
    import numba

    # never more threads than cores we may use: Numba's default counts every CPU of the
    # machine, not the process's affinity
    n = min(numba.get_num_threads(), usable_cores())
    return min(n, _idle_cores()) if ADAPTIVE_THREADS and n > 1 else n


def num_chunks(size: int) -> int:
    """How many ``prange`` chunks a kernel over ``size`` elements should use (>= 1).

    One chunk below ``PARALLEL_MIN_SIZE``; otherwise one per thread, but never chunks smaller
    than ``PARALLEL_MIN_CHUNK``.
    """
    if size < PARALLEL_MIN_SIZE:
        return 1
    return max(1, min(num_threads(), size // PARALLEL_MIN_CHUNK))
