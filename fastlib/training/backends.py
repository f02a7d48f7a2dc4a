"""Where a run's epochs execute: the host (CPU) or the device (CUDA), behind one interface.

The loop asks a back end to run an epoch, to snapshot and restore the weights (with or without
the optimizer state: the last good epoch for a divergence, the best one for ``train_sh``), and
for host copies a checkpoint can hold. The host back end keeps NumPy copies; the device back
end (``fastlib.cuda.training.DeviceRun``) keeps device copies, so a snapshot never crosses the
bus. Data-parallel runs are host runs whose algorithm ``fastlib.training.distributed`` wraps.
"""
from __future__ import annotations

import math

import numpy as np

from fastlib.training import epochs
from fastlib.training.algorithms import EpochStats

__all__ = ["HostBackend", "DeviceBackend", "check_device", "open_backend", "max_abs"]


def check_device(device) -> None:
    """Refuse an unknown device, or ``"cuda"`` where no GPU (nor the simulator) can run.

    Raises
    ------
    ValueError
        ``device`` is not ``"cpu"`` or ``"cuda"``.
    RuntimeError
        ``"cuda"`` without a usable device, with the reason.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        from fastlib.cuda import device as cuda_device

        reason = cuda_device.unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"device='cuda' is not available: {reason}; train with "
                               "device='cpu'")


class HostBackend:
    """The CPU: the algorithm's whole-epoch path where it applies, else batch by batch."""

    def __init__(self, ctx, algo, data):
        self.ctx, self.algo, self.data = ctx, algo, data

    def run_epoch(self, order) -> EpochStats:
        """Train one epoch in ``order`` (None: in order) and return its statistics."""
        ctx, x, y = self.ctx, self.data.x, self.data.y
        stats = None
        if self.algo.run_epoch is not None:
            stats = self.algo.run_epoch(ctx, x, y, order)
        return stats if stats is not None else epochs.run_batches(ctx, self.algo, x, y, order)

    def path(self, stats) -> str:
        """Which path ran the epoch (``TrainingResult.path``)."""
        return stats.path

    def snapshot(self, with_state=True):
        """Copies of the weights (and the optimizer state) to :meth:`restore` later."""
        params = {k: v.copy() for k, v in self.ctx.params.items()}
        return params, (self.ctx.opt_state.copy() if with_state else None)

    def restore(self, snap) -> None:
        """Put a :meth:`snapshot` back (its optimizer state too, when it holds one)."""
        params, opt_state = snap
        for k, v in self.ctx.params.items():
            np.copyto(v, params[k])
        if opt_state is not None:
            self.ctx.opt_state = opt_state

    def checkpoint_state(self, best):
        """``(optimizer state, best weights)`` as host arrays for a checkpoint."""
        return self.ctx.opt_state, None if best is None else best[0]

    def from_host(self, params):
        """A weights-only snapshot from host arrays (a checkpoint's best weights)."""
        return params, None

    def largest_weight(self):
        """The largest parameter magnitude (inf when one is not finite)."""
        return max_abs(self.ctx.params.values())

    def finish(self, result) -> None:
        """Nothing to release on the host."""


class DeviceBackend:
    """CUDA: every step on the device, weights and optimizer state resident there."""

    def __init__(self, ctx, data):
        from fastlib.cuda.training import DeviceRun

        self.ctx = ctx
        self.run = DeviceRun(ctx, data.x, data.y)

    def run_epoch(self, order) -> EpochStats:
        return self.run.run_epoch(order, EpochStats())

    def path(self, stats) -> str:
        return "cuda"

    def snapshot(self, with_state=True):
        """Device copies: the weights, the optimizer state and its step count."""
        return self.run.snapshot(), with_state

    def restore(self, snap) -> None:
        device_snap, with_state = snap
        self.run.restore(device_snap, with_state=with_state)

    def checkpoint_state(self, best):
        return (self.run.opt_state_to_host(),
                None if best is None else self.run.snapshot_to_host(best[0]))

    def from_host(self, params):
        return self.run.snapshot_from_host(params), False

    def largest_weight(self):
        # only the loss rules apply on the device: the weight and probe-gradient rules would
        # copy every weight to the host each epoch, which the device run exists to avoid
        return None

    def finish(self, result) -> None:
        """Record how the steps ran; keep only the weights on the device (for the sync)."""
        result.cuda_mode = self.run.mode
        result.cuda_graph_reason = self.run.graph_reason
        result.device_counts = self.run.device_counts
        self.run.finish()


def open_backend(ctx, algo, data, device, data_parallel):
    """The back end for ``device`` (``"cpu"`` or ``"cuda"``).

    Raises
    ------
    ValueError
        ``device="cuda"`` with data-parallel training, or a model the device cannot run.
    """
    if device == "cuda" and data_parallel is not None:
        raise ValueError("device='cuda' with distributed=True is not supported: data-parallel "
                         "training runs on the CPU engine; train on one GPU with "
                         "distributed=False, or across ranks with device='cpu'")
    if device == "cuda":
        return DeviceBackend(ctx, data)
    return HostBackend(ctx, algo, data)


def max_abs(arrays, finite_only=False):
    """The largest magnitude over ``arrays``: inf when any entry is NaN or Inf, or with
    ``finite_only`` the largest finite one."""
    largest = 0.0
    for a in arrays:
        if a.size:
            m = float(np.max(np.abs(a)))
            if not math.isfinite(m):
                if not finite_only:
                    return math.inf
                finite = np.abs(a[np.isfinite(a)])
                m = float(finite.max()) if finite.size else 0.0
            largest = max(largest, m)
    return largest
