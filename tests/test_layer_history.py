"""What a layer keeps after ``clear_history``: its parameters only.

Evaluation, the divergence probe and the per-batch path call ``clear_history`` when a forward
needs no backward; an array a layer keeps past it stays alive for the whole run (the attention
block's probabilities of a few hundred probe rows are tens of megabytes). Every layer type of
the registry is run forward, cleared, and searched for any array still attached to it.
"""
from __future__ import annotations

import numpy as np
import pytest

from fastlib.layers import (LAYER_TYPES, LSTM, RNN, Dense, Embedding, LayerNorm,
                            MultiHeadAttention, Parallel, RMSNorm, Sequential, Softmax, SwiGLU)

# one small instance of each registered type, and an input it takes
_EXAMPLES = {
    "Dense": (lambda: Dense(3, 4, "tanh"), "matrix"),
    "RNN": (lambda: RNN(3, 4, True), "sequence"),
    "LSTM": (lambda: LSTM(3, 4, True), "sequence"),
    "MultiHeadAttention": (lambda: MultiHeadAttention(3, 1, True), "sequence"),
    "SwiGLU": (lambda: SwiGLU(3, 5, 3), "sequence"),
    "LayerNorm": (lambda: LayerNorm(3), "sequence"),
    "RMSNorm": (lambda: RMSNorm(3), "sequence"),
    "Softmax": (lambda: Softmax(), "matrix"),
    "Embedding": (lambda: Embedding(5, 3), "tokens"),
    "Sequential": (lambda: Sequential([LayerNorm(3), MultiHeadAttention(3, 1)]), "sequence"),
    "Parallel": (lambda: Parallel([SwiGLU(3, 4, 3), RMSNorm(3)], "add"), "sequence"),
}


def _input(kind):
    rng = np.random.default_rng(0)
    if kind == "tokens":
        return rng.integers(0, 5, (2, 4))
    shape = (2, 3) if kind == "matrix" else (2, 4, 3)
    return rng.standard_normal(shape).astype(np.float32)


def _arrays(obj, params, where, seen):
    """``[(path, shape)]`` of every ndarray reachable from ``obj``'s attributes (through
    tuples, lists, dicts and child layers) that is not one of ``params``."""
    found = []
    if id(obj) in seen:
        return found
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        if not any(obj is p for p in params):
            found.append((where, obj.shape))
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            found += _arrays(v, params, f"{where}[{i}]", seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            found += _arrays(v, params, f"{where}[{k!r}]", seen)
    elif hasattr(obj, "__dict__") and hasattr(obj, "clear_history"):
        for k, v in vars(obj).items():
            found += _arrays(v, params, f"{where}.{k}", seen)
    return found


def test_every_registered_layer_type_has_an_example():
    # fastlib's own types (tests may register custom ones while the suite runs)
    import fastlib.layers

    own = {name for name in fastlib.layers.__all__ if name in LAYER_TYPES}
    assert own == set(_EXAMPLES), "add the new layer type to _EXAMPLES"


@pytest.mark.parametrize("name", sorted(_EXAMPLES))
def test_clear_history_drops_every_array_a_forward_kept(name):
    make, kind = _EXAMPLES[name]
    layer = make()
    params = list(layer.parameters().values())
    out = layer.forward(_input(kind))
    assert _arrays(layer, params, name, set()), "the forward kept nothing: the check is empty"
    layer.clear_history()
    left = _arrays(layer, params, name, set())
    assert not left, f"{name} keeps arrays past clear_history: {left}"
    with pytest.raises(Exception, match="forward"):   # and a backward says what is missing
        layer.backward(np.ones(out.shape, np.float32))


@pytest.mark.parametrize("fused", [False, True], ids=["per-batch", "compiled"])
def test_a_finished_run_leaves_no_saved_arrays(fused):
    # the per-batch path saves each batch's activations for its backward; the last batch's
    # are dead weight once train returns (as large as a batch's activations)
    import fastlib

    model = Sequential([LSTM(3, 4), Dense(4, 2)], seed=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((12, 5, 3)).astype(np.float32)
    y = rng.integers(0, 2, 12)
    fastlib.train(model, x, y, 2, 4, 1e-2, "cross_entropy", fused=fused, verbose=False)
    params = list(model.parameters().values())
    assert not _arrays(model, params, "model", set())
