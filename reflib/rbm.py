"""Reference restricted Boltzmann machine and contrastive divergence (CD-k), exact on demand.

The rules are spec.rbm's (its docstring has the table). Sampling takes its uniforms as an
input, so the reference replays exactly the chain a fast engine drew:

    h_s = 1 if u_s < p(h | ·) else 0,   uniforms of shape (k, batch, hidden)

Visible states of the negative phase are probabilities; the statistics use probabilities.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from optable.parameters import LAYER_KINDS, RBM_INIT_STD
from reflib import ops
from reflib.models.base import Layer, input_shape, set_sizes
from reflib.numeric import numeric_for

__all__ = ["RBM", "CDResult", "cd_step", "cd_train_step", "free_energy",
           "reconstruction_error", "PARAMETERS"]

# the parameter names and the initial draw (weights N(0, 0.01²), zero biases, the same values
# fastlib.RBM draws from the same seed) are the RBM kind's declaration in optable.parameters
PARAMETERS = tuple(p.name for p in LAYER_KINDS["RBM"].parameters)
INIT_STD = RBM_INIT_STD


class RBM(Layer):
    """Binary RBM: ``weight (visible, hidden)``, ``visible_bias (visible,)``,
    ``hidden_bias (hidden,)``. Called on data it gives p(h = 1 | v) = σ(v W + c).

    Parameters
    ----------
    visible, hidden : int
    seed, rng :
        Initialisation: weight N(0, 0.01²), zero biases.
    """

    def __init__(self, visible, hidden, *, seed=None, rng=None):
        super().__init__()
        set_sizes(self, visible=visible, hidden=hidden)
        self.reset_parameters(seed, rng)

    def trace(self, tape, x, ids):
        input_shape(tape, x, "RBM", 2, self.visible, "visible units")
        pre = tape.op("add", tape.op("matmul", x, ids["weight"]), ids["hidden_bias"])
        return tape.op("sigmoid", pre)

    def get_config(self):
        return {"type": "RBM", "visible": self.visible, "hidden": self.hidden}


class CDResult(NamedTuple):
    """One CD-k step: the gradient an optimizer descends, the chain, and the metrics."""

    grads: dict                 # keyed like the parameters
    reconstruction_error: float  # mean (v_0 − pv_1)² over entries
    free_energy: float          # mean F(v_0) over the batch
    ph: list                    # p(h | ·) at steps 0..k
    pv: list                    # p(v | h) at steps 1..k (pv[0] is None)
    h: list                     # sampled hidden states at steps 0..k-1


def _params(model, num):
    params = model.parameters() if hasattr(model, "parameters") else model
    missing = [n for n in PARAMETERS if n not in params]
    if missing:
        raise ValueError(f"an RBM has parameters {list(PARAMETERS)}; missing {missing}")
    return {n: num.asarray(params[n], f"RBM parameter {n!r}") for n in PARAMETERS}


def _hidden(p, v, dps):
    return ops.forward("sigmoid", [np.matmul(v, p["weight"]) + p["hidden_bias"]], dps=dps)


def _visible(p, h, dps):
    return ops.forward("sigmoid", [np.matmul(h, p["weight"].T) + p["visible_bias"]], dps=dps)


def _free_energy_rows(p, v, dps):
    soft = ops.forward("softplus", [np.matmul(v, p["weight"]) + p["hidden_bias"]], dps=dps)
    return -np.sum(v * p["visible_bias"], axis=-1) - np.sum(soft, axis=-1)


def _data(v0, p, num):
    v = num.asarray(v0, "v0")
    if v.ndim != 2 or v.shape[1] != p["weight"].shape[0]:
        raise ValueError(f"v0 must have shape (batch, {p['weight'].shape[0]}), got {v.shape}")
    if not np.all(num.isfinite(v)):
        raise ValueError("v0 holds NaN or Inf")
    return v


def cd_step(model, v0, uniforms, k=None, dps=None):
    """One CD-k gradient on the chain that ``uniforms`` determine (spec.rbm's rules).

    Parameters
    ----------
    model : RBM, or any object with ``parameters()`` (a fastlib.RBM), or a parameter dict
    v0 : array_like
        Data (batch, visible).
    uniforms : array_like
        (k, batch, hidden) draws in [0, 1).
    k : int, optional
        Checked against ``len(uniforms)``.
    dps : int or None
        None: float64; an int: exact mpmath.

    Returns
    -------
    CDResult
    """
    num = numeric_for(dps)
    with num.context():
        p = _params(model, num)
        v = _data(v0, p, num)
        u = np.asarray(uniforms, dtype=np.float64)
        H = p["weight"].shape[1]
        if u.ndim != 3 or u.shape[1:] != (v.shape[0], H):
            raise ValueError(f"uniforms must have shape (k, batch, hidden) = (k, {v.shape[0]}, "
                             f"{H}), got {u.shape}")
        if k is not None and u.shape[0] != k:
            raise ValueError(f"uniforms hold {u.shape[0]} Gibbs steps of draws but k = {k}")
        if u.shape[0] < 1:
            raise ValueError("CD-k needs k >= 1")
        ph = [_hidden(p, v, dps)]
        h = [num.asarray((ph[0] > u[0]).astype(np.float64))]
        pv = [None]
        steps = u.shape[0]
        for s in range(1, steps + 1):
            pv.append(_visible(p, h[s - 1], dps))
            ph.append(_hidden(p, pv[s], dps))
            if s < steps:
                h.append(num.asarray((ph[s] > u[s]).astype(np.float64)))
        batch = v.shape[0]
        grads = {"weight": (np.matmul(pv[-1].T, ph[-1]) - np.matmul(v.T, ph[0])) / batch,
                 "visible_bias": np.sum(pv[-1] - v, axis=0) / batch,
                 "hidden_bias": np.sum(ph[-1] - ph[0], axis=0) / batch}
        diff = (v - pv[1]).reshape(-1)
        recon = np.sum(diff * diff) / diff.size
        fe = np.sum(_free_energy_rows(p, v, dps)) / batch
    return CDResult(grads, float(recon), float(fe), ph, pv, h)


def cd_train_step(model, v0, uniforms, optimizer="SGD", state=None, lr=None, *, dps=None,
                  apply=False, **hyper):
    """One CD-k step then the optimizer's update (``reflib.optim.step``) of every parameter.

    Returns
    -------
    result : CDResult
    new_params : dict
    new_state : dict
        As ``reflib.train.train_step``.
    """
    from reflib import optim

    result = cd_step(model, v0, uniforms, dps=dps)
    params = model.parameters() if hasattr(model, "parameters") else model
    new_params, new_state = optim.step(optimizer, {n: params[n] for n in PARAMETERS},
                                       result.grads, state, lr=lr, dps=dps, **hyper)
    if apply:
        model.load_parameters(new_params)
    return result, new_params, new_state


def free_energy(model, v, dps=None):
    """F(v) = −v·b − Σ_j softplus(c_j + (vW)_j), one value per row."""
    num = numeric_for(dps)
    with num.context():
        p = _params(model, num)
        return _free_energy_rows(p, _data(v, p, num), dps)


def reconstruction_error(model, v, dps=None):
    """Mean-field reconstruction error: mean over entries of (v − σ(σ(vW + c) Wᵀ + b))²."""
    num = numeric_for(dps)
    with num.context():
        p = _params(model, num)
        data = _data(v, p, num)
        diff = (data - _visible(p, _hidden(p, data, dps), dps)).reshape(-1)
        return float(np.sum(diff * diff) / diff.size)
