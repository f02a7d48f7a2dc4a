"""Activation names of Dense (docs/CONTRACTS.md) and their integer codes in the fused kernels."""
from __future__ import annotations

import optable
from fastlib.layers.base import close_matches

# name -> code understood by fastlib.kernels.dense: the op table's activations and codes
ACTIVATIONS = optable.activation_codes()
LINEAR = ACTIVATIONS["linear"]
SOFTMAX = ACTIVATIONS["softmax"]

#: leaky_relu's slope inside Dense: the op table's default negative_slope.
LEAKY_SLOPE = optable.OPS["leaky_relu"].defaults["negative_slope"]


def check_activation(name, owner):
    """Canonical activation name (case-insensitive), or a ValueError naming close matches."""
    if not isinstance(name, str):
        raise TypeError(f"{owner}: activation must be a name (str), got {name!r}")
    key = name.strip().lower()
    if key not in ACTIVATIONS:
        raise ValueError(f"{owner}: unknown activation {name!r}{close_matches(key, ACTIVATIONS)}; "
                         f"choose one of {sorted(ACTIVATIONS)}")
    return key
