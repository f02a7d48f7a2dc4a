"""Each layer kind's parameters are declared once (optable.parameters) and every reader agrees.

Independent sources: the shapes each layer's docstring promises (written out by hand below),
the initialisation rules drawn by hand from a fresh generator (He-normal, Xavier-uniform,
N(0, 0.01^2), zeros, ones), and both engines' constructed layers.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib.layers as fl
import reflib.models as rm
from fastlib.rbm import RBM as FastRBM
from optable.parameters import LAYER_KINDS, initial_parameters, kind_of, parameter_shapes
from reflib.rbm import RBM as RefRBM

# one layer per kind, sizes all different so a swapped axis shows, with the shapes its
# documentation gives (by hand, not from the table)
CASES = {
    "Dense": ({"in_features": 3, "out_features": 5, "activation": "relu"},
              {"weight": (3, 5), "bias": (5,)}),
    "RNN": ({"input_size": 3, "hidden_size": 4}, {"w_ih": (3, 4), "w_hh": (4, 4), "b": (4,)}),
    "LSTM": ({"input_size": 3, "hidden_size": 5},
             {"w_ih": (3, 20), "w_hh": (5, 20), "b": (20,)}),
    "MultiHeadAttention": ({"d_model": 6, "heads": 2},
                           {"w_q": (6, 6), "w_k": (6, 6), "w_v": (6, 6), "w_o": (6, 6),
                            "b_q": (6,), "b_k": (6,), "b_v": (6,), "b_o": (6,)}),
    "SwiGLU": ({"d": 3, "hidden": 7, "out": 2},
               {"w_gate": (3, 7), "w_up": (3, 7), "w_down": (7, 2)}),
    "LayerNorm": ({"d": 5}, {"weight": (5,), "bias": (5,)}),
    "RMSNorm": ({"d": 4}, {"weight": (4,)}),
    "Embedding": ({"num": 9, "dim": 3}, {"weight": (9, 3)}),
    "Softmax": ({}, {}),
    "RBM": ({"visible": 5, "hidden": 3},
            {"weight": (5, 3), "visible_bias": (5,), "hidden_bias": (3,)}),
}


def _classes(kind):
    fast = FastRBM if kind == "RBM" else getattr(fl, kind)
    ref = RefRBM if kind == "RBM" else getattr(rm, kind)
    return fast, ref


def test_every_layer_kind_of_both_engines_is_declared():
    assert set(CASES) == set(LAYER_KINDS)
    assert set(rm.LAYER_TYPES) - {"Sequential", "Parallel"} <= set(LAYER_KINDS)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_declaration_is_what_both_engines_build(kind):
    kwargs, expected = CASES[kind]
    assert parameter_shapes(kind, kwargs) == expected
    for cls in _classes(kind):
        layer = cls(**kwargs, seed=3)
        built = layer.parameters()
        assert list(built) == list(expected), cls      # names, in parameters() order
        assert {k: v.shape for k, v in built.items()} == expected, cls
        assert kind_of(layer) == kind


def _by_hand(kind, kwargs, rng):
    """The documented first draw of each kind, from the generator directly."""
    def xavier(shape):
        a = np.sqrt(6.0 / (shape[0] + shape[1]))
        return rng.uniform(-a, a, size=shape)
    shapes = CASES[kind][1]
    out = {}
    for name, shape in shapes.items():
        if kind == "RBM" and name == "weight":
            out[name] = rng.normal(0.0, 0.01, shape)
        elif kind in ("LayerNorm", "RMSNorm") and name == "weight":
            out[name] = np.ones(shape)
        elif len(shape) == 1:
            out[name] = np.zeros(shape)
        elif kind == "Dense" and kwargs.get("activation") == "relu":
            out[name] = rng.standard_normal(shape) * np.sqrt(2.0 / shape[0])
        else:
            out[name] = xavier(shape)
    return out


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_first_draw_follows_the_documented_rule_in_both_engines(kind):
    kwargs, _ = CASES[kind]
    expected = _by_hand(kind, kwargs, np.random.default_rng(11))
    fast, ref = _classes(kind)
    for layer in (fast(**kwargs, dtype=np.float64, seed=11), ref(**kwargs, seed=11)):
        got = {k: np.asarray(v, dtype=np.float64) for k, v in layer.parameters().items()}
        assert list(got) == list(expected)
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{kind}.{name}")


def test_a_custom_layer_outside_the_table_draws_nothing():
    class Custom(fl.Layer):
        pass

    assert kind_of(Custom()) is None
    assert initial_parameters(Custom(), np.random.default_rng(0)) == {}


def test_a_subclass_keeps_its_kinds_declaration():
    class Wide(fl.Dense):
        pass

    layer = Wide(2, 3, seed=0)
    assert kind_of(layer) == "Dense"
    assert {k: v.shape for k, v in layer.parameters().items()} == {"weight": (2, 3),
                                                                   "bias": (3,)}
