"""The five losses on the device: forward (a 0-d array) and VJP.

Forward: a kernel writes one float64 term per element (mse, the two binary cross-entropies) or
per row (cross_entropy, categorical_cross_entropy, through the row log-sum-exp), then the block
tree reduction of :mod:`.reduce` sums the terms in float64 and divides by N. VJP: one kernel
writes each input's cotangent, ``grad / N`` times the local derivative.

The long story: docs/fastlib.md, section ``fastlib/cuda/loss.py``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64

import optable

from . import config, device
from .device import kernel, signatures
from .norm import row_max_sum
from .reduce import block_sum, reduce_device
from .scalar import sigmoid_f

_RB = config.REDUCE_BLOCK

# the elementwise losses' codes: the op table's
ELEMENTWISE = {n: optable.OPS[n].code for n in (
    "mse", "binary_cross_entropy", "binary_cross_entropy_with_logits")}
MSE, BCE, BCE_LOGITS = ELEMENTWISE.values()


# ---------------------------------------------------------------------------------------------
# elementwise losses

def _terms_body(p, t, out, mode):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < p.shape[0]:
        x = float64(p[i])
        y = float64(t[i])
        if mode == MSE:
            out[i] = (x - y) * (x - y)
        elif mode == BCE:
            out[i] = -(y * math.log(x) + (1.0 - y) * math.log1p(-x))
        else:
            out[i] = max(x, 0.0) - x * y + math.log1p(math.exp(-abs(x)))
        i += step


def _terms_vjp_body(p, t, gp, gt, mode, s):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < p.shape[0]:
        x = float64(p[i])
        y = float64(t[i])
        if mode == MSE:
            d = 2.0 * s * (x - y)
            gp[i] = d
            gt[i] = -d
        elif mode == BCE:
            gp[i] = s * (x - y) / (x * (1.0 - x))
            gt[i] = s * (math.log1p(-x) - math.log(x))
        else:
            gp[i] = s * (sigmoid_f(x) - y)
            gt[i] = -s * x
        i += step


_terms = kernel(*signatures("void({t}[::1], {t}[::1], float64[::1], int64)"))(_terms_body)
_terms_vjp = kernel(*signatures("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, float64)"))(
    _terms_vjp_body)


def _mean_of(d_terms, count, dtype):
    """0-d host array: the float64 sum of the terms divided by count, rounded once to ``dtype``."""
    d_total = reduce_device(d_terms, (d_terms.shape[0],), (0,), divisor=float(count))
    return device.get(d_total, ()).astype(dtype)


def elementwise_loss_forward(name, p, t):
    """Host function: mse / binary_cross_entropy / ..._with_logits of equal-shape ``p``, ``t``."""
    d_terms = device.empty(p.size, np.float64)
    _terms[device.grid_1d(p.size)](device.put(p), device.put(t), d_terms,
                                   ELEMENTWISE[name])
    return _mean_of(d_terms, p.size, p.dtype)


def elementwise_loss_vjp(name, p, t, grad):
    """Host function: (cotangent of p, cotangent of t) for the 0-d cotangent ``grad``."""
    d_gp, d_gt = device.empty(p.size, p.dtype), device.empty(p.size, p.dtype)
    s = float(grad) / p.size
    _terms_vjp[device.grid_1d(p.size)](device.put(p), device.put(t), d_gp, d_gt,
                                       ELEMENTWISE[name], s)
    return device.get(d_gp, p.shape), device.get(d_gt, p.shape)


# ---------------------------------------------------------------------------------------------
# row losses: cross_entropy (class indices) and categorical_cross_entropy (distributions)

@cuda.jit(device=True)
def _row_rest(shared, z, base, c, m):
    """sum exp(z - m) over the row but for one of its maxima (whose term is exp(0) = 1): the
    part of s = 1 + rest that log1p needs, since log(1 + 1e-17) rounds to 0 and would lose a
    cross-entropy of 1e-17 at a dominant logit."""
    below = 0.0
    ties = 0.0
    r = cuda.threadIdx.x
    while r < c:
        v = float64(z[base + r])
        if v < m:
            below += math.exp(v - m)
        else:
            ties += 1.0
        r += cuda.blockDim.x
    below = block_sum(shared, below)
    return below + (block_sum(shared, ties) - 1.0)


def _ce_body(z, target, out, rows, c):
    shared = cuda.shared.array(_RB, float64)
    row = cuda.blockIdx.x
    while row < rows:
        m, total = row_max_sum(shared, z, row * c, c, 1)
        rest = _row_rest(shared, z, row * c, c, m)
        if cuda.threadIdx.x == 0:
            # (m - z_t) + log(s): both terms >= 0, no cancellation against a rounded lse
            out[row] = (m - float64(z[row * c + target[row]])) + math.log1p(rest)
        row += cuda.gridDim.x


def _ce_vjp_body(z, target, gz, rows, c, s):
    shared = cuda.shared.array(_RB, float64)
    row = cuda.blockIdx.x
    while row < rows:
        base = row * c
        m, total = row_max_sum(shared, z, base, c, 1)
        rest = _row_rest(shared, z, base, c, m)
        total = 1.0 + rest
        r = cuda.threadIdx.x
        while r < c:
            y = math.exp(float64(z[base + r]) - m) / total  # softmax (fastlib.cuda.norm NOTE)
            if r == target[row]:
                # p_t - 1 = -(the others' share): at a maximum, -rest / s without cancelling
                y = -rest / total if float64(z[base + r]) == m else y - 1.0
            gz[base + r] = s * y
            r += cuda.blockDim.x
        row += cuda.gridDim.x


def _cce_body(z, t, out, rows, c):
    shared = cuda.shared.array(_RB, float64)
    row = cuda.blockIdx.x
    while row < rows:
        base = row * c
        m, total = row_max_sum(shared, z, base, c, 1)
        log_s = math.log1p(_row_rest(shared, z, base, c, m))
        acc = 0.0
        r = cuda.threadIdx.x
        while r < c:
            acc += float64(t[base + r]) * ((m - float64(z[base + r])) + log_s)
            r += cuda.blockDim.x
        total = block_sum(shared, acc)
        if cuda.threadIdx.x == 0:
            out[row] = total
        row += cuda.gridDim.x


def _cce_vjp_body(z, t, gz, gt, rows, c, s):
    shared = cuda.shared.array(_RB, float64)
    row = cuda.blockIdx.x
    while row < rows:
        base = row * c
        m, total = row_max_sum(shared, z, base, c, 1)
        rest = _row_rest(shared, z, base, c, m)
        total = 1.0 + rest
        log_s = math.log1p(rest)
        acc = 0.0
        r = cuda.threadIdx.x
        while r < c:
            acc += float64(t[base + r])
            r += cuda.blockDim.x
        mass = block_sum(shared, acc)  # sum_c t_c: 1 for a distribution, kept general
        r = cuda.threadIdx.x
        while r < c:
            shifted = float64(z[base + r]) - m
            log_p = shifted - log_s
            gz[base + r] = s * (math.exp(shifted) / total * mass - float64(t[base + r]))
            gt[base + r] = -s * log_p
            r += cuda.blockDim.x
        row += cuda.gridDim.x


_ce = kernel(*signatures("void({t}[::1], int64[::1], float64[::1], int64, int64)"))(_ce_body)
_ce_vjp = kernel(*signatures("void({t}[::1], int64[::1], {t}[::1], int64, int64, float64)"))(
    _ce_vjp_body)
_cce = kernel(*signatures("void({t}[::1], {t}[::1], float64[::1], int64, int64)"))(_cce_body)
_cce_vjp = kernel(*signatures("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, float64)"))(
    _cce_vjp_body)


def _row_launch(rows, c):
    return max(1, min(config.MAX_GRID, rows)), device.reduce_block(c)


def cross_entropy_forward(logits, index):
    """Host function: mean over rows of -log_softmax(logits)[n, index[n]] (``index`` int64)."""
    rows, c = logits.shape
    d_terms = device.empty(rows, np.float64)
    _ce[_row_launch(rows, c)](device.put(logits), device.put(index), d_terms, rows, c)
    return _mean_of(d_terms, rows, logits.dtype)


def cross_entropy_vjp(logits, index, grad):
    """Host function: ((softmax - onehot) * grad / N, None): the indices are not differentiable."""
    rows, c = logits.shape
    d_gz = device.empty(logits.size, logits.dtype)
    _ce_vjp[_row_launch(rows, c)](device.put(logits), device.put(index), d_gz, rows,
                                  c, float(grad) / rows)
    return device.get(d_gz, logits.shape), None


def categorical_cross_entropy_forward(logits, target):
    """Host function: -(1/N) sum target * log_softmax(logits), N the number of rows."""
    rows, c = logits.shape
    d_terms = device.empty(rows, np.float64)
    _cce[_row_launch(rows, c)](device.put(logits), device.put(target), d_terms,
                               rows, c)
    return _mean_of(d_terms, rows, logits.dtype)


def categorical_cross_entropy_vjp(logits, target, grad):
    """Host function: cotangents of the logits and of the (differentiable) target."""
    rows, c = logits.shape
    d_gz, d_gt = device.empty(logits.size, logits.dtype), device.empty(logits.size, logits.dtype)
    _cce_vjp[_row_launch(rows, c)](device.put(logits), device.put(target), d_gz,
                                   d_gt, rows, c, float(grad) / rows)
    return device.get(d_gz, logits.shape), device.get(d_gt, target.shape)
