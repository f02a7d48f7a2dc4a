"""A per-launch profile of device training: each kernel's grid, block, launches and GPU time.

Inside :func:`recording`, every launch of fastlib.cuda is tallied by (kernel, grid, block)
and, on a GPU, timed with a pair of CUDA events around it on its stream (so the launches run
one at a time, as in launches mode: a CUDA graph hides its kernels). The training run clears
the tally at the start of each epoch (:func:`begin_epoch`), so after a run it holds the last
epoch's launches: ``verigrad bench train --device cuda --profile`` prints it per step.
"""
from __future__ import annotations

import contextlib

from . import config

_ACTIVE = [None]


class Profile:
    """The tally: ``rows[(kernel, grid, block)] = [launches, events]`` and the epoch's steps."""

    def __init__(self):
        self.rows = {}
        self.steps = 0
        self.in_step = False

    def clear(self):
        self.rows = {}
        self.steps = 0

    def table(self):
        """One dict per (kernel, grid, block), most time (or launches) first: ``kernel``,
        ``grid``, ``block``, ``launches_per_step``, ``ms_per_step`` (None off a GPU)."""
        from numba import cuda

        steps = max(self.steps, 1)
        out = []
        for (name, grid, block), (count, events) in self.rows.items():
            ms = None
            if events and not config.SIMULATOR:
                events[-1][1].synchronize()
                ms = sum(cuda.event_elapsed_time(a, b) for a, b in events) / steps
            out.append({"kernel": name, "grid": grid, "block": block,
                        "launches_per_step": count / steps, "ms_per_step": ms})
        out.sort(key=lambda r: (-(r["ms_per_step"] or 0.0), -r["launches_per_step"],
                                r["kernel"]))
        return out


@contextlib.contextmanager
def recording():
    """Tally (and on a GPU, time) every launch inside the block; yields the :class:`Profile`."""
    before = _ACTIVE[0]
    _ACTIVE[0] = prof = Profile()
    try:
        yield prof
    finally:
        _ACTIVE[0] = before


def active():
    """The profile being recorded, or None."""
    return _ACTIVE[0]


def begin_epoch():
    """Clear the tally (a training run calls this at each epoch's start)."""
    if _ACTIVE[0] is not None:
        _ACTIVE[0].clear()


@contextlib.contextmanager
def step():
    """Tally the launches inside the block as one training step's (launches between steps,
    such as the loop's snapshots of the weights, are not a step's)."""
    prof = _ACTIVE[0]
    if prof is None:
        yield
        return
    prof.in_step = True
    try:
        yield
    finally:
        prof.in_step = False
        prof.steps += 1


def launch(name, configured, launch_config, args):
    """Run ``configured(*args)`` and tally it under (name, grid, block)."""
    prof = _ACTIVE[0]
    if not prof.in_step:
        return configured(*args)
    grid, block = _dims(launch_config[0]), _dims(launch_config[1])
    row = prof.rows.setdefault((name, grid, block), [0, []])
    row[0] += 1
    if config.SIMULATOR:
        return configured(*args)
    from numba import cuda

    stream = launch_config[2] if len(launch_config) > 2 else 0
    start, end = cuda.event(), cuda.event()
    start.record(stream)
    result = configured(*args)
    end.record(stream)
    row[1].append((start, end))
    return result


def _dims(d):
    return tuple(int(v) for v in d) if isinstance(d, tuple) else (int(d),)
