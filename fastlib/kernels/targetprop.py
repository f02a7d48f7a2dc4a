"""Kernels of Target Propagation: the normalised route, link budgets, momentum, attention route.

Private kernels on plain C-contiguous arrays of one float dtype; ``fastlib.targetprop``
validates, allocates and is the only caller. The rules are spec.targetprop's.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from fastlib.config import FASTMATH
from fastlib.kernels.vecmath import fexp

_FASTMATH = set(FASTMATH)  # numba takes a set (config holds a frozenset)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def route_scales(W, threshold, scales):
    """``scales[i] = 1 / Σ_j |W[i, j]|`` where that sum exceeds ``threshold``, else 0.

    NOTE: the sum is accumulated and compared in float64 (the threshold is a float64), so the
    gate of a row does not depend on the weights' dtype beyond their own rounding.
    """
    rows, cols = W.shape
    for i in range(rows):
        total = 0.0
        for j in range(cols):
            total += abs(np.float64(W[i, j]))
        scales[i] = 1.0 / total if total > threshold else 0.0


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def scale_columns(num, scales, out):
    """``out[r, i] = num[r, i] * scales[i]`` (scales in float64, rounded once to the dtype)."""
    rows, cols = num.shape
    for r in range(rows):
        for i in range(cols):
            out[r, i] = num[r, i] * scales[i]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def budget_and_gap(actual, target):
    """``((cos + 1) / 2, RMS(actual − target))`` of two flat arrays, in float64.

    NOTE: the budget is 0 when either norm is 0, and clamped to [0, 1] (rounding can take the
    cosine of parallel vectors a hair past ±1; the exact value never leaves [-1, 1]).
    """
    dot = 0.0
    na = 0.0
    nt = 0.0
    sq = 0.0
    for i in range(actual.size):
        a = np.float64(actual[i])
        t = np.float64(target[i])
        dot += a * t
        na += a * a
        nt += t * t
        sq += (a - t) * (a - t)
    gap = np.sqrt(sq / actual.size)
    if na == 0.0 or nt == 0.0:
        return 0.0, gap
    budget = (dot / (np.sqrt(na) * np.sqrt(nt)) + 1.0) / 2.0
    return min(1.0, max(0.0, budget)), gap


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def momentum_step(w, vel, grad, coef, mu):
    """``vel = mu·vel + (1 − mu)·(coef·grad)``; ``w += vel`` (flat arrays, updated in place).

    ``coef`` is the layer rate divided by the batch size: ``coef·grad`` is rate·d_θ with
    d_θ = J_θᵀ(t − y)/B.
    """
    m = w.dtype.type(mu)
    one_minus = w.dtype.type(1.0 - mu)
    c = w.dtype.type(coef)
    for i in range(w.size):
        v = m * vel[i] + one_minus * (c * grad[i])
        vel[i] = v
        w[i] += v


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def attention_value_route(q, k, lse, dA, heads, scale, causal, threshold, column, dV):
    """δV of the pure attention target, per (batch, head).

    Row normalisation (``column`` False): ``δV[s] = Σ_t P[t,s] δA[t] / Σ_t P[t,s]`` where that
    sum over queries exceeds ``threshold``, else 0. Column normalisation (``column`` True):
    ``δV[s] = Σ_t P[t,s] δA[t] / Σ_s' P[t,s']``, leaving out the queries whose sum does not
    exceed ``threshold`` (each sum is 1 up to rounding).

    P is recomputed from the forward's log-sum-exp (``P[t,s] = exp(q_t·k_s·scale − lse[t])``,
    0 for masked keys), as the attention backward does.
    """
    batch, steps, d = q.shape
    dh = d // heads
    p = np.empty((steps, steps), dtype=np.float64)
    for b in range(batch):
        for h in range(heads):
            start = h * dh
            for t in range(steps):
                last = t + 1 if causal else steps
                for s in range(steps):
                    if s < last:
                        dot = 0.0
                        for j in range(dh):
                            dot += np.float64(q[b, t, start + j]) * np.float64(k[b, s, start + j])
                        p[t, s] = fexp(dot * scale - np.float64(lse[b, h, t]))
                    else:
                        p[t, s] = 0.0
            if column:
                for t in range(steps):
                    row = 0.0
                    for s in range(steps):
                        row += p[t, s]
                    inv = 1.0 / row if row > threshold else 0.0
                    for s in range(steps):
                        p[t, s] *= inv
                for s in range(steps):
                    for j in range(dh):
                        acc = 0.0
                        for t in range(steps):
                            acc += p[t, s] * np.float64(dA[b, t, start + j])
                        dV[b, s, start + j] = acc
                continue
            for s in range(steps):
                col = 0.0
                for t in range(steps):
                    col += p[t, s]
                for j in range(dh):
                    if col > threshold:
                        acc = 0.0
                        for t in range(steps):
                            acc += p[t, s] * np.float64(dA[b, t, start + j])
                        dV[b, s, start + j] = acc / col
                    else:
                        dV[b, s, start + j] = 0.0
