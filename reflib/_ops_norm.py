"""Normalisation ops: softmax and log_softmax through log-sum-exp; layer_norm and rms_norm over the
last axis without affine parameters (weight and bias are separate mul / add ops)."""
from __future__ import annotations

import numpy as np

from reflib._ops_common import check_real, fail, implementations, one_axis
from reflib._ops_reduce import shifted_exp


def _axis(op, x, axis):
    if x.ndim == 0:
        fail(op, "needs an input with at least one axis; got a 0-d input")
    ax = one_axis(op, axis, x.ndim)
    if x.shape[ax] == 0:
        fail(op, f"needs a non-empty axis {axis}; got an input of shape {x.shape}")
    return ax


def softmax(F, x, axis=-1):
    _, e, s = shifted_exp(F, x, (_axis("softmax", x, axis),))
    return e / s


def softmax_vjp(F, x, out, g, axis=-1):
    # J^T g = y * (g - <g, y>) along the axis
    ax = _axis("softmax", x, axis)
    return (out * (g - np.sum(g * out, axis=ax, keepdims=True)),)


def log_softmax(F, x, axis=-1):
    xm, _, s = shifted_exp(F, x, (_axis("log_softmax", x, axis),))
    return xm - F.log(s)


def log_softmax_vjp(F, x, out, g, axis=-1):
    # J^T g = g - softmax(x) * sum(g) along the axis, softmax = exp(out)
    ax = _axis("log_softmax", x, axis)
    return (g - F.exp(out) * np.sum(g, axis=ax, keepdims=True),)


def _check_last(op, x, eps):
    _axis(op, x, -1)
    check_real(op, "eps", eps, positive=True)


def _layer_norm_parts(F, x, eps):
    d = x.shape[-1]
    xc = x - np.sum(x, axis=-1, keepdims=True) / d
    var = np.sum(xc * xc, axis=-1, keepdims=True) / d  # NOTE: biased variance (divide by D)
    r = 1 / F.sqrt(var + F.const(eps))
    return xc, r


def layer_norm(F, x, eps=1e-5):
    _check_last("layer_norm", x, eps)
    xc, r = _layer_norm_parts(F, x, eps)
    return xc * r


def layer_norm_vjp(F, x, out, g, eps=1e-5):
    # With y = (x - mean) r, r = 1/sqrt(var + eps):  J^T g = r (g - mean(g) - y mean(g y)).
    _, r = _layer_norm_parts(F, x, eps)
    d = x.shape[-1]
    mg = np.sum(g, axis=-1, keepdims=True) / d
    mgy = np.sum(g * out, axis=-1, keepdims=True) / d
    return (r * (g - mg - out * mgy),)


def _rms_scale(F, x, eps):
    ms = np.sum(x * x, axis=-1, keepdims=True) / x.shape[-1]
    return 1 / F.sqrt(ms + F.const(eps))


def rms_norm(F, x, eps=1e-6):
    _check_last("rms_norm", x, eps)
    return x * _rms_scale(F, x, eps)


def rms_norm_vjp(F, x, out, g, eps=1e-6):
    # With y = x r, r = 1/sqrt(mean(x^2) + eps):  J^T g = r (g - y mean(g y)).
    r = _rms_scale(F, x, eps)
    mgy = np.sum(g * out, axis=-1, keepdims=True) / x.shape[-1]
    return (r * (g - out * mgy),)


# op name -> (forward, vjp), paired by name (``abs_`` / ``abs_vjp``)
OPS = implementations(globals(), "softmax log_softmax layer_norm rms_norm")
