"""The five losses: value and gradient in one pass over the inputs (``want_grad``).

Each kernel returns the float64 loss (a pairwise sum of per-row or per-element terms, divided by
the count) and, when asked, writes the input gradients scaled by ``gscale = grad / count``.
Forward-only calls skip the gradient arithmetic; ``fastlib.ops.value_and_vjp`` gets both from
one call (for the cross-entropies: softmax and its gradient fused, as DataCode's fused
softmax-cross-entropy).

The long story: docs/fastlib.md, section ``fastlib/kernels/loss.py``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from fastlib import config
from fastlib.kernels.reduce import _pairwise_sum, _row_max, dd_shifted_exp
from fastlib.kernels.vecmath import (dd_add, dd_add_d, dd_div, dd_log, dd_mul, dd_mul_d,
                                     fexp, flog, flog1p, two_sum)

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
        top = 0
        for j in range(c):
            e[j] = fexp(v[j] - m)
            if v[j] == m and v[top] != m:
                top = j
        # log s = log1p(the other entries' sum): log(1 + 1e-17) would round to 0 and lose a
        # loss of 1e-17 at a dominant logit (e[top] = exp(0) = 1 exactly)
        e[top] = 0
        rest = _pairwise_sum(e, 0, c)
        e[top] = 1
        s = rest + 1.0
        ls = math.log1p(rest)
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
def _categorical_cross_entropy_grad64(z, t, grad, count, gz, gt):
    """float64 gradients of categorical_cross_entropy in double-double, each rounded once.

    gz = (softmax(z) sum(t) - t) grad / count is written ``(e_j sum(t) - t_j S) / S`` (e = exp(z -
    max), S = sum e): its numerator is exactly ``sum_k (e_j t_k - t_j e_k)``, and with e, S and
    sum(t) in dd the cancellation of p sum(t) - t where p is near t costs nothing (the float64
    formula lost u |t_j| there: 236 ULPs on well-conditioned elements). gt = ((max - z_j) +
    log S) grad / count, log S in dd. grad / count is a dd too, so each entry rounds once.
    """
    n_rows, c = z.shape
    eh = np.empty(c)
    el = np.empty(c)
    gsh, gsl = dd_div(grad, 0.0, count, 0.0)
    for n in range(n_rows):
        v = z[n]
        tr = t[n]
        m = v[0]
        for j in range(1, c):
            m = v[j] if v[j] > m else m
        sh, sl = dd_shifted_exp(v, m, eh, el)
        tth = 0.0
        ttl = 0.0
        for j in range(c):
            tth, ttl = dd_add_d(tth, ttl, tr[j])
        lh, ll = dd_log(sh, sl)
        ih, il = dd_div(1.0, 0.0, sh, sl)
        for j in range(c):
            wh, wl = dd_mul(eh[j], el[j], tth, ttl)
            ph, pl = dd_mul_d(sh, sl, tr[j])
            wh, wl = dd_add(wh, wl, -ph, -pl)
            wh, wl = dd_mul(wh, wl, ih, il)
            gz[n, j] = dd_mul(wh, wl, gsh, gsl)[0]
            dh, dl = two_sum(m, -v[j])
            dh, dl = dd_add(dh, dl, lh, ll)
            gt[n, j] = dd_mul(dh, dl, gsh, gsl)[0]


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _binary_cross_entropy(p, t, want_grad, gscale, gp, gt):
    """Sum of -(t log p + (1 - t) log(1 - p)) with 0 log 0 = 0, and its gradients.

    The logs are taken in the input's type in one vectorised pass (float32: the polynomial
    primitives, <= 2 ulp; the terms are non-negative, so the loss keeps that relative
    accuracy); the terms and gradients are combined in float64, in one pass:
    gp = (p - t) gscale / (p (1 - p)) (one division), gt = (log(1 - p) - log p) gscale.
    p = 0 or 1 (where that quotient is 0/0 or +-inf) are counted and fixed afterwards with the
    one-sided limits, so the main loop has no second division and no branch.
    """
    n = p.size
    lp = np.empty(n, p.dtype)
    lq = np.empty(n, p.dtype)
    for i in range(n):
        lp[i] = flog(p[i])
        lq[i] = flog1p(-p[i])
    terms = np.empty(n)
    if not want_grad:
        for i in range(n):
            tv = np.float64(t[i])
            a = tv * np.float64(lp[i]) if tv != 0 else 0.0
            b = (1.0 - tv) * np.float64(lq[i]) if tv != 1 else 0.0
            terms[i] = -(a + b)
        return _pairwise_sum(terms, 0, n)
    edges = 0
    for i in range(n):
        pv = np.float64(p[i])
        tv = np.float64(t[i])
        lpv = np.float64(lp[i])
        lqv = np.float64(lq[i])
        a = tv * lpv if tv != 0 else 0.0
        b = (1.0 - tv) * lqv if tv != 1 else 0.0
        terms[i] = -(a + b)
        gp[i] = (pv - tv) * gscale / (pv * (1.0 - pv))
        gt[i] = (lqv - lpv) * gscale
        edges += 0 if (pv > 0 and pv < 1) else 1
    if edges:
        # at p = 0 or 1 the one-sided limits: only the term whose coefficient is not 0
        for i in range(n):
            pv = np.float64(p[i])
            if not (pv > 0 and pv < 1):
                tv = np.float64(t[i])
                edge = ((-tv / pv if tv != 0 else 0.0)
                        + ((1.0 - tv) / (1.0 - pv) if tv != 1 else 0.0))
                gp[i] = edge * gscale
    return _pairwise_sum(terms, 0, n)


_F32 = np.float32
# log1p(e) / e on [0, 1]: its degree-9 Chebyshev interpolant (at 40 digits), in powers of e.
(_L1P_0, _L1P_1, _L1P_2, _L1P_3, _L1P_4, _L1P_5, _L1P_6, _L1P_7, _L1P_8, _L1P_9) = (
    _F32(c) for c in (0.9999999946562932, -0.4999989264807806, 0.3332971049921383,
                      -0.24951616265250073, 0.1966327426707285, -0.152696670978104,
                      0.10543623828468754, -0.056373613102277884, 0.019542527381418043,
                      -0.0031760570404003375))


def _log1p_unit(e):
    """log(1 + e) for 0 <= e <= 1 (e = exp(-|z|)), in e's type."""
    return math.log1p(e)


@njit(cache=True, error_model="numpy", fastmath=_FM, inline="always")
def _log1p_unit32(e):
    # log1p(e) = e h(e), h = log1p(e) / e analytic on [0, 1] (nearest singularity at -1): its
    # degree-9 Chebyshev interpolant, error below 5.4e-9 relative; ten float32 multiply-adds
    # and no division (the general log1p's reduction, a division and selects cost twice as
    # much). Within 1.8 ulp of log1p on [0, 1] (tests/test_accuracy_bar_losses.py): the
    # terms of the loss are non-negative, so the loss keeps that relative accuracy.
    return e * (_L1P_0 + e * (_L1P_1 + e * (_L1P_2 + e * (_L1P_3 + e * (_L1P_4 + e * (
        _L1P_5 + e * (_L1P_6 + e * (_L1P_7 + e * (_L1P_8 + e * _L1P_9)))))))))


@overload(_log1p_unit, inline="always")
def _log1p_unit_overload(e):
    if e == types.float32:
        return lambda e: _log1p_unit32(e)
    if e == types.float64:
        return lambda e: math.log1p(e)
    return None


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _binary_cross_entropy_with_logits(z, t, want_grad, gscale, gz, gt):
    """Sum of max(z, 0) - z t + log1p(exp(-|z|)), and its gradients.

    exp in the input's type in one vectorised pass; then one pass in float64 for the terms
    (log1p(e) in the input's type, ``_log1p_unit``) and the gradients
    gz = ((1 - t) sigmoid(z) - t sigmoid(-z)) gscale (the pair from one division) and
    gt = -z gscale.
    """
    n = z.size
    e = np.empty(n, z.dtype)
    for i in range(n):
        e[i] = fexp(-abs(z[i]))
    terms = np.empty(n)
    if not want_grad:
        for i in range(n):
            zv = np.float64(z[i])
            tv = np.float64(t[i])
            lin = zv * (1.0 - tv) if zv > 0 else -zv * tv
            terms[i] = lin + np.float64(_log1p_unit(e[i]))
        return _pairwise_sum(terms, 0, n)
    for i in range(n):
        ei = e[i]
        zv = np.float64(z[i])
        tv = np.float64(t[i])
        lin = zv * (1.0 - tv) if zv > 0 else -zv * tv
        terms[i] = lin + np.float64(_log1p_unit(ei))
        ev = np.float64(ei)
        big = 1.0 / (1.0 + ev)                 # sigmoid(|z|); sigmoid(-|z|) = e sigmoid(|z|)
        small = ev * big
        sig_pos = big if zv >= 0 else small
        sig_neg = small if zv >= 0 else big
        gz[i] = ((1.0 - tv) * sig_pos - tv * sig_neg) * gscale
        gt[i] = -zv * gscale
    return _pairwise_sum(terms, 0, n)


# --- launchers: (loss as a 0-d array, grads or None) ---------------------------------------

def _scalar(value, dtype):
    return np.array(value, dtype=dtype)        # 0-d


# stand-ins for the gradient buffers of a forward-only call (never written)
_NO_BUFS = {np.dtype(np.float32): np.empty(0, np.float32),
            np.dtype(np.float64): np.empty(0, np.float64)}


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
    if want and logits.dtype == np.float64:
        # the loss as the forward computes it (bit for bit), the gradients in dd
        total = _categorical_cross_entropy(logits, target, False, 0.0, gz, gt)
        _categorical_cross_entropy_grad64(logits, target, float(grad), float(n), gz, gt)
    else:
        total = _categorical_cross_entropy(logits, target, want, gscale, gz, gt)
    return _scalar(total / n, logits.dtype), ((gz, gt) if want else None)


def binary_cross_entropy(p, target, grad=None):
    """mean of -(t log p + (1 - t) log(1 - p)); grads (grad_p, grad_target)."""
    n = p.size
    if grad is None:
        nb = _NO_BUFS[p.dtype]
        total = _binary_cross_entropy(p.reshape(-1), target.reshape(-1), False, 0.0, nb, nb)
        return _scalar(total / n, p.dtype), None
    # NOTE: lean on purpose (two buffers, no list): at 256x10 the Python around the kernel
    # is a third of the call.
    gp = np.empty_like(p)
    gt = np.empty_like(p)
    total = _binary_cross_entropy(p.reshape(-1), target.reshape(-1), True, float(grad) / n,
                                  gp.reshape(-1), gt.reshape(-1))
    return _scalar(total / n, p.dtype), (gp, gt)


def binary_cross_entropy_with_logits(logits, target, grad=None):
    """mean of max(z, 0) - z t + log(1 + exp(-|z|)); grads (grad_logits, grad_target)."""
    n = logits.size
    if grad is None:
        nb = _NO_BUFS[logits.dtype]
        total = _binary_cross_entropy_with_logits(logits.reshape(-1), target.reshape(-1), False,
                                                  0.0, nb, nb)
        return _scalar(total / n, logits.dtype), None
    gz = np.empty_like(logits)
    gt = np.empty_like(logits)
    total = _binary_cross_entropy_with_logits(logits.reshape(-1), target.reshape(-1), True,
                                              float(grad) / n, gz.reshape(-1), gt.reshape(-1))
    return _scalar(total / n, logits.dtype), (gz, gt)
