"""Scalar forward and derivative of every unary op: the one source of each activation.

Every op ``<name>`` has ``<name>_f(x)`` (the value) and ``<name>_df(x)`` (the derivative at the
pre-activation ``x``); ``leaky_relu`` takes the slope as a second argument. They are
``@njit(cache=True)`` functions, generic over float32 and float64 (the result has ``x``'s
type), for use inside other kernels: fastlib's elementwise ops, the fused Dense / LSTM /
attention kernels, and anything else that needs an activation. Call them from jitted code::

    from fastlib.kernels.scalar import tanh_f, tanh_df
    out[i] = tanh_f(z[i]); dz[i] = g[i] * tanh_df(z[i])

The largest (softplus, gelu) are inlined at Numba's IR level (``inline="always"``): they grow
past LLVM's inlining threshold, and a call per element would stop the caller's loop from
vectorising. They are compiled with ``error_model="numpy"`` (IEEE division: ``log_df(0)`` and
``sqrt_df(0)`` are inf, never a ``ZeroDivisionError``; and no zero test to stop vectorisation)
and FMA contraction only (``fastlib.config.FASTMATH``), whatever the calling kernel uses.

``ACTIVATIONS`` maps an activation's name (as DESIGN.md names them, ``linear`` included) to its
``(f, df)`` pair, for code that selects one at trace time.

Kink conventions (docs/CONTRACTS.md): relu'(x) = 1 if x > 0 else 0, abs'(0) = 0,
leaky_relu'(x) = 1 if x > 0 else slope. Derivatives are written so that they keep full relative
accuracy where they are small (tanh' = 4e / (1 + e)^2 with e = exp(-2|x|), not 1 - tanh^2,
which is 0 in float32 for |x| > 9).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from fastlib import config
from fastlib.kernels.vecmath import fexp, flog, flog1p, fnormcdf, fnormpdf, ftanh, like

_FM = config.FASTMATH
_SQRT_2_OVER_PI = 0.79788456080286535588
_GELU_TANH_A = 0.044715


# --- building blocks -----------------------------------------------------------------------

@njit(cache=True, error_model="numpy", fastmath=_FM)
def _sigmoid_pair(x):
    """(sigmoid(x), sigmoid(-x)) from one exp(-|x|): both with full relative accuracy."""
    e = fexp(-abs(x))
    one = like(x, 1.0)
    big = one / (one + e)       # the one of the pair that is >= 1/2
    small = e / (one + e)
    return (big, small) if x >= 0 else (small, big)


# --- simple ops ----------------------------------------------------------------------------

@njit(cache=True, error_model="numpy", fastmath=_FM)
def identity_f(x):
    """identity(x) = x."""
    return x


@njit(cache=True, error_model="numpy", fastmath=_FM)
def identity_df(x):
    """identity'(x) = 1."""
    return like(x, 1.0)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def neg_f(x):
    """neg(x) = -x."""
    return -x


@njit(cache=True, error_model="numpy", fastmath=_FM)
def neg_df(x):
    """neg'(x) = -1."""
    return like(x, -1.0)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def square_f(x):
    """square(x) = x * x."""
    return x * x


@njit(cache=True, error_model="numpy", fastmath=_FM)
def square_df(x):
    """square'(x) = 2x."""
    return x + x


@njit(cache=True, error_model="numpy", fastmath=_FM)
def abs_f(x):
    """abs(x) = |x|."""
    return abs(x)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def abs_df(x):
    """abs'(x) = sign(x). NOTE: abs'(0) = 0 (the sign convention of CONTRACTS.md)."""
    one = like(x, 1.0)
    zero = like(x, 0.0)
    return one if x > 0 else (-one if x < 0 else zero)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def exp_f(x):
    """exp(x)."""
    return fexp(x)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def exp_df(x):
    """exp'(x) = exp(x)."""
    return fexp(x)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def log_f(x):
    """log(x); IEEE: log(0) = -inf, log(x < 0) = nan."""
    return flog(x)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def log_df(x):
    """log'(x) = 1 / x."""
    return like(x, 1.0) / x


@njit(cache=True, error_model="numpy", fastmath=_FM)
def sqrt_f(x):
    """sqrt(x); IEEE: sqrt(x < 0) = nan."""
    return math.sqrt(x)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def sqrt_df(x):
    """sqrt'(x) = 1 / (2 sqrt(x)); inf at 0."""
    return like(x, 0.5) / math.sqrt(x)


# --- activations ---------------------------------------------------------------------------

@njit(cache=True, error_model="numpy", fastmath=_FM)
def relu_f(x):
    """relu(x) = max(x, 0); NaN propagates (as in PyTorch)."""
    return like(x, 0.0) if x <= 0 else x


@njit(cache=True, error_model="numpy", fastmath=_FM)
def relu_df(x):
    """relu'(x). NOTE: 1 if x > 0 else 0, so relu'(0) = 0 (the Loom convention)."""
    return like(x, 1.0) if x > 0 else like(x, 0.0)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def leaky_relu_f(x, slope):
    """leaky_relu(x) = x if x > 0 else slope * x."""
    return x if x > 0 else x * like(x, slope)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def leaky_relu_df(x, slope):
    """leaky_relu'(x). NOTE: 1 if x > 0 else slope, so leaky_relu'(0) = slope."""
    return like(x, 1.0) if x > 0 else like(x, slope)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def sigmoid_f(x):
    """sigmoid(x) = 1 / (1 + exp(-x)), from exp(-|x|) so that it never overflows."""
    return _sigmoid_pair(x)[0]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def sigmoid_df(x):
    """sigmoid'(x) = sigmoid(x) sigmoid(-x) = e / (1 + e)^2 with e = exp(-|x|)."""
    e = fexp(-abs(x))
    d = like(x, 1.0) + e
    return e / (d * d)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def tanh_f(x):
    """tanh(x)."""
    return ftanh(x)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def tanh_df(x):
    """tanh'(x) = sech^2(x) = 4e / (1 + e)^2 with e = exp(-2|x|) (no 1 - tanh^2 cancellation)."""
    e = fexp(like(x, -2.0) * abs(x))
    d = like(x, 1.0) + e
    return like(x, 4.0) * e / (d * d)


@njit(cache=True, error_model="numpy", fastmath=_FM, inline="always")
def softplus_f(x):
    """softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): finite for any finite x."""
    pos = x if x > 0 else like(x, 0.0)
    return pos + flog1p(fexp(-abs(x)))


@njit(cache=True, error_model="numpy", fastmath=_FM)
def softplus_df(x):
    """softplus'(x) = sigmoid(x)."""
    return _sigmoid_pair(x)[0]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def silu_f(x):
    """silu(x) = x * sigmoid(x)."""
    return x * _sigmoid_pair(x)[0]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def silu_df(x):
    """silu'(x) = s (1 + x sigmoid(-x)), s = sigmoid(x); its limit 0 at x = -inf."""
    s, sm = _sigmoid_pair(x)
    return s * (like(x, 1.0) + x * sm) if s != 0 else s


@njit(cache=True, error_model="numpy", fastmath=_FM, inline="always")
def gelu_f(x):
    """gelu(x) = x Phi(x) (exact GELU; Phi through erfc, accurate in the lower tail)."""
    return x * fnormcdf(x)


@njit(cache=True, error_model="numpy", fastmath=_FM, inline="always")
def gelu_df(x):
    """gelu'(x) = Phi(x) + x phi(x); its limit 0 at x = -inf."""
    pdf = fnormpdf(x)
    cdf = fnormcdf(x)
    return cdf + x * pdf if pdf != 0 else cdf


@njit(cache=True, error_model="numpy", fastmath=_FM)
def gelu_tanh_f(x):
    """gelu_tanh(x) = x (1 + tanh(u)) / 2 = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).

    The sigmoid form is the same function without the cancellation of 1 + tanh(u) for x < 0.
    """
    u2 = like(x, 2.0 * _SQRT_2_OVER_PI) * (x + like(x, _GELU_TANH_A) * x * x * x)
    return x * _sigmoid_pair(u2)[0]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def gelu_tanh_df(x):
    """gelu_tanh'(x) = s + 2x s (1 - s) u', s = sigmoid(2u), u' = sqrt(2/pi)(1 + 3 a x^2)."""
    u2 = like(x, 2.0 * _SQRT_2_OVER_PI) * (x + like(x, _GELU_TANH_A) * x * x * x)
    s, sm = _sigmoid_pair(u2)
    t = s * sm
    du2 = like(x, 2.0 * _SQRT_2_OVER_PI) * (like(x, 1.0) + like(x, 3.0 * _GELU_TANH_A) * x * x)
    # t == 0 where x^2 may overflow: skip the 0 * inf term (its limit is 0).
    return s + x * t * du2 if t != 0 else s


# --- VJP g * sqrt'(x) rounded once (float32) ----------------------------------------------
#
# ``sqrt_vjp(x, g)`` is ``g * sqrt_df(x)``. In float32, g * (0.5 / sqrt(x)) rounds three times;
# the float32 path forms 1 / sqrt(x) to ~1e-14 in float64 (a float32 estimate and one Newton
# step: multiplies only, as fast as the float32 formula) and rounds g / 2 times it once. float64
# is ``g * sqrt_df(x)`` unchanged. The pure-Python body serves interpreted callers.

def sqrt_vjp(x, g):
    """g * sqrt'(x) = g / (2 sqrt(x))."""
    return g * sqrt_df(x)


_INF32 = np.float32(np.inf)


@njit(cache=True, error_model="numpy", fastmath=_FM, inline="always")
def _sqrt_vjp32(x, g):
    # r0 = 1 / sqrt(x) in float32 (relative error ~1e-7), one Newton step in float64 (~1e-14).
    # (float64 sqrt and division instead take 3x as long.) x = 0 or inf: r0 = inf or 0 is
    # exact (Newton's 0 * inf would give nan); x < 0: nan.
    r0 = np.float32(1.0) / math.sqrt(x)
    rd = np.float64(r0)
    r = rd * (1.5 - 0.5 * np.float64(x) * rd * rd)
    r = rd if (x == 0 or x == _INF32) else r
    return np.float32(0.5 * np.float64(g) * r)


def _sqrt_vjp_typer(x, g):
    if x == types.float32 and g == types.float32:
        return lambda x, g: _sqrt_vjp32(x, g)
    if x == types.float64 and g == types.float64:
        return lambda x, g: g * sqrt_df(x)
    return None


overload(sqrt_vjp, inline="always")(_sqrt_vjp_typer)


# activation name (DESIGN.md's names, ``linear`` = identity) -> (f, df); leaky_relu's pair
# takes the slope as a second argument.
ACTIVATIONS = {
    "linear": (identity_f, identity_df),
    "identity": (identity_f, identity_df),
    "relu": (relu_f, relu_df),
    "leaky_relu": (leaky_relu_f, leaky_relu_df),
    "tanh": (tanh_f, tanh_df),
    "sigmoid": (sigmoid_f, sigmoid_df),
    "silu": (silu_f, silu_df),
    "gelu": (gelu_f, gelu_df),
    "gelu_tanh": (gelu_tanh_f, gelu_tanh_df),
    "softplus": (softplus_f, softplus_df),
}
