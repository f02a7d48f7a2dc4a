"""Counts of what fastlib.cuda asks of the device: launches, allocations, copies, waits.

Counted at fastlib.cuda's own call sites (the kernel launcher, the allocator, the copies and the
synchronisations of :mod:`.device`), not by a driver profiler, so the same numbers come out on a
GPU and under numba's simulator: a test can hold a training step to its budget without a GPU.

Keys (cumulative since the process started or the last :func:`reset`):

- ``kernel_launches``: kernels launched one by one (a replayed CUDA graph counts none);
- ``graph_launches``: CUDA graph replays (one per training step in graph mode);
- ``allocations``: device arrays created (uploads included);
- ``h2d_copies`` / ``d2h_copies``: host-to-device / device-to-host copies;
- ``synchronizations``: waits of the host for the device (explicit ones and the blocking
  readbacks, which wait for the queued work before they copy).
"""
from __future__ import annotations

KEYS = ("kernel_launches", "graph_launches", "allocations", "h2d_copies", "d2h_copies",
        "synchronizations")

_COUNTS = dict.fromkeys(KEYS, 0)

__all__ = ["KEYS", "snapshot", "reset", "add", "difference"]


def add(key: str, n: int = 1) -> None:
    """Count ``n`` events of ``key`` (one of :data:`KEYS`)."""
    _COUNTS[key] += n


def snapshot() -> dict:
    """The cumulative counts, one entry per key of :data:`KEYS`.

    Returns
    -------
    dict
        ``{key: int}``; a copy (later events do not change it).
    """
    return dict(_COUNTS)


def reset() -> None:
    """Set every count back to zero."""
    for k in KEYS:
        _COUNTS[k] = 0


def difference(after: dict, before: dict) -> dict:
    """``after - before`` per key (two :func:`snapshot` results)."""
    return {k: after[k] - before[k] for k in KEYS}
