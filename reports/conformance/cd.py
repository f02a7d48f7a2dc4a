"""Contrastive divergence checks: fastlib.RBM against reflib.rbm against spec.rbm.

Moved here from ``tests/test_rbm.py`` (which imports them) so that ``verigrad conform`` runs
them from an installed package. Oracles: ``spec.rbm.cd_step`` evaluates the CD-k chain and
gradient in exact arithmetic (mpmath, 30 digits) on the same uniforms; ``reflib.rbm`` runs it
in float64 with the reference ops.

The long story: docs/reports-conformance.md, section ``reports/conformance/cd.py``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import fastlib
import fastlib.rbm as fr
import reflib.rbm as rr
import spec.rbm as sr
from reports.conformance.oracle import as_float64

F64_TOL = 1e-12
F32_TOL = 1e-4
SPEC_DPS = 30


class RBMCase(NamedTuple):
    """Parameters, a data batch in [0, 1] and the uniforms of k Gibbs steps."""

    params: dict
    v0: np.ndarray
    uniforms: np.ndarray


def _close(actual, expected, tol, what):
    a, e = as_float64(actual), as_float64(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    scale = max(float(np.max(np.abs(e))), 1e-300)
    err = float(np.max(np.abs(a - e)))
    assert err <= tol * scale, f"{what}: max error {err:.3e} > {tol:.0e} x scale {scale:.3e}"


@st.composite
def rbm_cases(draw, k, max_units=5):
    """An RBM case: sizes, N(0, 1) weights and biases, binary or probability data."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    V, H, B = (draw(st.integers(1, max_units)), draw(st.integers(1, max_units - 1)),
               draw(st.integers(1, 4)))
    params = {"weight": rng.normal(0, 1, (V, H)), "visible_bias": rng.normal(0, 1, V),
              "hidden_bias": rng.normal(0, 1, H)}
    v0 = (rng.integers(0, 2, (B, V)).astype(np.float64) if draw(st.booleans())
          else rng.uniform(0, 1, (B, V)))
    return RBMCase(params, v0, rng.random((k, B, H)))


def _margin(case, ref_result):
    """Smallest |u_s − ph_s| over the sampled steps of the reference chain."""
    k = case.uniforms.shape[0]
    return min(float(np.min(np.abs(case.uniforms[s] - ref_result.ph[s]))) for s in range(k))


def _fast_rbm(params, dtype=np.float64):
    V, H = params["weight"].shape
    rbm = fr.RBM(V, H, dtype=dtype)
    rbm.load_parameters(params)
    return rbm


# ---------------------------------------------------------------------------------------------
# properties

def prop_cd_fastlib_vs_reflib(case, dtype=np.float64):
    """Same uniforms: the same chain, gradient, reconstruction error and free energy."""
    k = case.uniforms.shape[0]
    ref = rr.cd_step(case.params, case.v0, case.uniforms, k=k)
    assume(_margin(case, ref) > (1e-9 if dtype == np.float64 else 1e-4))
    tol = F64_TOL if dtype == np.float64 else F32_TOL
    fast = fr.cd_gradients(_fast_rbm(case.params, dtype), case.v0.astype(dtype), k=k,
                           uniforms=case.uniforms)
    for name, g in ref.grads.items():
        _close(fast.grads[name], g, tol, f"gradient {name}")
    assert abs(fast.reconstruction_error - ref.reconstruction_error) <= tol * max(
        ref.reconstruction_error, 1e-300)
    assert abs(fast.free_energy - ref.free_energy) <= tol * max(abs(ref.free_energy), 1.0)


def prop_cd_reflib_vs_spec(case):
    """reflib's CD-k equals the exact chain and gradient on the same uniforms."""
    k = case.uniforms.shape[0]
    ref = rr.cd_step(case.params, case.v0, case.uniforms, k=k)
    assume(_margin(case, ref) > 1e-9)
    exact = sr.cd_step(case.params, case.v0, case.uniforms, k=k, dps=SPEC_DPS)
    for name, g in ref.grads.items():
        _close(g, exact["grads"][name], F64_TOL, f"gradient {name}")
    for s in range(k):
        assert np.array_equal(ref.h[s], as_float64(exact["h"][s])), f"hidden sample {s} differs"
    assert abs(ref.reconstruction_error - exact["reconstruction_error"]) <= F64_TOL * max(
        exact["reconstruction_error"], 1e-300)
    assert abs(ref.free_energy - exact["free_energy"]) <= F64_TOL * max(
        abs(exact["free_energy"]), 1.0)


def prop_cd_optimizer_step(case, optimizer, lr):
    """A CD-k gradient then one optimizer step: fastlib's update equals reflib's (spec's)."""
    k = case.uniforms.shape[0]
    ref_result, new_params, _ = rr.cd_train_step(case.params, case.v0, case.uniforms,
                                                 optimizer, lr=lr)
    assume(_margin(case, ref_result) > 1e-9)
    rbm = _fast_rbm(case.params)
    fast = fr.cd_gradients(rbm, case.v0, k=k, uniforms=case.uniforms)
    opt = fastlib.optim.get(optimizer, lr=lr)
    state = opt.init(rbm.parameters())
    opt.update(rbm.parameters(), fast.grads, state)
    for name, value in new_params.items():
        _close(rbm.parameters()[name], value, F64_TOL, f"{optimizer} parameter {name}")


# ---------------------------------------------------------------------------------------------
# at the sampling threshold: h = [u < p] with u on p, one ulp either side, and nearby

def _u_near(p, offset):
    if offset == "on":
        return p
    if offset == "below":
        return float(np.nextafter(p, 0.0))
    if offset == "above":
        return float(np.nextafter(p, 1.0))
    return p + offset


U_OFFSETS = ("on", "below", "above", 1e-12, -1e-12, 1e-6, -1e-6)


@st.composite
def threshold_rbm_cases(draw, k):
    """An RBM case whose "threshold" hidden units have p(h_0 = 1 | v_0) = σ(0) = 1/2 exactly,
    with their first uniforms on 1/2, one ulp either side, or nearby.

    A threshold unit's weight column is nonzero only on one visible unit that is 0 in every
    data row, and its bias is 0, so v_0 W + c is exactly 0 for it; its sample then moves the
    chain (p(v_1 | h_0) reads that weight), so a wrong draw changes the gradient. The other
    units, and every later step, are random and kept away from their thresholds.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    V, H, B = draw(st.integers(2, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    at = draw(st.lists(st.booleans(), min_size=H, max_size=H))
    at[draw(st.integers(0, H - 1))] = True
    at = np.array(at)
    z = draw(st.integers(0, V - 1))
    W = rng.normal(0, 1, (V, H))
    c = rng.normal(0, 1, H)
    W[:, at] = 0.0
    W[z, at] = rng.choice([-2.0, -1.5, 1.5, 2.0], int(at.sum()))
    c[at] = 0.0
    params = {"weight": W, "visible_bias": rng.normal(0, 1, V), "hidden_bias": c}
    v0 = (rng.integers(0, 2, (B, V)).astype(np.float64) if draw(st.booleans())
          else rng.uniform(0, 1, (B, V)))
    v0[:, z] = 0.0
    u = rng.random((k, B, H))
    for b in range(B):
        for j in np.flatnonzero(at):
            u[0, b, j] = _u_near(0.5, draw(st.sampled_from(U_OFFSETS)))
    return RBMCase(params, v0, u), tuple(bool(a) for a in at)


def prop_cd_at_threshold(case_at, dtype=np.float64):
    """fastlib (float64 or float32) and reflib draw exactly the spec's first states
    h_0 = [u < p] where p = 1/2 (u on it: 0; one ulp below: 1), hence the same chain and
    the same gradients as the exact one."""
    case, at = case_at
    at = np.array(at)
    k = case.uniforms.shape[0]
    ref = rr.cd_step(case.params, case.v0, case.uniforms, k=k)
    margin = 1e-9 if dtype == np.float64 else 1e-4
    gaps = [np.abs(case.uniforms[s] - ref.ph[s]) for s in range(k)]
    gaps[0] = gaps[0][:, ~at]
    if min((float(np.min(g)) if g.size else 1.0) for g in gaps) <= margin:
        assume(False)
    assert np.all(as_float64(ref.ph[0])[:, at] == 0.5), "the threshold units must have p = 1/2"
    want = (case.uniforms[0][:, at] < 0.5).astype(np.float64)
    exact = sr.cd_step(case.params, case.v0, case.uniforms, k=k, dps=SPEC_DPS)
    assert np.array_equal(as_float64(exact["h"][0])[:, at], want), "spec: h_0 = [u < 1/2]"
    assert np.array_equal(ref.h[0][:, at], want), "reflib: h_0 = [u < 1/2] at p = 1/2"
    fast = fr.cd_gradients(_fast_rbm(case.params, dtype), case.v0.astype(dtype), k=k,
                           uniforms=case.uniforms)
    tol = F64_TOL if dtype == np.float64 else F32_TOL
    for name, g in exact["grads"].items():
        _close(fast.grads[name], g, tol, f"fastlib gradient {name} (u at p = 1/2: "
                                         f"{case.uniforms[0][:, at].tolist()})")
        _close(ref.grads[name], g, F64_TOL, f"reflib gradient {name}")
