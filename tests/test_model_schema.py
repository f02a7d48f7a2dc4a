"""The loader's table of declared parameter shapes agrees with every real layer type."""
from __future__ import annotations

import numpy as np
import pytest

from fastlib.layers.config import LAYER_TYPES, from_config
from fastlib.model_schema import CONTAINERS, SchemaError, declared_parameters
from optable.parameters import LAYER_KINDS
from fastlib.rbm import RBM  # noqa: F401 - registers the RBM layer type

# one small config per layer type, sizes all different so a swapped axis shows
CONFIGS = {
    "Dense": {"type": "Dense", "in_features": 3, "out_features": 5, "activation": "relu"},
    "RNN": {"type": "RNN", "input_size": 3, "hidden_size": 4},
    "LSTM": {"type": "LSTM", "input_size": 3, "hidden_size": 5},
    "MultiHeadAttention": {"type": "MultiHeadAttention", "d_model": 6, "heads": 2},
    "SwiGLU": {"type": "SwiGLU", "d": 3, "hidden": 7, "out": 2},
    "LayerNorm": {"type": "LayerNorm", "d": 5},
    "RMSNorm": {"type": "RMSNorm", "d": 4},
    "Embedding": {"type": "Embedding", "num": 9, "dim": 3},
    "Softmax": {"type": "Softmax"},
    "RBM": {"type": "RBM", "visible": 5, "hidden": 3},
}


def test_the_table_covers_exactly_the_registered_layer_types():
    assert set(LAYER_KINDS) | set(CONTAINERS) == set(LAYER_TYPES)
    assert set(CONFIGS) == set(LAYER_KINDS)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_declared_shapes_are_the_built_layers_shapes(kind):
    built = from_config(CONFIGS[kind], dtype=np.float64).parameters()
    assert declared_parameters(CONFIGS[kind]) == {k: v.shape for k, v in built.items()}


def test_nested_containers_name_parameters_as_the_model_does():
    config = {"type": "Sequential", "layers": [
        CONFIGS["Dense"], {"type": "Parallel", "combine": "add", "layers": [
            {"type": "Dense", "in_features": 5, "out_features": 2},
            {"type": "Sequential", "layers": [CONFIGS["LayerNorm"] | {"d": 5},
                                              {"type": "Dense", "in_features": 5,
                                               "out_features": 2}]}]},
        CONFIGS["Softmax"]]}
    built = from_config(config).parameters()
    declared = declared_parameters(config)
    assert list(declared) == list(built)
    assert declared == {k: v.shape for k, v in built.items()}


def test_depth_is_checked_without_recursion():
    config = {"type": "Dense", "in_features": 1, "out_features": 1}
    for _ in range(5000):
        config = {"type": "Sequential", "layers": [config]}
    with pytest.raises(SchemaError, match="nested more than"):
        declared_parameters(config)
