"""Target Propagation: fastlib against reflib against spec, step by step.

Oracles, independent of the engine under test:

- ``spec.targetprop``: the rules evaluated in exact arithmetic (mpmath, 30 digits); its
  chain-rule signal J_xᵀ g and local update J_θᵀ (t − y) are high-precision numerical
  derivatives (``mpmath.diff``) of layer forwards built from the registry's op formulas;
- ``reflib.targetprop``: each layer traced on its own reference tape (float64), pure routes in
  plain NumPy;
- hand-derived values for the gate (a budget of exactly 0.2), zero norms and depth scaling.

Tolerances. Arrays are compared normwise against the largest magnitude of the expected array
(``_close``): both float64 engines evaluate each entry as sums of at most ~60 products of O(1)
factors through at most three layers, with routes divided by Σ|W| > 0.01, so each entry's
rounding error stays below ~60·3·eps64 ≈ 4e-14 of the array's scale; ``F64_TOL = 1e-11`` leaves
two orders of margin. Link budgets and rates are single float64 reductions (error < 1e-15).
float32 fastlib against float64 reflib: eps32 = 1.2e-7 with the same term counts gives ~2e-5 of
the scale; ``F32_TOL = 2e-4`` (the routes' division by Σ|W| and softmax/attention chains add a
factor of a few).

The property functions (``prop_*``) and the strategies ``tp_cases`` and ``budget_pairs`` live in
``reports.conformance.targetprop``, where ``verigrad conform`` runs them too.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlib
import fastlib.targetprop as ft
import reflib.targetprop as rt
import spec
import spec.targetprop as stp
from fastlib.layers import Dense, LayerNorm, Parallel, Sequential
from reflib.models import twin

# Strategies, tolerances and properties: reports.conformance.targetprop (also run by conform).
from reports.conformance.targetprop import (
    F64_TOL, SPEC_DPS, KINDS, Case, _close, tp_cases, budget_pairs, _run_fastlib, _run_reflib,
    prop_targets_fastlib_vs_reflib, prop_targets_reflib_vs_spec, prop_apply_fastlib_vs_reflib,
    prop_apply_reflib_vs_spec, _fast_budget, _ref_budget, prop_link_budget_three_ways,
)


# ---------------------------------------------------------------------------------------------
# tests: targets

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chain", [True, False], ids=["chain_rule", "pure"])
@settings(max_examples=12)
@given(data=st.data())
def test_targets_fastlib_vs_reflib(kind, chain, data):
    prop_targets_fastlib_vs_reflib(data.draw(tp_cases(kind)), chain)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chain", [True, False], ids=["chain_rule", "pure"])
@settings(max_examples=3)
@given(data=st.data())
def test_targets_reflib_vs_spec(kind, chain, data):
    prop_targets_reflib_vs_spec(data.draw(tp_cases(kind, small=True)), chain)


EXACT_TOL = 1e-25   # reflib exact (30 digits) against spec (30 digits): both exact to ~1e-30


def _exact_case(kind):
    import reflib.models as rm
    rng = np.random.default_rng(KINDS.index(kind))
    main, x_shape = {"Dense": (rm.Dense(2, 3, "tanh"), (2, 2)),
                     "RNN": (rm.RNN(2, 2, return_sequences=True), (1, 3, 2)),
                     "LSTM": (rm.LSTM(2, 2), (1, 2, 2)),
                     "MultiHeadAttention": (rm.MultiHeadAttention(2, 2, causal=True), (1, 2, 2)),
                     "SwiGLU": (rm.SwiGLU(2, 2, 2), (2, 2))}[kind]
    model = rm.Sequential([rm.Dense(2, 2, "sigmoid"), main])
    for value in model.parameters().values():
        value[...] = rng.normal(size=value.shape)
    x = rng.normal(size=x_shape)
    y = model(x)
    return model, x, y + rng.normal(size=y.shape)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chain", [True, False], ids=["chain_rule", "pure"])
def test_reflib_exact_mode_vs_spec(kind, chain):
    # reflib with dps=30 (every op in mpmath) is the exact referee: it must agree with the spec
    # to ~30 digits, not just to float64.
    model, x, target = _exact_case(kind)
    old = {k: v.copy() for k, v in model.parameters().items()}
    state = rt.TargetPropState(model, rt.TargetPropConfig(use_chain_rule=chain), dps=SPEC_DPS)
    rt.targetprop_forward(model, state, x)
    rt.targetprop_backward(model, state, target, input_target=True)
    state.calculate_link_budgets()
    rt.apply_targetprop_gaps(model, state, 0.1)
    exact = stp.backward(model.get_config(), old, x, target, {"use_chain_rule": chain},
                         dps=SPEC_DPS, input_target=True)
    for l, t in enumerate(exact["backward_targets"] + [exact["input_target"]]):
        got = (state.backward_targets + [state.input_target])[l]
        assert np.asarray(got).dtype == object          # exact values, not floats
        scale = max(abs(v) for v in np.asarray(t).reshape(-1))
        assert max(abs(a - b) for a, b in zip(np.asarray(got).reshape(-1),
                                              np.asarray(t).reshape(-1))) <= EXACT_TOL * scale
    step = stp.apply(model.get_config(), old, x, exact["backward_targets"], None, 0.1,
                     {"use_chain_rule": chain}, dps=SPEC_DPS)
    assert state.updated == step["updated"]
    for name, value in model.parameters().items():
        diff = max(abs(a - b) for a, b in zip(np.asarray(value).reshape(-1),
                                              step["params"][name].reshape(-1)))
        assert diff <= EXACT_TOL, f"{name}: {diff}"


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=4)
@given(data=st.data())
def test_targets_float32_vs_reflib(kind, data):
    case = data.draw(tp_cases(kind))
    prop_targets_fastlib_vs_reflib(case, data.draw(st.booleans()), dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# tests: budgets, gaps, gate, rates, momentum

@given(budget_pairs())
def test_link_budget_and_gap_three_ways(pair):
    prop_link_budget_three_ways(*pair)


def test_link_budget_zero_norms_is_zero():
    z, one = np.zeros((2, 3)), np.ones((2, 3))
    for y, t in ((z, one), (one, z), (z, z)):
        assert _fast_budget(y, t)[0] == _ref_budget(y, t)[0] == stp.link_budget(y, t) == 0.0
    # gap of zero vectors: RMS(0 − 1) = 1 by hand
    assert _fast_budget(z, one)[1] == _ref_budget(z, one)[1] == 1.0


def _gate_case(target):
    """Dense(2, 2, linear) whose output is exactly (5, 0): W = [[5, 0], [0, 0]], x = (1, 0)."""
    model = Sequential([Dense(2, 2)], dtype=np.float64)
    model.load_parameters({"0.weight": np.array([[5.0, 0.0], [0.0, 0.0]]),
                           "0.bias": np.zeros(2)})
    return Case(model, np.array([[1.0, 0.0]]), np.array([target]))


@pytest.mark.parametrize("target,passes", [((-3.0, 4.0), True), ((-3.0 - 2**-40, 4.0), False)],
                         ids=["exactly_0.2", "just_below"])
def test_gate_at_exactly_the_threshold(target, passes):
    # cos((5, 0), (-3, 4)) = -15/25 = -0.6 exactly in float64, so (cos + 1)/2 == 0.2 == τ: the
    # layer is updated (b >= τ); a target a hair more opposed gives b < τ: the layer is gated.
    case = _gate_case(target)
    budget_spec = stp.link_budget(case.model(case.x), case.target, SPEC_DPS)
    assert (budget_spec == 0.2) is passes
    before = {k: v.copy() for k, v in case.model.parameters().items()}
    ref, rs = _run_reflib(case, True, lr=0.1)
    model, fs = _run_fastlib(case, True, lr=0.1)
    assert (fs.link_budgets[0] == 0.2) is passes and (rs.link_budgets[0] == 0.2) is passes
    assert fs.updated == rs.updated == [passes]
    assert stp.layer_rate(0.1, budget_spec, 0)[0] is passes
    for name, value in model.parameters().items():
        changed = not np.array_equal(value, before[name])
        if name == "0.weight":
            assert changed is passes
        if not passes:
            assert not changed and not np.any(fs.velocities[name])
            assert not np.any(rs.velocities[name])


def test_zero_output_gates_the_layer():
    # All-zero weights and bias: the output is 0, its budget is 0 < 0.2, nothing changes.
    model = Sequential([Dense(3, 2)], dtype=np.float64)
    model.load_parameters({"0.weight": np.zeros((3, 2)), "0.bias": np.zeros(2)})
    case = Case(model, np.ones((2, 3)), np.ones((2, 2)))
    fs_model, fs = _run_fastlib(case, True, lr=0.5)
    _, rs = _run_reflib(case, True, lr=0.5)
    assert fs.link_budgets == rs.link_budgets == [0.0]
    assert fs.updated == rs.updated == [False] and fs.layer_rates == [0.0]
    assert not np.any(fs_model.parameters()["0.weight"])


@pytest.mark.parametrize("factor", [1.1, 1.0, 1.7])
def test_layer_rates_with_depth_scaling(factor):
    model = Sequential([Dense(3, 4, "tanh"), Sequential([Dense(4, 4, "tanh"), Dense(4, 2)])],
                       dtype=np.float64, seed=3)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 3))
    target = model(x) + rng.normal(0, 0.3, (5, 2))
    lr = 0.05
    for chain in (True, False):
        cfg = ft.TargetPropConfig(use_chain_rule=chain, depth_scale_factor=factor,
                                  budget_threshold=0.0)
        state = ft.TargetPropState(model, cfg)
        ft.targetprop_forward(model, state, x)
        ft.targetprop_backward(model, state, target)
        budgets = state.calculate_link_budgets()
        ft.apply_targetprop_gaps(model, state, lr)
        for depth, (b, r) in enumerate(zip(budgets, state.layer_rates)):
            by_hand = lr * (0.5 + 0.5 * b) * factor ** depth   # the rule, written out
            ok, exact = stp.layer_rate(lr, b, depth, {"depth_scale_factor": factor,
                                                      "budget_threshold": 0.0})
            assert ok and abs(r - exact) <= 4e-16 * exact and abs(r - by_hand) <= 4e-16 * r
        if factor == 1.0:   # scaling off: the rate depends on the budget only
            for b, r in zip(budgets, state.layer_rates):
                assert abs(r - lr * (0.5 + 0.5 * b)) <= 4e-16 * r


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chain", [True, False], ids=["chain_rule", "pure"])
@settings(max_examples=6)
@given(data=st.data())
def test_apply_and_momentum_fastlib_vs_reflib(kind, chain, data):
    case = data.draw(tp_cases(kind))
    lr = data.draw(st.sampled_from((0.01, 0.1, 0.5)))
    prop_apply_fastlib_vs_reflib(case, chain, lr, steps=2)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=2)
@given(data=st.data())
def test_apply_reflib_vs_spec(kind, data):
    case = data.draw(tp_cases(kind, small=True))
    prop_apply_reflib_vs_spec(case, data.draw(st.booleans()), 0.1)


def test_momentum_two_steps_by_hand():
    # One Dense(1, 1, linear) with x = 1: y = w + b, target t; d_w = d_b = (t − y) / 1.
    model = Sequential([Dense(1, 1)], dtype=np.float64)
    model.load_parameters({"0.weight": np.array([[0.5]]), "0.bias": np.array([0.25])})
    cfg = ft.TargetPropConfig(momentum=0.9)
    state = ft.TargetPropState(model, cfg)
    x, t = np.array([[1.0]]), np.array([[2.0]])
    w, b, v = 0.5, 0.25, 0.0
    for _ in range(2):
        ft.targetprop_forward(model, state, x)
        ft.targetprop_backward(model, state, t)
        (budget,) = state.calculate_link_budgets()
        assert budget == 1.0          # y and t are positive scalars: cos = 1
        ft.apply_targetprop_gaps(model, state, 0.1)
        rate = 0.1 * (0.5 + 0.5 * budget)
        d = 2.0 - (w + b)
        v = 0.9 * v + 0.1 * rate * d   # the same d for w and b (x = 1), so one velocity
        w, b = w + v, b + v
        assert model.parameters()["0.weight"][0, 0] == pytest.approx(w, rel=1e-15)
        assert model.parameters()["0.bias"][0] == pytest.approx(b, rel=1e-15)
        assert state.velocities["0.weight"][0, 0] == pytest.approx(v, rel=1e-15)


# ---------------------------------------------------------------------------------------------
# tests: pure routes and output targets

def test_pure_dense_route_by_hand():
    # target_in[i] = Σ_j W[i,j] t[j] / Σ_j |W[i,j]|, 0 when that sum <= 0.01 (Loom's rule)
    # rows: an ordinary one, a sum below 0.01, zero, a sum of exactly 0.01 (not "exceeding":
    # routes 0), and one just above it
    W = np.array([[1.0, -2.0], [0.004, 0.005], [0.0, 0.0], [0.01, 0.0], [3.0, 1.0],
                  [0.0, 0.0101]])
    t = np.array([[0.5, 1.5]])
    want = np.array([[(0.5 - 3.0) / 3.0, 0.0, 0.0, 0.0, (1.5 + 1.5) / 4.0, 1.5]])
    np.testing.assert_allclose(ft.route(W, t, 0.01), want, rtol=1e-15, atol=0)
    np.testing.assert_allclose(rt.route(W, t, 0.01), want, rtol=1e-15, atol=0)
    exact = stp.route(spec.backends.MPMATH, W.astype(object), t.astype(object), 0.01)
    np.testing.assert_allclose(exact.astype(float), want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("loss", stp.LOSS_TYPES)
def test_output_target_three_ways(loss):
    rng = np.random.default_rng(4)
    pred = rng.normal(size=(3, 4))
    if loss == "cross_entropy":
        y = rng.integers(0, 4, size=(3, 1))
    elif loss == "categorical_cross_entropy":
        y = np.eye(4)[rng.integers(0, 4, 3)]
    else:
        y = rng.uniform(0, 1, size=(3, 4))
    if loss == "binary_cross_entropy":
        pred = rng.uniform(0.05, 0.95, size=(3, 4))
    exact = stp.output_target(loss, pred, y, SPEC_DPS)
    _close(ft.output_target(loss, pred, y), exact, F64_TOL, f"fastlib {loss}")
    _close(rt.output_target(loss, pred, y), exact, F64_TOL, f"reflib {loss}")


def test_spec_rules_and_proofs():
    assert set(spec.TARGETPROP_RULES) >= {
        "output_target", "output_signal", "chain_rule_target", "route", "pure_dense",
        "pure_rnn", "pure_lstm", "pure_attention", "pure_swiglu", "link_budget", "gap", "gate",
        "layer_rate", "local_update", "momentum"}
    for rule in spec.TARGETPROP_RULES.values():
        _, result = rule.symbolic()           # every rule has a SymPy statement
        assert result is not None and rule.equation
    failed = [r for r in spec.prove_targetprop() if not r.ok]
    assert not failed, failed


# ---------------------------------------------------------------------------------------------
# tests: errors

def test_unsupported_layers_are_refused_by_name():
    for model in (Sequential([Dense(2, 2), LayerNorm(2)]),
                  Parallel([Dense(2, 2), Dense(2, 2)])):
        with pytest.raises(ValueError, match="not supported"):
            ft.TargetPropState(model)
        with pytest.raises(ValueError, match="not supported"):
            rt.TargetPropState(twin(model))
        with pytest.raises(ValueError, match="not supported"):
            stp.leaves(model.get_config())


def test_misuse_gets_clear_errors():
    model = Sequential([Dense(2, 3, "tanh"), Dense(3, 2)], dtype=np.float64)
    state = ft.TargetPropState(model)
    x = np.ones((4, 2))
    with pytest.raises(RuntimeError, match="targetprop_forward first"):
        ft.targetprop_backward(model, state, np.ones((4, 2)))
    ft.targetprop_forward(model, state, x)
    with pytest.raises(ValueError, match="shape"):
        ft.targetprop_backward(model, state, np.ones((4, 3)))
    with pytest.raises(ValueError, match="NaN"):
        ft.targetprop_backward(model, state, np.full((4, 2), np.nan))
    with pytest.raises(RuntimeError, match="targetprop_backward first"):
        ft.apply_targetprop_gaps(model, state, 0.1)
    ft.targetprop_backward(model, state, np.ones((4, 2)))
    with pytest.raises(ValueError, match="lr"):
        ft.apply_targetprop_gaps(model, state, -1.0)
    ft.apply_targetprop_gaps(model, state, 0.1)
    with pytest.raises(RuntimeError, match="targetprop_forward again"):
        ft.apply_targetprop_gaps(model, state, 0.1)
    with pytest.raises(ValueError, match="another model"):
        ft.targetprop_forward(Sequential([Dense(2, 2)], dtype=np.float64), state, x)
    with pytest.raises(ValueError, match="momentum"):
        ft.TargetPropConfig(momentum=1.0)
    with pytest.raises(TypeError, match="use_chain_rule"):
        ft.TargetPropConfig(use_chain_rule="yes")
    with pytest.raises(ValueError, match="did you mean 'mse'"):
        ft.output_target("mes", np.ones((1, 1)), np.ones((1, 1)))
    with pytest.raises(ValueError, match="unknown setting 'momentun'"):
        stp.resolve_config({"momentun": 0.5})


def test_fastlib_exports():
    for name in ("TargetPropConfig", "TargetPropState", "targetprop_forward",
                 "targetprop_backward", "apply_targetprop_gaps"):
        assert getattr(fastlib, name) is getattr(ft, name)
