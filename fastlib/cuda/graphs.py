"""One submit per training step: the step recorded once as a CUDA graph and replayed per batch.

numba-cuda (0.29 and later) launches kernels into a ``cuda.core`` graph builder given where a
stream goes (``kernel[grid, block, builder]``); :class:`StepGraph` records one call of a step
function that way and replays it with one ``graph.launch(stream)``. Everything a step reads
that changes per batch (the batch's position in the epoch's order, the step's row, the
optimizer's step count) lives in device memory, and every buffer it touches is allocated once
per run (:class:`.device.Arena`), so the recorded arguments stay right for every batch.

Where recording is unavailable -- the simulator, a numba-cuda or cuda.core without graph
builders, ``FASTLIB_CUDA_GRAPHS=0`` -- :func:`support` says why and training runs the same
kernels as plain launches (``TrainingResult.cuda_mode``: ``"graph"`` or ``"launches"``).
"""
from __future__ import annotations

import os

from . import config, counters, device

__all__ = ["support", "run_stream", "StepGraph"]


def _core():
    from cuda.core import Device  # numba-cuda 0.30 imports it from there too
    return Device


def support():
    """``(True, None)`` where steps can be recorded as CUDA graphs, else ``(False, reason)``."""
    if config.SIMULATOR:
        return False, "numba's CUDA simulator has no CUDA graphs"
    if os.environ.get("FASTLIB_CUDA_GRAPHS", "1") == "0":
        return False, "FASTLIB_CUDA_GRAPHS=0 in the environment"
    try:
        _core()
    except Exception as exc:
        return False, f"cuda.core is not importable ({type(exc).__name__}: {exc})"
    return True, None


def run_stream(with_graphs):
    """``(stream, graph stream or None)``: a non-default stream for a training run.

    With graphs, one cuda.core stream serves both: numba-cuda launches and copies onto a
    cuda.core stream as onto its own, and ``graph.launch`` needs a cuda.core stream.
    """
    if with_graphs:
        dev = _core()()
        dev.set_current()
        stream = dev.create_stream()
        return stream, stream
    from numba import cuda
    return cuda.stream(), None


class StepGraph:
    """``record()`` -- one training step's launches -- captured once, replayed by :meth:`launch`.

    Nothing runs while recording; the launches recorded are not counted (a replay counts one
    graph launch).
    """

    def __init__(self, record):
        dev = _core()()
        builder = dev.create_graph_builder()
        builder.begin_building()
        before = counters.snapshot()
        try:
            with device.using_stream(builder):
                record()
        finally:
            built = builder.end_building()
            recorded = counters.difference(counters.snapshot(), before)
            for key, n in recorded.items():
                counters.add(key, -n)
        self.graph = built.complete()

    def launch(self, core_stream):
        """Replay the step on ``core_stream`` (asynchronous, like a kernel launch)."""
        counters.add("graph_launches")
        self.graph.launch(core_stream)
