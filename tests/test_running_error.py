"""The running error bound (``reflib.running_error``) really bounds float32 evaluations.

Each test evaluates one of reflib's formulas in genuine float32 (NumPy's float32 arithmetic,
its float32 elementary functions, BLAS for matmul, NumPy's pairwise sum) and holds the error
against the exact value (mpmath at 40 digits: direct mpmath expressions for the single
functions, ``mpmath.fsum`` for sums and products, reflib's exact mode for whole formulas) to
the radius the running error numeric computes at ``u = 2**-24``. Pure arithmetic (sums,
products) is held to the radius itself; formulas with elementary functions to
``K_ORDER * radius``: the radius assumes correctly rounded functions, NumPy's float32 ones are
allowed 1 ulp (the same claim the train rows make). Each test also checks that the error it
bounds is not 0 (so the test could fail) and, where the formula is well conditioned, that the
radius stays within a factor 1e3 of the error actually seen.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import scipy.special

from reflib.numeric import Float64
from reflib.ops import OPS
from reflib.running_error import Bounded, RunningError, radii, values
from reports.conformance.training_rows import K_ORDER

U = 2.0 ** -24
RE = RunningError(U)
LOOSE = 1e3   # a radius more than this many times the worst error seen is useless as a bound


class Float32(Float64):
    """reflib's float64 numeric with every array, constant and function in float32: the
    formulas evaluated as a float32 engine written the same way would."""

    dtype = np.dtype(np.float32)

    def asarray(self, value, what="input"):
        return np.array(np.asarray(value, dtype=np.float64), dtype=np.float32)

    def const(self, value):
        return np.float32(float(value))

    def zeros(self, shape):
        return np.zeros(shape, dtype=np.float32)

    def pi(self):
        return np.float32(np.pi)

    @staticmethod
    def erf(x):
        return scipy.special.erf(np.asarray(x, np.float32))

    def sigmoid(self, x):
        e = np.exp(-np.abs(x))
        one = np.float32(1.0)
        return np.where(x >= 0, one / (one + e), e / (one + e))


F32 = Float32()


def bounded(x):
    """``x`` (float32 values, exact) as an object array of exact Bounded leaves."""
    with RE.context():
        return RE.asarray(np.asarray(x, np.float64))


def run(name, *inputs, **params):
    """reflib op ``name``'s forward in float32 and with running error bounds: (float32 result,
    values, radii)."""
    op = OPS[name]
    f32 = op.forward(F32, *[F32.asarray(v) for v in inputs], **params)
    with RE.context():
        b = op.forward(RE, *[bounded(v) for v in inputs], **params)
    return np.asarray(f32, np.float64), values(b), radii(b)


def exact_map(fn, x):
    with mpmath.workdps(40):
        return np.array([float(fn(mpmath.mpf(float(v)))) for v in np.ravel(x)]).reshape(
            np.shape(x))


def f32(x):
    return np.asarray(x, np.float32)


def check(got, exact, radius, k=1.0, tight=True):
    """``|got - exact| <= k * radius`` everywhere; the error is not all 0; and, when
    ``tight``, the radius is within ``LOOSE`` times the worst error."""
    err = np.abs(np.asarray(got, np.float64) - np.asarray(exact, np.float64))
    bad = err > k * radius
    assert not bad.any(), (f"error {err[bad][:3]} above {k} x radius {radius[bad][:3]} "
                           f"(exact {np.asarray(exact)[bad][:3]})")
    assert err.max() > 0, "no rounding error to bound: the test could not fail"
    if tight:
        assert radius.max() <= LOOSE * err.max(), (radius.max(), err.max())
    return err.max() / radius.max()


# ---------------------------------------------------------------------------------------------
# sums and products: the radius alone, for NumPy's pairwise order and a left-to-right loop

@pytest.mark.parametrize("seed", range(8))
def test_a_long_sum_in_any_order_is_within_its_radius(seed):
    rng = np.random.default_rng(seed)
    x = f32(rng.uniform(-1, 1, 3000) * np.exp(rng.uniform(-3, 3, 3000)))
    if seed % 2:
        x = np.abs(x)   # same signs: the partial sums only grow
    _, _, r = run("sum", x)
    with mpmath.workdps(40):
        exact = float(mpmath.fsum(mpmath.mpf(float(v)) for v in x))
    loop = np.float32(0)
    for v in x:
        loop = np.float32(loop + v)
    check(np.sum(x), exact, r, tight=False)         # NumPy: pairwise blocks
    check(loop, exact, r)                           # the recursive order the radius follows


@pytest.mark.parametrize("seed", range(6))
def test_a_matmul_through_blas_is_within_its_radius(seed):
    rng = np.random.default_rng(100 + seed)
    a, b = f32(rng.standard_normal((7, 400))), f32(rng.standard_normal((400, 5)))
    got, _, r = run("matmul", a, b)                  # float32 np.matmul: BLAS sgemm
    with mpmath.workdps(40):
        exact = np.array([[float(mpmath.fsum(mpmath.mpf(float(a[i, k])) * float(b[k, j])
                                             for k in range(400)))
                           for j in range(5)] for i in range(7)])
    check(got, exact, r)


# ---------------------------------------------------------------------------------------------
# elementary functions: NumPy's float32 functions within K_ORDER radii; the correctly rounded
# value within one radius

FUNCTIONS = {
    "exp": (mpmath.exp, lambda rng: rng.uniform(-20, 20, 4000)),
    "log": (mpmath.log, lambda rng: np.exp(rng.uniform(-20, 20, 4000))),
    "tanh": (mpmath.tanh, lambda rng: rng.uniform(-6, 6, 4000)),
    "sigmoid": (lambda v: 1 / (1 + mpmath.exp(-v)), lambda rng: rng.uniform(-30, 30, 4000)),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_elementary_functions_are_within_their_radius(name):
    fn, draw = FUNCTIONS[name]
    x = f32(draw(np.random.default_rng(7)))
    got, _, r = run(name, x)
    exact = exact_map(fn, x)
    check(got, exact, K_ORDER * r)
    # the model the radius assumes (each function correctly rounded) is within one radius
    check(f32(exact), exact, r)


# ---------------------------------------------------------------------------------------------
# whole formulas

@pytest.mark.parametrize("seed", range(4))
def test_a_function_of_a_computed_argument_carries_its_error(seed):
    # exp and tanh of a float32 product of 60 terms of size ~15: the argument's absolute error
    # (tens of u) becomes exp's relative error, and tanh's where it is not saturated; the radius
    # must carry it through |f'| (a radius of u |f| alone is far too small)
    rng = np.random.default_rng(500 + seed)
    a = f32(rng.uniform(0.5, 1.5, (40, 60)))
    w = f32(rng.uniform(-1, 1, (60, 3)) * 0.5)
    for name, fn in (("exp", mpmath.exp), ("tanh", mpmath.tanh)):
        op = OPS[name]
        got = np.asarray(op.forward(F32, np.matmul(a, w)), np.float64)
        with RE.context():
            r = radii(op.forward(RE, OPS["matmul"].forward(RE, bounded(a), bounded(w))))
        with mpmath.workdps(40):
            arg = [[mpmath.fsum(mpmath.mpf(float(a[i, k])) * float(w[k, j]) for k in range(60))
                    for j in range(3)] for i in range(40)]
            exact = np.array([[float(fn(v)) for v in row] for row in arg])
        check(got, exact, K_ORDER * r)
        if name == "exp":   # the argument's error dominates: more than the 4 u libm may add
            assert np.max(np.abs(got - exact) / exact) > K_ORDER * U


@pytest.mark.parametrize("seed", range(5))
def test_softmax_of_spread_logits_is_within_its_radius(seed):
    rng = np.random.default_rng(200 + seed)
    x = f32(rng.normal(0, 4, (50, 9)))
    got, _, r = run("softmax", x)
    with mpmath.workdps(40):
        exact = np.array([[float(mpmath.exp(mpmath.mpf(float(v))) /
                                 mpmath.fsum(mpmath.exp(mpmath.mpf(float(w))) for w in row))
                           for v in row] for row in x])
    check(got, exact, K_ORDER * r)


def _layer_norm_exact(x, eps):
    with mpmath.workdps(40):
        out = []
        for row in x:
            v = [mpmath.mpf(float(e)) for e in row]
            m = mpmath.fsum(v) / len(v)
            var = mpmath.fsum((e - m) ** 2 for e in v) / len(v)
            out.append([float((e - m) / mpmath.sqrt(var + mpmath.mpf(eps))) for e in v])
        return np.array(out)


@pytest.mark.parametrize("seed", range(5))
def test_a_two_wide_layer_norm_over_nearly_equal_inputs_is_within_its_radius(seed):
    # two values 1e-3 apart around 1..10: the mean's rounding (u |x|) is divided by a standard
    # deviation of 5e-4, so the output loses about a thousand times u, and the radius says so
    rng = np.random.default_rng(300 + seed)
    a = rng.uniform(1, 10, 400)
    x = f32(np.stack([a, a + rng.uniform(0.5e-3, 2e-3, 400)], axis=1))
    eps = np.float32(1e-5)
    got, val, r = run("layer_norm", x, eps=float(eps))
    exact = _layer_norm_exact(x, float(eps))
    ratio = check(got, exact, K_ORDER * r, tight=False)
    err = np.abs(got - exact)
    assert err.max() > 100 * U * np.abs(exact).max()     # the conditioning is real ...
    assert r.max() > 100 * U * np.abs(exact).max()       # ... and the radius sees it
    assert ratio > 1 / LOOSE


def test_a_small_model_value_and_grad_is_within_its_radius():
    import reflib.models
    from reflib.train import value_and_grad

    cfg = {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 3, "out_features": 6, "activation": "tanh"},
        {"type": "LayerNorm", "d": 6, "eps": 1e-5},
        {"type": "Dense", "in_features": 6, "out_features": 4, "activation": "sigmoid"},
        {"type": "Dense", "in_features": 4, "out_features": 3, "activation": "linear"}]}
    worst = 0.0
    for seed in range(4):
        rng = np.random.default_rng(400 + seed)
        model = reflib.models.from_config(cfg, seed=seed)
        model.load_parameters({k: f32(v).astype(np.float64)
                               for k, v in model.parameters().items()})
        x = f32(rng.uniform(-1, 1, (16, 3))).astype(np.float64)
        y = rng.integers(0, 3, 16)
        loss32, g32 = value_and_grad(model, x, y, "cross_entropy", dps=F32)
        loss_b, gb = value_and_grad(model, x, y, "cross_entropy", dps=RE)
        loss_e, ge = value_and_grad(model, x, y, "cross_entropy", dps=40)
        errs, rads = [], []
        for k in ge:
            e = np.abs(np.asarray(g32[k], np.float64) - ge[k].astype(np.float64))
            r = radii(gb[k])
            assert np.all(e <= K_ORDER * r), (k, e, r)
            errs.append(e.max())
            rads.append(r.max())
        assert abs(float(loss32) - float(loss_e)) <= K_ORDER * loss_b.r
        assert max(errs) > 0
        worst = max(worst, max(errs) / max(rads))
    # NOTE: a radius adds absolute values at every node, so through a model's forward and
    # backward (about ten mixing layers here, each summing |w| |r| over its inputs where the
    # errors themselves partly cancel) it grows faster than the error does: a few thousand
    # times the error seen is the price of a bound that holds for every rounding pattern
    assert worst > 1 / (10 * LOOSE), worst


# ---------------------------------------------------------------------------------------------
# the arithmetic itself, against hand derivation

def test_the_radius_of_each_operation_by_hand():
    with RE.context():
        a, b = Bounded(3.0, 1e-7), Bounded(-2.0, 2e-7)
        assert (a + b).r == pytest.approx(3e-7 + U * 1.0)
        assert (a * b).r == pytest.approx(3.0 * 2e-7 + 2.0 * 1e-7 + 2e-14 + U * 6.0)
        assert (a / b).r == pytest.approx((1e-7 + 1.5 * 2e-7) / (2.0 - 2e-7) + U * 1.5)
        # exact operations add no rounding: x + 0, x * 1, x * 2, x / 4
        x = Bounded(0.3, 1e-9)
        assert (x + 0.0).r == 1e-9 and (x * 1.0).r == 1e-9 and (2 * x).r == 2e-9
        assert (x / 4).r == pytest.approx(0.25e-9)
        t = RE.tanh(np.array([x], dtype=object))[0]
        assert t.r == pytest.approx((1 - math.tanh(0.3) ** 2) * 1e-9 + U * math.tanh(0.3))
        # a constant the format cannot hold is rounded once; one it can is exact
        assert RE.const("0.044715").r == pytest.approx(U * 0.044715)
        assert RE.const(0.5).r == 0.0
    with pytest.raises(RuntimeError, match="outside RunningError.context"):
        Bounded(1.0) + Bounded(2.0)


def test_bad_unit_roundoffs_are_refused():
    for bad in (0.0, 1.0, -1e-8, True, "2**-24"):
        with pytest.raises(ValueError, match="unit roundoff"):
            RunningError(bad)
