"""Loom's switchable TargetProp rules: ``update="loom"`` and ``normalisation="column"``.

Held three ways like the default rules (``reports.conformance.targetprop``'s variant
properties: fastlib against reflib, reflib against the exact spec), plus values derived by hand
here, and the settings kept identical in fastlib, reflib and spec. Tolerances: those of
``reports.conformance.targetprop`` (its module docstring); hand values are a few float64
operations, so they are compared to ~1e-15 relative.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlib
import fastlib.targetprop as ft
import reflib.targetprop as rt
import spec
import spec.targetprop as stp
from fastlib.layers import RNN, Dense, Sequential
from reflib.models import twin
from reports.conformance.targetprop import (KINDS, prop_variant_fastlib_vs_reflib,
                                            prop_variant_reflib_vs_spec, variant_cases)


def test_settings_are_the_same_in_fastlib_reflib_and_spec():
    for config in (ft.TargetPropConfig, rt.TargetPropConfig):
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        assert defaults == dict(spec.TARGETPROP_DEFAULTS), config.__module__
    assert spec.TARGETPROP_DEFAULTS["update"] == "gradient"
    assert spec.TARGETPROP_DEFAULTS["normalisation"] == "row"


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=6)
@given(data=st.data())
def test_variants_fastlib_vs_reflib(kind, data):
    case, options = data.draw(variant_cases(kind))
    prop_variant_fastlib_vs_reflib(case, options, data.draw(st.sampled_from((0.01, 0.1, 0.5))))


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=2)
@given(data=st.data())
def test_variants_reflib_vs_spec(kind, data):
    case, options = data.draw(variant_cases(kind, small=True))
    prop_variant_reflib_vs_spec(case, options, 0.1)


def test_column_route_by_hand():
    # N_col(W, v)[i] = Σ_j W[i,j] v[j] / Σ_k |W[k,j]|; a column with Σ_k |W[k,j]| <= 0.01 adds 0
    W = np.array([[1.0, -2.0, 0.004],
                  [3.0, 2.0, 0.005]])           # column sums 4, 4, 0.009 (left out)
    v = np.array([[0.5, 1.5, 7.0]])
    want = np.array([[1.0 * 0.5 / 4 - 2.0 * 1.5 / 4, 3.0 * 0.5 / 4 + 2.0 * 1.5 / 4]])
    np.testing.assert_allclose(ft.route(W, v, 0.01, "column"), want, rtol=1e-15, atol=0)
    np.testing.assert_allclose(rt.route(W, v, 0.01, "column"), want, rtol=1e-15, atol=0)
    exact = stp.route(spec.backends.MPMATH, W.astype(object), v.astype(object), 0.01, "column")
    np.testing.assert_allclose(exact.astype(float), want, rtol=1e-15, atol=0)
    # the row form of the same W and v, for contrast: rows divided by 3.004 and 5.005
    row = ft.route(W, v, 0.01)
    np.testing.assert_allclose(row, [[(0.5 - 3.0 + 0.028) / 3.004,
                                      (1.5 + 3.0 + 0.035) / 5.005]], rtol=1e-15)


def test_loom_update_one_step_by_hand():
    # Dense(2, 1, tanh), batch 2; Loom's delta: d_W = xᵀ(t − y)/B, d_b = Σ(t − y)/B, no tanh'.
    model = Sequential([Dense(2, 1, "tanh")], dtype=np.float64)
    w0, b0 = np.array([[0.3], [-0.2]]), np.array([0.1])
    model.load_parameters({"0.weight": w0, "0.bias": b0})
    x = np.array([[1.0, 2.0], [-1.0, 0.5]])
    t = np.array([[0.5], [-0.25]])
    y = np.tanh(x @ w0 + b0)
    state = ft.TargetPropState(model, ft.TargetPropConfig(update="loom", momentum=0.0))
    ft.targetprop_forward(model, state, x)
    ft.targetprop_backward(model, state, t)
    (budget,) = state.calculate_link_budgets()
    ft.apply_targetprop_gaps(model, state, 0.5)
    rate = 0.5 * (0.5 + 0.5 * budget)           # depth 0: no depth factor
    gap = t - y
    want_w = w0 + rate * (x.T @ gap) / 2
    want_b = b0 + rate * gap.sum(axis=0) / 2
    np.testing.assert_allclose(model.parameters()["0.weight"], want_w, rtol=1e-14)
    np.testing.assert_allclose(model.parameters()["0.bias"], want_b, rtol=1e-14)
    # the default (gradient) update of the same step includes tanh' and so differs
    grad_model = Sequential([Dense(2, 1, "tanh")], dtype=np.float64)
    grad_model.load_parameters({"0.weight": w0, "0.bias": b0})
    gs = ft.TargetPropState(grad_model, ft.TargetPropConfig(momentum=0.0))
    ft.targetprop_forward(grad_model, gs, x)
    ft.targetprop_backward(grad_model, gs, t)
    ft.apply_targetprop_gaps(grad_model, gs, 0.5)
    want_grad = w0 + rate * (x.T @ (gap * (1 - y**2))) / 2
    np.testing.assert_allclose(grad_model.parameters()["0.weight"], want_grad, rtol=1e-14)


def test_train_takes_the_switches_by_name():
    data = fastlib.datasets.load_digits("train", dtype=np.float64)
    x, y = data.x[:96], data.y[:96]
    results = {}
    for options in ({}, {"update": "loom"}, {"use_chain_rule": False, "normalisation": "column"}):
        model = Sequential([Dense(64, 16, "relu"), Dense(16, 10)], dtype=np.float64, seed=0)
        result = fastlib.train(model, x, y, 2, 32, 0.1, "cross_entropy", verbose=False,
                               algorithm="targetprop", **options)
        assert all(np.isfinite(result.loss_history))
        results[tuple(options.items())] = result.loss_history
    # each switch changes the run (the first epoch's loss is measured before any update)
    second = [h[1] for h in results.values()]
    assert len(set(second)) == 3, results


def test_bad_settings_are_refused_with_the_fix():
    for mod in (ft, rt):
        with pytest.raises(ValueError, match="update must be one of 'gradient', 'loom'"):
            mod.TargetPropConfig(update="delta")
        with pytest.raises(ValueError, match="normalisation must be one of 'row', 'column'"):
            mod.TargetPropConfig(normalisation="columns")
    model = Sequential([Dense(3, 2), RNN(2, 2)], dtype=np.float64)
    with pytest.raises(ValueError, match="layer 'RNN' at '1'.*update='gradient'"):
        ft.TargetPropState(model, ft.TargetPropConfig(update="loom"))
    with pytest.raises(ValueError, match="layer 'RNN' at '1'.*update='gradient'"):
        rt.TargetPropState(twin(model), rt.TargetPropConfig(update="loom"))
    with pytest.raises(ValueError, match="layer 'RNN' at '1'.*update='gradient'"):
        stp.local_updates(model.get_config(), model.parameters(), np.ones((1, 2, 3)),
                          [np.ones((1, 2, 2)), np.ones((1, 2))], config={"update": "loom"})
    with pytest.raises(ValueError, match="normalisation must be one of"):
        stp.resolve_config({"normalisation": "diagonal"})


def test_verigrad_train_switches(capsys):
    from reports.cli import main

    code = main(["train", "--algorithm", "targetprop", "--update", "loom", "--epochs", "1",
                 "--hidden", "16", "--val-fraction", "0"])
    out = capsys.readouterr().out
    assert code == 0 and "test accuracy" in out, out
    code = main(["train", "--update", "loom", "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--update only applies to --algorithm targetprop" in err, err
    code = main(["train", "--algorithm", "kBP", "--normalisation", "column", "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--normalisation only applies to --algorithm targetprop" in err, err
