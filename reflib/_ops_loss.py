"""Losses: scalar (0-d) outputs, mean reductions, cotangent ``g`` 0-d. Targets follow the
contracts' formats; the cross-entropies go through log-sum-exp so finite logits never overflow."""
from __future__ import annotations

import numpy as np

from optable.checks import class_indices
from reflib._ops_common import fail, implementations, require_domain
from reflib._ops_reduce import shifted_exp


def _same_shape(op, a, b, names):
    if a.shape != b.shape:
        fail(op, f"{names[0]} and {names[1]} need the same shape; got {a.shape} and {b.shape}")
    if a.size == 0:
        fail(op, f"needs at least one element; got shape {a.shape}")


def _logits_2d(op, z):
    if z.ndim != 2 or z.shape[0] == 0 or z.shape[1] == 0:
        fail(op, f"logits must be a non-empty 2-D array (N, C); got shape {z.shape}")


def mse(F, pred, target):
    _same_shape("mse", pred, target, ("pred", "target"))
    d = pred - target
    return np.sum(d * d) / pred.size


def mse_vjp(F, pred, target, out, g):
    gp = g * 2 * (pred - target) / pred.size
    return gp, -gp


def _log_softmax_rows(F, z):
    zm, e, _ = shifted_exp(F, z, (1,))
    # log s = log1p(s - 1), s - 1 summed without the max's own exp(0) = 1: in float64,
    # log(1 + 1e-17) rounds to 0 and a dominant logit's loss of 1e-17 would be lost
    below = np.sum(np.where(zm < 0, e, 0 * e), axis=1, keepdims=True)
    ties = _ties_beyond_one(e, zm)
    return zm - F.log1p(below + ties)


def _ties_beyond_one(e, zm):
    """Σ exp(z - max) over a row's tied maxima, less the max's own 1.

    NOTE: the tied entries' exp(0) are summed as values, not counted: the count is the same
    number, but dual numbers (reflib.jvp) and the recorded second backward need each tied
    entry's own tangent, which a count of them drops.
    """
    return np.sum(np.where(zm == 0, e, 0 * e), axis=1, keepdims=True) - 1


def _softmax_minus_onehot(F, z, t):
    """softmax(z) - onehot(t) per row, the target's entry as minus the others' share (no
    1 - p cancellation at a dominant logit)."""
    n = z.shape[0]
    zm, e, _ = shifted_exp(F, z, (1,))
    below = np.sum(np.where(zm < 0, e, 0 * e), axis=1, keepdims=True)
    ties = _ties_beyond_one(e, zm)
    s = 1 + (below + ties)
    p = e / s
    rows = np.arange(n)
    at_max = zm[rows, t] == 0
    # (s - e_t) / s; at the max e_t is exactly 1, so 1 - e_t adds an exact 0 to the value and
    # only its tangent (a tied target's own) to a dual number
    others = (below[:, 0] + ties[:, 0] + (1 - e[rows, t])) / s[:, 0]
    p[rows, t] = np.where(at_max, -others, p[rows, t] - 1)
    return p


def cross_entropy(F, logits, target):
    _logits_2d("cross_entropy", logits)
    n, c = logits.shape
    t = class_indices("cross_entropy", target, n, c)
    return -np.sum(_log_softmax_rows(F, logits)[np.arange(n), t]) / n


def cross_entropy_vjp(F, logits, target, out, g):
    n, c = logits.shape
    t = class_indices("cross_entropy", target, n, c)
    return g * _softmax_minus_onehot(F, logits, t) / n, None


def categorical_cross_entropy(F, logits, target):
    _logits_2d("categorical_cross_entropy", logits)
    _same_shape("categorical_cross_entropy", logits, target, ("logits", "target"))
    return -np.sum(target * _log_softmax_rows(F, logits)) / logits.shape[0]


def categorical_cross_entropy_vjp(F, logits, target, out, g):
    # d/dz of -(1/N) sum t (z - lse(z)) = (softmax(z) * rowsum(t) - t) / N; holds for any target,
    # not only rows summing to 1, so the VJP stays exact under perturbation of the target.
    n = logits.shape[0]
    ls = _log_softmax_rows(F, logits)
    gz = g * (F.exp(ls) * np.sum(target, axis=1, keepdims=True) - target) / n
    return gz, -g * ls / n


def binary_cross_entropy(F, p, target):
    _same_shape("binary_cross_entropy", p, target, ("p", "target"))
    require_domain(F, "binary_cross_entropy", "p", p, (p > 0) & (p < 1),
                   "strictly inside (0, 1) (probabilities; for logits use "
                   "binary_cross_entropy_with_logits)")
    return -np.sum(target * F.log(p) + (1 - target) * F.log1p(-p)) / p.size


def binary_cross_entropy_vjp(F, p, target, out, g):
    n = p.size
    gp = g * (p - target) / (p * (1 - p)) / n
    gt = g * (F.log1p(-p) - F.log(p)) / n
    return gp, gt


def binary_cross_entropy_with_logits(F, logits, target):
    _same_shape("binary_cross_entropy_with_logits", logits, target, ("logits", "target"))
    z = logits
    az = np.where(z < 0, -z, z)
    # both branches on the right side at z = 0, as in softplus (reflib.jvp's slope there)
    return np.sum(np.where(z >= 0, z, 0.0) - z * target + F.log1p(F.exp(-az))) / z.size


def binary_cross_entropy_with_logits_vjp(F, logits, target, out, g):
    n = logits.size
    return g * (F.sigmoid(logits) - target) / n, -g * logits / n


# op name -> (forward, vjp), paired by name (``abs_`` / ``abs_vjp``)
OPS = implementations(globals(), (
    "mse cross_entropy categorical_cross_entropy binary_cross_entropy "
    "binary_cross_entropy_with_logits"
))
