"""The training loss of the compiled epochs: the loss terms of a piece's output rows, the
gradient of the batch's mean loss, and the correct count, for every loss of the op table.

The codes are optable's (``optable.losses.LOSS_CODES``); importing this module fails when the
table holds a loss code that :func:`loss_terms` has no branch for.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from fastlib.kernels.vecmath import flog, flog1p
from optable.losses import LOSS_CODES

CE, CCE, MSE = (LOSS_CODES[n] for n in ("cross_entropy", "categorical_cross_entropy", "mse"))
BCE, BCE_LOGITS = LOSS_CODES["binary_cross_entropy"], LOSS_CODES["binary_cross_entropy_with_logits"]
# the codes loss_terms branches on, in its order: every code of the table must be one
BRANCHES = (CE, CCE, MSE, BCE_LOGITS, BCE)
if set(LOSS_CODES.values()) != set(BRANCHES):
    raise ImportError(f"fastlib.kernels.batch_loss: the op table's loss codes {LOSS_CODES} are "
                      f"not the codes loss_terms branches on {BRANCHES}; add the branch")


@njit(cache=True, error_model="numpy")
def loss_terms(code, z, yi, yf, rows, dz, n_mean):
    """The float64 sum of the loss terms of the output ``z`` (rows x C) and the correct count;
    the gradient of the mean over ``n_mean`` rows into ``dz``.

    ``n_mean`` is the row count the loss averages over, which exceeds ``z``'s rows when a
    batch is cut into pieces: the pieces' summed terms divided by it (:func:`batch_mean`)
    give the batch's mean. ``rows[i]`` is the row of ``yi`` (class indices) or ``yf``
    (targets) that holds row i's target.
    """
    c = z.shape[1]
    n = z.shape[0]
    total = 0.0
    correct = 0.0
    one = z.dtype.type(1)
    if code == CE or code == CCE:
        inv_n = one / z.dtype.type(n_mean)
        for i in range(n):
            m = z[i, 0]
            arg = 0
            for j in range(1, c):
                if z[i, j] > m:
                    m = z[i, j]
                    arg = j
            s = z.dtype.type(0)
            for j in range(c):
                s += math.exp(z[i, j] - m)
            lse = m + math.log(s)
            if code == CE:
                k = yi[rows[i]]
                total += np.float64(lse - z[i, k])
                for j in range(c):
                    dz[i, j] = math.exp(z[i, j] - lse) * inv_n
                dz[i, k] -= inv_n
                if arg == k:
                    correct += 1.0
            else:
                r = rows[i]
                t_sum = z.dtype.type(0)
                t_arg = 0
                for j in range(c):
                    t = yf[r, j]
                    t_sum += t
                    total -= np.float64(t * (z[i, j] - lse))
                    if t > yf[r, t_arg]:
                        t_arg = j
                for j in range(c):
                    dz[i, j] = (math.exp(z[i, j] - lse) * t_sum - yf[r, j]) * inv_n
                if arg == t_arg:
                    correct += 1.0
        return total, correct
    if code != MSE and code != BCE_LOGITS and code != BCE:
        raise ValueError("compiled loss: unknown loss code")
    inv_m = one / z.dtype.type(n_mean * c)
    eps = np.finfo(z.dtype).eps
    for i in range(n):
        r = rows[i]
        hits = 0
        for j in range(c):
            t = yf[r, j]
            x = z[i, j]
            if code == MSE:
                d = x - t
                total += np.float64(d * d)
                dz[i, j] = 2 * d * inv_m
            elif code == BCE_LOGITS:
                # NOTE: max(z, 0) - z t + log(1 + exp(-|z|)): finite for any finite z
                total += np.float64(max(x, 0) - x * t + math.log1p(math.exp(-abs(x))))
                sig = one / (one + math.exp(-x)) if x >= 0 else math.exp(x) / (one + math.exp(x))
                dz[i, j] = (sig - t) * inv_m
                if (x > 0) == (t > 0.5):
                    hits += 1
            else:
                # NOTE: a probability that makes the term infinite (p = 0 with t > 0, p = 1
                # with t < 1) is clamped into [eps, 1 - eps], as fastlib.losses does
                if (x <= 0 and t > 0) or (x >= 1 and t < 1):
                    x = min(max(x, eps), one - eps)
                p, tv = np.float64(x), np.float64(t)
                a = tv * np.float64(flog(x)) if tv != 0 else 0.0
                b = (1.0 - tv) * np.float64(flog1p(-x)) if tv != 1 else 0.0
                total -= a + b
                if p > 0 and p < 1:
                    dz[i, j] = (p - tv) * inv_m / (p * (1.0 - p))
                else:   # the one-sided limit: only the term whose coefficient is not 0
                    dz[i, j] = ((-tv / p if tv != 0 else 0.0)
                                + ((1.0 - tv) / (1.0 - p) if tv != 1 else 0.0)) * inv_m
                if (x > 0.5) == (t > 0.5):
                    hits += 1
        if code != MSE:
            correct += hits / c
    return total, correct


@njit(cache=True, error_model="numpy")
def batch_mean(code, total, n_mean, width):
    """The batch's mean loss from its summed terms: over ``n_mean`` rows (the
    cross-entropies), or over ``n_mean`` rows of ``width`` entries."""
    if code == CE or code == CCE:
        return total / n_mean
    return total / (n_mean * width)
