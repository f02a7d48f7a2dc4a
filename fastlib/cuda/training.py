"""``train(device="cuda")``: the whole training step on the device, one small readback per epoch.

The long story: docs/fastlib.md, section ``fastlib/cuda/training.py``.
"""
from __future__ import annotations

import math

import numpy as np

from fastlib import optim as _optim

from . import device
from . import train_kernels as tk
from .layers import DT, DeviceUnsupportedError, build, launch

__all__ = ["DeviceRun", "DeviceUnsupportedError", "HostBinding", "readbacks"]

#: Device-to-host copies made by device training (tests count them; ``readbacks()`` reads it).
_READBACKS = [0]


def readbacks() -> int:
    """How many device-to-host copies device training has made in this process."""
    return _READBACKS[0]


def _read(d_array):
    _READBACKS[0] += 1
    return d_array.copy_to_host()


def _flat(d):
    return d.reshape(int(d.size)) if len(d.shape) != 1 else d


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


def _layers(model):
    yield model
    for c in getattr(model, "_children", ()):
        yield from _layers(c)


def check_supported(model, algorithm, options):
    """Raise :class:`DeviceUnsupportedError` for anything the device cannot train.

    Called before any data moves: the model's layer types (:func:`.layers.build` names the
    layer), the algorithm (only back-propagation runs on the device) and its options.
    """
    if algorithm != "bp":
        raise DeviceUnsupportedError(
            f"train(device='cuda'): algorithm {algorithm!r} runs only on the CPU (the device "
            f"path is back-propagation, algorithm='bp'); train it with device='cpu'")
    unknown = [k for k in options if k != "fused"]
    if unknown:
        raise DeviceUnsupportedError(f"train(device='cuda'): options {unknown} are not "
                                     "supported on the device")
    build(model, {}, "", "model")


class DeviceRun:
    """One training run on the device (see the module docstring).

    Parameters
    ----------
    ctx : fastlib.training.algorithms.StepContext
        The loop's context: model, params, optimizer, state, rate, config.
    x, y : ndarray
        The validated training inputs and targets (``train`` checked them once).
    """

    #: "epoch": one readback per epoch (nothing in the loop needs a step's numbers sooner);
    #: "step": one readback after every step.
    default_readback = "epoch"

    def __init__(self, ctx, x, y, readback=None):
        device.require_device()
        self.readback = readback or self.default_readback
        if self.readback not in ("epoch", "step"):
            raise ValueError(f"readback must be 'epoch' or 'step', got {self.readback!r}")
        check_supported(ctx.model, ctx.config.algorithm, ctx.config.extra)
        self.ctx = ctx
        self.model = ctx.model
        self.dtype = np.dtype(self.model.dtype)
        self.opt = ctx.optimizer
        self.host_params = ctx.params  # the model's own arrays (synchronised in place)
        self.params = {k: device.put(v) for k, v in self.host_params.items()}
        self.slots = {s: {k: device.put(np.asarray(ctx.opt_state.slots[s][k], self.dtype))
                          for k in self.params} for s in self.opt.state_names}
        self.t = int(ctx.opt_state.t)
        self.twin = build(self.model, self.params)
        self.loss_code = tk.LOSS_CODES[ctx.loss_type]
        self.x_shape = tuple(x.shape[1:])
        if self.model.takes_indices:
            for layer in _layers(self.model):
                if type(layer).__name__ == "Embedding":
                    layer.indices(x)  # the range check, once for the whole data set
            self.x = device.put(np.asarray(x).astype(np.int64))
        else:
            self.x = device.put(np.asarray(x, self.dtype))
        if self.loss_code == tk.CE:
            self.y = device.put(np.asarray(y).reshape(-1).astype(np.int64))
            self.y_shape = ()
        else:
            self.y = device.put(np.asarray(y, self.dtype))
            self.y_shape = tuple(np.shape(y)[1:])
        self.n = int(x.shape[0])
        self.keys = list(self.params)
        self.binding = HostBinding(self)
        for layer in _layers(self.model):
            layer._device_binding = self.binding
        self._empty = device.empty(0, self.dtype)

    def finish(self):
        """Free the device copies of the data and the optimizer state at the end of a run.

        Only the weights stay on the device, for the host's synchronisation on demand (the
        optimizer state was copied into every checkpoint already).
        """
        self.x = self.y = None
        self.slots = {}
        self.twin = None

    # -- host copies ----------------------------------------------------------------------------
    def params_to_host(self):
        """Copy every device weight into the model's host arrays (in place)."""
        for k, d in self.params.items():
            np.copyto(self.host_params[k], _read(d).reshape(self.host_params[k].shape))

    def opt_state_to_host(self):
        """The optimizer state as a host :class:`fastlib.optim.OptState` (for checkpoints)."""
        slots = {s: {k: _read(d).reshape(self.host_params[k].shape) for k, d in per.items()}
                 for s, per in self.slots.items()}
        state = _optim.OptState(self.t, slots)
        self.ctx.opt_state = state
        return state

    # -- snapshots on the device ------------------------------------------------------------------
    def _copy(self, d):
        out = device.empty(d.shape[0], d.dtype)
        if d.shape[0]:
            launch(tk.copy, d.shape[0])(d, out)
        return out

    def snapshot(self):
        """Device copies of the weights, the optimizer state and its step count."""
        return ({k: self._copy(d) for k, d in self.params.items()},
                {s: {k: self._copy(d) for k, d in per.items()} for s, per in self.slots.items()},
                self.t)

    def restore(self, snap, with_state=True):
        """Put a :meth:`snapshot` back (weights only when ``with_state`` is False)."""
        params, slots, t = snap
        for k, d in params.items():
            launch(tk.copy, d.shape[0])(d, self.params[k])
        if with_state:
            for s, per in slots.items():
                for k, d in per.items():
                    launch(tk.copy, d.shape[0])(d, self.slots[s][k])
            self.t = t
        self.binding.stale = True

    def snapshot_from_host(self, params):
        """A weights-only snapshot from host arrays (a checkpoint's best weights)."""
        return ({k: device.put(np.asarray(params[k], self.dtype)) for k in self.keys}, {}, self.t)

    def snapshot_to_host(self, snap):
        """Host arrays of a snapshot's weights (for a checkpoint)."""
        return {k: _read(d).reshape(self.host_params[k].shape) for k, d in snap[0].items()}

    # -- the epoch ------------------------------------------------------------------------------
    def run_epoch(self, order, stats):
        """Train one epoch on the device; fill ``stats`` (an EpochStats) as the CPU loop does.

        ``order`` is the epoch's sample order (None: in order). Training stops at the first
        batch whose loss is not finite (its update and every later one are not applied),
        recorded in ``stats``. With ``readback="epoch"`` (the default) the steps' numbers come
        back in one copy at the end of the epoch; with ``"step"``, one copy after each step.
        """
        ctx = self.ctx
        bs = ctx.config.batch_size
        starts = list(range(0, self.n, bs))
        idx = np.arange(self.n, dtype=np.int64) if order is None else \
            np.asarray(order, dtype=np.int64)
        d_order = device.put(idx)
        n_coef = self.opt.coefficients(1).shape[0]
        table = device.put(self.opt.coefficient_table(self.t + 1, len(starts), ctx.lr,
                                                      self.dtype))
        # steps applied so far this epoch, and the halt flag a non-finite loss sets
        d_t = device.put(np.zeros(1, np.int64))
        d_halt = device.put(np.zeros(1, np.int64))
        # one row of numbers per step: loss partials, hit partials, the guard's four
        self.blocks = device.grid_1d(bs, device.config.REDUCE_BLOCK)[0]
        width = 2 * self.blocks + 4
        per_step = self.readback == "step"
        rows = device.zeros(width * (1 if per_step else len(starts)), np.float64)
        # NOTE: NaN/Inf are reported by the loop (skipped steps, divergence); the simulator's
        # NumPy overflow warnings on the way there would only repeat it less clearly.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for b, start in enumerate(starts):
                count = min(bs, self.n - start)
                row = rows if per_step else rows[b * width:(b + 1) * width]
                self._step(d_order, start, count, table, n_coef, d_t, d_halt, row)
                if per_step and not self._account(b, count, _read(rows), stats):
                    break
            if not per_step:
                host = _read(rows).reshape(len(starts), width)  # the epoch's one readback
                for b, start in enumerate(starts):
                    if not self._account(b, min(bs, self.n - start), host[b], stats):
                        break
        ctx.opt_state.t = self.t
        return stats

    def _account(self, b, count, row, stats):
        """Add step ``b``'s numbers to ``stats``; False when its loss was not finite."""
        blocks, dt = self.blocks, self.dtype
        n_terms = count if self.categorical else count * self.out_width
        self.ctx.step += 1
        guard = row[2 * blocks:]
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

    def _batch(self, d_data, d_order, start, count, shape):
        width = int(np.prod(shape, dtype=np.int64))
        out = device.empty(count * width, d_data.dtype)
        launch(tk.gather_rows, count * width)(d_data, d_order, out, start, count, width)
        return DT(out, (count,) + tuple(shape))

    def _step(self, d_order, start, count, table, n_coef, d_t, d_halt, stats):
        """One frame: batch, forward, loss, backward, guard, update; numbers into ``stats``."""
        cfg, dt = self.ctx.config, self.dtype
        xb = self._batch(self.x, d_order, start, count, self.x_shape)
        yb = self._batch(self.y, d_order, start, count, self.y_shape)
        pred = self.twin.forward(xb)
        rows = pred.shape[0]
        width = int(np.prod(pred.shape[1:], dtype=np.int64))
        self.out_width = width
        self.categorical = self.loss_code in (tk.CE, tk.CCE)
        n_terms = rows if self.categorical else rows * width
        blocks = self.blocks
        grad = device.empty(rows * width, dt)
        eps = float(np.finfo(dt).eps)
        tk.loss_rows[blocks, device.config.REDUCE_BLOCK](
            pred.data, yb.data, grad, stats, rows, width, self.loss_code, 1.0 / n_terms, eps)
        _, grads = self.twin.backward(DT(grad, pred.shape), False)
        # the guard: per-thread sums of squares and non-finite counts of every gradient
        sizes = [int(self.params[k].shape[0]) for k in self.keys]
        grids = [device.grid_1d(n) for n in sizes]
        offsets = np.cumsum([0] + [2 * b * t for b, t in grids])
        sums = device.empty(int(offsets[-1]), np.float64)
        for i, k in enumerate(self.keys):
            tk.sumsq[grids[i]](_flat(grads[k]), sums, int(offsets[i]))
        clip, norm_mode = float(cfg.gradient_clip), int(cfg.clip_mode == "norm")
        tk.guard_finalize[1, 1](sums, sums.shape[0], stats, blocks, 2 * blocks, clip, norm_mode,
                                1.0 / n_terms, float(np.finfo(dt).max), d_halt)
        for k in self.keys:
            slots = [self.slots[s][k] for s in self.opt.state_names]
            while len(slots) < 2:
                slots.append(self._empty)
            w = self.params[k]
            launch(tk.guarded_update, w.shape[0])(
                self.opt.kind, w, _flat(grads[k]), slots[0], slots[1], table, n_coef, d_t,
                stats, 2 * blocks, clip, norm_mode)
        tk.advance[1, 1](d_t, stats, 2 * blocks)
        self.binding.stale = True
