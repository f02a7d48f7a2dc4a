"""Device-function twins of ``fastlib/kernels/scalar.py``: one activation per pair of names.

numba.cuda kernels cannot call the CPU ``@njit`` scalars, so each ``<name>_f(x)`` (the value)
and ``<name>_df(x)`` (the derivative, as a function of the input ``x``) is written again here as
a ``@cuda.jit(device=True)`` function with the same name and the same math. A test compares
every pair elementwise with the CPU scalars on adversarial values (kinks, saturation, tiny and
large magnitudes). ``leaky_relu`` takes its slope as a second argument.

The formulas are the CPU module's, term for term (the sigmoid pair from one exp(-|x|), sech^2 as
4e / (1 + e)^2, gelu_tanh as x sigmoid(2u), Phi through erfc, the 0 * inf guards), so both
engines have the same accuracy profile and the same limits in the tails.

NOTE: the kernels call these functions on float64 values (a float32 input is widened first) and
round once when they store the result: at least as accurate as the CPU's float32 evaluation,
and cheap next to the memory traffic of an elementwise pass.

NOTE: the kink conventions are the registry's: relu'(x) = 1 if x > 0 else 0, abs'(0) = 0,
leaky_relu'(x) = 1 if x > 0 else slope.
"""
from __future__ import annotations

import math

from numba import cuda

_SQRT_HALF = 0.7071067811865476            # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327         # 1 / sqrt(2 pi)
_SQRT_2_OVER_PI = 0.7978845608028654       # sqrt(2 / pi)
_GELU_TANH_C = 0.044715
_EXP_OVERFLOW = 709.782712893384           # log(largest float64): exp overflows above it


@cuda.jit(device=True)
def neg_f(x):
    return -x


@cuda.jit(device=True)
def neg_df(x):
    return -1.0


@cuda.jit(device=True)
def identity_f(x):
    return x


@cuda.jit(device=True)
def identity_df(x):
    return 1.0


@cuda.jit(device=True)
def exp_f(x):
    # IEEE overflow to +inf, said explicitly: the simulator's math.exp raises instead.
    if x > _EXP_OVERFLOW:
        return math.inf
    return math.exp(x)


@cuda.jit(device=True)
def exp_df(x):
    return exp_f(x)


@cuda.jit(device=True)
def log_f(x):
    return math.log(x)


@cuda.jit(device=True)
def log_df(x):
    return 1.0 / x


@cuda.jit(device=True)
def sqrt_f(x):
    return math.sqrt(x)


@cuda.jit(device=True)
def sqrt_df(x):
    return 0.5 / math.sqrt(x)


@cuda.jit(device=True)
def square_f(x):
    return x * x


@cuda.jit(device=True)
def square_df(x):
    return 2.0 * x


@cuda.jit(device=True)
def abs_f(x):
    return abs(x)


@cuda.jit(device=True)
def abs_df(x):
    # NOTE: abs'(0) = 0 (the sign function), the registry's convention.
    if x > 0:
        return 1.0
    if x < 0:
        return -1.0
    return 0.0


@cuda.jit(device=True)
def relu_f(x):
    return 0.0 if x <= 0 else x


@cuda.jit(device=True)
def relu_df(x):
    # NOTE: relu'(0) = 0 (strict inequality), as the Loom document states.
    return 1.0 if x > 0 else 0.0


@cuda.jit(device=True)
def leaky_relu_f(x, slope):
    return x if x > 0 else x * slope


@cuda.jit(device=True)
def leaky_relu_df(x, slope):
    # NOTE: the slope at 0, matching relu'(0) = 0 when slope = 0.
    return 1.0 if x > 0 else slope


@cuda.jit(device=True)
def sigmoid_pair(x):
    """(sigmoid(x), sigmoid(-x)) from one exp(-|x|): both with full relative accuracy."""
    e = math.exp(-abs(x))
    big = 1.0 / (1.0 + e)   # the one of the pair that is >= 1/2
    small = e / (1.0 + e)
    if x >= 0:
        return big, small
    return small, big


@cuda.jit(device=True)
def sigmoid_f(x):
    return sigmoid_pair(x)[0]


@cuda.jit(device=True)
def sigmoid_df(x):
    # sigmoid(x) sigmoid(-x) = e / (1 + e)^2, e = exp(-|x|): no 1 - s cancellation.
    e = math.exp(-abs(x))
    d = 1.0 + e
    return e / (d * d)


@cuda.jit(device=True)
def tanh_f(x):
    return math.tanh(x)


@cuda.jit(device=True)
def tanh_df(x):
    # sech^2(x) = 4e / (1 + e)^2, e = exp(-2|x|): keeps relative accuracy where 1 - tanh^2
    # would round to 0.
    e = math.exp(-2.0 * abs(x))
    d = 1.0 + e
    return 4.0 * e / (d * d)


@cuda.jit(device=True)
def softplus_f(x):
    # log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow, full precision for large |x|.
    pos = x if x > 0 else 0.0
    return pos + math.log1p(math.exp(-abs(x)))


@cuda.jit(device=True)
def softplus_df(x):
    return sigmoid_pair(x)[0]


@cuda.jit(device=True)
def silu_f(x):
    return x * sigmoid_pair(x)[0]


@cuda.jit(device=True)
def silu_df(x):
    # s (1 + x sigmoid(-x)); its limit at -inf is 0 (skip 0 * inf).
    s, sm = sigmoid_pair(x)
    if s == 0:
        return s
    return s * (1.0 + x * sm)


@cuda.jit(device=True)
def normcdf(x):
    """Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation in the lower tail (unlike 1 + erf)."""
    return 0.5 * math.erfc(-x * _SQRT_HALF)


@cuda.jit(device=True)
def normpdf(x):
    """phi(x) = exp(-x^2 / 2) / sqrt(2 pi)."""
    return _INV_SQRT_2PI * math.exp(-0.5 * x * x)


@cuda.jit(device=True)
def gelu_f(x):
    return x * normcdf(x)


@cuda.jit(device=True)
def gelu_df(x):
    # Phi(x) + x phi(x); where phi underflows its limit is Phi (skip 0 * inf).
    pdf = normpdf(x)
    cdf = normcdf(x)
    if pdf == 0:
        return cdf
    return cdf + x * pdf


@cuda.jit(device=True)
def gelu_tanh_f(x):
    # x (1 + tanh u) / 2 = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the same function
    # without the cancellation of 1 + tanh(u) for x < 0.
    u2 = 2.0 * _SQRT_2_OVER_PI * (x + _GELU_TANH_C * x * x * x)
    return x * sigmoid_pair(u2)[0]


@cuda.jit(device=True)
def gelu_tanh_df(x):
    # s + 2 x s (1 - s) u', s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 a x^2).
    u2 = 2.0 * _SQRT_2_OVER_PI * (x + _GELU_TANH_C * x * x * x)
    s, sm = sigmoid_pair(u2)
    t = s * sm
    if t == 0:  # where x^2 may overflow the term's limit is 0
        return s
    du2 = 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_C * x * x)
    return s + x * t * du2


#: name -> (value, derivative); leaky_relu's pair takes the slope as a second argument.
ACTIVATIONS = {
    "neg": (neg_f, neg_df), "identity": (identity_f, identity_df), "exp": (exp_f, exp_df),
    "log": (log_f, log_df), "sqrt": (sqrt_f, sqrt_df), "square": (square_f, square_df),
    "abs": (abs_f, abs_df), "relu": (relu_f, relu_df), "leaky_relu": (leaky_relu_f, leaky_relu_df),
    "sigmoid": (sigmoid_f, sigmoid_df), "tanh": (tanh_f, tanh_df),
    "softplus": (softplus_f, softplus_df), "silu": (silu_f, silu_df), "gelu": (gelu_f, gelu_df),
    "gelu_tanh": (gelu_tanh_f, gelu_tanh_df),
}

#: The unary ops whose pair takes a parameter (passed as the second argument).
WITH_PARAM = frozenset({"leaky_relu"})
