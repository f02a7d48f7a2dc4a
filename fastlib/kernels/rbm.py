"""Kernels of the RBM and contrastive divergence: Bernoulli sampling and the free energy.

Private kernels on plain C-contiguous arrays; ``fastlib.rbm`` validates, allocates and is the
only caller. The affine-plus-sigmoid passes reuse ``fastlib.kernels.dense.bias_activation``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from fastlib.config import FASTMATH
from fastlib.kernels import scalar

_FASTMATH = set(FASTMATH)  # numba takes a set (config holds a frozenset)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def sample_bernoulli(p, u, out):
    """``out = 1 if u < p else 0`` elementwise (flat arrays; ``u`` float64 in [0, 1)).

    NOTE: the comparison is made in float64 (``p`` widened exactly), the same comparison the
    reference makes on the same uniforms, so both engines draw the same states from the same
    probabilities.
    """
    one = out.dtype.type(1.0)
    zero = out.dtype.type(0.0)
    for i in range(p.size):
        out[i] = one if u[i] < np.float64(p[i]) else zero


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def free_energy_rows(v, pre, visible_bias, out):
    """``out[r] = −v[r]·b − Σ_j softplus(pre[r, j])`` with ``pre = v W + c``, in float64."""
    rows, visible = v.shape
    hidden = pre.shape[1]
    for r in range(rows):
        linear = 0.0
        for i in range(visible):
            linear += np.float64(v[r, i]) * np.float64(visible_bias[i])
        soft = 0.0
        for j in range(hidden):
            soft += scalar.softplus_f(np.float64(pre[r, j]))
        out[r] = -linear - soft


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def mean_squared_difference(a, b):
    """mean((a − b)²) of two flat arrays, accumulated in float64."""
    total = 0.0
    for i in range(a.size):
        d = np.float64(a[i]) - np.float64(b[i])
        total += d * d
    return total / a.size


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def mean_difference_columns(a, b, out):
    """``out[j] = mean_i (a[i, j] − b[i, j])``, accumulated in float64 (the bias gradients)."""
    rows, cols = a.shape
    acc = np.zeros(cols, dtype=np.float64)
    for i in range(rows):
        for j in range(cols):
            acc[j] += np.float64(a[i, j]) - np.float64(b[i, j])
    for j in range(cols):
        out[j] = acc[j] / rows
