"""Contrastive divergence checks: fastlib.RBM against reflib.rbm against spec.rbm (issue 6 §3).

Moved here from ``tests/test_rbm.py`` (which imports them) so that ``verigrad conform`` runs
them from an installed package. Oracles: ``spec.rbm.cd_step`` evaluates the CD-k chain and
gradient in exact arithmetic (mpmath, 30 digits) on the same uniforms; ``reflib.rbm`` runs it
in float64 with the reference ops.

Tolerances: every entry is a sum of at most B·H ≤ 24 products of numbers in [0, 1] or
O(1) weights, so float64 engines differ by < 24·eps64·scale ≈ 5e-15 of the array's scale:
``F64_TOL = 1e-12``. float32 against float64: 24·eps32 ≈ 3e-6 of the scale, through at most
three sigmoid layers of the chain (each 1-Lipschitz up to the weights, |W| ≤ ~3): 1e-4.

Sampling is a comparison u < p, discontinuous in p. Two engines that compute p to within a
few ulps draw the same states unless some u lies within that distance of its p, so the
properties reject draws with |u − p| < 1e-9 (float64) or < 1e-4 (float32) at every step.

The property functions (``prop_*``) assert; the strategy is ``rbm_cases``.
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

F64_TOL = 1e-12
F32_TOL = 1e-4
SPEC_DPS = 30


class RBMCase(NamedTuple):
    """Parameters, a data batch in [0, 1] and the uniforms of k Gibbs steps."""

    params: dict
    v0: np.ndarray
    uniforms: np.ndarray


def _f64(x):
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype == object else np.asarray(x, dtype=np.float64)


def _close(actual, expected, tol, what):
    a, e = _f64(actual), _f64(expected)
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
        assert np.array_equal(ref.h[s], _f64(exact["h"][s])), f"hidden sample {s} differs"
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
