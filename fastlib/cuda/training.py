"""``train(device="cuda")``: the whole training step on the device, one small readback per epoch.

The long story: docs/fastlib.md, section ``fastlib/cuda/training.py``.
"""
from __future__ import annotations

import math

import numpy as np

from fastlib import optim as _optim
from fastlib.kernels.optim_rules import coefficient_dtype

from fastlib.kernels import instructions as ins

from . import counters, device, graphs, profile, recurrent
from . import train_kernels as tk
from .layers import DeviceUnsupportedError, launch
from .lowering import Lowered, compile_program, layers_of
from .mixed import DeviceMixed

__all__ = ["DeviceRun", "DeviceUnsupportedError", "HostBinding", "readbacks"]


def readbacks() -> int:
    """How many device-to-host copies fastlib.cuda has made in this process."""
    return counters.snapshot()["d2h_copies"]


class HostBinding:
    """Ties a model's host parameter arrays to their device copies.

    ``stale`` is True when the device holds newer weights than the host arrays; reading a
    bound layer's parameters then calls :meth:`sync` first (``Layer._params``).
    """

    def __init__(self, run):
        self.run = run
        self.stale = False

    def sync(self):
        """Copy the device weights into the host arrays (in place) and clear ``stale``."""
        self.stale = False  # first: the copy below reads the host dicts through the property
        self.run.params_to_host()


def check_supported(model, algorithm, options, x):
    """The model's compiled program (:func:`.lowering.compile_program`) for the data ``x``;
    raise :class:`DeviceUnsupportedError` for anything the device cannot train.

    Called before any data moves: the model (the message names the layer the program cannot
    hold, or the row kind without device kernels), the algorithm (only back-propagation runs
    on the device) and its options.
    """
    if algorithm != "bp":
        raise DeviceUnsupportedError(
            f"train(device='cuda'): algorithm {algorithm!r} runs only on the CPU (the device "
            f"path is back-propagation, algorithm='bp'); train it with device='cpu'")
    unknown = [k for k in options if k != "fused"]
    if unknown:
        raise DeviceUnsupportedError(f"train(device='cuda'): options {unknown} are not "
                                     "supported on the device")
    return compile_program(model, x)


class DeviceRun:
    """One training run on the device (see the module docstring).

    Parameters
    ----------
    ctx : fastlib.training.algorithms.StepContext
        The loop's context: model, params, optimizer, state, rate, config.
    x, y : ndarray
        The validated training inputs and targets (``train`` checked them once).
    readback : {"epoch", "step"}, optional
        When the steps' numbers come back (default :attr:`default_readback`).

    Attributes
    ----------
    mode : {"graph", "launches"}
        How the steps were submitted: one CUDA graph replay per step, or the same kernels
        launched one by one (:mod:`.graphs` says when and why).
    graph_reason : str or None
        Why steps are not graphs (None in graph mode).
    device_counts : dict
        Per-step counts of the last epoch (:mod:`.counters` keys, mean over its steps) and
        ``"per_epoch"``: that epoch's boundary traffic (order, coefficients, state, readback).
    recurrent_mode : {"persistent", "per-step"} or None
        How the recurrent layers stepped through time: one cooperative launch per layer and
        direction, or one launch per time step (:mod:`.recurrent`); None without one.
    recurrent_reason : str or None
        Why not persistent (None when persistent, or without a recurrent layer).
    """

    #: "epoch": one readback per epoch (nothing in the loop needs a step's numbers sooner);
    #: "step": one readback after every step.
    default_readback = "epoch"

    def __init__(self, ctx, x, y, readback=None):
        device.require_device()
        self.readback = readback or self.default_readback
        if self.readback not in ("epoch", "step"):
            raise ValueError(f"readback must be 'epoch' or 'step', got {self.readback!r}")
        self.program = check_supported(ctx.model, ctx.config.algorithm, ctx.config.extra, x)
        self.ctx = ctx
        self.model = ctx.model
        self.dtype = np.dtype(self.model.dtype)
        self.opt = ctx.optimizer
        self.host_params = ctx.params  # the model's own arrays (synchronised in place)
        self.stream, self.core_stream, self.graph_reason = graphs.run_stream()
        self.mode = "launches" if self.core_stream is None else "graph"
        self.graphs = {}
        self.arena = device.Arena()
        self.device_counts = None
        self.n = int(x.shape[0])
        bs = ctx.config.batch_size
        self.n_steps = -(-self.n // bs)
        # the loss kernel's blocks: one row of numbers per step holds their loss and hit
        # partials and the guard's four
        self.blocks = device.grid_1d(bs, device.config.REDUCE_BLOCK)[0]
        mp = ctx.scratch.get("mixed_precision")
        # per step: the loss kernel's loss and hit partials, the guard's numbers, and (mixed
        # precision with a loss scale) the scale's state after the step
        self.width = 2 * self.blocks + tk.GUARD_SIZE + DeviceMixed.row_extra(mp)
        self.mixed = None
        with device.using_stream(self.stream):
            self._allocate(ctx, x, y)
            if mp is not None:   # mixed precision: the rows read the masters rounded
                self.mixed = DeviceMixed(mp, self.w.shape[0])
                if not self.model.takes_indices:   # the inputs as the format holds them
                    self.mixed.round_in_place(self.x)
        self.t = int(ctx.opt_state.t)
        self.recurrence = recurrent.Recurrence()
        self.lowered = Lowered(self.program, self.mixed.w16 if self.mixed else self.w, self.g,
                               self.recurrence, self.dtype, rounding=self.mixed)
        self.loss_code = tk.LOSS_CODES[ctx.loss_type]
        self.categorical = self.loss_code in (tk.CE, tk.CCE)
        self.x_shape = tuple(x.shape[1:])
        self.binding = HostBinding(self)
        for _, layer, _ in layers_of(self.model):
            layer._device_binding = self.binding

    def _host(self, flat):
        """Host arrays keyed like the model's parameters, cut from a flat host vector laid
        out by the program's blocks."""
        arrays = {k: np.empty_like(v, dtype=self.dtype) for k, v in self.host_params.items()}
        self.program.unflatten(flat, arrays)
        return arrays

    def _allocate(self, ctx, x, y):
        """Everything the run keeps on the device, allocated (and uploaded) once."""
        dt = self.dtype
        # one flat buffer each for the weights, their gradients and every optimizer slot, laid
        # out by the program's blocks: the guard and the update are one pass over it; the rows
        # read and write their blocks
        flat = self.program.flatten(self.host_params)
        self.w = device.put(flat)
        self.g = device.empty(flat.shape[0], dt)
        self.slot = {s: device.put(self.program.flatten(ctx.opt_state.slots[s]))
                     for s in self.opt.state_names}
        self.none = device.empty(0, dt)
        if self.model.takes_indices:
            for _, layer, _ in layers_of(self.model):
                if type(layer).__name__ == "Embedding":
                    layer.indices(x)  # the range check, once for the whole data set
            self.x = device.put(np.asarray(x).astype(np.int64))
        else:
            self.x = device.put(np.asarray(x, dt))
        if tk.LOSS_CODES[ctx.loss_type] == tk.CE:
            self.y = device.put(np.asarray(y).reshape(-1).astype(np.int64))
        else:
            self.y = device.put(np.asarray(y, dt))
        self.order = device.empty(self.n, np.int64)
        self.state = device.empty(tk.STATE_SIZE, np.int64)
        self.table = device.empty(self.n_steps, coefficient_dtype(dt))
        self.rows = device.zeros(self.n_steps * self.width, np.float64)
        self.partials = device.empty(2 * device.config.GUARD_BLOCKS, np.float64)

    @property
    def recurrent_mode(self):
        return self.recurrence.mode if self._has_recurrent() else None

    @property
    def recurrent_reason(self):
        return None if self.recurrent_mode is None else self.recurrence.reason

    def _has_recurrent(self):
        return bool(self.program.kinds() & {ins.RNN, ins.LSTM})

    def finish(self):
        """Free the device copies of the data and the optimizer state at the end of a run.

        Only the weights stay on the device, for the host's synchronisation on demand (the
        optimizer state was copied into every checkpoint already).
        """
        self.x = self.y = self.g = None
        self.slot = {}
        self.lowered = self.arena = None
        self._drop_graphs()

    def _drop_graphs(self):
        for graph in self.graphs.values():
            graph.close()
        self.graphs = {}

    # -- host copies ----------------------------------------------------------------------------
    def params_to_host(self):
        """Copy every device weight into the model's host arrays (in place): one readback."""
        with device.using_stream(self.stream):
            flat = device.read(self.w)
        self.program.unflatten(flat, self.host_params)

    def opt_state_to_host(self):
        """The optimizer state as a host :class:`fastlib.optim.OptState` (for checkpoints)."""
        with device.using_stream(self.stream):
            slots = {s: self._host(device.read(d)) for s, d in self.slot.items()}
        state = _optim.OptState(self.t, slots)
        self.ctx.opt_state = state
        return state

    # -- snapshots on the device ------------------------------------------------------------------
    def _copy(self, d, out=None):
        out = device.empty(d.shape[0], d.dtype) if out is None else out
        if d.shape[0]:
            launch(tk.copy, d.shape[0])(d, out)
        return out

    def snapshot(self):
        """Device copies of the weights, the optimizer state and its step count."""
        with device.using_stream(self.stream):
            return (self._copy(self.w), {s: self._copy(d) for s, d in self.slot.items()},
                    self.t)

    def restore(self, snap, with_state=True):
        """Put a :meth:`snapshot` back (weights only when ``with_state`` is False)."""
        w, slots, t = snap
        with device.using_stream(self.stream):
            self._copy(w, self.w)
            if with_state:
                for s, d in slots.items():
                    self._copy(d, self.slot[s])
                self.t = t
        self.binding.stale = True

    def snapshot_from_host(self, params):
        """A weights-only snapshot from host arrays (a checkpoint's best weights)."""
        flat = self.program.flatten(params)
        with device.using_stream(self.stream):
            return device.put(flat), {}, self.t

    def snapshot_to_host(self, snap):
        """Host arrays of a snapshot's weights (for a checkpoint)."""
        with device.using_stream(self.stream):
            flat = device.read(snap[0])
        return self._host(flat)

    # -- the epoch ------------------------------------------------------------------------------
    def run_epoch(self, order, stats):
        """Train one epoch on the device; fill ``stats`` (an EpochStats) as the CPU loop does.

        ``order`` is the epoch's sample order (None: in order). Training stops at the first
        batch whose loss is not finite (its update and every later one are not applied),
        recorded in ``stats``. The epoch's traffic is three uploads into buffers allocated once
        (the order, the optimizer's coefficients, the step state) and, with
        ``readback="epoch"`` (the default), one copy of the steps' numbers at its end; with
        ``"step"``, one copy after each step.
        """
        ctx = self.ctx
        bs = ctx.config.batch_size
        starts = list(range(0, self.n, bs))
        idx = np.arange(self.n, dtype=np.int64) if order is None else \
            np.asarray(order, dtype=np.int64)
        per_step = self.readback == "step"
        step_counts = dict.fromkeys(counters.KEYS, 0)
        epoch_start = counters.snapshot()
        # NOTE: NaN/Inf are reported by the loop (skipped steps, divergence); the simulator's
        # NumPy overflow warnings on the way there would only repeat it less clearly.
        profile.begin_epoch()
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), \
                device.using_stream(self.stream):
            device.upload(self.order, idx)
            device.upload(self.table, self.opt.coefficient_table(self.t + 1, len(starts),
                                                                 ctx.lr, self.dtype))
            device.upload(self.state, np.zeros(tk.STATE_SIZE, np.int64))
            if self.mixed is not None:
                self.mixed.upload_state(ctx.state)
                skips_before = int(ctx.state.get("loss_scale_skips", 0))
            for b, start in enumerate(starts):
                count = min(bs, self.n - start)
                before = counters.snapshot()
                with profile.step():
                    self._submit(count)
                stop = False
                if per_step:
                    row = device.read(self.rows[b * self.width:(b + 1) * self.width])
                    stop = not self._account(b, count, row, stats)
                for k, v in counters.difference(counters.snapshot(), before).items():
                    step_counts[k] += v
                if stop:
                    break
            steps_run = b + 1
            if not per_step:
                host = device.read(self.rows).reshape(len(starts), self.width)  # the one copy
                for b, start in enumerate(starts):
                    if not self._account(b, min(bs, self.n - start), host[b], stats):
                        break
        epoch = counters.difference(counters.snapshot(), epoch_start)
        self.device_counts = {k: step_counts[k] / steps_run for k in counters.KEYS}
        self.device_counts["per_epoch"] = {k: epoch[k] - step_counts[k] for k in counters.KEYS}
        ctx.opt_state.t = self.t
        if self.mixed is not None:
            stats.scaler_skips = int(ctx.state.get("loss_scale_skips", 0)) - skips_before
        self.binding.stale = True
        return stats

    def _account(self, b, count, row, stats):
        """Add step ``b``'s numbers to ``stats``; False when its loss was not finite."""
        blocks, dt = self.blocks, self.dtype
        n_terms = count if self.categorical else count * self.out_width
        self.ctx.step += 1
        guard = row[2 * blocks:]
        if self.mixed is not None:
            self.mixed.account(guard[tk.GUARD_SIZE:], self.ctx.state)
        if guard[tk.APPLY] != 0.0:
            self.t += 1
        # the mean in float64, rounded once to the dtype: the CPU loss kernels' value (a float32
        # loss beyond 3.4e38 is inf there too, which stops training at the same step)
        loss = float(dt.type(float(np.sum(row[:blocks])) / n_terms))
        if not math.isfinite(loss):
            stats.diverged_batch, stats.diverged_loss = b, loss
            return False
        stats.loss_sum += loss * count
        stats.count += count
        if self.loss_code == tk.MSE or stats.correct is None:
            stats.correct = None
        else:
            hits = float(np.sum(row[blocks:2 * blocks]))
            stats.correct += hits if self.categorical else hits / self.out_width
        stats.skipped += int(guard[tk.GRAD_FINITE] == 0.0)
        return True

    def _submit(self, count):
        """Queue one step of ``count`` samples: a graph replay where one was recorded for this
        batch size, else the kernels one by one (the first step of a size records its buffers;
        in graph mode the graph is recorded right after it, for the next step of that size)."""
        graph = self.graphs.get(count)
        if graph is not None:
            graph.launch(self.core_stream)
            return
        with self.arena.step(count):
            self._step(count)
        if self.mode == "graph":
            try:
                with self.arena.step(count):
                    self.graphs[count] = graphs.StepGraph(lambda: self._step(count))
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
                if self.recurrence.mode == "persistent" and self.recurrence.used:
                    # the cooperative launches may be what capture refused: the next step of
                    # this size runs per step (compiling those kernels) and is recorded then
                    self.recurrence.fall_back(f"recording a step with its persistent recurrent "
                                              f"kernels as a CUDA graph failed ({why})")
                    self._drop_graphs()
                    return
                # no graphs after all: the same kernels, launched (the step itself already
                # ran as launches; recording runs nothing)
                self.mode = "launches"
                self.graph_reason = (f"recording the step of {count} samples as a CUDA graph "
                                     f"failed ({why})")
                self._drop_graphs()

    def _step(self, count):
        """One step's launches: batch, forward, loss, backward, guard, update.

        Every argument is the same at every step of this batch size (the batch's position,
        the step's row and the optimizer's step count are read from ``self.state``)."""
        cfg, dt = self.ctx.config, self.dtype
        width_x = int(np.prod(self.x_shape, dtype=np.int64))
        mixed = self.mixed
        if mixed is not None:
            mixed.round_weights(self.w)
        xb = device.empty(count * width_x, self.x.dtype)
        launch(tk.gather_rows, count * width_x)(self.x, self.order, self.state, xb, count,
                                                width_x)
        pred = self.lowered.forward(xb, count)
        rows = pred.shape[0]
        width = int(np.prod(pred.shape[1:], dtype=np.int64))
        self.out_width = width
        n_terms = rows if self.categorical else rows * width
        grad = device.empty(rows * width, dt)
        eps = float(np.finfo(dt).eps)
        tk.loss_rows[self.blocks, device.config.REDUCE_BLOCK](
            pred.data, self.y, self.order, self.state, grad, self.rows, self.width, rows, width,
            self.loss_code, 1.0 / n_terms, eps)
        if mixed is not None:
            mixed.scaled_cotangent(grad)
        self.lowered.backward(pred._replace(data=grad))
        if mixed is not None:
            mixed.unscaled_gradients(self.g)
        tk.guard_partials[device.config.GUARD_BLOCKS, device.config.REDUCE_BLOCK](
            self.g, self.partials)
        slots = [self.slot[s] for s in self.opt.state_names] + [self.none, self.none]
        blocks = max(1, min(device.config.UPDATE_BLOCKS,
                            device.grid_1d(self.w.shape[0])[0]))
        tk.guarded_update[blocks, device.config.BLOCK](
            self.opt.kind, self.w, self.g, slots[0], slots[1], self.table, self.state,
            self.rows, self.width, self.blocks, self.partials,
            float(cfg.gradient_clip), int(cfg.clip_mode == "norm"), 1.0 / n_terms,
            float(np.finfo(dt).max), count)
        if mixed is not None:
            mixed.scale_step(self.rows, self.state, self.width, self.blocks)
