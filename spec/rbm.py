"""Contrastive divergence (CD-k) for a binary RBM as math, stated once.

The long story: docs/spec.md, section ``spec/rbm.py``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import mpmath
import numpy as np

from spec.backends import MPMATH, SYMPY
from spec.evaluate import GUARD_DIGITS, _check_dps
from spec.opspec import call_formula
from spec.prove import ProofResult, worst_at_points
from spec.targetprop import _exact, _op, _round, _scalar, _symbols

PARAMETERS = ("weight", "visible_bias", "hidden_bias")


def _hidden_probability(M, v, weight, hidden_bias):
    return _op(M, "sigmoid", np.matmul(v, weight) + hidden_bias)


def _visible_probability(M, h, weight, visible_bias):
    return _op(M, "sigmoid", np.matmul(h, np.asarray(weight, dtype=object).T) + visible_bias)


def _sample(M, p, u):
    return np.asarray(M.where(M.gt(p, u), M.num(1), M.num(0)), dtype=object)


def _gibbs_chain(M, v0, weight, visible_bias, hidden_bias, uniforms):
    """The chain's probabilities and samples: ph[0..k], pv[1..k] (pv[0] is None), h[0..k-1]."""
    k = len(uniforms)
    ph = [_hidden_probability(M, v0, weight, hidden_bias)]
    h = [_sample(M, ph[0], uniforms[0])]
    pv = [None]
    for s in range(1, k + 1):
        pv.append(_visible_probability(M, h[s - 1], weight, visible_bias))
        ph.append(_hidden_probability(M, pv[s], weight, hidden_bias))
        if s < k:
            h.append(_sample(M, ph[s], uniforms[s]))
    return {"ph": ph, "pv": pv, "h": h}


def _cd_gradient(M, v0, ph0, vk, phk):
    batch = v0.shape[0]
    gW = (np.matmul(vk.T, phk) - np.matmul(np.asarray(v0, dtype=object).T, ph0)) / batch
    gb = M.sum(vk - v0, axis=0) / batch
    gc = M.sum(phk - ph0, axis=0) / batch
    return {"weight": gW, "visible_bias": gb, "hidden_bias": gc}


def _free_energy(M, v, weight, visible_bias, hidden_bias):
    v = np.asarray(v, dtype=object)
    linear = M.sum(v * visible_bias, axis=-1)
    soft = M.sum(_op(M, "softplus", np.matmul(v, weight) + hidden_bias), axis=-1)
    return -linear - soft


def _reconstruction_error(M, v0, pv1):
    diff = (np.asarray(v0, dtype=object) - pv1).reshape(-1)
    return _scalar(M.sum(diff * diff)) / diff.size


@dataclass(frozen=True)
class RBMRule:
    """One CD rule: its statement, formula, and example shapes for the SymPy statement."""

    name: str
    equation: str
    formula: Callable
    arrays: Mapping = field(default_factory=dict)

    def apply(self, M, **arguments):
        """Evaluate the formula on backend ``M`` with the named arguments."""
        return call_formula(self.formula, dict(arguments, M=M))

    def symbolic(self):
        """``(arguments, result)`` on symbol arrays of the example shapes."""
        sp = SYMPY.sp
        args = {n: _symbols(sp, n + "_", s) for n, s in self.arrays.items()}
        return args, self.apply(SYMPY, **args)


_V, _H, _B = 2, 2, 1
RBM_RULES = MappingProxyType({r.name: r for r in (
    RBMRule("hidden_probability", "p(h=1|v) = σ(v W + c)", _hidden_probability,
            {"v": (_B, _V), "weight": (_V, _H), "hidden_bias": (_H,)}),
    RBMRule("visible_probability", "p(v=1|h) = σ(h Wᵀ + b)", _visible_probability,
            {"h": (_B, _H), "weight": (_V, _H), "visible_bias": (_V,)}),
    RBMRule("sample", "s = 1 if u < p else 0", _sample, {"p": (2,), "u": (2,)}),
    RBMRule("cd_gradient", "gW = (pv_kᵀ ph_k − v_0ᵀ ph_0)/B; gb = mean(pv_k − v_0); "
            "gc = mean(ph_k − ph_0)", _cd_gradient,
            {"v0": (_B, _V), "ph0": (_B, _H), "vk": (_B, _V), "phk": (_B, _H)}),
    RBMRule("free_energy", "F(v) = −v·b − Σ_j softplus(c_j + (vW)_j)", _free_energy,
            {"v": (_B, _V), "weight": (_V, _H), "visible_bias": (_V,), "hidden_bias": (_H,)}),
    RBMRule("reconstruction_error", "mean (v_0 − pv_1)²", _reconstruction_error,
            {"v0": (_B, _V), "pv1": (_B, _V)}),
)})


# ---------------------------------------------------------------------------------------------
# Exact evaluation.

def _params(params):
    missing = [n for n in PARAMETERS if n not in params]
    if missing:
        raise ValueError(f"RBM parameters need {list(PARAMETERS)}; missing {missing}")
    return {n: _exact(params[n], f"parameter {n!r}") for n in PARAMETERS}


def _check_uniforms(uniforms, k, batch, hidden):
    u = np.asarray(uniforms)
    if u.dtype == object:
        u = u.astype(np.float64)
    if u.ndim != 3 or u.shape[1:] != (batch, hidden):
        raise ValueError(f"uniforms must have shape (k, batch, hidden) = (k, {batch}, {hidden}), "
                         f"got {u.shape}")
    if k is not None and u.shape[0] != k:
        raise ValueError(f"uniforms hold {u.shape[0]} draws but k = {k}; CD-k uses one (batch, "
                         "hidden) array per Gibbs step")
    if u.shape[0] < 1:
        raise ValueError("CD-k needs k >= 1 Gibbs step")
    if not np.all((u >= 0) & (u < 1)):
        raise ValueError("uniforms must lie in [0, 1)")
    return u


def cd_step(params, v0, uniforms, k=None, dps=50):
    """One CD-k gradient, exactly, on the chain the given uniforms determine.

    Parameters
    ----------
    params : dict
        ``weight (V, H)``, ``visible_bias (V,)``, ``hidden_bias (H,)``.
    v0 : array_like
        Data batch (B, V), entries in [0, 1].
    uniforms : array_like
        (k, B, H) draws in [0, 1): ``uniforms[s]`` samples h_s.
    k : int, optional
        Checked against ``len(uniforms)`` when given.
    dps : int

    Returns
    -------
    dict
        ``grads`` (keyed like ``params``), ``ph``, ``pv``, ``h`` (the chain),
        ``reconstruction_error`` and ``free_energy`` (mean F(v_0)) as float64.
    """
    dps = _check_dps(dps)
    with mpmath.workdps(dps + GUARD_DIGITS):
        p = _params(params)
        v = _exact(v0, "v0")
        V, H = p["weight"].shape
        if v.ndim != 2 or v.shape[1] != V:
            raise ValueError(f"v0 must have shape (batch, {V}), got {v.shape}")
        u = _check_uniforms(uniforms, k, v.shape[0], H)
        chain = _gibbs_chain(MPMATH, v, p["weight"], p["visible_bias"], p["hidden_bias"],
                             [_exact(a, "uniforms") for a in u])
        grads = _cd_gradient(MPMATH, v, chain["ph"][0], chain["pv"][-1], chain["ph"][-1])
        recon = _reconstruction_error(MPMATH, v, chain["pv"][1])
        fe = _free_energy(MPMATH, v, p["weight"], p["visible_bias"], p["hidden_bias"])
        fe_mean = mpmath.fsum(fe.reshape(-1)) / fe.size
    names = list(grads)
    return {"grads": dict(zip(names, _round([grads[n] for n in names], dps))),
            "ph": _round(chain["ph"], dps), "pv": _round(chain["pv"], dps),
            "h": _round(chain["h"], dps), "reconstruction_error": float(recon),
            "free_energy": float(fe_mean)}


def free_energy(params, v, dps=50):
    """F(v) per row, exactly (object array of mpf)."""
    dps = _check_dps(dps)
    with mpmath.workdps(dps + GUARD_DIGITS):
        p = _params(params)
        out = _free_energy(MPMATH, _exact(v, "v"), p["weight"], p["visible_bias"],
                           p["hidden_bias"])
    return _round([out], dps)[0]


# ---------------------------------------------------------------------------------------------
# Proofs against the energy E(v, h) = −v·b − h·c − vᵀWh, summed over every binary h (or v).

def _states(n):
    return [np.array([(s >> i) & 1 for i in range(n)], dtype=object) for s in range(2 ** n)]


def _energy(v, h, W, b, c):
    return -(sum(v * b) + sum(h * c) + sum(np.matmul(v, W) * h))


def _prove_conditionals_and_free_energy():
    """p(h|v), p(v|h) and F(v) equal the sums over all 2^H (2^V) states of exp(−E), for V = 3,
    H = 2, at 10 random points with 50 digits."""
    rng = np.random.default_rng(3)
    V, H = 3, 2
    worst = 0.0
    with mpmath.workdps(50):
        for _ in range(10):
            W = np.array([mpmath.mpf(float(a)) for a in rng.normal(size=V * H)],
                         dtype=object).reshape(V, H)
            b = np.array([mpmath.mpf(float(a)) for a in rng.normal(size=V)], dtype=object)
            c = np.array([mpmath.mpf(float(a)) for a in rng.normal(size=H)], dtype=object)
            v = np.array([mpmath.mpf(float(a)) for a in rng.integers(0, 2, V)], dtype=object)
            hs = _states(H)
            weights = [mpmath.exp(-_energy(v, h, W, b, c)) for h in hs]
            Z = mpmath.fsum(weights)
            ph = _hidden_probability(MPMATH, v[None, :], W, c)[0]
            for j in range(H):
                exact = mpmath.fsum(w for w, h in zip(weights, hs) if h[j] == 1) / Z
                worst = max(worst, float(abs(ph[j] - exact)))
            fe = _free_energy(MPMATH, v[None, :], W, b, c)[0]
            worst = max(worst, float(abs(fe + mpmath.log(Z))))
            h = np.array([mpmath.mpf(int(a)) for a in rng.integers(0, 2, H)], dtype=object)
            vs = _states(V)
            vw = [mpmath.exp(-_energy(s, h, W, b, c)) for s in vs]
            pv = _visible_probability(MPMATH, h[None, :], W, b)[0]
            for i in range(V):
                exact = mpmath.fsum(w for w, s in zip(vw, vs) if s[i] == 1) / mpmath.fsum(vw)
                worst = max(worst, float(abs(pv[i] - exact)))
    return worst < 1e-40, "sampling", (f"V=3, H=2, all states summed: max |diff| {worst:.1e} "
                                       "at 10 points, 50 digits")


def _prove_gradient_is_free_energy_difference():
    """cd_gradient = mean ∇_θ F(v_0) − mean ∇_θ F(v_k) with ph = p(h|v) (SymPy ∂F/∂θ)."""
    sp = SYMPY.sp
    B, V, H = 2, 2, 2
    v0, vk = _symbols(sp, "v", (B, V)), _symbols(sp, "u", (B, V))
    W, b, c = _symbols(sp, "W", (V, H)), _symbols(sp, "b", (V,)), _symbols(sp, "c", (H,))
    F0 = sum(_free_energy(SYMPY, v0, W, b, c))
    Fk = sum(_free_energy(SYMPY, vk, W, b, c))
    ph0 = _hidden_probability(SYMPY, v0, W, c)
    phk = _hidden_probability(SYMPY, vk, W, c)
    stated = _cd_gradient(SYMPY, v0, ph0, vk, phk)
    symbols = list(v0.reshape(-1)) + list(vk.reshape(-1)) + list(W.reshape(-1)) + list(b) + \
        list(c)
    diffs = []
    for name, theta in (("weight", W), ("visible_bias", b), ("hidden_bias", c)):
        for idx in np.ndindex(theta.shape):
            diffs.append(stated[name][idx] - (sp.diff(F0, theta[idx]) -
                                              sp.diff(Fk, theta[idx])) / B)
    worst = worst_at_points(symbols, diffs, 4)
    return worst < 1e-40, "sampling", (f"B=V=H=2: max |diff| {worst:.1e} at 10 points, "
                                       "50 digits")


def prove_rbm():
    """Check the CD rules against the RBM's energy.

    Returns
    -------
    list of ProofResult
        ``conditionals_and_free_energy`` and ``cd_gradient``.
    """
    out = []
    for name, fn in (("conditionals_and_free_energy", _prove_conditionals_and_free_energy),
                     ("cd_gradient", _prove_gradient_is_free_energy_difference)):
        start = time.perf_counter()
        try:
            ok, method, detail = fn()
        except Exception as exc:  # a statement that raises is a failed proof
            ok, method, detail = False, "sampling", f"{type(exc).__name__}: {exc}"
        out.append(ProofResult(op=name, ok=bool(ok), method=method, shapes=(), detail=detail,
                               seconds=time.perf_counter() - start))
    return out
