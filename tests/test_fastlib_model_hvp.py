"""fastlib's model Hessian- and Gauss-Newton-vector products beyond MLPs: every layer kind.

Independent source: reflib's exact products (``reflib.model_hvp`` / ``reflib.gnvp`` at 30
digits: reverse over reverse on the reference tape, itself held to spec, to forward over
reverse, to 60-digit differences and to PyTorch in tests/test_reflib_second_order*.py). The
fastlib models are the reference models' twins (same config, same parameters).
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
import reflib
from fastlib.layers import Layer, from_config
from tests.test_reflib_second_order import MODELS, model_case

DPS = 30
# NOTE: float64 forward over reverse through these tiny O(1) graphs: a few hundred roundings of
# O(1) terms per entry, so 1e-12 relative to the largest entry is ~4e3 ulps of room; a dropped
# term, a wrong sign or a wrong layout is off by O(1).
RTOL = 1e-12


def fastlib_twin(model):
    twin = from_config(model.get_config(), dtype=np.float64)
    twin.load_parameters(model.parameters())
    return twin


def assert_close(got, exact, what):
    exact = np.asarray(exact, dtype=np.float64)
    assert got.shape == exact.shape and got.dtype == np.float64, what
    scale = max(1.0, float(np.max(np.abs(exact))))
    err = float(np.max(np.abs(got - exact))) / scale
    assert err <= RTOL, f"{what}: normwise error {err:.3e} > {RTOL:.0e}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_hvp_and_gnvp_equal_reflibs_exact_products(name):
    model, x, y, loss, v = model_case(name)
    fast = fastlib_twin(model)
    hv, gn = fastlib.hvp(fast, x, y, loss, v), fastlib.gnvp(fast, x, y, loss, v)
    exact_hv = reflib.model_hvp(model, x, y, loss, v, dps=DPS)
    exact_gn = reflib.gnvp(model, x, y, loss, v, dps=DPS)
    assert set(hv) == set(gn) == set(model.parameters())
    for k in exact_hv:
        assert_close(hv[k], exact_hv[k], f"{name} hvp {k}")
        assert_close(gn[k], exact_gn[k], f"{name} gnvp {k}")


def test_containers_and_the_layer_kinds_not_in_the_reference_cases():
    # Parallel (concat and add), Softmax, return_sequences, attention after recurrences; the
    # referee is reflib's reverse over reverse in float64 here (the exact one takes a minute on
    # a graph this size; the float64 one is held to it in tests/test_reflib_second_order.py)
    cfg = {"type": "Sequential", "layers": [
        {"type": "Parallel", "combine": "concat", "layers": [
            {"type": "LSTM", "input_size": 2, "hidden_size": 2, "return_sequences": True},
            {"type": "RNN", "input_size": 2, "hidden_size": 2, "return_sequences": True}]},
        {"type": "MultiHeadAttention", "d_model": 4, "heads": 2, "causal": False},
        {"type": "Parallel", "combine": "add", "layers": [
            {"type": "RNN", "input_size": 4, "hidden_size": 3, "return_sequences": False},
            {"type": "LSTM", "input_size": 4, "hidden_size": 3, "return_sequences": False}]},
        {"type": "Softmax", "axis": -1}]}
    rng = np.random.default_rng(4)
    model = reflib.models.from_config(cfg)
    model.load_parameters({k: 0.7 * rng.standard_normal(w.shape)
                           for k, w in model.parameters().items()})
    x, y = rng.standard_normal((2, 3, 2)), rng.standard_normal((2, 3))
    v = {k: rng.standard_normal(w.shape) for k, w in model.parameters().items()}
    hv = fastlib.hvp(fastlib_twin(model), x, y, "mse", v)
    reference = reflib.model_hvp(model, x, y, "mse", v)
    for k in reference:
        assert_close(hv[k], reference[k], k)


def test_an_input_the_model_does_not_take_is_named():
    model, x, y, loss, v = model_case("lstm")
    with pytest.raises(ValueError, match="LSTM"):
        fastlib.hvp(fastlib_twin(model), np.zeros((1, 2, 3)), y, loss, v)


def test_an_unknown_layer_is_named():
    class Doubler(Layer):
        def forward(self, x):
            return 2 * x

    model = fastlib.Sequential([fastlib.Dense(2, 2), Doubler(np.float64)], dtype=np.float64)
    v = {k: np.zeros_like(w) for k, w in model.parameters().items()}
    with pytest.raises(ValueError, match="Doubler is not a layer"):
        fastlib.hvp(model, np.zeros((1, 2)), np.zeros((1, 2)), "mse", v)


# float32's kernels compile on first use (minutes on a loaded machine): the deep run only
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_float32_model_hvp_within_float32_accuracy_of_the_exact_one(name):
    # NOTE: float32 forward over reverse through these tiny O(1) graphs: at most a few hundred
    # roundings of O(1) terms per entry at u = 2^-24 ≈ 6e-8, i.e. ~2e-5 of the largest entry in
    # the worst case (the exact product is taken at the float32-rounded parameters and
    # direction, so their rounding is not error); measured: under 1e-6. A wrong term is O(1).
    model, x, y, loss, v = model_case(name)
    fast = from_config(model.get_config(), dtype=np.float32)
    fast.load_parameters(model.parameters())
    params32 = {k: w.astype(np.float64) for k, w in fast.parameters().items()}
    v32 = {k: np.asarray(d, dtype=np.float32) for k, d in v.items()}
    model.load_parameters(params32)     # the exact product at the float32-rounded point
    exact = reflib.model_hvp(model, x, y, loss, {k: d.astype(np.float64) for k, d in v32.items()},
                             dps=DPS)
    x32 = x if name == "embedding" else np.asarray(x, dtype=np.float32)
    got = fastlib.hvp(fast, x32, y, loss, v32)
    for k in exact:
        e = np.asarray(exact[k], dtype=np.float64)
        assert got[k].dtype == np.float32
        scale = max(1.0, float(np.max(np.abs(e))))
        assert float(np.max(np.abs(got[k] - e))) <= 2e-5 * scale, k
