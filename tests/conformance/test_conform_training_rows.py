"""The train rows (``training_rows``): whole ``fastlib.train`` runs against exact trajectories,
their bounds, the boundary cases read from the kernels, the training mutants they must catch,
and the TargetProp / CD threshold checks with the bugs they must catch.

Oracles: reflib's tape at 30 digits with the spec's optimizer updates (the exact trajectory),
``spec.targetprop`` / ``spec.rbm`` at 30 digits; the planted bugs come from
``training_mutants`` (and, for the thresholds, comparisons written the wrong way here).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from reports.conformance import cd, targetprop as tp, training_cases as tc
from reports.conformance import training_rows as tr
from reports.conformance.training_cases import EpochCase
from reports.conformance.training_mutants import MUTANTS

_MLP = {"type": "Sequential", "layers": [
    {"type": "Dense", "in_features": 3, "out_features": 4, "activation": "tanh"},
    {"type": "Dense", "in_features": 4, "out_features": 2, "activation": "linear"}]}


def _witnesses():
    """Seven samples in batches of three (the last partial), shuffled, clipped, two epochs:
    the generic loop (value and norm clipping) and the fused epoch, whole and in pieces."""
    rng = np.random.default_rng(5)
    x, y = rng.uniform(-1, 1, (7, 3)), rng.integers(0, 2, (7, 1))
    return [EpochCase(_MLP, x, y, "cross_entropy", 3, "float64", opt, 0.05, 3, 2, True, 0.5,
                      mode, path, label=f"{opt} {mode} {path}")
            for opt, mode, path in (("SGD", "value", "generic"), ("Adam", "norm", "generic"),
                                    ("Momentum", "value", "fused"), ("SGD", "norm", "pieces"))]


# a causal attention model on the compiled attention path (seven samples, batches of three,
# shuffled, clipped, two epochs)
_ATTENTION = {"type": "Sequential", "layers": [
    {"type": "Dense", "in_features": 2, "out_features": 4, "activation": "tanh"},
    {"type": "LayerNorm", "d": 4, "eps": 1e-5},
    {"type": "MultiHeadAttention", "d_model": 4, "heads": 2, "causal": True},
    {"type": "Dense", "in_features": 4, "out_features": 2, "activation": "linear"}]}


def _attention_witness():
    rng = np.random.default_rng(6)
    return EpochCase(_ATTENTION, rng.uniform(-1, 1, (7, 3, 2)), rng.uniform(-1, 1, (7, 3, 2)),
                     "mse", 3, "float64", "Adam", 0.05, 3, 2, True, 0.5, "norm", "compiled",
                     label="Adam norm compiled attention")


WITNESSES = _witnesses() + [_attention_witness()]


@pytest.mark.parametrize("case", WITNESSES, ids=lambda c: c.label)
def test_the_clean_engine_passes_the_witnesses(case):
    result = tr.check_epochs(case)
    assert result.ok, result.describe()
    names = {m.what.split()[0] for m in result.measures}
    assert {"gradient", "loss", "0.weight", "1.bias"} <= names


# which witnesses each mutant touches: the fused epoch has its own optimizer kernel (the
# generic Optimizer.update is not on its path) and the float32 leak is a fused-path bug
_TOUCHES = {"step-1e-7-one-tensor": ("generic",), "fused-float32-leak": ("fused", "pieces"),
            "compiled-attention-unmasked": ("compiled",)}



def _two_wide_layer_norm():
    """A Dense, a two-wide LayerNorm (output ±1 but for eps) and a Dense head, weights moved,
    on the generic loop: the LayerNorm's input gradient is all cancellation."""
    rng = np.random.default_rng(7)
    cfg = {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 3, "out_features": 2, "activation": "tanh"},
        {"type": "LayerNorm", "d": 2, "eps": 1e-5},
        {"type": "Dense", "in_features": 2, "out_features": 2, "activation": "linear"}]}
    return EpochCase(cfg, rng.uniform(-1, 1, (5, 3)), rng.uniform(-1, 1, (5, 2)), "mse", 20,
                     "float64", "SGD", 0.05, 3, 1, False, label="two-wide LayerNorm",
                     moved=True)


# mutants that only a witness of their own shows: a LayerNorm input-gradient term a few
# hundred ulps off is rounding-sized in a well-conditioned layer
_OWN_WITNESSES = {"layer-norm-term-256-ulps": [_two_wide_layer_norm()]}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_training_mutant_fails_the_rows(name):
    cases = _OWN_WITNESSES.get(name) or [c for c in WITNESSES
                                         if c.path in _TOUCHES.get(name, (c.path,))]
    with MUTANTS[name].apply():
        results = [tr.check_epochs(c) for c in cases]
    assert all(not r.ok for r in results), [(c.label, r) for c, r in zip(cases, results)]
    # and the planted function is back afterwards
    assert tr.check_epochs(cases[0]).ok


def test_a_layer_norm_term_off_by_ulps_passes_the_running_radius_and_fails_the_adjoint(
        monkeypatch):
    # behind a two-wide LayerNorm the running radius adds magnitudes that cancel, and admits
    # a LayerNorm backward 256 ulps off in one term; the adjoint radius does not. The clean
    # engine passes both
    case = _two_wide_layer_norm()
    assert tr.narrow_norm(case.config)
    assert tr.check_epochs(case).ok
    with MUTANTS["layer-norm-term-256-ulps"].apply():
        adjoint = tr.check_epochs(case)
        monkeypatch.setattr(tr, "narrow_norm", lambda config: False)
        running = tr.check_epochs(case)
    assert not adjoint.ok and "gradient 0." in adjoint.describe()
    assert running.ok, running.describe()


def test_the_adjoint_radius_tightens_every_bound_of_a_narrow_norm_row(monkeypatch):
    # entry by entry, every step: the gradient allowances (the adjoint radius is at most the
    # running one), the parameters' bounds (the smaller of the two carried through the
    # optimizer) and the loss's radius; in front of the two-wide norm by far more than noise
    import fastlib

    case = _two_wide_layer_norm()
    model = fastlib.layers.from_config(case.config, dtype=np.float64, seed=case.seed)
    params0 = tc.moved_parameters(model.parameters(), case.seed, "float64")
    new = tr.reference_run(case, params0, True)
    new_allow, new_bounds = tr.run_bounds(case, new, params0, True, 0.0)
    monkeypatch.setattr(tr, "narrow_norm", lambda config: False)
    old = tr.reference_run(case, params0, True)
    old_allow, old_bounds = tr.run_bounds(case, old, params0, True, 0.0)
    assert "running_radius" in new.steps[0] and "running_radius" not in old.steps[0]
    for t in range(len(new.steps)):
        assert new.steps[t]["loss_radius"] <= old.steps[t]["loss_radius"]
        for k in params0:
            assert np.all(new_allow[t][k] <= old_allow[t][k]), (t, k)
            assert np.all(new_bounds[t][k] <= old_bounds[t][k]), (t, k)
    assert np.max(old_allow[0]["0.weight"] / new_allow[0]["0.weight"]) > 10.0


def test_a_failure_names_the_entry_and_both_values():
    with MUTANTS["gradient-1e-10"].apply():
        result = tr.check_epochs(WITNESSES[0])
    text = result.describe()
    assert "gradient 0.weight[" in text and "engine" in text and "exact" in text


def test_the_order_check_sees_a_repeated_sample_in_the_generic_loop():
    with MUTANTS["shuffle-repeats-sample"].apply():
        result = tr.check_epochs(WITNESSES[0])
    assert "did not see every sample once" in result.describe()


def test_a_zero_tensor_is_judged_at_its_layer_scale_not_the_model_max():
    # a key bias that is 0 in exact arithmetic, next to its layer's weights and a much larger
    # gradient elsewhere: its floor is its layer's scale
    grads = {"0.w_v": np.full((2, 2), 1e-2), "0.b_k": np.zeros(2),
             "1.weight": np.full((2, 2), 10.0)}
    scales = tr.tensor_scales(grads)
    assert scales["0.b_k"] == pytest.approx(1e-2)
    assert scales["1.weight"] == pytest.approx(10.0)
    # a small tensor that is not 0 keeps its own scale (a lost 1e-7 of it is seen)
    grads["0.b_v"] = np.full(2, 1e-5)
    assert tr.tensor_scales(grads)["0.b_v"] == pytest.approx(1e-5)
    # a whole layer at 0 is judged at the model's scale; a model at 0 at the loss terms'
    grads["2.weight"] = np.zeros((2, 2))
    assert tr.tensor_scales(grads)["2.weight"] == pytest.approx(10.0)
    zero = {"0.weight": np.zeros(3), "0.bias": np.zeros(1)}
    assert tr.tensor_scales(zero, floor=0.5)["0.bias"] == pytest.approx(0.5)


def test_attention_key_bias_rows_pass_with_an_exactly_zero_gradient():
    rng = np.random.default_rng(1)
    cfg = {"type": "Sequential", "layers": [
        {"type": "MultiHeadAttention", "d_model": 2, "heads": 1, "causal": False},
        {"type": "Dense", "in_features": 2, "out_features": 2, "activation": "linear"}]}
    case = EpochCase(cfg, rng.uniform(-1, 1, (3, 3, 2)), rng.uniform(-1, 1, (3, 3, 2)), "mse", 4,
                     "float64", "Adam", 0.05, 2, 1, True)
    result = tr.check_epochs(case)
    assert result.ok, result.describe()
    assert any(m.what == "gradient 0.b_k" for m in result.measures)


def _cancelling_cases():
    """Clean runs whose gradients cancel inside the model: a two-wide LayerNorm over two inputs
    1e-3 apart around 2..8 (its mean's rounding is divided by their tiny spread), and
    attention feeding a two-wide LayerNorm."""
    rng = np.random.default_rng(11)
    a = rng.uniform(2, 8, (6, 1))
    x = np.concatenate([a, a + rng.uniform(1e-3, 3e-3, (6, 1))], axis=1)
    norm = EpochCase({"type": "Sequential", "layers": [
        {"type": "LayerNorm", "d": 2, "eps": 1e-5},
        {"type": "Dense", "in_features": 2, "out_features": 2, "activation": "linear"}]},
        x, rng.uniform(-1, 1, (6, 2)), "mse", 3, "float64", "Adam", 0.01, 3, 2, True,
        label="two-wide LayerNorm over nearly equal inputs")
    rng = np.random.default_rng(12)
    attention = EpochCase({"type": "Sequential", "layers": [
        {"type": "MultiHeadAttention", "d_model": 2, "heads": 1, "causal": False},
        {"type": "LayerNorm", "d": 2, "eps": 1e-5},
        {"type": "Dense", "in_features": 2, "out_features": 2, "activation": "linear"}]},
        np.array([[[0.5478467492858172, -0.9208531449445188],
                   [-1.8361059042552212, -1.9338894578858836]],
                  [[1.2530809568010897, 1.6510223091108869],
                   [0.42654310306871945, 0.9179862439359936]],
                  [[0.17449996586169148, 1.740289695151073],
                   [1.2634142164861286, -1.9890459993194076]]]),
        rng.uniform(-1, 1, (3, 2, 2)), "mse", 0, "float64", "SGD", 0.01, 1, 2, True,
        path="compiled", label="attention into a two-wide LayerNorm")
    return [norm, attention]


@pytest.mark.parametrize("case", _cancelling_cases(), ids=lambda c: c.label)
def test_the_running_error_term_is_what_admits_a_cancelling_clean_run(case, monkeypatch):
    # the clean engine's error here is rounding amplified by the formula's conditioning: the
    # running error bound of reflib's formulas admits it; without that term the first,
    # conditioning-blind term alone rejects the clean engine
    result = tr.check_epochs(case)
    assert result.ok, result.describe()
    monkeypatch.setattr(tr, "K_ORDER", 0.0)
    assert not tr.check_epochs(case).ok


def test_loss_condition_grows_as_the_fit_closes():
    y = np.array([[0], [1]])
    far, terms = tr.loss_condition("cross_entropy", np.zeros((2, 2)), y)
    close, _ = tr.loss_condition("cross_entropy", np.array([[9.0, -9.0], [-9.0, 9.0]]), y)
    assert far == pytest.approx(2.0) and terms == pytest.approx(1.0) and close > 1e6


def test_boundary_cases_follow_the_kernels_constants(monkeypatch):
    from fastlib.kernels import recurrent

    # the generic recurrent rows: "(pieces of N)" (the compiled program's say "sub-pieces")
    before = [c.batch_size for c in tc.boundary_cases("float64") if "(pieces of" in c.label]
    monkeypatch.setattr(recurrent, "PIECE", 5)
    after = [c for c in tc.boundary_cases("float64") if "(pieces of" in c.label]
    assert [c.batch_size for c in after] == [5, 6, 6, 4] and before != [5, 6, 6, 4]
    assert all("pieces of 5" in c.label for c in after)


def test_boundary_cases_straddle_every_threshold():
    b = tc.kernel_boundaries()
    cases32 = tc.boundary_cases("float32")
    params = sorted(int(c.label.split(": ")[1].split()[0]) for c in cases32
                    if "parameters" in c.label)
    assert params[0] < b["split_min_params"] <= params[1]
    rows = [len(c.x) * (c.x.shape[1] if c.x.ndim == 3 else 1) for c in cases32]
    assert max(rows) > b["reduce_block"]
    cases64 = tc.boundary_cases("float64")
    batches = {c.batch_size for c in cases64}
    piece = b["recurrent_piece"]
    assert {piece - 1, piece, piece + 1} <= batches
    # each recurrent kind has a batch of two pieces (a carry reset per piece is exercised)
    for kind in ("RNN", "LSTM"):
        assert any(c.label.startswith(kind) and c.batch_size > piece for c in cases64), kind
    assert any(len(c.x) > b["reduce_block"] for c in cases64)
    # the compiled attention path: batches of rows on each side of its piece size, and
    # models on each side of its chunk size
    rows = sorted(c.batch_size * c.x.shape[1] for c in cases64 if c.path == "compiled")
    assert rows[0] < b["attention_min_piece_rows"] <= rows[-1]
    # every compiled model family (attention alone, LSTM + RMSNorm) on each side of the chunk
    weights = {}
    for c in cases32:
        if c.path == "compiled":
            family = "LSTM" if "LSTM" in c.label else "attention"
            n = int(re.search(r"(\d+) weights", c.label).group(1))
            weights.setdefault(family, []).append(n)
    assert set(weights) == {"attention", "LSTM"}
    for family, ns in weights.items():
        assert min(ns) < b["attention_chunk_min_params"] <= max(ns), family


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(["LSTM", "MultiHeadAttention", "Parallel"]).flatmap(
    tc.epoch_cases))
def test_drawn_generic_runs_pass(case):
    result = tr.check_epochs(case)
    assert result.ok, result.describe()


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(["float64", "float32"]).flatmap(
    lambda d: st.sampled_from(["fused", "pieces"]).flatmap(lambda p: tc.fused_cases(d, p))))
def test_drawn_fused_runs_pass(case):
    result = tr.check_epochs(case)
    assert result.ok, result.describe()


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(["float64", "float32"]).flatmap(tc.recurrent_cases))
def test_drawn_compiled_recurrent_runs_pass(case):
    result = tr.check_epochs(case)
    assert result.ok, result.describe()


def test_compiled_recurrent_boundaries_follow_the_kernels_constants(monkeypatch):
    from fastlib.kernels import recurrent, skeleton

    b = tc.kernel_boundaries()
    piece, block = b["compiled_recurrent_piece"], b["compiled_recurrent_block"]
    cases64 = [c for c in tc.boundary_cases("float64") if c.path == "fused"
               and "compiled" in c.label]
    assert {piece - 1, piece, piece + 1, 2 * piece + 1} <= {c.batch_size for c in cases64}
    assert any(len(c.x) > c.batch_size > piece for c in cases64)   # a partial second piece
    sizes = sorted(sum(np.prod(v.shape) for v in fastlib_params(c).values())
                   for c in tc.boundary_cases("float32") if "update blocks" in c.label)
    assert sizes[0] < block <= sizes[1]
    monkeypatch.setattr(recurrent, "PIECE", 5)
    monkeypatch.setattr(skeleton, "BLOCK", 4096)
    moved = [c for c in tc.boundary_cases("float64") if "compiled" in c.label]
    assert {4, 5, 6, 11} <= {c.batch_size for c in moved}
    sizes = sorted(sum(np.prod(v.shape) for v in fastlib_params(c).values())
                   for c in tc.boundary_cases("float32") if "update blocks" in c.label)
    assert sizes[0] < 4096 <= sizes[1]


def fastlib_params(case):
    import fastlib

    return fastlib.layers.from_config(case.config, dtype=np.float64, seed=0).parameters()


# ---------------------------------------------------------------------------------------------
# TargetProp and CD at their thresholds

@settings(max_examples=10, deadline=None)
@given(case=tp.route_threshold_cases())
def test_route_at_threshold(case):
    tp.prop_route_at_threshold(case)


@pytest.mark.parametrize("offset", tp.THRESHOLD_OFFSETS)
def test_gate_at_threshold(offset):
    tp.prop_gate_at_threshold(offset, 0.1)


@settings(max_examples=3, deadline=None)
@given(case=tp.route_threshold_cases())
def test_route_check_catches_a_route_that_keeps_a_row_on_the_threshold(case):
    import fastlib.kernels.targetprop as kernels

    def at_least(W, threshold, scales):   # ">=" where the rule says ">"
        total = np.sum(np.abs(W), axis=1)
        scales[:] = np.where(total >= threshold, 1.0 / np.where(total > 0, total, 1.0), 0.0)

    original, kernels.route_scales = kernels.route_scales, at_least
    try:
        with pytest.raises(AssertionError, match="must route nothing"):
            tp.prop_route_at_threshold(case)
    finally:
        kernels.route_scales = original


@pytest.mark.parametrize("kind", tp.KINDS)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_route_at_threshold_in_every_kind(kind, data):
    tp.prop_route_kind_at_threshold(*data.draw(tp.route_threshold_kind_cases(kind)))


@pytest.mark.parametrize("kind, column", [("LSTM", False), ("SwiGLU", True),
                                          ("MultiHeadAttention", True)])
def test_route_check_of_every_kind_catches_a_line_on_the_threshold_kept(kind, column):
    """A route that keeps a line whose Σ|W| equals θ (">=" where the rule says ">") fails the
    check in a recurrent, a gated and an attention layer, row and column normalisation."""
    import fastlib.kernels.targetprop as kernels

    def at_least(W, threshold, scales):
        total = np.sum(np.abs(W), axis=1)
        scales[:] = np.where(total >= threshold, 1.0 / np.where(total > 0, total, 1.0), 0.0)

    @settings(max_examples=1, deadline=None, database=None, phases=[Phase.generate])
    @given(case=tp.route_threshold_kind_cases(kind, column))
    def run(case):
        tp.prop_route_kind_at_threshold(*case)

    original, kernels.route_scales = kernels.route_scales, at_least
    try:
        with pytest.raises(AssertionError, match="input_target|backward_targets"):
            run()
    finally:
        kernels.route_scales = original


def test_gate_check_catches_a_strict_comparison(monkeypatch):
    import fastlib.targetprop as ft

    calculate = ft.TargetPropState.calculate_link_budgets

    def strict(self):   # a budget exactly on τ gated, as "b > τ" would
        calculate(self)
        tau = self.config.budget_threshold
        self.link_budgets = [float(np.nextafter(b, 0.0)) if b == tau else b
                             for b in self.link_budgets]

    monkeypatch.setattr(ft.TargetPropState, "calculate_link_budgets", strict)
    with pytest.raises(AssertionError, match="gates differ"):
        tp.prop_gate_at_threshold(0.0, 0.1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from([1, 2]).flatmap(cd.threshold_rbm_cases))
def test_cd_sampling_at_threshold(dtype, case):
    cd.prop_cd_at_threshold(case, dtype)


def test_cd_check_catches_u_at_most_p(monkeypatch):
    import fastlib.kernels.rbm as kernels

    def at_most(p, u, out):   # "u <= p" where the rule says "u < p"
        out[:] = (u <= p.astype(np.float64)).astype(out.dtype)

    monkeypatch.setattr(kernels, "sample_bernoulli", at_most)
    params = {"weight": np.array([[0.0], [1.5]]), "visible_bias": np.array([0.2, -0.3]),
              "hidden_bias": np.array([0.0])}
    v0 = np.array([[1.0, 0.0]])
    u = np.array([[[0.5]]])                    # on p = 1/2: the rule draws 0
    with pytest.raises(AssertionError, match="fastlib gradient"):
        cd.prop_cd_at_threshold((cd.RBMCase(params, v0, u), (True,)))
