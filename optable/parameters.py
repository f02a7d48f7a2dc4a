"""Each layer kind's parameters, declared once: their names, shapes and initial draws.

A layer kind (``"Dense"``, ``"LSTM"``, ...) names the integer sizes that define it (the keys
of its config, the attributes of its layer) and, in ``parameters()`` order, each parameter:
its name, its shape as a function of those sizes, and how it is first drawn. Everything that
needs a layer's parameters reads them here: fastlib's and reflib's layers draw their initial
values with :func:`initial_parameters`, fastlib's file loader checks a file's arrays against
:func:`parameter_shapes` before building anything, and the compiled program lays its
parameter blocks out from the same shapes. A new layer kind is one entry of
:data:`LAYER_KINDS`. NumPy only, like the rest of optable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from optable.layers import RELU_FAMILY, he_normal, xavier_uniform

__all__ = ["Parameter", "LayerKind", "LAYER_KINDS", "RBM_INIT_STD", "kind_of",
           "layer_sizes", "parameter_shapes", "initial_parameters"]

#: The standard deviation of an RBM's initial weights (Hinton's practical guide: N(0, 0.01²)).
RBM_INIT_STD = 0.01


def _he_or_xavier(rng, shape, activation):
    # He for the relu family, whose units drop half their inputs; Xavier for the rest
    return (he_normal if activation in RELU_FAMILY else xavier_uniform)(rng, shape)


# how a parameter is first drawn: f(rng, shape, activation) -> float64 array; the draws that
# consume the generator are made in ``parameters()`` order, so one seed gives both engines,
# and every run, the same values
INITS: dict[str, Callable] = {
    "he_or_xavier": _he_or_xavier,
    "xavier": lambda rng, shape, activation: xavier_uniform(rng, shape),
    "zeros": lambda rng, shape, activation: np.zeros(shape),
    "ones": lambda rng, shape, activation: np.ones(shape),
    "rbm_normal": lambda rng, shape, activation: rng.normal(0.0, RBM_INIT_STD, shape),
}


@dataclass(frozen=True)
class Parameter:
    """One parameter of a layer kind: ``name``, ``shape(sizes) -> tuple`` and ``init`` (a key
    of :data:`INITS`)."""

    name: str
    shape: Callable[[Mapping[str, int]], tuple]
    init: str


@dataclass(frozen=True)
class LayerKind:
    """A layer kind: the integer ``sizes`` that define it and its ``parameters`` in order."""

    sizes: tuple
    parameters: tuple = ()


def _p(name, init, shape):
    return Parameter(name, shape, init)


def _recurrent(gates):
    return LayerKind(("input_size", "hidden_size"), (
        _p("w_ih", "xavier", lambda s: (s["input_size"], gates * s["hidden_size"])),
        _p("w_hh", "xavier", lambda s: (s["hidden_size"], gates * s["hidden_size"])),
        _p("b", "zeros", lambda s: (gates * s["hidden_size"],))))


def _square(s):
    return s["d_model"], s["d_model"]


#: Every layer kind that holds parameters, or none (``Softmax``), by its type name.
LAYER_KINDS: dict[str, LayerKind] = {
    "Dense": LayerKind(("in_features", "out_features"), (
        _p("weight", "he_or_xavier", lambda s: (s["in_features"], s["out_features"])),
        _p("bias", "zeros", lambda s: (s["out_features"],)))),
    "RNN": _recurrent(1),
    "LSTM": _recurrent(4),
    "MultiHeadAttention": LayerKind(("d_model", "heads"), tuple(
        [_p(f"w_{n}", "xavier", _square) for n in "qkvo"]
        + [_p(f"b_{n}", "zeros", lambda s: (s["d_model"],)) for n in "qkvo"])),
    "SwiGLU": LayerKind(("d", "hidden", "out"), (
        _p("w_gate", "xavier", lambda s: (s["d"], s["hidden"])),
        _p("w_up", "xavier", lambda s: (s["d"], s["hidden"])),
        _p("w_down", "xavier", lambda s: (s["hidden"], s["out"])))),
    "LayerNorm": LayerKind(("d",), (_p("weight", "ones", lambda s: (s["d"],)),
                                    _p("bias", "zeros", lambda s: (s["d"],)))),
    "RMSNorm": LayerKind(("d",), (_p("weight", "ones", lambda s: (s["d"],)),)),
    "Embedding": LayerKind(("num", "dim"), (
        _p("weight", "xavier", lambda s: (s["num"], s["dim"])),)),
    "Softmax": LayerKind(()),
    "RBM": LayerKind(("visible", "hidden"), (
        _p("weight", "rbm_normal", lambda s: (s["visible"], s["hidden"])),
        _p("visible_bias", "zeros", lambda s: (s["visible"],)),
        _p("hidden_bias", "zeros", lambda s: (s["hidden"],)))),
}


def kind_of(layer):
    """The layer kind name of ``layer`` (its class, or the nearest base class, named in
    :data:`LAYER_KINDS`), or None for a layer outside the table (a container, a custom
    layer)."""
    for cls in type(layer).__mro__:
        if cls.__name__ in LAYER_KINDS:
            return cls.__name__
    return None


def layer_sizes(layer, kind=None):
    """``{size name: int}`` of ``layer`` (read from its attributes)."""
    kind = kind or kind_of(layer)
    return {key: int(getattr(layer, key)) for key in LAYER_KINDS[kind].sizes}


def parameter_shapes(kind, sizes) -> dict:
    """``{parameter name: shape tuple}`` of a ``kind`` layer of ``sizes``, in order.

    Parameters
    ----------
    kind : str
        A key of :data:`LAYER_KINDS`.
    sizes : Mapping[str, int]
        At least the kind's ``sizes`` keys (a config dict will do).
    """
    return {p.name: tuple(int(d) for d in p.shape(sizes)) for p in LAYER_KINDS[kind].parameters}


def initial_parameters(layer, rng) -> dict:
    """The first values of ``layer``'s parameters, ``{name: float64 array}``, drawn from
    ``rng`` in order (empty for a layer outside the table).

    Parameters
    ----------
    layer : object
        A layer of a kind in :data:`LAYER_KINDS`, with its size attributes set (and its
        ``activation``, for a Dense).
    rng : numpy.random.Generator
    """
    kind = kind_of(layer)
    if kind is None:
        return {}
    sizes = layer_sizes(layer, kind)
    activation = getattr(layer, "activation", None)
    return {p.name: INITS[p.init](rng, tuple(p.shape(sizes)), activation)
            for p in LAYER_KINDS[kind].parameters}
