"""reflib's forward mode (``reflib.jvp``) and reverse-over-reverse HVPs (``reflib.hvp``,
``reflib.model_hvp``, ``reflib.gnvp``).

Independent sources: ``spec.jvp`` / ``spec.hvp`` (spec's own declarations run forward over
reverse on dual numbers, proven against SymPy) for every op; for the reference models,
forward over reverse on reflib's tape (dual-number parameters, one backward) and central
differences of the exact gradient at 60 digits; hand derivations at the kinks. The PyTorch
comparisons are in tests/test_reflib_second_order_torch.py (skipped where torch is absent).
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest

import reflib
import spec
from reflib.forward_mode import DualNumeric, ForwardDual
from reflib.losses import add_loss
from reflib.models import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention, RMSNorm,
                           Sequential, SwiGLU, from_config)
from reflib.recorded import RecordingNumeric, values_of
from reflib.tape import Tape
from reports.conformance.engines import ReflibEngine
from reports.conformance.second_order import check_second_order, draw

DPS = 30
# Both sides are correct to DPS digits before their last rounding (each grows its working
# precision until the digits stop moving), so they differ by at most a unit in the last digit
# or two: 10^-(DPS-2) relative to the array's largest entry.
EXACT_RTOL = mpmath.mpf(10) ** -(DPS - 2)


def assert_exact(got, expected, what=""):
    got = np.asarray(got, dtype=object)
    expected = np.asarray(expected, dtype=object)
    assert got.shape == expected.shape, what
    scale = max([abs(mpmath.mpf(e)) for e in expected.flat] + [mpmath.mpf(1)])
    worst = max([abs(mpmath.mpf(g) - mpmath.mpf(e)) for g, e in zip(got.flat, expected.flat)]
                + [mpmath.mpf(0)])
    assert worst <= EXACT_RTOL * scale, f"{what}: off by {mpmath.nstr(worst, 5)}"


def objects(flat, shape):
    """An object array of ``shape`` holding the numbers of ``flat`` in order."""
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


# -- ops: reflib's routes against spec's, exactly ----------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(spec.OPS))
def test_jvp_and_hvp_equal_spec_exactly(name, seed):
    # reflib: its own forward on spec.dual numbers (JVP) and a second backward through its
    # recorded first backward (HVP); spec: its declarations forward over reverse
    inputs, tangents, cotangent, params = draw(name, np.float64, seed)
    value, jv = reflib.jvp(name, inputs, tangents, dps=DPS, **params)
    out, exact_jv = spec.jvp(name, inputs, tangents, params, dps=DPS)
    assert_exact(value, out, f"{name} value")
    assert_exact(jv, exact_jv, f"{name} jvp")
    hv = reflib.hvp(name, inputs, cotangent, tangents, dps=DPS, **params)
    exact_hv = spec.hvp(name, inputs, cotangent, tangents, params, dps=DPS)
    for iname, h, e in zip(spec.OPS[name].inputs, hv, exact_hv):
        assert (h is None) == (e is None), f"{name}: d/d{iname}"
        if e is not None:
            assert all(isinstance(v, mpmath.mpf) for v in h.flat)
            assert_exact(h, e, f"{name} hvp d/d{iname}")


@pytest.mark.parametrize("name", sorted(spec.OPS))
def test_the_float64_engine_passes_the_second_order_checks(name):
    # float64 arithmetic throughout; held to spec's exact values by the conformance bound
    results = check_second_order(ReflibEngine(), name, np.float64, seed=0)
    assert [r.check for r in results] == ["jvp2", "hvp"]
    assert all(r.status == "passed" for r in results), [r.detail for r in results]


@pytest.mark.parametrize("name, inputs, slopes", [
    ("relu", [np.array([0.0, 2.0, -1.0])], [[0.0, 1.0, 0.0]]),
    ("abs", [np.array([0.0, 2.0, -1.0])], [[0.0, 1.0, -1.0]]),
    ("leaky_relu", [np.array([0.0, 2.0, -1.0])], [[0.01, 1.0, 0.01]]),
    ("maximum", [np.array([1.0, 2.0, -1.0]), np.array([1.0, 0.5, 3.0])],
     [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
])
def test_kinks_follow_the_stated_conventions(name, inputs, slopes):
    # first order: the registry's convention at the kink (relu'(0) = |x|'(0) = 0, the slope of
    # leaky_relu at 0 is its negative slope, a tie of maximum goes to the first argument);
    # second order: 0 (the piece the value selects is linear)
    tangents = [np.array([0.7, -1.3, 2.1]) for _ in inputs]
    expected = sum(np.array(s) * t for s, t in zip(slopes, tangents))
    for dps in (None, DPS):
        _, jv = reflib.jvp(name, inputs, tangents, dps=dps)
        assert [float(v) for v in jv] == pytest.approx(list(expected), rel=1e-15)
        hv = reflib.hvp(name, inputs, np.array([1.5, -0.5, 2.0]), tangents, dps=dps)
        assert all(float(v) == 0.0 for h in hv for v in h)


def test_hand_derived_values():
    # d/dx tanh = 1 - tanh², d²/dx² tanh = -2 tanh (1 - tanh²); d²(ab)/da db = 1
    x = np.array([0.5])
    _, jv = reflib.jvp("tanh", [x], [np.array([2.0])], dps=DPS)
    hv = reflib.hvp("tanh", [x], np.array([3.0]), [np.array([2.0])], dps=DPS)
    with mpmath.workdps(DPS + 10):
        th = mpmath.tanh(mpmath.mpf("0.5"))
        assert_exact(jv, [2 * (1 - th**2)])
        assert_exact(hv[0], [3 * 2 * (-2 * th * (1 - th**2))])
    ha, hb = reflib.hvp("mul", [np.array([2.0]), np.array([5.0])], np.array([1.0]),
                        [np.array([3.0]), np.array([7.0])])
    assert ha[0] == 7.0 and hb[0] == 3.0          # the cross terms, nothing else


def test_bad_tangents_say_what_to_fix():
    x = [np.array([1.0, 2.0])]
    with pytest.raises(ValueError, match="shape"):
        reflib.jvp("tanh", x, [np.array([1.0])])
    with pytest.raises(TypeError, match="list or tuple"):
        reflib.hvp("tanh", x, np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="one entry per input"):
        reflib.hvp("tanh", x, np.ones(2), [np.ones(2), np.ones(2)])
    with pytest.raises(ValueError, match="class indices"):
        reflib.hvp("cross_entropy", [np.zeros((1, 2)), np.array([0])], np.array(1.0),
                   [np.ones((1, 2)), np.ones(1)])
    with pytest.raises(ValueError, match="finite"):
        reflib.hvp("tanh", x, np.ones(2), [np.array([1.0, np.nan])])
    for dps in (None, DPS):   # sqrt's forward is defined at 0, its slope is not
        with pytest.raises(ValueError, match="sqrt: a derivative is infinite"):
            reflib.jvp("sqrt", [np.array([0.0, 1.0])], [np.ones(2)], dps=dps)
        with pytest.raises(ValueError, match="sqrt: a derivative is infinite"):
            reflib.hvp("sqrt", [np.array([0.0, 1.0])], np.ones(2), [np.ones(2)], dps=dps)
    with pytest.raises(ValueError, match="cotangent has shape"):
        reflib.hvp("tanh", x, np.ones(3), [np.ones(2)])
    with pytest.raises(ValueError, match="cotangent holds"):
        reflib.hvp("tanh", x, np.array([1.0, np.inf]), [np.ones(2)])


def test_the_recorded_first_backward_is_the_plain_backward():
    # the tape runs unchanged on recorded scalars: its backward_dense gives the values of the
    # plain exact tape, entry by entry (reached and unreached nodes alike)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 2))
    grads = []
    for dps in (RecordingNumeric(DPS), DPS):
        tape = Tape(dps=dps)
        ia, ib, unused = tape.leaf(a), tape.leaf(b), tape.leaf(np.ones(2))
        y = tape.op("softmax", tape.op("matmul", ia, tape.op("tanh", ib)), axis=-1)
        dense = tape.backward_dense(tape.op("sum", tape.op("log", y)), np.array(1.0))
        assert dense[unused] is None
        grads.append([None if g is None else values_of(g) for g in dense])
    for got, expected in zip(*grads):
        assert (got is None) == (expected is None)
        if expected is not None:
            assert_exact(got, expected)


# -- reference models: reverse over reverse against two independent routes ----------------------

def randomised(model, seed):
    """Standard-normal values in every parameter (LayerNorm/RMSNorm weights away from 1)."""
    rng = np.random.default_rng(seed)
    model.load_parameters({k: rng.standard_normal(v.shape) for k, v in model.parameters().items()})
    return model


MODELS = {
    "mlp": (lambda: Sequential([Dense(3, 3, "tanh"), Dense(3, 2)]), (2, 3), "cross_entropy"),
    "rnn": (lambda: RNN(2, 2), (2, 3, 2), "mse"),
    "lstm": (lambda: LSTM(1, 2), (1, 2, 1), "mse"),
    "attention_causal": (lambda: MultiHeadAttention(2, 2, causal=True), (1, 2, 2), "mse"),
    "layernorm_mlp": (lambda: Sequential([Dense(2, 3, "silu"), LayerNorm(3), Dense(3, 2)]),
                      (2, 2), "categorical_cross_entropy"),
    "rmsnorm_swiglu": (lambda: Sequential([RMSNorm(2), SwiGLU(2, 2, 1)]), (2, 2),
                       "binary_cross_entropy_with_logits"),
    "embedding": (lambda: Sequential([Embedding(3, 2), Dense(2, 2, "gelu")]), "indices", "mse"),
}


def model_case(name, seed=0):
    build, shape, loss = MODELS[name]
    model = randomised(build(), seed)
    rng = np.random.default_rng(50 + seed)
    x = np.array([[0, 2], [1, 1]]) if shape == "indices" else rng.standard_normal(shape)
    out = model(x)
    if loss == "cross_entropy":
        y = rng.integers(0, out.shape[-1], size=(out.shape[0], 1))
    elif loss == "categorical_cross_entropy":
        y = rng.dirichlet(np.ones(out.shape[-1]), size=out.shape[0])
    elif loss == "binary_cross_entropy_with_logits":
        y = rng.uniform(size=out.shape)
    else:
        y = rng.standard_normal(out.shape)
    v = {k: rng.standard_normal(w.shape) for k, w in model.parameters().items()}
    return model, x, y, loss, v


def forward_over_reverse(model, x, y, loss, v, dps):
    """H v by the other route: the parameters as duals θ + ε v on reflib's tape, one backward;
    the gradients' ε parts are H v."""
    def compute():
        F = DualNumeric(dps, working=mpmath.mp.dps)
        tape = Tape(dps=F)
        ids = {}
        with F.context():
            for k, w in model.parameters().items():
                duals = np.empty(w.shape, dtype=object)
                for idx in np.ndindex(*w.shape):
                    duals[idx] = ForwardDual(mpmath.mpf(w[idx]), mpmath.mpf(v[k][idx]))
                ids[k] = tape.leaf(duals)
        out = model.trace(tape, tape.leaf(x, requires_grad=False), ids)
        grads = tape.backward_scalar(add_loss(tape, out, y, loss))
        return tuple(objects([d.tangent for d in grads[ids[k]].flat], grads[ids[k]].shape)
                     for k in ids)

    from spec.precision import converge
    return dict(zip(model.parameters(), converge(compute, dps, 20)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_hvp_equals_forward_over_reverse_exactly(name):
    model, x, y, loss, v = model_case(name)
    got = reflib.model_hvp(model, x, y, loss, v, dps=DPS)
    expected = forward_over_reverse(model, x, y, loss, v, DPS)
    assert set(got) == set(model.parameters())
    for k in got:
        assert_exact(got[k], expected[k], f"{name}: {k}")
    # float64 arithmetic: the same products to float64's accuracy on these O(1) tiny graphs
    # (a few hundred roundings of O(1) terms: 1e-12 relative is ~4e3 ulps of room, a wrong
    # term is off by O(1))
    got64 = reflib.model_hvp(model, x, y, loss, v)
    for k in got64:
        assert got64[k].dtype == np.float64
        scale = max(1.0, max(abs(float(e)) for e in expected[k].flat))
        assert np.max(np.abs(got64[k] - np.asarray(expected[k], dtype=float))) <= 1e-12 * scale


@pytest.mark.parametrize("name", ["mlp", "lstm", "layernorm_mlp", "attention_causal"])
def test_model_hvp_equals_central_differences_of_the_exact_gradient(name):
    # (∇L(θ + h v) - ∇L(θ - h v)) / 2h at 60 digits, h = 1e-25: truncation ~h²·|L''''| ≈ 1e-50,
    # rounding ~1e-60 / 1e-25 = 1e-35, both far below the 1e-27 compared
    model, x, y, loss, v = model_case(name, seed=1)
    got = reflib.model_hvp(model, x, y, loss, v, dps=DPS)
    h = mpmath.mpf("1e-25")
    grads = {}
    with mpmath.workdps(70):
        for sign in (1, -1):
            shifted = from_config(model.get_config())
            shifted.load_parameters({k: objects(
                [mpmath.mpf(w) + sign * h * mpmath.mpf(d) for w, d in
                 zip(np.asarray(model.parameters()[k]).flat, np.asarray(v[k]).flat)],
                np.shape(v[k])) for k in v})
            grads[sign] = reflib.value_and_grad(shifted, x, y, loss, dps=60)[1]
        for k in got:
            fd = (grads[1][k] - grads[-1][k]) / (2 * h)
            scale = max([abs(e) for e in fd.flat] + [mpmath.mpf(1)])
            worst = max(abs(a - b) for a, b in zip(got[k].flat, fd.flat))
            assert worst <= mpmath.mpf("1e-27") * scale, f"{name}: {k}"


def test_gauss_newton_equals_the_hessian_of_a_linear_model_under_mse():
    # the model's output is linear in its parameters, so the Hessian's second term
    # (Σ ∂L/∂out · ∂²out/∂θ²) vanishes and the Gauss-Newton product is H v exactly
    rng = np.random.default_rng(8)
    linear = randomised(Dense(3, 2), 4)
    v = {k: rng.standard_normal(w.shape) for k, w in linear.parameters().items()}
    x, y = rng.standard_normal((2, 3)), rng.standard_normal((2, 2))
    gn = reflib.gnvp(linear, x, y, "mse", v, dps=DPS)
    hv = reflib.model_hvp(linear, x, y, "mse", v, dps=DPS)
    for k in hv:
        assert_exact(gn[k], hv[k], k)
    # mse: H_loss = 2/size · I, so Jᵀ H_loss J v of Dense(x) = x w + b is 2/size · [xᵀ(xV + vb),
    # Σ_rows(xV + vb)]: a hand derivation in float64
    jv = x @ v["weight"] + v["bias"]
    expected = {"weight": 2 / jv.size * x.T @ jv, "bias": 2 / jv.size * jv.sum(axis=0)}
    for k in expected:
        np.testing.assert_allclose(np.asarray(gn[k], dtype=float), expected[k], rtol=1e-14)


def test_gauss_newton_is_not_the_hessian_of_a_curved_model():
    # the second term is there for a tanh MLP: the two products differ (the check could fail)
    model, x, y, loss, v = model_case("mlp")
    gn, hv = reflib.gnvp(model, x, y, loss, v), reflib.model_hvp(model, x, y, loss, v)
    assert max(np.max(np.abs(gn[k] - hv[k])) for k in hv) > 1e-3


def test_a_dropped_cross_term_in_the_recording_is_caught(monkeypatch):
    # a planted second-order bug: products recorded with the left operand's partial only (the
    # first backward's values are unchanged, so first-order checks cannot see it)
    from reflib import recorded

    def left_only(self, o):
        r = recorded._binary(lambda a, b: a * b, self, o)
        if isinstance(r, recorded.Recorded) and len(r.parents) == 2:
            r.parents, r.partials = r.parents[:1], r.partials[:1]
        return r

    monkeypatch.setattr(recorded.Recorded, "__mul__", left_only)
    inputs, tangents, cotangent, params = draw("mul", np.float64, 0)
    got = reflib.hvp("mul", inputs, cotangent, tangents, dps=DPS)
    exact = spec.hvp("mul", inputs, cotangent, tangents, params, dps=DPS)
    with pytest.raises(AssertionError):
        for h, e in zip(got, exact):
            assert_exact(h, e)
    model, x, y, loss, v = model_case("mlp")
    got = reflib.model_hvp(model, x, y, loss, v, dps=DPS)
    monkeypatch.undo()
    expected = forward_over_reverse(model, x, y, loss, v, DPS)
    with pytest.raises(AssertionError):
        for k in got:
            assert_exact(got[k], expected[k])


def test_unreached_parameters_get_zeros():
    # an RNN on a length-1 sequence never reaches w_hh
    model = randomised(RNN(2, 2), 1)
    x = np.random.default_rng(1).standard_normal((1, 1, 2))
    v = {k: np.ones(w.shape) for k, w in model.parameters().items()}
    got = reflib.model_hvp(model, x, np.zeros((1, 2)), "mse", v)
    assert np.all(got["w_hh"] == 0.0) and np.any(got["w_ih"] != 0.0)


def test_bad_directions_say_what_to_fix():
    model, x, y, loss, v = model_case("rnn")
    with pytest.raises(ValueError, match="keyed like model.parameters"):
        reflib.model_hvp(model, x, y, loss, {"w_ih": v["w_ih"]})
    with pytest.raises(ValueError, match="shape"):
        reflib.model_hvp(model, x, y, loss, {**v, "b": np.ones(7)})
    with pytest.raises(ValueError, match="finite"):
        reflib.gnvp(model, x, y, loss, {**v, "b": np.full(v["b"].shape, np.inf)})


@pytest.mark.parametrize("name", ["cross_entropy", "categorical_cross_entropy", "log_softmax"])
def test_tied_maxima_keep_each_tied_entry_s_tangent(name):
    # rows whose maximum is tied (every entry, two entries) and a dominant logit: the tied
    # entries' exp(0) carry their own tangents, which a count of the ties would drop
    x = np.array([[-1e4, -1e4, -1e4], [2.0, 2.0, -1.0], [1e4, -1e4, 0.0]])
    rng = np.random.default_rng(3)
    t = rng.standard_normal(x.shape)
    inputs, tangents = [x], [t]
    if name == "cross_entropy":
        inputs, tangents = [x, np.array([[0], [1], [2]])], [t, None]
    elif name == "categorical_cross_entropy":
        target = np.array([[0.2, 0.5, 0.3], [0.0, 1.0, 0.0], [0.5, 0.25, 0.25]])
        inputs, tangents = [x, target], [t, rng.standard_normal(x.shape)]
    _, exact = spec.jvp(name, inputs, tangents, {}, dps=30)
    _, got = reflib.jvp(name, inputs, tangents, dps=30)
    assert np.allclose(np.asarray(got, dtype=float), np.asarray(exact, dtype=float),
                       rtol=1e-25, atol=1e-25)
    g = rng.standard_normal(np.shape(exact))
    hv_exact = spec.hvp(name, inputs, g, tangents, {}, dps=30)
    hv = reflib.hvp(name, inputs, g, tangents, dps=30)
    for e, h in zip(hv_exact, hv):
        if e is not None:
            assert np.allclose(np.asarray(h, dtype=float), np.asarray(e, dtype=float),
                               rtol=1e-25, atol=1e-25)


def test_softplus_jvp_at_zero_takes_one_side():
    # max(x, 0) + log1p(exp(-|x|)) at x = 0: both branches on the same side, slope 1/2
    x, t = np.array([0.0, -0.0]), np.array([1.5, -2.0])
    _, jt = reflib.jvp("softplus", [x], [t], dps=30)
    assert np.array_equal(np.asarray(jt, dtype=float), t / 2)
