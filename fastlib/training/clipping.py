"""Gradient clipping and the finiteness check that guards every optimizer step.

Two modes, both from Loom's training documentation and engine: ``"value"`` clamps every
gradient element to ``[-clip, clip]`` (what Loom's engine does); ``"norm"`` rescales all gradients together when
their global L2 norm over every parameter exceeds ``clip``, by exactly ``clip / norm`` (what
its documentation describes; ``torch.nn.utils.clip_grad_norm_`` divides by ``norm + 1e-6``).
``clip = 0`` turns clipping off.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple

import numpy as np

from fastlib.kernels import optim as _k

CLIP_MODES = ("value", "norm")


class ClipInfo(NamedTuple):
    """What :func:`clip_gradients` saw: the global L2 norm before clipping, and finiteness."""

    norm: float
    finite: bool


def check_clip(gradient_clip, clip_mode) -> tuple[float, str]:
    """Validate the clipping options; return ``(clip, mode)``.

    Raises
    ------
    TypeError, ValueError
        ``gradient_clip`` not a non-negative finite number, or an unknown ``clip_mode``.
    """
    if isinstance(gradient_clip, bool) or not isinstance(gradient_clip, (int, float, np.number)):
        raise TypeError(f"gradient_clip must be a number >= 0 (0 disables clipping), got "
                        f"{type(gradient_clip).__name__}")
    clip = float(gradient_clip)
    if not math.isfinite(clip) or clip < 0:
        raise ValueError(f"gradient_clip must be finite and >= 0 (0 disables clipping), got {clip}")
    if clip_mode not in CLIP_MODES:
        raise ValueError(f"clip_mode must be 'value' (elementwise clamp) or 'norm' (global L2 "
                         f"norm), got {clip_mode!r}")
    return clip, clip_mode


def _flat(g: np.ndarray) -> np.ndarray:
    if not g.flags.c_contiguous:
        raise ValueError("gradients must be C-contiguous arrays to be clipped in place")
    return g.reshape(-1)


def clip_gradients(grads: Mapping[str, np.ndarray], clip: float, mode: str = "value") -> ClipInfo:
    """Clip ``grads`` in place and report their global norm and finiteness.

    Parameters
    ----------
    grads : mapping of str to ndarray
        Gradients keyed like the parameters (float32 or float64, C-contiguous).
    clip : float
        0 disables clipping (the norm and the finiteness are still computed).
    mode : {"value", "norm"}
        ``"value"``: ``g = min(max(g, -clip), clip)`` elementwise. ``"norm"``: when the global
        norm ``sqrt(sum over all parameters of g^2)`` exceeds ``clip``, every gradient is
        multiplied by ``clip / norm``.

    Returns
    -------
    ClipInfo
        ``norm`` before clipping (accumulated in float64) and ``finite``: False when any
        element is NaN or Inf, in which case nothing is clipped and the caller skips the step.
    """
    flats = [_flat(g) for g in grads.values()]
    total = 0.0
    for f in flats:
        total += _k.sum_squares_flat(f)
    finite = math.isfinite(total) or all(_k.all_finite_flat(f) for f in flats)
    # NOTE: a finite-element gradient whose squares overflow float64 (|g| > 1e154) still counts
    # as finite; its norm is then +inf and norm clipping scales it by clip / inf = 0 (the
    # direction is lost, the step is harmless). Such gradients do not occur in float32.
    norm = math.sqrt(total) if finite else math.nan
    if not finite or clip == 0.0:
        return ClipInfo(norm, finite)
    if mode == "value":
        for f in flats:
            _k.clip_value_flat(f, clip)
    elif norm > clip:
        scale = clip / norm
        for f in flats:
            _k.scale_flat(f, scale)
    return ClipInfo(norm, finite)
