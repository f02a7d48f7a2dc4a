"""The adjoint radius (``reflib.adjoint_error``) bounds real evaluations and never exceeds the
running radius it refines.

Oracles: reflib's formulas at 60 digits (mpmath) for the exact values; reflib's float64
numeric for the evaluation the radius claims to bound (NumPy's float64 arithmetic and libm:
pairwise sums where the radius assumes left to right, so the sites differ as an engine's do);
hand derivations for the single-operation cases. Each comparison also checks that the error it
bounds is not 0, so the test could fail.
"""
from __future__ import annotations

import numpy as np
import pytest

import reflib.models
from reflib.adjoint_error import AdjointError, Traced, adjoint_radii
from reflib.ops import forward
from reflib.running_error import RunningError, radii
from reflib.train import value_and_grad
from reports.conformance import training_rows as tr
from reports.conformance.training_rows import K_ORDER

U64 = 2.0 ** -53


def test_a_rounding_that_cancels_downstream_costs_nothing():
    # t = x0 + x1 rounds once; t - t is exactly 0 whatever that rounding was: the adjoint
    # radius sees the one site twice with slopes +1 and -1, the running radius adds 2 u |t|
    # (a sum, not a product: no FMA can take its rounding away in one use only)
    x = np.array([1.0, 2.0 ** -30])
    F = AdjointError(U64)
    t = forward("sum", [x], dps=F)
    d = forward("sub", [t, t], dps=F)
    assert float(d) == 0.0
    assert d[()].r == pytest.approx(2 * U64 * (1.0 + 2.0 ** -30))
    assert adjoint_radii(F, d)[()] == 0.0


def test_without_cancellation_it_is_the_running_radius():
    # (a b) c with exact leaves: u |ab| |c| + u |abc| either way (hand derivation)
    a, b, c = 1.1, 3.3, -0.7
    F = AdjointError(U64)
    ab = forward("mul", [np.array(a), np.array(b)], dps=F)
    abc = forward("mul", [ab, np.array(c)], dps=F)
    expected = U64 * abs(float(ab)) * abs(c) + U64 * abs(float(abc))
    assert adjoint_radii(F, abc)[()] == pytest.approx(expected, rel=1e-12)
    assert abc[()].r == pytest.approx(expected, rel=1e-12)


def test_a_product_a_sum_may_fuse_keeps_its_rounding_use_by_use():
    # g = a b rounds once; g - g is 0 as written, but an engine that fuses one use into an
    # FMA computes (a b exactly) - g: the product's rounding, once per fusable use
    F = AdjointError(U64)
    g = forward("mul", [np.array(1.1), np.array(3.3)], dps=F)
    d = forward("sub", [g, g], dps=F)
    assert adjoint_radii(F, d)[()] == pytest.approx(2 * U64 * abs(float(g)), rel=1e-12)
    # so is c - a b written as c + (-(a b)), against c - a b
    # (each sum's own rounding, and the product's once per sum)
    c = np.array(0.25)
    s1 = forward("add", [c, forward("neg", [g], dps=F)], dps=F)
    s2 = forward("sub", [c, g], dps=F)
    expected = U64 * (abs(float(s1)) + abs(float(s2)) + 2 * abs(float(g)))
    assert adjoint_radii(F, forward("sub", [s1, s2], dps=F))[()] == pytest.approx(
        expected, rel=1e-12)
    # a quotient is never fused: its rounding cancels as the algebra says
    q = forward("div", [np.array(1.1), np.array(3.3)], dps=F)
    assert adjoint_radii(F, forward("sub", [q, q], dps=F))[()] == 0.0


def test_values_and_running_radii_are_running_errors():
    # the traced evaluation is RunningError's, entry for entry
    rng = np.random.default_rng(0)
    x, w = rng.uniform(-1, 1, (3, 4)), rng.uniform(-1, 1, (4, 2))
    F, R = AdjointError(U64), RunningError(U64)
    got = forward("tanh", [forward("matmul", [x, w], dps=F)], dps=F)
    want = forward("tanh", [forward("matmul", [x, w], dps=R)], dps=R)
    assert all(isinstance(v, Traced) for v in got.flat)
    assert np.array_equal(radii(got), radii(want))
    assert np.array_equal([v.v for v in got.flat], [v.v for v in want.flat])


def test_outside_a_context_it_says_where_to_go():
    with pytest.raises(RuntimeError, match="F.context"):
        Traced(1.0, 0.1, -1) + 1.5


def _norm_model(d, seed):
    """Dense(3, d, tanh) + LayerNorm(d) + Dense(d, 2), every parameter off its initial value."""
    cfg = {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 3, "out_features": d, "activation": "tanh"},
        {"type": "LayerNorm", "d": d, "eps": 1e-5},
        {"type": "Dense", "in_features": d, "out_features": 2, "activation": "linear"}]}
    rng = np.random.default_rng(seed)
    model = reflib.models.from_config(cfg, seed=seed)
    model.load_parameters({k: np.asarray(v, np.float64) + rng.uniform(-0.5, 0.5, np.shape(v))
                           for k, v in sorted(model.parameters().items())})
    return model, rng.uniform(-1, 1, (4, 3)), rng.uniform(-1, 1, (4, 2))


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_the_adjoint_radius_bounds_float64_and_stays_under_the_running_radius(d, seed):
    model, x, y = _norm_model(d, seed)
    _, exact = value_and_grad(model, x, y, "mse", dps=60)
    _, got = value_and_grad(model, x, y, "mse")
    (running, _), (adjoint, _) = tr.running_radius(model, x, y, "mse", "float64", both=True)
    seen = 0.0
    for k in exact:
        err = np.abs(np.asarray(got[k], np.float64) - np.asarray(exact[k], np.float64))
        seen = max(seen, float(err.max()))
        # the engine's libm may be 2 ulp off where the radius counts half an ulp (K_ORDER)
        assert np.all(err <= K_ORDER * adjoint[k]), (k, err, adjoint[k])
        assert np.all(adjoint[k] <= running[k] * (1 + 1e-12)), (k, adjoint[k], running[k])
    assert seen > 0.0


@pytest.mark.parametrize("seed", range(3))
def test_behind_a_two_wide_layer_norm_it_is_far_tighter(seed):
    # the first Dense's gradient is r h eps / (var + eps) per row: all cancellation, and the
    # running radius adds the magnitudes the adjoint sees cancel (one-wide: an exact 0)
    for d, factor in ((1, 100.0), (2, 5.0)):
        model, x, y = _norm_model(d, seed)
        (running, _), (adjoint, _) = tr.running_radius(model, x, y, "mse", "float64",
                                                       both=True)
        assert np.max(running["0.weight"]) >= factor * np.max(adjoint["0.weight"]), d


@pytest.mark.parametrize("seed", range(3))
def test_a_one_wide_layer_norm_in_fastlib_stays_within_the_fused_products_rounding(seed):
    # the front Dense's gradient is exactly 0 (the norm's output is its bias); fastlib's
    # kernel recomputes g = dy w inside r (g - mean(g) - ...), which the compiler fuses into
    # an FMA, so it leaves the rounding of dy w, times r = 1 / sqrt(eps): what the adjoint
    # radius keeps for a product a sum may fuse, and the running radius overstates 1000-fold
    import fastlib

    model, x, y = _norm_model(1, seed)
    engine = fastlib.layers.from_config(model.get_config(), dtype=np.float64)
    engine.load_parameters({k: np.asarray(v, np.float64) for k, v in model.parameters().items()})
    _, got = fastlib.value_and_grad(engine, x, y, "mse")
    _, exact = value_and_grad(model, x, y, "mse", dps=60)
    (running, _), (adjoint, _) = tr.running_radius(model, x, y, "mse", "float64", both=True)
    assert not np.any(np.asarray(exact["0.weight"], np.float64))
    err = np.abs(got["0.weight"])
    assert np.all(err <= K_ORDER * adjoint["0.weight"]), (err, adjoint["0.weight"])
    assert np.all(running["0.weight"] >= 1000 * adjoint["0.weight"])
