"""Counts of what fastlib.cuda asks of the device: launches, allocations, copies, waits.

Counted at fastlib.cuda's own call sites (the launcher, the allocator, the copies and waits of
:mod:`.device`), not by a driver profiler, so the same numbers come out on a GPU and under
numba's simulator: a test can hold a training step to its budget without a GPU. Keys
(cumulative since start or :func:`reset`): ``kernel_launches`` (a replayed graph counts none),
``graph_launches``, ``allocations`` (uploads included), ``h2d_copies``, ``d2h_copies`` and
``synchronizations`` (explicit waits and blocking readbacks). docs/gpu.md gives the budgets.
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
