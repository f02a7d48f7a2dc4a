"""Containers: Sequential (a chain) and Parallel (branches on one input, concat or add).

Children are numbered from 0 and their parameters are named ``"<index>.<name>"``, to any depth.
"""
from __future__ import annotations

import numpy as np

from reflib.models.base import Layer


def check_children(layers, owner):
    layers = list(layers) if not isinstance(layers, Layer) else None
    if layers is None:
        raise TypeError(f"{owner} takes a list of layers, e.g. {owner}([Dense(2, 3)])")
    if not layers:
        raise ValueError(f"{owner} needs at least one layer")
    for i, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise TypeError(f"{owner}: item {i} is {type(layer).__name__}, not a reflib layer")
    if len({id(layer) for layer in layers}) != len(layers):
        raise ValueError(f"{owner}: the same layer object appears twice; build a new layer "
                         "for each position (parameters are not shared)")
    return tuple(layers)


def container_seed(seed, rng):
    """Keyword arguments for ``reset_parameters``: ``rng`` wins over the default seed 0."""
    if rng is None:
        return {"seed": seed}
    if seed not in (0, None):
        raise ValueError("pass either seed= or rng=, not both")
    return {"rng": rng}


def child_ids(ids, index):
    """The entries of ``ids`` that belong to child ``index``, with the prefix removed."""
    prefix = f"{index}."
    return {k[len(prefix):]: v for k, v in ids.items() if k.startswith(prefix)}


class Sequential(Layer):
    """Apply layers in order: ``layers[-1](... layers[0](x))``.

    Parameters
    ----------
    layers : list of Layer
        The children (containers may nest).
    seed, rng :
        Every child is re-initialised from one generator (``rng``, else ``default_rng(seed)``),
        children in order, depth first, as fastlib's containers do, so the same construction
        and seed give the same parameters in both engines. Load values afterwards with
        ``load_parameters``.
    """

    def __init__(self, layers, *, seed=0, rng=None):
        super().__init__()
        self._children = check_children(layers, "Sequential")
        self.reset_parameters(**container_seed(seed, rng))

    @property
    def layers(self):
        return list(self._children)

    def trace(self, tape, x, ids):
        for i, layer in enumerate(self._children):
            x = layer.trace(tape, x, child_ids(ids, i))
        return x

    def get_config(self):
        return {"type": "Sequential", "layers": [c.get_config() for c in self._children]}


class Parallel(Layer):
    """Run every branch on the same input and combine the outputs.

    Parameters
    ----------
    layers : list of Layer
        The branches.
    combine : {"concat", "add"}
        ``concat``: join the outputs on the last axis, in branch order (leading shapes must
        agree); ``add``: sum them left to right (shapes must be equal).
    seed, rng :
        As for ``Sequential``.
    """

    COMBINE = ("concat", "add")

    def __init__(self, layers, combine="concat", *, seed=0, rng=None):
        super().__init__()
        self._children = check_children(layers, "Parallel")
        if combine not in self.COMBINE:
            raise ValueError(f"Parallel: combine must be 'concat' or 'add', got {combine!r}")
        self.combine = combine
        self.reset_parameters(**container_seed(seed, rng))

    @property
    def layers(self):
        return list(self._children)

    def trace(self, tape, x, ids):
        out = None
        for i, layer in enumerate(self._children):
            y = layer.trace(tape, x, child_ids(ids, i))
            if out is not None:
                self._check_shapes(np.shape(tape.value(out)), np.shape(tape.value(y)), i)
                y = tape.op("concat", out, y, axis=-1) if self.combine == "concat" \
                    else tape.op("add", out, y)
            out = y
        return out

    def _check_shapes(self, left, right, index):
        ok = left[:-1] == right[:-1] if self.combine == "concat" else left == right
        if not ok or len(left) != len(right):
            need = "equal leading axes" if self.combine == "concat" else "equal shapes"
            raise ValueError(f"Parallel(combine={self.combine!r}): branch {index} gives shape "
                             f"{right}, the branches before it {left}; {need} are required")

    def get_config(self):
        return {"type": "Parallel", "combine": self.combine,
                "layers": [c.get_config() for c in self._children]}

