"""One submit per training step: the step recorded once as a CUDA graph and replayed per batch.

:class:`StepGraph` records one call of a step function into a ``cuda.core`` graph builder
(numba-cuda 0.29+ launches into a builder where a stream goes), in ``thread_local`` capture
mode so an unsafe call fails instead of running outside the graph, and replays it with one
``Graph.launch(stream)``. Whatever changes per batch (position in the order, row, step count)
lives in device memory, and every buffer is allocated once per run, so the frozen arguments
stay right. Where recording is unavailable or fails, :func:`support` or the run says why and
the same kernels run as plain launches (``TrainingResult.cuda_mode``, ``cuda_graph_reason``).
The full story (the calls, :class:`RecordingError`, deferred frees): docs/gpu.md.
"""
from __future__ import annotations

import os

from . import config, counters, device
from .device import RecordingError

__all__ = ["support", "run_stream", "StepGraph", "RecordingError"]


def _core():
    """cuda.core's ``Device`` (numba-cuda 0.29+ builds on cuda.core and imports it the same)."""
    from cuda.core import Device
    return Device


def support():
    """``(True, None)`` where steps can be recorded as CUDA graphs, else ``(False, reason)``."""
    if os.environ.get("FASTLIB_CUDA_GRAPHS", "1") == "0":
        return False, "FASTLIB_CUDA_GRAPHS=0 in the environment"
    if config.SIMULATOR:
        return False, "numba's CUDA simulator has no CUDA graphs"
    from . import profile
    if profile.active() is not None:
        return False, "profiling: each kernel is launched and timed on its own"
    try:
        from numba.cuda.cudadrv import driver
    except Exception as exc:  # pragma: no cover - fastlib.cuda reports it as unavailable first
        return False, f"numba.cuda is not importable ({type(exc).__name__}: {exc})"
    if not hasattr(driver, "GraphBuilder"):
        return False, (f"this numba-cuda cannot launch into a CUDA graph builder (0.29 or "
                       f"later can; {device.INSTALL_HINT} installs one)")
    try:
        _core()
    except Exception as exc:
        return False, f"cuda.core is not importable ({type(exc).__name__}: {exc})"
    return True, None


def run_stream():
    """``(stream, graph stream or None, reason or None)``: a non-default stream for a run.

    With graphs, one cuda.core stream serves both: numba-cuda launches and copies onto a
    cuda.core stream as onto its own, and ``Graph.launch`` takes a cuda.core stream. Without,
    a numba stream, and the reason graphs are off.
    """
    ok, reason = support()
    if ok:
        try:
            dev = _core()()
            dev.set_current()  # the primary context, the one numba uses
            stream = dev.create_stream()
            return stream, stream, None
        except Exception as exc:
            reason = f"creating a cuda.core stream failed ({type(exc).__name__}: {exc})"
    from numba import cuda
    return cuda.stream(), None, reason


def _discard(builder):
    """End a failed recording and close its builder, whatever state capture was left in.

    ``end_building`` raises on an invalidated capture; ``close`` ends the capture
    (``cuStreamEndCapture``, which raises once more for an invalidated one, but ends it) and,
    called again, closes the builder's stream. The recording's own exception is the one
    that matters, so these are not re-raised.
    """
    for step in (builder.end_building, builder.close, builder.close):
        try:
            step()
        except Exception:
            pass


class StepGraph:
    """``record()`` -- one training step's launches -- captured once, replayed by :meth:`launch`.

    Nothing runs while recording; the launches recorded are not counted (a replay counts one
    graph launch). Raises whatever recording raised (:class:`RecordingError` for a copy, wait
    or allocation inside the step), after ending the capture and closing the builder.

    Attributes
    ----------
    recorded : dict
        The counts of the recorded step (:mod:`.counters` keys): its kernel launches.
    """

    def __init__(self, record):
        from numba import cuda

        builder = _core()().create_graph_builder()
        before = counters.snapshot()
        try:
            # NOTE: the mode is given, not left to cuda.core: its default was "global" in the
            # experimental releases and is "relaxed" since, which would let an unsafe call run
            # outside the graph instead of failing
            builder.begin_building(mode="thread_local")
            with cuda.defer_cleanup(), device.recording(builder):
                record()
            builder.end_building()
            self.graph = builder.complete()
        except BaseException:
            _discard(builder)
            raise
        finally:
            self.recorded = counters.difference(counters.snapshot(), before)
            for key, n in self.recorded.items():
                counters.add(key, -n)
        builder.close()  # the executable graph does not need the builder's graph or stream

    def launch(self, core_stream):
        """Replay the step on ``core_stream`` (asynchronous, like a kernel launch)."""
        counters.add("graph_launches")
        self.graph.launch(core_stream)

    def close(self):
        """Destroy the executable graph now (cuda.core would at garbage collection)."""
        self.graph.close()
