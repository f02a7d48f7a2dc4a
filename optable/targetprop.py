"""``TargetPropConfig``: the switches of Target Propagation, shared by fastlib and reflib.

One definition, so the exact referee and the fast engine read the same options with the same
defaults (spec.targetprop states the rules they select; docs/semantics.md explains them).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from optable.errors import did_you_mean
from optable.losses import LOSSES

__all__ = ["TargetPropConfig", "UPDATES", "NORMALISATIONS", "SUPPORTED_LAYERS", "LOSS_TYPES",
           "check_loss_type", "flatten_layers", "check_fresh", "check_apply"]

UPDATES = ("gradient", "loom")          # first = default
NORMALISATIONS = ("row", "column")      # first = default
#: The layer types TargetProp trains, by class name (nested Sequential models are flattened).
SUPPORTED_LAYERS = ("Dense", "RNN", "LSTM", "MultiHeadAttention", "SwiGLU")
#: The losses whose output-layer target TargetProp forms from labels: every loss.
LOSS_TYPES = LOSSES
_NUMBERS = ("gradient_scale", "depth_scale_factor", "budget_threshold", "momentum",
            "weight_threshold")


@dataclass(frozen=True)
class TargetPropConfig:
    """TargetProp settings (Loom's TargetPropConfig; defaults of ``spec.TARGETPROP_DEFAULTS``).

    Attributes
    ----------
    use_chain_rule : bool, default True
        True: t_in = x + gradient_scale · (layer backward of the signal); False: pure targets
        through the weights, no derivatives.
    gradient_scale : float, default 0.1
        Loom's GradientScale.
    depth_scale_factor : float, default 1.1
        Layer ℓ (0 = first) learns at depth_scale_factor^ℓ times the rate; 1.0 turns it off.
    budget_threshold : float, default 0.2
        Layers whose link budget is below it are not updated.
    momentum : float, default 0.9
        μ in v ← μ v + (1 − μ) delta.
    weight_threshold : float, default 0.01
        A route's row (column, with ``normalisation="column"``) whose ``Σ |W|`` does not exceed it
        routes nothing.
    update : {"gradient", "loom"}, default "gradient"
        The local update d_θ of a layer that passes the gate. ``"gradient"``: d_θ = J_θᵀ(t −
        y)/B, the layer's own backward of its gap (descent on ‖y − t‖²/2B; every layer type).
        ``"loom"``: Loom's delta = lr·input·gap for Dense layers, d_W = xᵀ(t − y)/B and d_b =
        Σ(t − y)/B, without the activation derivative (Dense-only models).
    normalisation : {"row", "column"}, default "row"
        Pure mode's route N(W, v): ``"row"`` divides by each input row's ``Σ_j |W[i,j]|`` (Loom's
        engine); ``"column"`` divides each output's v[j] by its column's ``Σ_i |W[i,j]|`` (Loom's
        document, ``/ totalWeight[j]``).
    """

    use_chain_rule: bool = True
    gradient_scale: float = 0.1
    depth_scale_factor: float = 1.1
    budget_threshold: float = 0.2
    momentum: float = 0.9
    weight_threshold: float = 0.01
    update: str = "gradient"
    normalisation: str = "row"

    def __post_init__(self):
        if not isinstance(self.use_chain_rule, (bool, np.bool_)):
            raise TypeError(f"TargetPropConfig: use_chain_rule must be True or False, got "
                            f"{self.use_chain_rule!r}")
        for name, choices in (("update", UPDATES), ("normalisation", NORMALISATIONS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"TargetPropConfig: {name} must be one of "
                                 f"{', '.join(map(repr, choices))}, got {getattr(self, name)!r}")
        for name in _NUMBERS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"TargetPropConfig: {name} must be a finite number, got {v!r}")
        if self.gradient_scale <= 0 or self.depth_scale_factor <= 0:
            raise ValueError("TargetPropConfig: gradient_scale and depth_scale_factor must be > 0")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"TargetPropConfig: momentum must be in [0, 1), got {self.momentum}")
        if self.budget_threshold < 0 or self.weight_threshold < 0:
            raise ValueError("TargetPropConfig: budget_threshold and weight_threshold must be >= 0")


def check_loss_type(loss_type):
    """Raise a ValueError naming the close names unless ``loss_type`` is in ``LOSS_TYPES``."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"output_target: unknown loss_type {loss_type!r}"
                         f"{did_you_mean(loss_type, LOSS_TYPES)}; use one of {LOSS_TYPES}")


def flatten_layers(model, kind, children):
    """``[(prefix, depth, layer)]``: the layers TargetProp trains, in forward order.

    The one walk of a model (an engine's layer objects, or spec's config dicts): nested
    ``Sequential`` models are flattened depth first, their layers named ``"<i>."`` prefixes.

    Parameters
    ----------
    model : object
        The model's root.
    kind : callable
        ``kind(layer)`` -> the layer's type name (``"Dense"``, ``"Sequential"``, ...).
    children : callable
        ``children(sequential)`` -> its layers, in order.

    Raises
    ------
    ValueError
        A layer whose type is not in ``SUPPORTED_LAYERS`` (Parallel, norms, Embedding, ...).
    """
    out = []

    def walk(layer, prefix):
        name = kind(layer)
        if name == "Sequential":
            for i, child in enumerate(children(layer)):
                walk(child, f"{prefix}{i}.")
            return
        if name not in SUPPORTED_LAYERS:
            where = prefix.rstrip(".") or "the model"
            raise ValueError(f"TargetProp: layer {name!r} at {where!r} is not supported; "
                             f"TargetProp trains {', '.join(SUPPORTED_LAYERS)} and nested "
                             "Sequential models")
        out.append((prefix, len(out), layer))

    walk(model, "")
    return out


def check_fresh(state):
    """Raise unless ``state`` holds a forward of the current parameters (none applied since)."""
    if state.applied:
        raise RuntimeError("the parameters changed since targetprop_forward (apply_targetprop_gaps "
                           "ran); run targetprop_forward again before another backward or apply")


def check_apply(state, lr):
    """The preconditions of ``apply_targetprop_gaps``: a fresh state and a finite ``lr > 0``."""
    check_fresh(state)
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not (math.isfinite(lr) and
                                                                         lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
