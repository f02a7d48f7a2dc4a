"""pytest entry points over the suite's other checks: optimizers against spec.step, the tape laws
on random DAGs for both tapes, fastlib's training step against reflib's per layer type, and the
TargetProp / CD rows; plus the bounds and the special-values table themselves.

Oracles: spec.step in mpmath (optimizers), graph reachability written out in
``strategies.reached`` and reflib's exact tape (tapes), reflib's tape and spec's updates
(training), spec.evaluate at 50 digits rounded once to the dtype (bounds: the best possible
answer must pass, an answer 1e-3 off must not).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spec
from reports.conformance import algorithms, bounds, engines, oracle, properties, training_rows
from reports.conformance.special_values import CATEGORIES, special_cases
from reports.conformance.strategies import (LAYER_KINDS, OPTIMIZER_NAMES, dags, make_example,
                                            mlp_cases, model_cases, optimizer_cases)


@pytest.mark.parametrize("engine, dtype", [("reflib", np.float64), ("fastlib", np.float32),
                                           ("fastlib", np.float64)])
@given(case=optimizer_cases(), steps=st.integers(1, 4))
def test_optimizer_steps_match_spec(engine, dtype, case, steps):
    name, shape, seed, hyper = case
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(shape)
    grads = [rng.standard_normal(shape) for _ in range(steps)]
    result = properties.check_optimizer(engines.get_engine(engine), name, w0, grads, hyper,
                                        dtype)
    assert result.ok, result.describe()


def test_optimizer_check_catches_eps_outside_the_root():
    """A hand-made RMSprop with eps outside the square root (torch's form) must fail."""
    import math

    class Outside(engines.Engine):
        name = "outside"
        dtypes = (np.dtype(np.float64),)
        optimizers = ("RMSprop",)

        def _optimizer_step(self, name, w, g, state, t, lr, gamma, eps):
            E = gamma * state.get("E", np.zeros_like(w)) + (1 - gamma) * g * g
            return w - lr / (np.sqrt(E) + eps) * g, {"E": E}

    w0, grads = np.array([0.5, -1.0]), [np.array([0.3, 0.2]), np.array([-0.1, 0.4])]
    hyper = {"lr": 0.1, "gamma": 0.9, "eps": 1e-3}
    result = properties.check_optimizer(Outside(), "RMSprop", w0, grads, hyper, np.float64)
    assert not result.ok and math.isfinite(result.worst.error)


@pytest.mark.parametrize("engine", properties.TAPE_ENGINES)
@given(dag=dags(), seed=st.integers(0, 2**31 - 1))
def test_tape_laws_on_random_dags(engine, dag, seed):
    result = properties.check_tape_laws(engine, dag, seed)
    assert result.ok, result.describe()


@pytest.mark.parametrize("kind", LAYER_KINDS)
@settings(max_examples=3)
@given(data=st.data(), optimizer=st.sampled_from(OPTIMIZER_NAMES), lr=st.sampled_from([0.01, 0.1]))
def test_training_step_matches_reflib(kind, data, optimizer, lr):
    model = data.draw(model_cases(kind), label="model")
    assert kind in model.kinds
    result = training_rows.check_train_step(model, optimizer, lr)
    assert result.ok, result.describe()


@settings(max_examples=10)
@given(model=mlp_cases(), optimizer=st.sampled_from(OPTIMIZER_NAMES),
       lr=st.sampled_from([0.01, 0.1]))
def test_fused_mlp_training_matches_reflib_whole_and_in_pieces(model, optimizer, lr):
    result = training_rows.check_train_step(model, optimizer, lr, require_fused=True)
    assert result.ok, result.describe()
    assert any("in pieces" in m.what for m in result.measures)


def test_the_fused_mlp_row_fails_a_model_the_fused_path_refuses():
    from reports.conformance.strategies import ModelCase

    # a softmax hidden layer: no compiled path takes it (every elementwise activation is fused)
    refused = ModelCase({"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 2, "out_features": 3, "activation": "softmax"},
        {"type": "Dense", "in_features": 3, "out_features": 2, "activation": "linear"}]},
        np.array([[0.5, -1.0], [1.5, 0.25]]), np.array([[0], [1]]), "cross_entropy", 0,
        frozenset(("Dense", "Sequential")))
    result = training_rows.check_train_step(refused, "sgd", 0.1, require_fused=True)
    assert not result.ok and "did not take a whole-epoch compiled path" in result.describe()
    assert training_rows.check_train_step(refused, "sgd", 0.1).ok


@pytest.mark.parametrize("engine", ["fastlib", "reflib"])
def test_algorithm_rows_run(engine):
    """Each TargetProp / CD row of the suite runs one drawn case and passes."""
    from reports.conformance.runner import run_property

    rows = algorithms.rows_for(engine)
    assert {r.kind for r in rows} == {"targetprop", "cd"}
    for row in rows:
        out = run_property(row.strategy, row.check, 1, seed=0, reproduce=row.reproduce)
        assert out.status == "pass" and out.examples == 1, (row.name, out.detail)


# ---------------------------------------------------------------------------------------------
# the bounds and the table


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(spec.OPS))
@settings(max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), near=st.booleans(), edges=st.booleans())
def test_bounds_admit_the_exact_answer_rounded_and_reject_larger_errors(name, dtype, seed, near,
                                                                        edges):
    """The best possible answer (exact, rounded once) passes, at every magnitude the edge
    draws reach; an answer off by 1e-3 relative, or by three times the bound where the input
    is that ill-conditioned, fails."""
    op = spec.OPS[name]
    example = op.examples[seed % len(op.examples)]
    ex = make_example(name, example.shapes, dict(example.params), seed, dtype,
                      near_kinks=near and bool(op.kinks), edges=edges)
    exact = oracle.exact_vjp(name, ex.inputs, ex.grad, ex.params)
    inputs64 = [oracle.as_float64(x) for x in ex.inputs]
    a_out, a_grads = bounds.admissible(name, inputs64, oracle.as_float64(ex.grad), ex.params,
                                       exact.out[0], [g and g[0] for g in exact.grads])
    pairs = [(exact.out, a_out)] + [(g, a) for g, a in zip(exact.grads, a_grads) if g is not None]
    eps = float(np.finfo(dtype).eps)
    for e, a in pairs:
        with np.errstate(over="ignore"):    # an exact value beyond float32 rounds to inf
            rounded = oracle.measure("rounded", e[0].astype(dtype), e, a, dtype)
        assert rounded.ok
        # every element off by 1e-3 relative, or by three times its own bound where that is
        # larger (an ill-conditioned element): each must fail on its own
        big, tiny = float(np.finfo(dtype).max), float(np.finfo(dtype).tiny)
        with np.errstate(over="ignore", invalid="ignore"):
            delta = np.maximum(1e-3 * np.abs(e[0]), 3 * eps * np.asarray(a) + 4 * tiny)
            off = e[0] + delta
        fits = np.isfinite(off) & (np.abs(off) < big / 2)
        if np.any(fits):
            with np.errstate(over="ignore"):
                off = np.where(fits, off, e[0]).astype(dtype)
            measured = oracle.measure("off", off, e, a, dtype)
            assert measured.failing == int(np.sum(fits)), (measured, int(np.sum(fits)))


def test_pairwise_constant():
    assert bounds.pairwise(1) == 0
    assert bounds.pairwise(2) == (2 + 1) / 2
    assert bounds.pairwise(4096) == (128 + 12) / 2


def test_every_op_has_a_bound_family_and_special_cases():
    for name in spec.OPS:
        assert bounds.family_of(name)
        for dtype in (np.float32, np.float64):
            labels = {ex.label for ex in special_cases(name, dtype)}
            assert "zero cotangent" in labels and labels <= set(CATEGORIES) | {
                "near 1", "huge & tiny", "cancellation"}, (name, labels)
    covered = {ex.label for n in spec.OPS for ex in special_cases(n, np.float32)}
    assert set(CATEGORIES) <= covered


def test_special_cases_are_representable_and_deterministic():
    a = special_cases("exp", np.float32)
    b = special_cases("exp", np.float32)
    assert [x.label for x in a] == [x.label for x in b]
    # exp(80) = 5.5e34 fits float32 (max 3.4e38); exp(1e15) does not, so it is left out
    assert any(ex.label == "saturation" for ex in a)
    huge = [float(ex.inputs[0]) for ex in a if ex.label == "huge"]
    # each magnitude is its own case: exp(-1e15) = 0 stays, exp(1e15) overflows and is left out
    assert huge == [float(np.float32(-1e15))], "exp(1e15) overflows float32: left out"
    long_sum = [ex for ex in special_cases("sum", np.float32) if ex.label == "long reduction"]
    assert long_sum and long_sum[0].inputs[0].size == 4096


def test_nonfinite_contract_catches_wrong_limits_and_leaks():
    """Oracle: the limits of docs/CONTRACTS.md written out by hand (sigmoid(-inf) = 0)."""
    from reports.conformance.special_values import nonfinite_cases

    class WrongLimit(engines.FastlibEngine):
        name = "wrong-limit"

        def _forward(self, name, inputs, **params):
            out = super()._forward(name, inputs, **params)
            return np.where(np.isneginf(inputs[0]), 1.0, out).astype(out.dtype)

    class Leaky(engines.FastlibEngine):
        name = "leaky"

        def _vjp(self, name, inputs, grad, **params):
            (g,) = super()._vjp(name, inputs, grad, **params)
            return (g * np.where(np.any(np.isnan(inputs[0])), np.nan, 1.0).astype(g.dtype),)

    (ex,) = nonfinite_cases("sigmoid", np.float64)
    assert properties.check_nonfinite(engines.get_engine("fastlib"), ex).ok
    bad = properties.check_nonfinite(WrongLimit(), ex)
    assert not bad.ok and "the limit is 0.0" in bad.describe()
    leak = properties.check_nonfinite(Leaky(), ex)
    assert not leak.ok and "leaks" in leak.describe()
    ref = properties.check_nonfinite(engines.get_engine("reflib"), ex)
    assert ref.ok and ref.conventions == ["rejects non-finite inputs (ValueError)"]
