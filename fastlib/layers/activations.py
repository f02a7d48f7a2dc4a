"""Activation names of Dense (docs/CONTRACTS.md) and their integer codes in the fused kernels."""
from __future__ import annotations

from fastlib.layers.base import close_matches

# name -> code understood by fastlib.kernels.dense (one table; the kernels switch on the code)
ACTIVATIONS = {
    "linear": 0, "relu": 1, "leaky_relu": 2, "tanh": 3, "sigmoid": 4, "silu": 5, "gelu": 6,
    "gelu_tanh": 7, "softplus": 8, "softmax": 9,
}
LINEAR = ACTIVATIONS["linear"]
SOFTMAX = ACTIVATIONS["softmax"]

#: leaky_relu's slope inside Dense: the registry's default negative_slope.
LEAKY_SLOPE = 0.01


def check_activation(name, owner):
    """Canonical activation name (case-insensitive), or a ValueError naming close matches."""
    if not isinstance(name, str):
        raise TypeError(f"{owner}: activation must be a name (str), got {name!r}")
    key = name.strip().lower()
    if key not in ACTIVATIONS:
        raise ValueError(f"{owner}: unknown activation {name!r}{close_matches(key, ACTIVATIONS)}; "
                         f"choose one of {sorted(ACTIVATIONS)}")
    return key
