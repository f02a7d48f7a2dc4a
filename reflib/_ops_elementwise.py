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
    # 1 - sigmoid(x) taken as sigmoid(-x): no cancellation once sigmoid(x) saturates
    return (g * F.sigmoid(x) * (1 + x * F.sigmoid(-x)),)


def _std_normal_cdf(F, x):
    # erfc(-x / sqrt 2) / 2, not (1 + erf(x / sqrt 2)) / 2: no cancellation in the lower tail,
    # where float64 would return 0 from x < -8.3 on (the exact Phi(-30) is 4.9e-198)
    return F.erfc(-x / F.sqrt(F.const(2))) / 2


def gelu(F, x):
    return x * _std_normal_cdf(F, x)


def gelu_vjp(F, x, out, g):
    # d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi)
    phi = F.exp(-x * x / 2) / F.sqrt(2 * F.pi())
    return (g * (_std_normal_cdf(F, x) + x * phi),)


def gelu_tanh(F, x):
    # (1 + tanh u) / 2 = sigmoid(2u): the same function without the cancellation of 1 + tanh u
    # for x < 0
    c, k = _gelu_tanh_constants(F)
    return x * F.sigmoid(2 * c * (x + k * x * x * x))


def _gelu_tanh_constants(F):
    return F.sqrt(2 / F.pi()), F.const(GELU_TANH_CUBIC)


def gelu_tanh_vjp(F, x, out, g):
    # u = c (x + k x^3), s = sigmoid(2u): d/dx [x s] = s + x s sigmoid(-2u) 2u'
    # ((1 - tanh^2 u) / 2 = 2 s sigmoid(-2u), without forming 1 - tanh^2)
    c, k = _gelu_tanh_constants(F)
    u2 = 2 * c * (x + k * x * x * x)
    s = F.sigmoid(u2)
    du2 = 2 * c * (1 + 3 * k * x * x)
    return (g * (s + x * s * F.sigmoid(-u2) * du2),)


def tanh(F, x):
    return F.tanh(x)


def tanh_vjp(F, x, out, g):
    # sech^2 x = 4e / (1 + e)^2 with e = exp(-2|x|), not 1 - tanh^2 x, which cancels to 0
    # once tanh x rounds to +-1 (|x| > 19 in float64: the exact slope is still 1e-16 there)
    e = F.exp(-2 * np.where(x < 0, -x, x))
    return (g * 4 * e / ((1 + e) * (1 + e)),)


def sigmoid(F, x):
    return F.sigmoid(x)


def sigmoid_vjp(F, x, out, g):
    # sigmoid(x) sigmoid(-x), not out (1 - out), which cancels once out rounds to 1
    return (g * F.sigmoid(x) * F.sigmoid(-x),)


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
