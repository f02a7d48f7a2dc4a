"""The forward and backward kernels of the feed-forward layer kinds (Dense, LayerNorm, RMSNorm,
SwiGLU, Embedding): the layers and the compiled program's rows call these same kernels.

Each writes caller-owned buffers (no allocation); a backward writes, adds or skips its input's
cotangent (``mode``: ``instructions.GRAD_WRITE``, ``GRAD_ADD``, ``GRAD_SKIP``). The GEMMs stay
in BLAS (``np.dot``); Dense's epilogue is bias + activation forward and activation' + bias
gradient backward, switching on the op table's activation codes and calling the scalar
functions of ``fastlib.kernels.scalar``. Reductions over rows (bias, weight and norm-parameter
gradients) and over a row's features (norm statistics) accumulate in float64 whatever the
dtype (NOTE: keeps float32 results at float32 accuracy for any batch size, at no measurable
cost next to the GEMMs). Arrays are C-contiguous 2-D (rows = every leading axis flattened).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

import optable
from fastlib.config import FASTMATH
from fastlib.kernels import scalar
from fastlib.kernels.blas import dot_into
from fastlib.kernels.instructions import GRAD_ADD, GRAD_SKIP, GRAD_WRITE, row_index
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


# NOTE: the epilogues call relu inline (the common case) and every other code through a call,
# so the hot loops stay small (inlining every activation's body there cost ~10% of an MLP
# epoch); they are compiled without fast-math, so every path applies one formula per code.
@njit(cache=True, error_model="numpy")
def _activate_call(z, code, slope):
    return activate(z, code, slope)


@njit(cache=True, error_model="numpy")
def _derivative_call(z, code, slope):
    return activate_derivative(z, code, slope)


@njit(inline="always", error_model="numpy")
def fast_activate(z, code, slope):
    """f(z) for an elementwise code, relu inline."""
    if code == _RELU:
        return scalar.relu_f(z)
    return _activate_call(z, code, slope)


@njit(inline="always", error_model="numpy")
def fast_derivative(z, code, slope):
    """f'(z) for an elementwise code, relu inline."""
    if code == _RELU:
        return scalar.relu_df(z)
    return _derivative_call(z, code, slope)


@njit(cache=True, error_model="numpy")
def bias_activation(pre, bias, post, code, slope):
    """``pre += bias; post = f(pre)``: the Dense forward epilogue, one pass (linear: ``post``
    is ``pre``, the bias added in place)."""
    require_activation(code)
    if code == _LINEAR or code == _SOFTMAX:
        add_bias(pre, bias)
        if code == _SOFTMAX:
            softmax_rows(pre, post)
        return
    rows, cols = pre.shape
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
                o[j] = _activate_call(z, code, slope)


@njit(cache=True, error_model="numpy")
def backward_epilogue(g, pre, post, gpre, acc, code, slope):
    """``gpre = g * f'(pre)`` (softmax: its product with the Jacobian, from ``post``) and its
    column sums into the caller's float64 ``acc`` (the bias gradient: rows in order). ``gpre``
    may be ``g`` (in place); a linear code leaves it unwritten, so pass ``g`` then."""
    require_activation(code)
    rows, cols = g.shape
    for j in range(cols):
        acc[j] = 0.0
    if code == _SOFTMAX:
        for i in range(rows):
            dot = 0.0
            for j in range(cols):
                dot += g[i, j] * post[i, j]
            for j in range(cols):
                v = post[i, j] * (g[i, j] - dot)
                gpre[i, j] = v
                acc[j] += v
        return
    for i in range(rows):
        for j in range(cols):
            v = g[i, j]
            if code != _LINEAR:
                v = v * fast_derivative(pre[i, j], code, slope)
                gpre[i, j] = v
            acc[j] += v


@njit(cache=True, error_model="numpy")
def column_sums_into(g, out, acc):
    """``out[j] = sum_i g[i, j]`` through the caller's float64 ``acc``, rows in order."""
    backward_epilogue(g, g, g, g, acc, _LINEAR, 0.0)
    for j in range(g.shape[1]):
        out[j] = acc[j]


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


@njit(cache=True, error_model="numpy")
def activation_backward(g, pre, post, gpre, gbias, code, slope):
    """:func:`backward_epilogue` with its accumulator allocated, the bias gradient into
    ``gbias``."""
    acc = np.empty(g.shape[1], dtype=np.float64)
    backward_epilogue(g, pre, post, gpre, acc, code, slope)
    for j in range(g.shape[1]):
        gbias[j] = acc[j]


# -- products and cotangents ----------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def outer(u, v, out):
    """``out = u^T v`` for one row each: the batch-1 weight gradient ``x^T @ delta``.

    NOTE: each element is the single product u[i] * v[j], exactly what a matrix product with
    an inner dimension of 1 computes, so the values equal the BLAS path's; a plain loop is
    several times faster than a GEMM call at this shape.
    """
    m, n = u.shape[0], v.shape[0]
    for i in range(m):
        ui = u[i]
        for j in range(n):
            out[i, j] = ui * v[j]


@njit(cache=True, error_model="numpy")
def weight_gradient(a, d, out):
    """``out = a^T d``: BLAS, or the outer product at one row."""
    if a.shape[0] > 1:
        dot_into(a.T, d, out)
    else:
        outer(a[0], d[0], out)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def input_grad(a, bt, gx, mode, tmp):
    """``gx = a @ bt`` (mode WRITE) or ``gx += a @ bt`` (ADD, through ``tmp``); SKIP: nothing."""
    if mode == GRAD_SKIP:
        return
    if mode == GRAD_WRITE:
        dot_into(a, bt, gx)
        return
    rows, cols = gx.shape
    t = tmp[:rows * cols].reshape((rows, cols))
    dot_into(a, bt, t)
    for i in range(rows):
        gr = gx[i]
        tr = t[i]
        for j in range(cols):
            gr[j] += tr[j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def pass_grad(g, gx, mode):
    """``gx (=|+=) g``: a cotangent handed on unchanged."""
    if mode == GRAD_SKIP:
        return
    rows, cols = gx.shape
    for i in range(rows):
        a, o = g[i], gx[i]
        if mode == GRAD_ADD:
            for j in range(cols):
                o[j] += a[j]
        else:
            for j in range(cols):
                o[j] = a[j]


# -- Dense ----------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def dense_forward(x, w, b, pre, post, code, slope):
    """``pre = x @ w + b``, ``post = f(pre)`` (``post`` is ``pre`` when linear)."""
    dot_into(x, w, pre)
    bias_activation(pre, b, post, code, slope)


@njit(cache=True, error_model="numpy")
def dense_backward(x, w, pre, post, g, gpre, gw, gb, acc, gx, mode, tmp, code, slope):
    """The pre-activation's cotangent into ``gpre`` (:func:`backward_epilogue`; ``g`` itself
    in the program, whose output cotangent has no other reader), the bias and weight
    gradients, and the input's cotangent by ``mode``."""
    backward_epilogue(g, pre, post, gpre, acc, code, slope)
    for j in range(gb.shape[0]):
        gb[j] = acc[j]
    weight_gradient(x, gpre, gw)
    input_grad(gpre, w.T, gx, mode, tmp)


# -- SwiGLU: [w_gate | w_up] is one (d, 2h) block, so both projections are one product -------
@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def swiglu_forward(x, w_gu, w_down, au, hidden, y):
    """``au = x @ [w_gate | w_up]``, ``hidden = silu(a) * u``, ``y = hidden @ w_down``."""
    dot_into(x, w_gu, au)
    rows, hid = hidden.shape
    for i in range(rows):
        ar = au[i]
        hr = hidden[i]
        for j in range(hid):
            hr[j] = scalar.silu_f(ar[j]) * ar[hid + j]
    dot_into(hidden, w_down, y)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def swiglu_backward(x, w_gu, w_down, au, hidden, g, dhidden, dau, gw_gu, gw_down, gx, mode,
                    tmp):
    """``da = dh u silu'(a)``, ``du = dh silu(a)`` into ``dau``; the weight gradients; the
    input's cotangent ``dau @ [w_gate | w_up]^T`` by ``mode``."""
    dot_into(g, w_down.T, dhidden)
    dot_into(hidden.T, g, gw_down)
    rows, hid = hidden.shape
    for i in range(rows):
        ar = au[i]
        dr = dhidden[i]
        out = dau[i]
        for j in range(hid):
            a = ar[j]
            out[j] = dr[j] * ar[hid + j] * scalar.silu_df(a)
            out[hid + j] = dr[j] * scalar.silu_f(a)
    dot_into(x.T, dau, gw_gu)
    input_grad(dau, w_gu.T, gx, mode, tmp)


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
def layer_norm_backward(dy, xhat, rstd, weight, dx, mode, dweight, dbias, acc):
    """``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * weight``, by
    ``mode``; the weight and bias gradients through the float64 ``acc`` (2 x cols)."""
    rows, cols = dy.shape
    for j in range(2 * cols):
        acc[j] = 0.0
    for i in range(rows):
        dr = dy[i]
        hr = xhat[i]
        mean_g = 0.0
        mean_gx = 0.0
        for j in range(cols):
            g = dr[j] * weight[j]
            mean_g += g
            mean_gx += g * hr[j]
            acc[j] += dr[j] * hr[j]
            acc[cols + j] += dr[j]
        if mode == GRAD_SKIP:
            continue
        mean_g /= cols
        mean_gx /= cols
        r = rstd[i]
        xr = dx[i]
        for j in range(cols):
            g = dr[j] * weight[j]
            v = r * (g - mean_g - hr[j] * mean_gx)
            if mode == GRAD_ADD:
                xr[j] += v
            else:
                xr[j] = v
    for j in range(cols):
        dweight[j] = acc[j]
        dbias[j] = acc[cols + j]


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
def rms_norm_backward(dy, x, rinv, weight, dx, mode, dweight, acc):
    """``dx = r g - r^3 x mean(g x)`` with ``g = dy * weight``, by ``mode``;
    ``dweight = sum dy x r`` through the float64 ``acc``."""
    rows, cols = dy.shape
    for j in range(cols):
        acc[j] = 0.0
    for i in range(rows):
        r = rinv[i]
        dr = dy[i]
        xr = x[i]
        mean_gx = 0.0
        for j in range(cols):
            mean_gx += dr[j] * weight[j] * xr[j]
            acc[j] += dr[j] * xr[j] * r
        if mode == GRAD_SKIP:
            continue
        mean_gx /= cols
        r3 = r * r * r
        out = dx[i]
        for j in range(cols):
            v = r * dr[j] * weight[j] - r3 * xr[j] * mean_gx
            if mode == GRAD_ADD:
                out[j] += v
            else:
                out[j] = v
    for j in range(cols):
        dweight[j] = acc[j]


# -- Embedding -----------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def embedding_forward(tokens, table, y):
    """``y[i] = table[tokens[i]]``."""
    for i in range(tokens.shape[0]):
        src = table[tokens[i]]
        dst = y[i]
        for j in range(table.shape[1]):
            dst[j] = src[j]


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def embedding_backward(tokens, g, dweight, acc, samples, steps, group):
    """``dweight[tokens[i]] += g[i]`` (repeated tokens sum), ``dweight`` written whole.

    NOTE: rows are added sample by sample, each sample's positions in order (``row_index`` of
    the rows' layout), into the float64 ``acc`` (num x dim), so repeated tokens sum at float64
    accuracy before the one rounding to the weight's dtype, in one order whatever the layout.
    """
    num, dim = dweight.shape
    table = acc[:num * dim].reshape((num, dim))
    for r in range(num):
        tr = table[r]
        for j in range(dim):
            tr[j] = 0.0
    for s in range(samples):
        for t in range(steps):
            i = row_index(s, t, samples, steps, group)
            tr = table[tokens[i]]
            gr = g[i]
            for j in range(dim):
                tr[j] += gr[j]
    for r in range(num):
        tr = table[r]
        dr = dweight[r]
        for j in range(dim):
            dr[j] = tr[j]
