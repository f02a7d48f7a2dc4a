"""Contrastive divergence: fastlib.RBM against reflib.rbm against spec.rbm.

Oracles: ``spec.rbm.cd_step`` evaluates the CD-k chain and gradient in exact arithmetic (mpmath,
30 digits) on the same uniforms; ``reflib.rbm`` runs it in float64 with the reference ops;
``spec.prove_rbm`` checks the conditionals, the free energy and the gradient against sums over
every state of the RBM's energy.

Tolerances: every entry is a sum of at most B·H ≤ 24 products of numbers in [0, 1] or
O(1) weights, so float64 engines differ by < 24·eps64·scale ≈ 5e-15 of the array's scale:
``F64_TOL = 1e-12``. float32 against float64: 24·eps32 ≈ 3e-6 of the scale, through at most
three sigmoid layers of the chain (each 1-Lipschitz up to the weights, |W| ≤ ~3): 1e-4.

Sampling is a comparison u < p, discontinuous in p. Two engines that compute p to within a
few ulps draw the same states unless some u lies within that distance of its p, so the
strategies reject draws with |u − p| < 1e-9 (float64) or < 1e-4 (float32) at every step
(measure zero otherwise, but Hypothesis likes round numbers).

The strategy ``rbm_cases`` and the ``prop_*`` functions live in ``reports.conformance.cd``,
where ``verigrad conform`` runs them too.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlib
import fastlib.rbm as fr
import reflib.rbm as rr
import spec
import spec.rbm as sr
from reflib.tape import Tape

# Strategies, tolerances and properties: reports.conformance.cd (`verigrad conform` runs them).
from reports.conformance.cd import (
    F64_TOL, SPEC_DPS, _close, rbm_cases, _fast_rbm, prop_cd_fastlib_vs_reflib,
    prop_cd_reflib_vs_spec, prop_cd_optimizer_step,
)


# ---------------------------------------------------------------------------------------------
# tests

@pytest.mark.parametrize("k", [1, 3])
@settings(max_examples=20)
@given(data=st.data())
def test_cd_fastlib_vs_reflib(k, data):
    prop_cd_fastlib_vs_reflib(data.draw(rbm_cases(k)))


@pytest.mark.parametrize("k", [1, 3])
@settings(max_examples=6)
@given(data=st.data())
def test_cd_float32_vs_reflib(k, data):
    prop_cd_fastlib_vs_reflib(data.draw(rbm_cases(k)), dtype=np.float32)


@pytest.mark.parametrize("k", [1, 3])
@settings(max_examples=6)
@given(data=st.data())
def test_cd_reflib_vs_spec(k, data):
    prop_cd_reflib_vs_spec(data.draw(rbm_cases(k, max_units=3)))


@pytest.mark.parametrize("optimizer", ["SGD", "Momentum", "Adam"])
@settings(max_examples=5)
@given(data=st.data())
def test_cd_then_optimizer_step(optimizer, data):
    case = data.draw(rbm_cases(data.draw(st.sampled_from([1, 3]))))
    prop_cd_optimizer_step(case, optimizer, data.draw(st.sampled_from([0.01, 0.1])))


@pytest.mark.parametrize("k", [1, 3])
def test_reflib_exact_mode_vs_spec(k):
    # reflib at 30 digits is the exact referee: gradients agree with the spec to ~1e-25.
    rng = np.random.default_rng(k)
    params = {"weight": rng.normal(size=(3, 2)), "visible_bias": rng.normal(size=3),
              "hidden_bias": rng.normal(size=2)}
    v0, u = rng.uniform(size=(2, 3)), rng.random((k, 2, 2))
    ref = rr.cd_step(params, v0, u, dps=SPEC_DPS)
    exact = sr.cd_step(params, v0, u, dps=SPEC_DPS)
    for name, g in ref.grads.items():
        assert np.asarray(g).dtype == object
        diff = max(abs(a - b) for a, b in zip(g.reshape(-1), exact["grads"][name].reshape(-1)))
        assert diff <= 1e-25, f"{name}: {diff}"


def test_cd_k1_by_hand():
    # V = H = 1, W = 0, biases 0: every probability is σ(0) = 1/2. u = 0.25 < 1/2 samples h0 = 1;
    # pv1 = σ(0) = 1/2, ph1 = 1/2. With v0 = 1: gW = (1/2·1/2 − 1·1/2)/1 = −1/4,
    # gb = 1/2 − 1 = −1/2, gc = 1/2 − 1/2 = 0; reconstruction error (1 − 1/2)² = 1/4;
    # F(1) = −0 − softplus(0) = −log 2.
    params = {"weight": np.zeros((1, 1)), "visible_bias": np.zeros(1),
              "hidden_bias": np.zeros(1)}
    u = np.array([[[0.25]]])
    for result in (fr.cd_gradients(_fast_rbm(params), np.ones((1, 1)), uniforms=u),
                   rr.cd_step(params, np.ones((1, 1)), u)):
        assert result.grads["weight"][0, 0] == -0.25
        assert result.grads["visible_bias"][0] == -0.5
        assert result.grads["hidden_bias"][0] == 0.0
        assert result.reconstruction_error == 0.25
        assert result.free_energy == pytest.approx(-np.log(2.0), rel=1e-15)


def test_sampling_is_strict_u_below_p():
    # W = 1, c = −1, v0 = 1: p(h0 = 1) = σ(0) = 1/2 exactly. u = 0.5 is not below p: h0 = 0 and
    # pv1 = σ(0) = 1/2; u just below 1/2: h0 = 1 and pv1 = σ(1). The reconstruction error
    # (1 − pv1)² shows which state each engine drew.
    params = {"weight": np.ones((1, 1)), "visible_bias": np.zeros(1),
              "hidden_bias": -np.ones(1)}
    v0 = np.ones((1, 1))
    for u, h0 in ((0.5, 0.0), (np.nextafter(0.5, 0.0), 1.0)):
        uniforms = np.full((1, 1, 1), u)
        pv1 = 1.0 / (1.0 + np.exp(-h0))
        exact = sr.cd_step(params, v0, uniforms, dps=SPEC_DPS)
        assert float(exact["h"][0][0, 0]) == h0
        assert rr.cd_step(params, v0, uniforms).h[0][0, 0] == h0
        fast = fr.cd_gradients(_fast_rbm(params), v0, uniforms=uniforms)
        assert fast.reconstruction_error == pytest.approx((1.0 - pv1) ** 2, rel=1e-14)


def test_uniforms_come_from_the_explicit_generator():
    rng = np.random.default_rng(0)
    params = {"weight": rng.normal(size=(4, 3)), "visible_bias": rng.normal(size=4),
              "hidden_bias": rng.normal(size=3)}
    v0 = rng.uniform(size=(5, 4))
    fast = fr.cd_gradients(_fast_rbm(params), v0, k=2, rng=np.random.default_rng(42))
    np.testing.assert_array_equal(fast.uniforms, np.random.default_rng(42).random((2, 5, 3)))
    replay = rr.cd_step(params, v0, fast.uniforms)     # the reference replays the same chain
    for name, g in replay.grads.items():
        _close(fast.grads[name], g, F64_TOL, name)
    with pytest.raises(ValueError, match="rng= .* or uniforms="):
        fr.cd_gradients(_fast_rbm(params), v0)


def test_free_energy_and_reconstruction_three_ways():
    rng = np.random.default_rng(5)
    params = {"weight": rng.normal(size=(4, 3)), "visible_bias": rng.normal(size=4),
              "hidden_bias": rng.normal(size=3)}
    v = rng.uniform(size=(6, 4))
    rbm = _fast_rbm(params)
    exact = sr.free_energy(params, v, SPEC_DPS)
    _close(rbm.free_energy(v), exact, F64_TOL, "fastlib free energy")
    _close(rr.free_energy(params, v), exact, F64_TOL, "reflib free energy")
    # mean-field reconstruction by hand from the spec's conditionals
    import mpmath
    from spec.backends import MPMATH
    with mpmath.workdps(SPEC_DPS):
        W = sr._exact(params["weight"], "W")
        ph = sr._hidden_probability(MPMATH, sr._exact(v, "v"), W, sr._exact(
            params["hidden_bias"], "c"))
        pv = sr._visible_probability(MPMATH, ph, W, sr._exact(params["visible_bias"], "b"))
        want = float(sr._reconstruction_error(MPMATH, sr._exact(v, "v"), pv))
    assert abs(rbm.reconstruction_error(v) - want) <= F64_TOL * want
    assert abs(rr.reconstruction_error(params, v) - want) <= F64_TOL * want


def test_rbm_layer_is_a_sigmoid_feature_layer():
    # forward = p(h|v); backward against the reference RBM traced on the tape.
    rng = np.random.default_rng(6)
    rbm = fr.RBM(4, 3, dtype=np.float64, seed=1)
    ref = rr.RBM(4, 3, seed=1)
    np.testing.assert_array_equal(rbm.parameters()["weight"], ref.parameters()["weight"])
    for p in rbm.parameters().values():
        p[...] = rng.normal(size=p.shape)
    ref.load_parameters(rbm.parameters())
    x, R = rng.uniform(size=(5, 4)), rng.normal(size=(5, 3))
    out = rbm(x)
    tape = Tape()
    ids = ref.attach(tape)
    xid = tape.leaf(x)
    node = ref.trace(tape, xid, ids)
    _close(out, tape.value(node), F64_TOL, "forward")
    grads = tape.backward(node, R)
    gin, fgrads = rbm.backward(R)
    _close(gin, grads[xid], F64_TOL, "input gradient")
    for name, i in ids.items():
        _close(fgrads[name], grads.get(i, np.zeros(np.shape(tape.value(i)))), F64_TOL, name)
    feature_model = fastlib.Sequential([fr.RBM(4, 3), fastlib.Dense(3, 2)], seed=0)
    assert feature_model(x.astype(np.float32)).shape == (5, 2)


def test_rbm_save_and_load(tmp_path):
    rbm = fr.RBM(5, 2, seed=3)
    path = rbm.save(tmp_path / "rbm.npz")
    back = fastlib.load(path)
    assert isinstance(back, fr.RBM) and back.get_config() == rbm.get_config()
    for name, value in rbm.parameters().items():
        np.testing.assert_array_equal(back.parameters()[name], value)


def test_spec_rules_and_proofs():
    assert set(spec.RBM_RULES) == {"hidden_probability", "visible_probability", "sample",
                                   "cd_gradient", "free_energy", "reconstruction_error"}
    for rule in spec.RBM_RULES.values():
        assert rule.symbolic()[1] is not None
    failed = [r for r in spec.prove_rbm() if not r.ok]
    assert not failed, failed


def test_bad_input_gets_clear_errors():
    rbm = fr.RBM(3, 2, dtype=np.float64)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fr.cd_gradients(rbm, np.full((2, 3), 2.0), rng=rng)
    with pytest.raises(ValueError, match="shape"):
        fr.cd_gradients(rbm, np.zeros((2, 3)), k=2, uniforms=np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        fr.cd_gradients(rbm, np.zeros((2, 3)), uniforms=np.ones((1, 2, 2)))
    with pytest.raises(ValueError, match="cd_k"):
        fr.cd_gradients(rbm, np.zeros((2, 3)), k=0, rng=rng)
    with pytest.raises(ValueError, match="3 visible units"):
        fr.cd_gradients(rbm, np.zeros((2, 4)), rng=rng)
    with pytest.raises(TypeError, match="Generator"):
        fr.cd_gradients(rbm, np.zeros((2, 3)), rng=5)
    with pytest.raises(ValueError, match="k = 2"):
        rr.cd_step(rbm, np.zeros((2, 3)), np.zeros((1, 2, 2)), k=2)
    with pytest.raises(ValueError, match="missing"):
        rr.cd_step({"weight": np.zeros((3, 2))}, np.zeros((2, 3)), np.zeros((1, 2, 2)))


def test_saved_rbm_loads_in_a_fresh_process(tmp_path):
    """fastlib.load must rebuild an RBM without the caller importing fastlib.rbm first."""
    import subprocess
    import sys

    import fastlib.rbm
    model = fastlib.rbm.RBM(6, 3, dtype=np.float64, seed=1)
    path = tmp_path / "rbm.npz"
    model.save(path)
    code = ("import sys, numpy as np, fastlib; m = fastlib.load(sys.argv[1]); "
            "print(type(m).__name__, float(np.sum(m.parameters()['weight'])))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    name, total = out.stdout.split()
    assert name == "RBM"
    assert float(total) == float(np.sum(model.parameters()["weight"]))
