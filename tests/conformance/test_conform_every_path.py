"""Every path at every parameter: the train rows start from moved parameters and take targets at
the validator's tolerance, the Dense bias-sum row holds the float32 sum rounded once, and
maximum's NaN routing is pinned (strict) or reported (subgradient)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from reports.conformance import conventions, layer_sums
from reports.conformance import training_cases as tc
from reports.conformance.engines import get_engine


def test_moved_parameters_leave_the_initial_values():
    import fastlib

    cfg = {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 3, "out_features": 3, "activation": "tanh"},
        {"type": "LayerNorm", "d": 3, "eps": 1e-5},
        {"type": "RMSNorm", "d": 3, "eps": 1e-5}]}
    model = fastlib.layers.from_config(cfg, dtype=np.float32, seed=4)
    start = model.parameters()
    moved = tc.moved_parameters(start, 4, np.float32)
    assert moved.keys() == start.keys()
    for k in start:
        assert moved[k].dtype == np.float32 and np.all(moved[k] != start[k]), k
        assert np.all(np.abs(moved[k].astype(np.float64) - start[k]) <= 0.5), k
    # norm weights off 1 and biases off 0: the values a backward forgetting them is exact at
    assert np.all(moved["1.weight"] != 1.0) and np.all(moved["1.bias"] != 0.0)
    again = tc.moved_parameters(start, 4, np.float32)
    assert all(np.array_equal(again[k], moved[k]) for k in start)   # reproducible


def test_tolerance_targets_miss_one_but_pass_both_validators():
    import fastlib.losses
    import reflib.losses

    t = tc.tolerance_targets(np.random.default_rng(0), 64, 3)
    miss = np.abs(t.sum(axis=1) - 1.0)
    assert np.all(miss <= 0.9 * fastlib.losses._ROW_SUM_TOL) and np.max(miss) > 1e-6
    z = np.zeros((64, 3))
    fastlib.losses.validate_targets("categorical_cross_entropy", z, t.astype(np.float32))
    assert reflib.losses._ROW_SUM_TOL == fastlib.losses._ROW_SUM_TOL


def test_the_boundaries_hold_a_norm_behind_a_dense_and_fused_tolerance_targets():
    cases = [c for c in tc.boundary_cases("float64") if c.moved]
    norms = [c for c in cases if c.config["layers"][1]["type"] in ("LayerNorm", "RMSNorm")]
    assert {c.config["layers"][1]["type"] for c in norms} == {"LayerNorm", "RMSNorm"}
    assert all(c.config["layers"][0]["type"] == "Dense" for c in norms)
    fused = [c for c in cases if c.loss == "categorical_cross_entropy"]
    assert {c.path for c in fused} == {"generic", "fused"}
    assert all(np.any(np.abs(np.sum(c.y, axis=1) - 1) > 1e-7) for c in fused)


def test_the_bias_sum_row_passes_fastlib():
    for case in (("linear", 4096, 2, 1), ("relu", 1500, 3, 5)):
        result = layer_sums.check_bias_sum(case)
        assert result.ok, result.describe()


def test_the_bias_sum_row_catches_a_float32_running_sum(monkeypatch):
    from fastlib.layers import dense

    original = dense.Dense.backward

    def float32_bias(self, grad_out, need_input_grad=True):
        gin, grads = original(self, grad_out, need_input_grad)
        g = np.asarray(grad_out, np.float32)
        acc = np.zeros(g.shape[1], np.float32)
        for row in g:                       # the running float32 sum the kernel avoids
            acc += row
        grads["bias"] = acc
        return gin, grads

    monkeypatch.setattr(dense.Dense, "backward", float32_bias)
    result = layer_sums.check_bias_sum(("linear", 2048, 2, 3))
    assert not result.ok and "rounded once" in result.describe()


def test_the_swamped_cotangent_really_swamps_a_float32_sum():
    g = layer_sums._cotangent(2048, 1, 0)
    running = np.float32(0)
    for v in g[:, 0]:
        running = np.float32(running + v)
    exact = math.fsum(float(v) for v in g[:, 0])
    assert abs(float(running) - exact) > 100 * np.spacing(np.float32(abs(exact)))


def test_maximum_nan_routing_is_pinned_for_fastlib_and_reported_for_reflib():
    assert conventions.check_maximum_nan(get_engine("fastlib"), "float64").ok
    r = conventions.check_maximum_nan(get_engine("reflib"), "float64")
    assert r.ok and r.conventions == ["maximum rejects NaN arguments (ValueError)"]


class _OtherRouting:
    """fastlib, but a NaN in ``a`` sends maximum's gradient to ``b``."""

    def __init__(self):
        self._inner = get_engine("fastlib")

    def forward(self, name, inputs, **params):
        return self._inner.forward(name, inputs, **params)

    def vjp(self, name, inputs, grad, **params):
        ga, gb = self._inner.vjp(name, inputs, grad, **params)
        a = np.asarray(inputs[0])
        return np.where(np.isnan(a), 0, ga), np.where(np.isnan(a), grad, gb)


@pytest.mark.parametrize("strict", [True, False])
def test_another_nan_routing_fails_strict_and_is_reported_otherwise(strict):
    r = conventions.check_maximum_nan(_OtherRouting(), "float32", strict=strict)
    if strict:
        assert not r.ok and "the contract sends it to a" in r.describe()
    else:
        assert r.ok and any("goes to b" in c for c in r.conventions)
