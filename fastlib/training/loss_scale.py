"""The dynamic loss scale of float16 training, with ``torch.amp.GradScaler``'s dynamics.

The loss's cotangent is multiplied by the scale before the 16-bit backward (so small gradients
do not underflow float16), and the gradients are divided by it in float32 before the optimizer
reads them. A step whose unscaled gradient holds inf or NaN is skipped and the scale is
multiplied by ``backoff_factor``; after ``growth_interval`` clean steps in a row it is
multiplied by ``growth_factor``. The running state (scale, clean steps, skips) lives in the
run's algorithm state, so a checkpoint holds it and a resumed run continues it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

from fastlib.kernels.skeleton import scale_after_step

__all__ = ["LossScale", "resolve_loss_scale", "STATE_KEYS"]

#: the keys of the scale's running state in ``StepContext.state`` (checkpointed with the run)
STATE_KEYS = ("loss_scale", "loss_scale_clean_steps", "loss_scale_skips")


def _positive(name, value, above_one=False, below_one=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(
            value) or value <= 0:
        raise ValueError(f"LossScale: {name} must be a finite number > 0, got {value!r}")
    if above_one and value < 1:
        raise ValueError(f"LossScale: {name} must be >= 1 (it grows the scale), got {value!r}")
    if below_one and value > 1:
        raise ValueError(f"LossScale: {name} must be <= 1 (it shrinks the scale), got "
                         f"{value!r}")
    return float(value)


@dataclass(frozen=True)
class LossScale:
    """How a mixed-precision run scales its loss (``torch.amp.GradScaler``'s parameters).

    Parameters
    ----------
    init_scale : float, default 2**16
        The scale of the first step.
    growth_factor : float, default 2.0
        Multiplies the scale after ``growth_interval`` clean steps in a row (>= 1).
    backoff_factor : float, default 0.5
        Multiplies the scale when a step's gradient held inf or NaN (in (0, 1]).
    growth_interval : int, default 2000
        Clean steps in a row before the scale grows (>= 1).
    dynamic : bool, default True
        False keeps ``init_scale`` for the whole run (a step with inf/NaN is still skipped).

    Raises
    ------
    ValueError
        A value out of its range, naming the field.
    """

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    dynamic: bool = True

    def __post_init__(self):
        object.__setattr__(self, "init_scale", _positive("init_scale", self.init_scale))
        object.__setattr__(self, "growth_factor",
                           _positive("growth_factor", self.growth_factor, above_one=True))
        object.__setattr__(self, "backoff_factor",
                           _positive("backoff_factor", self.backoff_factor, below_one=True))
        interval = self.growth_interval
        if isinstance(interval, bool) or not isinstance(interval, numbers.Integral) or \
                interval < 1:
            raise ValueError(f"LossScale: growth_interval must be an int >= 1, got "
                             f"{interval!r}")
        object.__setattr__(self, "growth_interval", int(interval))
        object.__setattr__(self, "dynamic", bool(self.dynamic))

    def settings(self) -> dict:
        """The fields as a dict (a checkpoint's settings compare them on resume)."""
        return asdict(self)

    # --- the running state, kept in the run's algorithm state --------------------------------

    def start(self, state: dict) -> None:
        """Put the first step's state into ``state`` unless a resumed run brought its own."""
        if "loss_scale" not in state:
            state.update(loss_scale=self.init_scale, loss_scale_clean_steps=0,
                         loss_scale_skips=0)

    def update(self, state: dict, found_inf: bool) -> None:
        """After a step: back off (and count a skip) on inf/NaN, grow after a clean run
        (``fastlib.kernels.skeleton.scale_after_step``, the compiled epochs' rule)."""
        # NOTE: the rule's Python source, not its compiled form: a step of the per-batch path
        # need not compile anything for three numbers
        scale, clean, skips = scale_after_step.py_func(
            float(state["loss_scale"]), int(state["loss_scale_clean_steps"]),
            int(state["loss_scale_skips"]), bool(found_inf), self.growth_factor,
            self.backoff_factor, self.growth_interval, self.dynamic)
        state.update(loss_scale=float(scale), loss_scale_clean_steps=int(clean),
                     loss_scale_skips=int(skips))


_WORDS = ("dynamic",)


def resolve_loss_scale(value, fmt: str) -> LossScale | None:
    """The run's :class:`LossScale` from ``TrainOptions.loss_scale`` and the 16-bit format.

    ``None`` is the format's default: dynamic for float16 (its 5 exponent bits lose small
    gradients), none for bfloat16 (float32's exponent range); ``False`` is none; ``"dynamic"``
    GradScaler's defaults; a number a fixed scale; a dict or a ``LossScale`` its fields.

    Raises
    ------
    TypeError, ValueError
        A value of another type, a word other than ``"dynamic"``, a field out of range.
    """
    if value is None:
        return LossScale() if fmt == "float16" else None
    if value is False:
        return None
    if isinstance(value, LossScale):
        return value
    if isinstance(value, str):
        if value != "dynamic":
            raise ValueError(f"loss_scale: unknown word {value!r}; use 'dynamic', a number (a "
                             "fixed scale), a dict of LossScale's fields, or False (none)")
        return LossScale()
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(LossScale.__dataclass_fields__))
        if unknown:
            raise ValueError(f"loss_scale: unknown field(s) {unknown}; LossScale takes "
                             f"{list(LossScale.__dataclass_fields__)}")
        return LossScale(**value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return LossScale(init_scale=value, dynamic=False)
    raise TypeError(f"loss_scale must be None, False, 'dynamic', a number, a dict or a "
                    f"fastlib.training.loss_scale.LossScale; got {type(value).__name__}")
