"""The five losses: value and gradient in one pass over the inputs (``want_grad``).

Each kernel returns the float64 loss (a pairwise sum of per-row or per-element terms, divided by
the count) and, when asked, writes the input gradients scaled by ``gscale = grad / count``.
Forward-only calls skip the gradient arithmetic; ``fastlib.ops.value_and_vjp`` gets both from
one call (for the cross-entropies: softmax and its gradient fused, as DataCode's fused
softmax-cross-entropy).

NOTE (accuracy): terms are arranged so that no subtraction cancels.
- cross_entropy: loss_n = (max - z_t) + log(sum exp(z - max)), two non-negative terms (log1p
  of the other classes' sum when z_t is the maximum); the target's gradient entry is
  -(sum over other classes of exp) / sum, not softmax_t - 1.
- categorical_cross_entropy: sum_c t_c ((max - z_c) + log s), non-negative terms for t >= 0.
- binary_cross_entropy: -(t log p + (1 - t) log1p(-p)) with 0 log 0 = 0 (finite at p in {0, 1}
  when the target agrees); d/dp = (p - t) / (p (1 - p)) inside (0, 1).
- binary_cross_entropy_with_logits: z (1 - t) for z > 0, -z t otherwise, plus
  log1p(exp(-|z|)); d/dz = (1 - t) sigmoid(z) - t sigmoid(-z), which is sigmoid(z) - t.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from fastlib import config
from fastlib.kernels.reduce import _pairwise_sum, _row_max
from fastlib.kernels.vecmath import fexp, flog, flog1p

_FM = config.FASTMATH


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _mse(p, t, want_grad, gscale, gp, gt):
    """Sum of (p - t)^2 (float64, pairwise); gradients 2 (p - t) * gscale, and its negative."""
    n = p.size
    sq = np.empty(n)
    for i in range(n):
        d = np.float64(p[i]) - np.float64(t[i])
        sq[i] = d * d
        if want_grad:
            v = 2.0 * d * gscale
            gp[i] = v
            gt[i] = -v
    return _pairwise_sum(sq, 0, n)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _cross_entropy(z, target, want_grad, gscale, gz):
    """Sum over rows of -log_softmax(z)[n, target[n]]; gz = (softmax - onehot) * gscale."""
    n_rows, c = z.shape
    losses = np.empty(n_rows)
    e = np.empty(c, z.dtype)
    for n in range(n_rows):
        v = z[n]
        t = target[n]
        m = _row_max(v)
        for j in range(c):
            e[j] = fexp(v[j] - m)
        et = np.float64(e[t])
        e[t] = 0
        rest = _pairwise_sum(e, 0, c)       # the other classes, without cancellation
        s = rest + et
        tail = math.log1p(rest) if v[t] == m else math.log(s)
        losses[n] = (np.float64(m) - np.float64(v[t])) + tail
        if want_grad:
            scale = gscale / s
            for j in range(c):
                gz[n, j] = np.float64(e[j]) * scale
            gz[n, t] = -rest * scale
    return _pairwise_sum(losses, 0, n_rows)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _categorical_cross_entropy(z, t, want_grad, gscale, gz, gt):
    """Sum over rows of -sum_c t log_softmax(z); gz = (softmax sum(t) - t) gscale,
    gt = -log_softmax(z) gscale."""
    n_rows, c = z.shape
    losses = np.empty(n_rows)
    e = np.empty(c, z.dtype)
    terms = np.empty(c)
    for n in range(n_rows):
        v = z[n]
        tr = t[n]
        m = _row_max(v)
        for j in range(c):
            e[j] = fexp(v[j] - m)
        s = _pairwise_sum(e, 0, c)
        ls = math.log(s)
        for j in range(c):
            # -log_softmax = (max - z) + log s: two non-negative terms
            terms[j] = np.float64(tr[j]) * ((np.float64(m) - np.float64(v[j])) + ls)
        losses[n] = _pairwise_sum(terms, 0, c)
        if want_grad:
            total = _pairwise_sum(tr, 0, c)
            for j in range(c):
                p = np.float64(e[j]) / s
                gz[n, j] = (p * total - np.float64(tr[j])) * gscale
                gt[n, j] = ((np.float64(m) - np.float64(v[j])) + ls) * gscale
    return _pairwise_sum(losses, 0, n_rows)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _binary_cross_entropy(p, t, want_grad, gscale, gp, gt):
    """Sum of -(t log p + (1 - t) log(1 - p)) with 0 log 0 = 0, and its gradients.

    The logs are taken in the input's type in one vectorised pass (float32: the polynomial
    primitives, <= 2 ulp; the terms are non-negative, so the loss keeps that relative
    accuracy); the terms and gradients are combined in float64.
    """
    n = p.size
    lp = np.empty(n, p.dtype)
    lq = np.empty(n, p.dtype)
    for i in range(n):
        lp[i] = flog(p[i])
        lq[i] = flog1p(-p[i])
    terms = np.empty(n)
    for i in range(n):
        tv = np.float64(t[i])
        a = tv * np.float64(lp[i]) if tv != 0 else 0.0
        b = (1.0 - tv) * np.float64(lq[i]) if tv != 1 else 0.0
        terms[i] = -(a + b)
    if want_grad:
        for i in range(n):
            pv = np.float64(p[i])
            tv = np.float64(t[i])
            inner = (pv - tv) / (pv * (1.0 - pv))
            # at p = 0 or 1 the one-sided limits: only the term whose coefficient is not 0
            edge = (-tv / pv if tv != 0 else 0.0) + ((1.0 - tv) / (1.0 - pv) if tv != 1 else 0.0)
            gp[i] = (inner if 0 < pv < 1 else edge) * gscale
            gt[i] = (np.float64(lq[i]) - np.float64(lp[i])) * gscale
    return _pairwise_sum(terms, 0, n)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _binary_cross_entropy_with_logits(z, t, want_grad, gscale, gz, gt):
    """Sum of max(z, 0) - z t + log1p(exp(-|z|)), and its gradients (exp and log1p in the
    input's type, one vectorised pass; the rest in float64)."""
    n = z.size
    e = np.empty(n, z.dtype)
    soft = np.empty(n, z.dtype)
    for i in range(n):
        ei = fexp(-abs(z[i]))
        e[i] = ei
        soft[i] = flog1p(ei)
    terms = np.empty(n)
    for i in range(n):
        zv = np.float64(z[i])
        tv = np.float64(t[i])
        lin = zv * (1.0 - tv) if zv > 0 else -zv * tv
        terms[i] = lin + np.float64(soft[i])
    if want_grad:
        for i in range(n):
            zv = np.float64(z[i])
            tv = np.float64(t[i])
            ev = np.float64(e[i])
            big = 1.0 / (1.0 + ev)
            small = ev / (1.0 + ev)
            sig_pos = big if zv >= 0 else small
            sig_neg = small if zv >= 0 else big
            gz[i] = ((1.0 - tv) * sig_pos - tv * sig_neg) * gscale
            gt[i] = -zv * gscale
    return _pairwise_sum(terms, 0, n)


# --- launchers: (loss as a 0-d array, grads or None) ---------------------------------------

def _scalar(value, dtype):
    return np.asarray(value, dtype=dtype).reshape(())


def _buffers(x, want, count):
    """``count`` gradient buffers shaped like x, or empty stand-ins for a forward-only call."""
    return [np.empty_like(x) if want else np.empty((0,) * x.ndim, x.dtype)
            for _ in range(count)]


def mse(pred, target, grad=None):
    """mean((pred - target)^2) and, with ``grad`` (0-d), (grad_pred, grad_target)."""
    n = pred.size
    want = grad is not None
    gscale = float(grad) / n if want else 0.0
    gp, gt = _buffers(pred, want, 2)
    total = _mse(pred.reshape(-1), target.reshape(-1), want, gscale, gp.reshape(-1),
                 gt.reshape(-1))
    return _scalar(total / n, pred.dtype), ((gp, gt) if want else None)


def cross_entropy(logits, target_index, grad=None):
    """mean over rows of -log_softmax(logits)[n, target[n]]; grads (grad_logits, None)."""
    n = logits.shape[0]
    want = grad is not None
    gscale = float(grad) / n if want else 0.0
    (gz,) = _buffers(logits, want, 1)
    total = _cross_entropy(logits, target_index, want, gscale, gz)
    return _scalar(total / n, logits.dtype), ((gz, None) if want else None)


def categorical_cross_entropy(logits, target, grad=None):
    """-(1/N) sum target * log_softmax(logits); grads (grad_logits, grad_target)."""
    n = logits.shape[0]
    want = grad is not None
    gscale = float(grad) / n if want else 0.0
    gz, gt = _buffers(logits, want, 2)
    total = _categorical_cross_entropy(logits, target, want, gscale, gz, gt)
    return _scalar(total / n, logits.dtype), ((gz, gt) if want else None)


def binary_cross_entropy(p, target, grad=None):
    """mean of -(t log p + (1 - t) log(1 - p)); grads (grad_p, grad_target)."""
    n = p.size
    want = grad is not None
    gscale = float(grad) / n if want else 0.0
    gp, gt = _buffers(p, want, 2)
    total = _binary_cross_entropy(p.reshape(-1), target.reshape(-1), want, gscale,
                                  gp.reshape(-1), gt.reshape(-1))
    return _scalar(total / n, p.dtype), ((gp, gt) if want else None)


def binary_cross_entropy_with_logits(logits, target, grad=None):
    """mean of max(z, 0) - z t + log(1 + exp(-|z|)); grads (grad_logits, grad_target)."""
    n = logits.size
    want = grad is not None
    gscale = float(grad) / n if want else 0.0
    gz, gt = _buffers(logits, want, 2)
    total = _binary_cross_entropy_with_logits(logits.reshape(-1), target.reshape(-1), want,
                                              gscale, gz.reshape(-1), gt.reshape(-1))
    return _scalar(total / n, logits.dtype), ((gz, gt) if want else None)
