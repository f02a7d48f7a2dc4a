"""Unary elementwise reference ops: forward and VJP side by side, one pair per op.

Every forward takes the numeric object ``F`` (float64 or exact, see reflib.numeric) and the
input array; every VJP also gets the forward's ``out`` and the cotangent ``g`` (same shape).
"""
from __future__ import annotations

import numpy as np

from reflib._ops_common import check_real, implementations, require_domain

# gelu_tanh's cubic coefficient, as a decimal (exact in mpmath, the nearest double in float64).
GELU_TANH_CUBIC = "0.044715"


def neg(F, x):
    return -x


def neg_vjp(F, x, out, g):
    return (-g,)


def exp(F, x):
    return F.exp(x)


def exp_vjp(F, x, out, g):
    return (g * out,)


def log(F, x):
    require_domain(F, "log", "x", x, x > 0, "> 0 (log is real only on positive numbers)")
    return F.log(x)


def log_vjp(F, x, out, g):
    return (g / x,)


def sqrt(F, x):
    require_domain(F, "sqrt", "x", x, x >= 0, ">= 0 (sqrt is real only on non-negative numbers)")
    return F.sqrt(x)


def sqrt_vjp(F, x, out, g):
    require_domain(F, "sqrt", "x", x, x > 0, "> 0 for the VJP (the derivative 1/(2 sqrt x) is "
                   "infinite at 0)")
    return (g / (2 * out),)


def square(F, x):
    return x * x


def square_vjp(F, x, out, g):
    return (2 * x * g,)


def abs_(F, x):
    return np.where(x < 0, -x, x)


def abs_vjp(F, x, out, g):
    # NOTE: kink convention abs'(0) = 0 (the sign function).
    return (np.where(x > 0, g, np.where(x < 0, -g, 0.0)),)


def relu(F, x):
    return np.where(x > 0, x, 0.0)


def relu_vjp(F, x, out, g):
    # NOTE: kink convention relu'(x) = 1 if x > 0 else 0, so relu'(0) = 0.
    return (np.where(x > 0, g, 0.0),)


def leaky_relu(F, x, negative_slope=0.01):
    s = F.const(check_real("leaky_relu", "negative_slope", negative_slope))
    return np.where(x > 0, x, s * x)


def leaky_relu_vjp(F, x, out, g, negative_slope=0.01):
    # NOTE: kink convention leaky_relu'(x) = 1 if x > 0 else negative_slope (so at 0 the slope).
    s = F.const(negative_slope)
    return (np.where(x > 0, g, s * g),)


def silu(F, x):
    return x * F.sigmoid(x)


def silu_vjp(F, x, out, g):
    s = F.sigmoid(x)
    return (g * s * (1 + x * (1 - s)),)


def _std_normal_cdf(F, x):
    return (1 + F.erf(x / F.sqrt(F.const(2)))) / 2


def gelu(F, x):
    return x * _std_normal_cdf(F, x)


def gelu_vjp(F, x, out, g):
    # d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi)
    phi = F.exp(-x * x / 2) / F.sqrt(2 * F.pi())
    return (g * (_std_normal_cdf(F, x) + x * phi),)


def _gelu_tanh_inner(F, x):
    c = F.sqrt(2 / F.pi())
    k = F.const(GELU_TANH_CUBIC)
    return c, k, F.tanh(c * (x + k * x * x * x))


def gelu_tanh(F, x):
    _, _, t = _gelu_tanh_inner(F, x)
    return x * (1 + t) / 2


def gelu_tanh_vjp(F, x, out, g):
    # u = c (x + k x^3); d/dx [x (1 + tanh u) / 2] = (1 + tanh u)/2 + x (1 - tanh^2 u) u' / 2
    c, k, t = _gelu_tanh_inner(F, x)
    du = c * (1 + 3 * k * x * x)
    return (g * ((1 + t) + x * (1 - t * t) * du) / 2,)


def tanh(F, x):
    return F.tanh(x)


def tanh_vjp(F, x, out, g):
    return (g * (1 - out * out),)


def sigmoid(F, x):
    return F.sigmoid(x)


def sigmoid_vjp(F, x, out, g):
    return (g * out * (1 - out),)


def softplus(F, x):
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow, no loss for very negative x.
    ax = np.where(x < 0, -x, x)
    # NOTE: both branches take the right side at x = 0 (x >= 0 above, x < 0 for |x|), so
    # reflib.jvp's dual numbers see one side's slope, 1 - 1/2, not a mix of the two
    return np.where(x >= 0, x, 0.0) + F.log1p(F.exp(-ax))


def softplus_vjp(F, x, out, g):
    return (g * F.sigmoid(x),)


def identity(F, x):
    return x  # reflib.forward hands back a fresh array either way


def identity_vjp(F, x, out, g):
    return (g,)


# op name -> (forward, vjp), paired by name (``abs_`` / ``abs_vjp``)
OPS = implementations(globals(), (
    "neg exp log sqrt square abs relu leaky_relu silu gelu gelu_tanh tanh sigmoid "
    "softplus identity"
))
