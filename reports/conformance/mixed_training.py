"""What the referee needs to replay a mixed-precision run: the format, and float16's loss scale.

A mixed-precision run (``fastlib.train(..., dtype="bfloat16" | "float16")``) is held to the
exact trajectory like any other ``train`` row, at the 16-bit format's unit roundoff for the
gradient and float32's for the master weights' update. With a loss scale, the referee decides
each step as float16 does: the step is skipped when the scaled backward (the loss cotangent,
every Dense layer's input cotangent, every parameter gradient) reaches float16's overflow
threshold. The decision is taken from float64 values at the exact parameters and must be clear
by ``MARGIN``: a case whose step sits nearer the threshold is refused (``Undecided``).
"""
from __future__ import annotations

import numpy as np

import optable

__all__ = ["MARGIN", "Undecided", "format_eps", "scaled_peak", "ScaleReplay",
           "MIXED_ACTIVATIONS", "MIXED_LOSSES"]

#: a step whose scaled peak is within this fraction of the overflow threshold is undecided
MARGIN = 0.25
#: the activations and losses whose backward ``scaled_peak`` writes out (smooth ones)
MIXED_ACTIVATIONS = ("tanh", "sigmoid", "linear")
MIXED_LOSSES = ("cross_entropy", "mse")


class Undecided(ValueError):
    """A float16 step too near the overflow threshold for the referee to say what it does."""


def format_eps(name) -> float:
    """``eps`` of the format ``name`` (optable.formats)."""
    return float(optable.formats.FORMATS[name].eps)


def _act(name, pre):
    if name == "tanh":
        post = np.tanh(pre)
        return post, 1.0 - post * post
    if name == "sigmoid":
        post = 1.0 / (1.0 + np.exp(-pre))
        return post, post * (1.0 - post)
    if name == "linear":
        return pre, np.ones_like(pre)
    raise ValueError(f"scaled_peak: activation {name!r} is not one of {MIXED_ACTIVATIONS}")


def scaled_peak(config, params, x, y, loss) -> float:
    """The largest magnitude the unscaled 16-bit backward of a Dense MLP writes: the loss
    cotangent, each layer's input cotangent (the first's is not computed) and every parameter
    gradient, in float64 from ``params``."""
    layers = config["layers"]
    h = np.asarray(x, np.float64)
    saved = []
    for i, cfg in enumerate(layers):
        if cfg["type"] != "Dense":
            raise ValueError(f"scaled_peak: layer {i} is a {cfg['type']}; Dense MLPs only")
        pre = h @ params[f"{i}.weight"] + params[f"{i}.bias"]
        post, slope = _act(cfg["activation"], pre)
        saved.append((h, slope))
        h = post
    y = np.asarray(y)
    if loss == "cross_entropy":
        s = np.exp(h - h.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
        g = (s - np.eye(h.shape[1])[y.reshape(-1)]) / h.shape[0]
    elif loss == "mse":
        g = 2.0 * (h - np.asarray(y, np.float64)) / h.size
    else:
        raise ValueError(f"scaled_peak: loss {loss!r} is not one of {MIXED_LOSSES}")
    peak = float(np.max(np.abs(g)))
    for i in range(len(layers) - 1, -1, -1):
        inp, slope = saved[i]
        gpre = g * slope
        peak = max(peak, float(np.max(np.abs(inp.T @ gpre))),
                   float(np.max(np.abs(gpre.sum(axis=0)))))
        if i > 0:
            g = gpre @ params[f"{i}.weight"].T
            peak = max(peak, float(np.max(np.abs(g))))
    return peak


class ScaleReplay:
    """float16's loss scale replayed by the referee (``torch.amp.GradScaler``'s dynamics, as
    ``fastlib.training.loss_scale`` documents them, written out again here)."""

    def __init__(self, settings):
        s = dict(settings)
        self.scale = float(s.get("init_scale", 2.0 ** 16))
        self.growth = float(s.get("growth_factor", 2.0))
        self.backoff = float(s.get("backoff_factor", 0.5))
        self.interval = int(s.get("growth_interval", 2000))
        self.dynamic = bool(s.get("dynamic", True))
        self.clean = 0
        self.skips = 0
        self.threshold = float(optable.formats.FORMATS["float16"].overflow)

    def skips_step(self, config, params, x, y, loss, step) -> bool:
        """True when float16 overflows at this step (``Undecided`` when too near to say)."""
        ratio = self.scale * scaled_peak(config, params, x, y, loss) / self.threshold
        if abs(ratio - 1.0) < MARGIN:
            raise Undecided(f"step {step}: scale {self.scale:g} puts the backward at "
                            f"{ratio:.3f} of float16's overflow threshold (within {MARGIN})")
        return ratio > 1.0

    def update(self, skipped) -> None:
        """After a step: back off on a skip, grow after ``interval`` clean steps."""
        if skipped:
            self.skips += 1
            self.clean = 0
            if self.dynamic:
                self.scale *= self.backoff
            return
        self.clean += 1
        if self.dynamic and self.clean == self.interval:
            self.scale *= self.growth
            self.clean = 0
