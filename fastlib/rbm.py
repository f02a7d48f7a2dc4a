"""Restricted Boltzmann machine and contrastive divergence (CD-k), SINGA's kCD, fast.

``RBM(visible, hidden)`` holds ``weight (visible, hidden)``, ``visible_bias (visible,)`` and
``hidden_bias (hidden,)``; called on data it gives p(h = 1 | v) = σ(v W + c), so a trained RBM
can feed a ``Sequential`` as a feature layer. ``fastlib.train(rbm, x, None, ...,
algorithm="cd", cd_k=1)`` trains it on unlabeled data, any optimizer updating the parameters.

The long story: docs/fastlib-training.md, section ``fastlib/rbm.py``.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from fastlib.kernels import dense as dense_kernels
from fastlib.kernels import rbm as kernels
from fastlib.layers import config as layer_config
from fastlib.layers.activations import ACTIVATIONS, LEAKY_SLOPE
from fastlib.layers.base import PROBABILITIES, Layer, set_sizes
from fastlib.training.algorithms import BatchResult, EpochStats, register_algorithm
from fastlib.training.clipping import clip_gradients
from optable.parameters import RBM_INIT_STD

__all__ = ["RBM", "CDResult", "cd_gradients", "draw_uniforms", "cd_train_one_batch"]

_SIGMOID = ACTIVATIONS["sigmoid"]
# the initial draw (N(0, 0.01²) weights, zero biases, as reflib.rbm.RBM, so the same seed gives
# both engines the same initial parameters) is the RBM kind's declaration in optable.parameters
INIT_STD = RBM_INIT_STD


class RBM(Layer):
    """Binary restricted Boltzmann machine.

    Parameters
    ----------
    visible, hidden : int
        Numbers of visible and hidden units.
    dtype : float32 (default) or float64
    seed : int or numpy.random.Generator, optional
        Initialisation (None: seed 0): weight N(0, 0.01²), zero biases.
    rng : numpy.random.Generator, optional

    Attributes
    ----------
    history : dict
        ``reconstruction_error`` and ``free_energy`` per epoch of ``train(algorithm="cd")``.

    Examples
    --------
    >>> rbm = RBM(64, 32, seed=0)
    >>> sorted(rbm.parameters())
    ['hidden_bias', 'visible_bias', 'weight']
    """

    _in_attr, _out_attr = "visible", "hidden"
    _label_attrs = ("visible", "hidden")
    output_range = PROBABILITIES     # the hidden units' sigmoid
    _input_rank, _feature_name = 2, "visible units"

    def __init__(self, visible, hidden, *, dtype=np.float32, seed=None, rng=None):
        super().__init__(dtype)
        set_sizes(self, visible=visible, hidden=hidden)
        self.hist_post = None
        self.history = {"reconstruction_error": [], "free_energy": []}
        self.reset_parameters(seed, rng)

    def get_config(self):
        return {"type": "RBM", "visible": self.visible, "hidden": self.hidden}

    # -- the two conditionals ------------------------------------------------------------------
    def _affine_sigmoid(self, x, weight, bias):
        pre = np.dot(x, weight)
        post = np.empty_like(pre)
        dense_kernels.bias_activation(pre, bias, post, _SIGMOID, LEAKY_SLOPE)
        return pre, post

    def hidden_probabilities(self, v):
        """p(h = 1 | v) = σ(v W + c) for a batch ``v`` (batch, visible)."""
        return self._affine_sigmoid(np.asarray(v, dtype=self.dtype), self._params["weight"],
                                    self._params["hidden_bias"])[1]

    def visible_probabilities(self, h):
        """p(v = 1 | h) = σ(h Wᵀ + b) for a batch ``h`` (batch, hidden)."""
        return self._affine_sigmoid(np.asarray(h, dtype=self.dtype),
                                    self._params["weight"].T, self._params["visible_bias"])[1]

    def free_energy(self, v):
        """F(v) = −v·b − Σ_j softplus(c_j + (vW)_j) per row (float64)."""
        v = self.check_input(v)
        pre, _ = self._affine_sigmoid(v, self._params["weight"], self._params["hidden_bias"])
        out = np.empty(v.shape[0], dtype=np.float64)
        kernels.free_energy_rows(v, pre, self._params["visible_bias"], out)
        return out

    def reconstruction_error(self, v):
        """Mean-field reconstruction error mean((v − σ(σ(vW + c) Wᵀ + b))²) (float64)."""
        v = self.check_input(v)
        recon = self.visible_probabilities(self.hidden_probabilities(v))
        return float(kernels.mean_squared_difference(v.reshape(-1), recon.reshape(-1)))

    # -- the layer protocol: p(h | v) as a sigmoid feature layer -------------------------------
    def forward(self, x):
        pre, post = self._affine_sigmoid(x, self._params["weight"], self._params["hidden_bias"])
        self.hist_in, self.hist_pre, self.hist_post = x, pre, post
        return post

    def backward(self, grad_out, need_input_grad=True):
        x = self._history("hist_in")
        g = np.ascontiguousarray(grad_out, dtype=self.dtype)
        gpre = np.empty_like(g)
        gc = np.empty(self.hidden, dtype=self.dtype)
        dense_kernels.activation_backward(g, self.hist_pre, self.hist_post, gpre, gc, _SIGMOID,
                                          LEAKY_SLOPE)
        grads = {"weight": np.dot(x.T, gpre), "visible_bias": np.zeros(self.visible, self.dtype),
                 "hidden_bias": gc}
        return (np.dot(gpre, self._params["weight"].T) if need_input_grad else None), grads


# fastlib.load / from_config rebuild an RBM once this module is imported.
layer_config.LAYER_TYPES.setdefault("RBM", RBM)


class CDResult(NamedTuple):
    """One CD-k step: the gradient to descend, the metrics, and the uniforms used."""

    grads: dict                   # keyed like rbm.parameters()
    reconstruction_error: float   # mean (v_0 − pv_1)² over entries
    free_energy: float            # mean F(v_0) over the batch
    uniforms: np.ndarray          # (k, batch, hidden) float64


def _check_k(k):
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"cd_k must be an int >= 1 (Gibbs steps; SINGA's default is 1), got "
                         f"{k!r}")
    return int(k)


def draw_uniforms(rng, k, batch, hidden):
    """The (k, batch, hidden) float64 uniforms of one CD-k step, from Generator ``rng``."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}; use "
                        "numpy.random.default_rng(seed)")
    return rng.random((k, batch, hidden))


def _check_data(v, owner="cd_gradients"):
    lo, hi = float(v.min()), float(v.max())
    if lo < 0 or hi > 1:
        raise ValueError(f"{owner}: RBM data must lie in [0, 1] (binary or probabilities); got "
                         f"values in [{lo}, {hi}]; scale the data first")


def cd_gradients(rbm, v0, k=1, rng=None, uniforms=None):
    """One CD-k gradient of ``rbm`` on the batch ``v0`` (the parameters are not changed).

    Parameters
    ----------
    rbm : RBM
    v0 : array_like
        (batch, visible) data in [0, 1].
    k : int, default 1
        Gibbs steps (SINGA's ``cd_k``).
    rng : numpy.random.Generator, optional
        Source of the uniforms when ``uniforms`` is not given.
    uniforms : array_like, optional
        (k, batch, hidden) draws in [0, 1) to replay a chain.

    Returns
    -------
    CDResult
    """
    if not isinstance(rbm, RBM):
        raise TypeError(f"cd_gradients needs a fastlib RBM, got {type(rbm).__name__}")
    k = _check_k(k)
    v = rbm.check_input(v0)
    _check_data(v)
    if uniforms is None:
        if rng is None:
            raise ValueError("cd_gradients needs rng= (a numpy.random.Generator) or uniforms= "
                             "to sample the hidden states; randomness is always explicit")
        u = draw_uniforms(rng, k, v.shape[0], rbm.hidden)
    else:
        u = np.asarray(uniforms, dtype=np.float64)
        if u.shape != (k, v.shape[0], rbm.hidden):
            raise ValueError(f"uniforms must have shape (k, batch, hidden) = "
                             f"{(k, v.shape[0], rbm.hidden)}, got {u.shape}")
        if not np.all((u >= 0) & (u < 1)):
            raise ValueError("uniforms must lie in [0, 1)")
        u = np.ascontiguousarray(u)
    return _cd(rbm, v, u)


def _cd(rbm, v0, u):
    """The chain and the gradient on validated arrays (``u`` float64 (k, B, H))."""
    p = rbm._params
    W, Wt = p["weight"], p["weight"].T
    pre0, ph0 = rbm._affine_sigmoid(v0, W, p["hidden_bias"])
    h = np.empty_like(ph0)
    kernels.sample_bernoulli(ph0.reshape(-1), u[0].reshape(-1), h.reshape(-1))
    steps = u.shape[0]
    pv1 = None
    for s in range(1, steps + 1):
        _, pv = rbm._affine_sigmoid(h, Wt, p["visible_bias"])
        _, ph = rbm._affine_sigmoid(pv, W, p["hidden_bias"])
        if pv1 is None:
            pv1 = pv
        if s < steps:
            kernels.sample_bernoulli(ph.reshape(-1), u[s].reshape(-1), h.reshape(-1))
    batch = v0.shape[0]
    gW = np.dot(pv.T, ph)
    gW -= np.dot(v0.T, ph0)
    gW /= rbm.dtype.type(batch)
    gb = np.empty(rbm.visible, dtype=rbm.dtype)
    gc = np.empty(rbm.hidden, dtype=rbm.dtype)
    kernels.mean_difference_columns(pv, v0, gb)
    kernels.mean_difference_columns(ph, ph0, gc)
    recon = kernels.mean_squared_difference(v0.reshape(-1), pv1.reshape(-1))
    fe = np.empty(batch, dtype=np.float64)
    kernels.free_energy_rows(v0, pre0, p["visible_bias"], fe)
    grads = {"weight": gW, "visible_bias": gb, "hidden_bias": gc}
    return CDResult(grads, float(recon), float(fe.mean()), u)


# ---------------------------------------------------------------------------------------------
# train(..., algorithm="cd")

def _cd_k(ctx):
    k = ctx.scratch.get("cd_k")
    if k is None:
        extra = dict(ctx.config.extra)
        unknown = [key for key in extra if key != "cd_k"]
        if unknown:
            raise ValueError(f"train(algorithm='cd'): unknown option {unknown[0]!r}; the only "
                             "option is cd_k (Gibbs steps, default 1)")
        if not isinstance(ctx.model, RBM):
            raise TypeError(f"algorithm='cd' trains a fastlib.RBM, got "
                            f"{type(ctx.model).__name__}")
        k = ctx.scratch["cd_k"] = _check_k(extra.get("cd_k", 1))
    return k


def _cd_batch(ctx, x):
    rbm = ctx.model
    _check_data(x, "train(algorithm='cd')")
    k = _cd_k(ctx)
    res = _cd(rbm, x, draw_uniforms(ctx.rng, k, x.shape[0], rbm.hidden))
    if not math.isfinite(res.reconstruction_error):
        return BatchResult(res.reconstruction_error, None, False), res
    grads = res.grads
    info = clip_gradients(grads, ctx.config.gradient_clip, ctx.config.clip_mode)
    if not info.finite:
        return BatchResult(res.reconstruction_error, None, True), res
    ctx.opt_state = ctx.optimizer.update(ctx.params, grads, ctx.opt_state, lr=ctx.lr)
    return BatchResult(res.reconstruction_error, None, False), res


def cd_train_one_batch(ctx, x, y=None):
    """One CD-k step on batch ``x`` (``y`` is ignored): gradient, clipping, optimizer update.

    The loss reported is the chain's reconstruction error (before the update).
    """
    return _cd_batch(ctx, x)[0]


def _cd_run_epoch(ctx, x, y, order):
    """The epoch as the loop runs it, batch by batch, also averaging the free energy."""
    _cd_k(ctx)
    stats = EpochStats()
    stats.correct = None
    bs, n = ctx.config.batch_size, x.shape[0]
    fe_sum = 0.0
    for b, start in enumerate(range(0, n, bs)):
        xb = x[start:start + bs] if order is None else x[order[start:start + bs]]
        result, cd = _cd_batch(ctx, xb)
        ctx.step += 1
        if not math.isfinite(result.loss):
            stats.diverged_batch, stats.diverged_loss = b, float(result.loss)
            return stats
        stats.add(result, xb.shape[0])
        fe_sum += cd.free_energy * xb.shape[0]
    recon_hist = ctx.state.setdefault("cd_reconstruction_error", [])
    fe_hist = ctx.state.setdefault("cd_free_energy", [])
    recon_hist.append(stats.loss)
    fe_hist.append(fe_sum / n)
    ctx.model.history = {"reconstruction_error": list(recon_hist), "free_energy": list(fe_hist)}
    return stats


def cd_evaluate(model, x, y, loss_type):
    """Validation for CD: (mean-field reconstruction error, None); ``y`` is ignored."""
    return model.reconstruction_error(x), None


register_algorithm("cd", cd_train_one_batch, needs_targets=False, evaluate=cd_evaluate,
                   run_epoch=_cd_run_epoch, overwrite=True, options=("cd_k",))
