"""Mixed precision on the device: the CPU's rounding points, as launches in the recorded step.

A run with ``dtype="bfloat16"`` / ``"float16"`` keeps the float32 masters in the run's flat
weights and, at every step, rounds them into a second flat buffer that the rows read; each
unit's output and its cotangent are rounded where the unit ends (``lowering.Lowered``); the
loss cotangent is scaled and rounded, every gradient rounded and unscaled in float32; the loss
scale moves on the device by the rule every path shares. Values are float32 holding the
format's numbers, as on the CPU (``fastlib.training.mixed_precision`` says where each rounding
falls, and why a step is skipped).
"""
from __future__ import annotations

import numpy as np

from . import device
from . import half as dhalf
from . import train_kernels as tk
from .layers import launch

__all__ = ["DeviceMixed"]


class DeviceMixed:
    """One run's format and loss scale on the device.

    Parameters
    ----------
    mp : fastlib.training.mixed_precision.MixedPrecision
        The run's format and :class:`~fastlib.training.loss_scale.LossScale` (None: unscaled).
    n_weights : int
        The length of the run's flat weights.
    """

    def __init__(self, mp, n_weights):
        self.fmt, self.scale = mp.fmt, mp.scale
        self.w16 = device.empty(n_weights, np.float32)   # the rounded weights the rows read
        # scale, clean steps, skips (float64: the rule's numbers, exact up to 2**53 steps)
        self.state = device.empty(tk.SCALE_STATE_SIZE, np.float64) if self.scale else None

    @staticmethod
    def row_extra(mp) -> int:
        """Numbers each step of a run in ``mp`` (or None) adds to its row after the guard's:
        the scale's state after the step, when it has a loss scale."""
        return tk.SCALE_STATE_SIZE if mp is not None and mp.scale is not None else 0

    # -- per epoch, on the host ---------------------------------------------------------------
    def upload_state(self, state: dict) -> None:
        """Start the epoch from the run's scale state (``ctx.state``; a fresh run's first)."""
        if self.scale is None:
            return
        self.scale.start(state)
        device.upload(self.state, np.array([state["loss_scale"],
                                            state["loss_scale_clean_steps"],
                                            state["loss_scale_skips"]], np.float64))

    def account(self, row_tail, state: dict) -> None:
        """Copy a step's scale state (the numbers after its guard) into ``ctx.state``."""
        if self.scale is None:
            return
        state.update(loss_scale=float(row_tail[tk.LOSS_SCALE]),
                     loss_scale_clean_steps=int(row_tail[tk.SCALE_CLEAN]),
                     loss_scale_skips=int(row_tail[tk.SCALE_SKIPS]))

    # -- launches inside a step ---------------------------------------------------------------
    def round_weights(self, w) -> None:
        """The masters ``w`` rounded into :attr:`w16` (first in every step: a restored
        snapshot or a resumed run is rounded afresh)."""
        dhalf.round_device(w, self.w16, self.fmt)

    def rounded_copy(self, d):
        """A new buffer holding ``d`` rounded to the format."""
        out = device.empty(d.shape[0], np.float32)
        dhalf.round_device(d, out, self.fmt)
        return out

    def round_in_place(self, d) -> None:
        """``d`` rounded to the format, in place."""
        dhalf.round_device(d, d, self.fmt)

    def scaled_cotangent(self, grad) -> None:
        """The loss cotangent times the scale (float32), rounded to the format, in place."""
        if self.scale is not None and grad.shape[0]:
            launch(tk.scale_values, grad.shape[0])(grad, self.state, 0)
        self.round_in_place(grad)

    def unscaled_gradients(self, g) -> None:
        """Every gradient rounded to the format, then times the float32 reciprocal of the
        scale, in place (one flat buffer)."""
        self.round_in_place(g)
        if self.scale is not None and g.shape[0]:
            launch(tk.scale_values, g.shape[0])(g, self.state, 1)

    def scale_step(self, rows, state, width, n_loss) -> None:
        """Move the scale after the guarded update (``train_kernels.loss_scale_step``)."""
        if self.scale is None:
            return
        s = self.scale
        tk.loss_scale_step[1, 1](self.state, rows, state, width, n_loss, s.growth_factor,
                                 s.backoff_factor, s.growth_interval, int(s.dynamic))
