"""Fused elementwise kernels of the feed-forward layers (Dense, SwiGLU, LayerNorm, RMSNorm,
Embedding): the work around the GEMMs, one pass over memory each way.

The GEMMs stay in BLAS (``np.dot``). Dense's epilogue is bias + activation forward and
activation' + bias gradient backward. Activations switch on the integer codes of
``fastlib.layers.activations`` and call the scalar functions of ``fastlib.kernels.scalar`` (one source per activation).

The kernels take plain C-contiguous 2-D arrays (rows = every leading axis flattened) of one float
dtype; the layers are their only callers and allocate their outputs, so they do not validate.
Reductions over rows (bias, weight and norm-parameter gradients) and over a row's features (norm
statistics) accumulate in float64 whatever the dtype (NOTE: keeps float32 results at float32
accuracy for any batch size, at no measurable cost next to the GEMMs).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

import optable
from fastlib.config import FASTMATH
from fastlib.kernels import scalar
from fastlib.kernels.vecmath import fexp, like

# activation codes: the op table's (optable.ACTIVATIONS), compiled in as constants
_CODE = optable.activation_codes()
_LINEAR, _RELU, _LEAKY, _TANH = _CODE["linear"], _CODE["relu"], _CODE["leaky_relu"], _CODE["tanh"]
_SIGMOID, _SILU, _GELU = _CODE["sigmoid"], _CODE["silu"], _CODE["gelu"]
_GELU_TANH, _SOFTPLUS, _SOFTMAX = _CODE["gelu_tanh"], _CODE["softplus"], _CODE["softmax"]

_FASTMATH = set(FASTMATH)  # numba takes a set (config holds a frozenset)
# every activation code of the table, for the one check per kernel call
_KNOWN_CODES = np.array(sorted(_CODE.values()), dtype=np.int64)
_UNKNOWN = "unknown activation code (not a code of optable's activations):"


@njit(cache=True, error_model="numpy")
def require_activation(code):
    """Raise ``ValueError`` naming ``code`` unless it is an activation code of the op table.

    NOTE: the epilogues call it once, before their element loops: ``activate`` itself answers
    an unknown code with NaN (a sentinel that a raise inside the loop would cost the loop its
    vectorisation to carry), never with the identity.
    """
    for known in _KNOWN_CODES:
        if code == known:
            return
    raise ValueError(_UNKNOWN, code)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH, inline="always")
def activate(x, code, slope):
    """f(x) for the elementwise activation ``code``."""
    if code == _RELU:
        return scalar.relu_f(x)
    if code == _LEAKY:
        return scalar.leaky_relu_f(x, slope)
    if code == _TANH:
        return scalar.tanh_f(x)
    if code == _SIGMOID:
        return scalar.sigmoid_f(x)
    if code == _SILU:
        return scalar.silu_f(x)
    if code == _GELU:
        return scalar.gelu_f(x)
    if code == _GELU_TANH:
        return scalar.gelu_tanh_f(x)
    if code == _SOFTPLUS:
        return scalar.softplus_f(x)
    if code == _LINEAR:
        return x
    return like(x, math.nan)        # unknown (or softmax, not elementwise): see require_activation


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH, inline="always")
def activate_derivative(x, code, slope):
    """f'(x) for the elementwise activation ``code`` (the kink conventions are scalar's)."""
    if code == _RELU:
        return scalar.relu_df(x)
    if code == _LEAKY:
        return scalar.leaky_relu_df(x, slope)
    if code == _TANH:
        return scalar.tanh_df(x)
    if code == _SIGMOID:
        return scalar.sigmoid_df(x)
    if code == _SILU:
        return scalar.silu_df(x)
    if code == _GELU:
        return scalar.gelu_df(x)
    if code == _GELU_TANH:
        return scalar.gelu_tanh_df(x)
    if code == _SOFTPLUS:
        return scalar.softplus_df(x)
    if code == _LINEAR:
        return scalar.identity_df(x)
    return like(x, math.nan)        # unknown (or softmax, not elementwise): see require_activation


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def add_bias(pre, bias):
    """``pre += bias`` row by row, in place."""
    rows, cols = pre.shape
    for i in range(rows):
        p = pre[i]
        for j in range(cols):
            p[j] += bias[j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def softmax_rows(pre, post):
    """Row-wise softmax through the row maximum: finite for any finite input."""
    rows, cols = pre.shape
    for i in range(rows):
        m = pre[i, 0]
        for j in range(1, cols):
            if pre[i, j] > m:
                m = pre[i, j]
        total = 0.0
        for j in range(cols):
            e = fexp(pre[i, j] - m)
            post[i, j] = e
            total += e
        inv = 1.0 / total
        for j in range(cols):
            post[i, j] *= inv


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def bias_activation(pre, bias, post, code, slope):
    """``pre += bias; post = f(pre)``: the Dense forward epilogue, one pass."""
    require_activation(code)
    rows, cols = pre.shape
    if code == _SOFTMAX:
        add_bias(pre, bias)
        softmax_rows(pre, post)
        return
    for i in range(rows):
        p = pre[i]
        o = post[i]
        if code == _RELU:      # NOTE: the common case as its own loop, which vectorises
            for j in range(cols):
                z = p[j] + bias[j]
                p[j] = z
                o[j] = scalar.relu_f(z)
        else:
            for j in range(cols):
                z = p[j] + bias[j]
                p[j] = z
                o[j] = activate(z, code, slope)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def column_sums(g, out):
    """``out[j] = sum_i g[i, j]``.

    NOTE: accumulated in float64 whatever the dtype, so a float32 bias gradient over a large
    batch keeps float32 accuracy instead of growing an O(batch * eps) error.
    """
    rows, cols = g.shape
    acc = np.zeros(cols, dtype=np.float64)
    for i in range(rows):
        gr = g[i]
        for j in range(cols):
            acc[j] += gr[j]
    for j in range(cols):
        out[j] = acc[j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def activation_backward(g, pre, post, gpre, gbias, code, slope):
    """``gpre = g * f'(pre)`` and ``gbias = sum_rows(gpre)``: the Dense backward epilogue.

    Softmax uses its Jacobian-vector product on the saved output:
    ``gpre = post * (g - sum_j g_j post_j)`` per row.
    """
    require_activation(code)
    rows, cols = g.shape
    acc = np.zeros(cols, dtype=np.float64)  # NOTE: float64 accumulator, as in column_sums
    if code == _SOFTMAX:
        for i in range(rows):
            dot = 0.0
            for j in range(cols):
                dot += g[i, j] * post[i, j]
            for j in range(cols):
                v = post[i, j] * (g[i, j] - dot)
                gpre[i, j] = v
                acc[j] += v
    else:
        # NOTE: 1-D row views, and relu as its own loop: a loop over ``a[i, j]`` that switches
        # on the activation code per element does not vectorise (64 x 128 float32, relu:
        # 0.023 ms that way)
        for i in range(rows):
            gr = g[i]
            pr = pre[i]
            out = gpre[i]
            if code == _RELU:
                for j in range(cols):
                    v = gr[j] * scalar.relu_df(pr[j])
                    out[j] = v
                    acc[j] += v
            else:
                for j in range(cols):
                    v = gr[j] * activate_derivative(pr[j], code, slope)
                    out[j] = v
                    acc[j] += v
    for j in range(cols):
        gbias[j] = acc[j]


# -- SwiGLU gate ----------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def swiglu_gate(a, u, hidden):
    """``hidden = silu(a) * u`` (a = x @ w_gate, u = x @ w_up)."""
    rows, cols = a.shape
    for i in range(rows):
        for j in range(cols):
            hidden[i, j] = scalar.silu_f(a[i, j]) * u[i, j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def swiglu_gate_backward(dh, a, u, da, du):
    """``da = dh * u * silu'(a)``, ``du = dh * silu(a)``."""
    rows, cols = a.shape
    for i in range(rows):
        for j in range(cols):
            g = dh[i, j]
            da[i, j] = g * u[i, j] * scalar.silu_df(a[i, j])
            du[i, j] = g * scalar.silu_f(a[i, j])


# -- LayerNorm and RMSNorm (over the last axis, with their affine parameters) ------------------
@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def layer_norm_forward(x, weight, bias, eps, xhat, rstd, y):
    """``xhat = (x - mean) / sqrt(var + eps)`` (biased var), ``y = xhat * weight + bias``."""
    rows, cols = x.shape
    for i in range(rows):
        mean = 0.0
        for j in range(cols):
            mean += x[i, j]
        mean /= cols
        var = 0.0
        for j in range(cols):  # NOTE: two passes (mean, then squared deviations): no cancellation
            dev = x[i, j] - mean
            var += dev * dev
        var /= cols
        r = 1.0 / np.sqrt(var + eps)
        rstd[i] = r
        for j in range(cols):
            xh = (x[i, j] - mean) * r
            xhat[i, j] = xh
            y[i, j] = xh * weight[j] + bias[j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def layer_norm_backward(dy, xhat, rstd, weight, dx, dweight, dbias):
    """``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * weight``."""
    rows, cols = dy.shape
    acc_w = np.zeros(cols, dtype=np.float64)
    acc_b = np.zeros(cols, dtype=np.float64)
    for i in range(rows):
        mean_g = 0.0
        mean_gx = 0.0
        for j in range(cols):
            g = dy[i, j] * weight[j]
            mean_g += g
            mean_gx += g * xhat[i, j]
            acc_w[j] += dy[i, j] * xhat[i, j]
            acc_b[j] += dy[i, j]
        mean_g /= cols
        mean_gx /= cols
        r = rstd[i]
        for j in range(cols):
            g = dy[i, j] * weight[j]
            dx[i, j] = r * (g - mean_g - xhat[i, j] * mean_gx)
    for j in range(cols):
        dweight[j] = acc_w[j]
        dbias[j] = acc_b[j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def rms_norm_forward(x, weight, eps, rinv, y):
    """``r = 1 / sqrt(mean(x^2) + eps)``, ``y = x * r * weight``."""
    rows, cols = x.shape
    for i in range(rows):
        ms = 0.0
        for j in range(cols):
            ms += x[i, j] * x[i, j]
        r = 1.0 / np.sqrt(ms / cols + eps)
        rinv[i] = r
        for j in range(cols):
            y[i, j] = x[i, j] * r * weight[j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def rms_norm_backward(dy, x, rinv, weight, dx, dweight):
    """``dx = r g - r^3 x mean(g x)`` with ``g = dy * weight``; ``dweight = sum dy x r``."""
    rows, cols = dy.shape
    acc_w = np.zeros(cols, dtype=np.float64)
    for i in range(rows):
        r = rinv[i]
        mean_gx = 0.0
        for j in range(cols):
            mean_gx += dy[i, j] * weight[j] * x[i, j]
            acc_w[j] += dy[i, j] * x[i, j] * r
        mean_gx /= cols
        r3 = r * r * r
        for j in range(cols):
            dx[i, j] = r * dy[i, j] * weight[j] - r3 * x[i, j] * mean_gx
    for j in range(cols):
        dweight[j] = acc_w[j]


# -- Embedding -----------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def embedding_backward(indices, grad_rows, dweight):
    """``dweight[indices[n]] += grad_rows[n]`` (repeated indices sum), dweight zeroed here.

    NOTE: rows are added in index order n = 0, 1, ... into a float64 accumulator, so repeated
    tokens sum at float64 accuracy before the one rounding to the weight's dtype.
    """
    num, dim = dweight.shape
    acc = np.zeros((num, dim), dtype=np.float64)
    for n in range(indices.shape[0]):
        row = indices[n]
        for j in range(dim):
            acc[row, j] += grad_rows[n, j]
    for r in range(num):
        for j in range(dim):
            dweight[r, j] = acc[r, j]
