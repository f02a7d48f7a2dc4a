"""Scalar value and derivative of every unary op: one source, compiled for the CPU and for CUDA.

Every op ``<name>`` has ``<name>_f(x)`` (the value), ``<name>_df(x)`` and ``<name>_d2f(x)``
(its derivatives at ``x``; ``leaky_relu``'s take the slope second), written once as plain Python
against a small math shim (``MATH_SHIM``: ``exp``, ``log``, ``sqrt``, ``normcdf``, ``like``,
...). ``@scalar_source`` compiles each here with ``@njit`` (float32 or float64, the result in
``x``'s type) for fastlib's elementwise, Dense, LSTM and attention kernels, and records its
source in ``SOURCES``; ``fastlib.cuda.scalar`` compiles the same sources as device functions
over its own shim. Also here: the once-rounded VJPs ``<name>_vjp(x, g)`` of exp, log, sqrt,
tanh, sigmoid, silu, gelu and gelu_tanh. docs/fastlib.md explains the compile options, the
kink conventions and the accuracy choices.
"""
from __future__ import annotations

import math
from fractions import Fraction
from math import sqrt

import numpy as np
from numba import njit, types
from numba.extending import overload

from fastlib import config
from fastlib.kernels.vecmath import _exp64, _normcdf64, dd_add_d, dd_div, dd_exp, dd_mul
from fastlib.kernels.vecmath import dd_mul_d, fast_two_sum, like, two_prod, two_sum
# The math shim: the names the shared sources call, bound to the CPU's vectorisable versions
# (fastlib.cuda.scalar binds the same names to device functions).
from fastlib.kernels.vecmath import fexp as exp
from fastlib.kernels.vecmath import flog as log
from fastlib.kernels.vecmath import flog1p as log1p
from fastlib.kernels.vecmath import fnormcdf as normcdf
from fastlib.kernels.vecmath import fnormpdf as normpdf
from fastlib.kernels.vecmath import ftanh as tanh

_FM = config.FASTMATH
#: Options of a small function every loop inlines: LLVM's inlining (``forceinline``: its
#: ``alwaysinline``), not Numba's IR inlining, which copies and types a body again at every call
#: site. Each function is typed once per signature, and LLVM still inlines it before the loop
#: vectoriser runs (``fastlib.kernels.elementwise`` uses the same).
INLINED = {"error_model": "numpy", "fastmath": _FM, "forceinline": True}
_SQRT_2_OVER_PI = 0.79788456080286535588
_GELU_TANH_A = 0.044715

#: The names a scalar source may call besides builtins, its sibling sources and number
#: constants; each compile target binds every one of them.
MATH_SHIM = ("exp", "log", "log1p", "sqrt", "tanh", "normcdf", "normpdf", "like")
SHIM = {name: globals()[name] for name in MATH_SHIM}

#: name -> the plain Python function of each scalar source, in definition order.
SOURCES = {}


def scalar_source(fn=None, *, inline=False):
    """Record ``fn`` as a scalar source and return its CPU compile.

    Parameters
    ----------
    fn : function, optional
        Plain Python over ``MATH_SHIM``, builtins, other sources and number constants.
    inline : bool
        Inline at Numba's IR level (``inline="always"``): for the largest functions, which
        grow past LLVM's inlining threshold and would stop the caller's loop from vectorising.
        (IR level on purpose: with LLVM's ``alwaysinline`` instead, a GELU Dense layer's
        trained weights came out with other bits, measured; FMA contraction, most likely.)

    Returns
    -------
    numba dispatcher
        ``@njit(cache=True, error_model="numpy")`` with FMA contraction only: IEEE division
        (``log_df(0)`` is inf, never a ``ZeroDivisionError``), whatever the caller uses.
    """
    def compile_cpu(fn):
        SOURCES[fn.__name__] = fn
        options = {"inline": "always"} if inline else {}
        return njit(cache=True, error_model="numpy", fastmath=_FM, **options)(fn)
    return compile_cpu if fn is None else compile_cpu(fn)


# --- building blocks -----------------------------------------------------------------------

@scalar_source
def _sigmoid_pair(x):
    """(sigmoid(x), sigmoid(-x)) from one exp(-|x|): both with full relative accuracy."""
    e = exp(-abs(x))
    one = like(x, 1.0)
    big = one / (one + e)       # the one of the pair that is >= 1/2
    small = e / (one + e)
    return (big, small) if x >= 0 else (small, big)


# --- simple ops ----------------------------------------------------------------------------

@scalar_source
def identity_f(x):
    """identity(x) = x."""
    return x


@scalar_source
def identity_df(x):
    """identity'(x) = 1."""
    return like(x, 1.0)


@scalar_source
def identity_d2f(x):
    """identity''(x) = 0."""
    return like(x, 0.0)


@scalar_source
def neg_f(x):
    """neg(x) = -x."""
    return -x


@scalar_source
def neg_df(x):
    """neg'(x) = -1."""
    return like(x, -1.0)


@scalar_source
def neg_d2f(x):
    """neg''(x) = 0."""
    return like(x, 0.0)


@scalar_source
def square_f(x):
    """square(x) = x * x."""
    return x * x


@scalar_source
def square_df(x):
    """square'(x) = 2x."""
    return x + x


@scalar_source
def square_d2f(x):
    """square''(x) = 2."""
    return like(x, 2.0)


@scalar_source
def abs_f(x):
    """abs(x) = |x|."""
    return abs(x)


@scalar_source
def abs_df(x):
    """abs'(x) = sign(x). NOTE: abs'(0) = 0 (the sign convention of CONTRACTS.md)."""
    one = like(x, 1.0)
    zero = like(x, 0.0)
    return one if x > 0 else (-one if x < 0 else zero)


@scalar_source
def abs_d2f(x):
    """abs''(x) = 0 (the derivative of the piece the value selects, at the kink too)."""
    return like(x, 0.0)


@scalar_source
def exp_f(x):
    """exp(x)."""
    return exp(x)


@scalar_source
def exp_df(x):
    """exp'(x) = exp(x)."""
    return exp(x)


@scalar_source
def exp_d2f(x):
    """exp''(x) = exp(x)."""
    return exp(x)


@scalar_source
def log_f(x):
    """log(x); IEEE: log(0) = -inf, log(x < 0) = nan."""
    return log(x)


@scalar_source
def log_df(x):
    """log'(x) = 1 / x."""
    return like(x, 1.0) / x


@scalar_source
def log_d2f(x):
    """log''(x) = -1 / x^2."""
    return like(x, -1.0) / (x * x)


@scalar_source
def log_vjp(x, g):
    """g * log'(x) = g / x, rounded once."""
    return g / x


@scalar_source
def sqrt_f(x):
    """sqrt(x); IEEE: sqrt(x < 0) = nan."""
    return sqrt(x)


@scalar_source
def sqrt_df(x):
    """sqrt'(x) = 1 / (2 sqrt(x)); inf at 0."""
    return like(x, 0.5) / sqrt(x)


@scalar_source
def sqrt_d2f(x):
    """sqrt''(x) = -1 / (4 x sqrt(x))."""
    return like(x, -0.25) / (x * sqrt(x))


# --- activations ---------------------------------------------------------------------------

@scalar_source
def relu_f(x):
    """relu(x) = max(x, 0); NaN propagates (as in PyTorch)."""
    return like(x, 0.0) if x <= 0 else x


@scalar_source
def relu_df(x):
    """relu'(x). NOTE: 1 if x > 0 else 0, so relu'(0) = 0 (the Loom convention)."""
    return like(x, 1.0) if x > 0 else like(x, 0.0)


@scalar_source
def relu_d2f(x):
    """relu''(x) = 0 (the derivative of the piece the value selects, at the kink too)."""
    return like(x, 0.0)


@scalar_source
def leaky_relu_f(x, slope):
    """leaky_relu(x) = x if x > 0 else slope * x."""
    return x if x > 0 else x * like(x, slope)


@scalar_source
def leaky_relu_df(x, slope):
    """leaky_relu'(x). NOTE: 1 if x > 0 else slope, so leaky_relu'(0) = slope."""
    return like(x, 1.0) if x > 0 else like(x, slope)


@scalar_source
def leaky_relu_d2f(x, slope):
    """leaky_relu''(x) = 0 (the derivative of the piece the value selects, at the kink too)."""
    return like(x, 0.0)


@scalar_source
def sigmoid_f(x):
    """sigmoid(x) = 1 / (1 + exp(-x)), from exp(-|x|) so that it never overflows."""
    return _sigmoid_pair(x)[0]


@scalar_source
def sigmoid_df(x):
    """sigmoid'(x) = sigmoid(x) sigmoid(-x) = e / (1 + e)^2 with e = exp(-|x|)."""
    e = exp(-abs(x))
    d = like(x, 1.0) + e
    return e / (d * d)


@scalar_source
def sigmoid_d2f(x):
    """sigmoid''(x) = s (1 - s) (1 - 2s) = s sigmoid(-x) (sigmoid(-x) - s), s = sigmoid(x):
    no 1 - s is formed by subtraction (it would cancel once s saturates)."""
    s, sm = _sigmoid_pair(x)
    return s * sm * (sm - s)


@scalar_source
def tanh_f(x):
    """tanh(x)."""
    return tanh(x)


@scalar_source
def tanh_df(x):
    """tanh'(x) = sech^2(x) = 4e / (1 + e)^2 with e = exp(-2|x|) (no 1 - tanh^2 cancellation)."""
    e = exp(like(x, -2.0) * abs(x))
    d = like(x, 1.0) + e
    return like(x, 4.0) * e / (d * d)


@scalar_source
def tanh_d2f(x):
    """tanh''(x) = -2 tanh(x) tanh'(x)."""
    return like(x, -2.0) * tanh(x) * tanh_df(x)


@scalar_source(inline=True)
def softplus_f(x):
    """softplus(x) = log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): finite for any finite x."""
    pos = x if x > 0 else like(x, 0.0)
    return pos + log1p(exp(-abs(x)))


@scalar_source
def softplus_df(x):
    """softplus'(x) = sigmoid(x)."""
    return _sigmoid_pair(x)[0]


@scalar_source
def softplus_d2f(x):
    """softplus''(x) = sigmoid'(x) = s sigmoid(-x)."""
    s, sm = _sigmoid_pair(x)
    return s * sm


@scalar_source
def silu_f(x):
    """silu(x) = x * sigmoid(x)."""
    return x * _sigmoid_pair(x)[0]


@scalar_source
def silu_df(x):
    """silu'(x) = s (1 + x sigmoid(-x)), s = sigmoid(x); its limit 0 at x = -inf."""
    s, sm = _sigmoid_pair(x)
    return s * (like(x, 1.0) + x * sm) if s != 0 else s


@scalar_source
def silu_d2f(x):
    """silu''(x) = t (2 + x (sigmoid(-x) - s)), t = s sigmoid(-x); its limit 0 where t is 0."""
    s, sm = _sigmoid_pair(x)
    t = s * sm
    return t * (like(x, 2.0) + x * (sm - s)) if t != 0 else t


@scalar_source(inline=True)
def gelu_f(x):
    """gelu(x) = x Phi(x) (exact GELU; Phi through erfc, accurate in the lower tail)."""
    return x * normcdf(x)


@scalar_source(inline=True)
def gelu_df(x):
    """gelu'(x) = Phi(x) + x phi(x); its limit 0 at x = -inf."""
    pdf = normpdf(x)
    cdf = normcdf(x)
    return cdf + x * pdf if pdf != 0 else cdf


@scalar_source(inline=True)
def gelu_d2f(x):
    """gelu''(x) = phi(x) (2 - x^2); its limit 0 where phi is 0."""
    pdf = normpdf(x)
    return pdf * (like(x, 2.0) - x * x) if pdf != 0 else pdf


@scalar_source
def gelu_tanh_f(x):
    """gelu_tanh(x) = x (1 + tanh(u)) / 2 = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).

    The sigmoid form is the same function without the cancellation of 1 + tanh(u) for x < 0.
    """
    u2 = like(x, 2.0 * _SQRT_2_OVER_PI) * (x + like(x, _GELU_TANH_A) * x * x * x)
    return x * _sigmoid_pair(u2)[0]


@scalar_source
def gelu_tanh_df(x):
    """gelu_tanh'(x) = s + 2x s (1 - s) u', s = sigmoid(2u), u' = sqrt(2/pi)(1 + 3 a x^2)."""
    u2 = like(x, 2.0 * _SQRT_2_OVER_PI) * (x + like(x, _GELU_TANH_A) * x * x * x)
    s, sm = _sigmoid_pair(u2)
    t = s * sm
    du2 = like(x, 2.0 * _SQRT_2_OVER_PI) * (like(x, 1.0) + like(x, 3.0 * _GELU_TANH_A) * x * x)
    # t == 0 where x^2 may overflow: skip the 0 * inf term (its limit is 0).
    return s + x * t * du2 if t != 0 else s


@scalar_source
def gelu_tanh_d2f(x):
    """gelu_tanh''(x) = t (2 du2 + 12 c a x^2 + x du2^2 (1 - 2s)), s = sigmoid(2u), t = s (1 - s),
    du2 = 2u' (the derivative of x sigmoid(2u) twice); its limit 0 where t is 0."""
    u2 = like(x, 2.0 * _SQRT_2_OVER_PI) * (x + like(x, _GELU_TANH_A) * x * x * x)
    s, sm = _sigmoid_pair(u2)
    t = s * sm
    du2 = like(x, 2.0 * _SQRT_2_OVER_PI) * (like(x, 1.0) + like(x, 3.0 * _GELU_TANH_A) * x * x)
    curve = like(x, 12.0 * _SQRT_2_OVER_PI * _GELU_TANH_A) * x * x
    return t * (like(x, 2.0) * du2 + curve + x * du2 * du2 * (sm - s)) if t != 0 else t


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


@njit(cache=True, **INLINED)
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


overload(sqrt_vjp, jit_options=INLINED)(_sqrt_vjp_typer)


# --- VJPs g * f'(x) of the elementwise ops, rounded once -----------------------------------
#
# ``<name>_vjp(x, g)`` is ``g * <name>_df(x)``, evaluated so that the product rounds once:
#
# - float32 sigmoid and silu: the derivative and the product in float64 (``_exp64``, relative
#   error < 1e-14, vectorisable), rounded to float32 at the end: correctly rounded but for
#   values within ~1e-14 of a rounding boundary. (The float32 formulas round five to seven
#   times: their median errors were 0.54 and 0.51 ULP, PyTorch's 0.47.) About twice the
#   float32 formula's time, still 2-3x faster than NumPy. float64 is ``g * <name>_df(x)``.
# - float32 exp and tanh: likewise (``_exp64``, rounded once at the end). Their float32
#   formulas round two (exp: exp(x), then the product) to five times (tanh), and their median
#   errors ended up farther from exact than PyTorch's; rounded once, they are correctly
#   rounded but for values within ~1e-14 of a rounding boundary.
# - float64 silu: in double-double (``_silu_vjp64``), since 1 + x (1 - s) cancels for x < 0.
# - float64 gelu and gelu_tanh: in double-double (``vecmath``'s dd arithmetic and ``dd_exp``),
#   since both derivatives cancel for x < 0 (Phi(x) + x phi(x); s (1 + x (1 - s) 2u')): float64
#   formulas were 4-6 ULPs off where the derivative is well conditioned. float32 is
#   ``g * <name>_df(x)`` (its Phi and phi are already float64 inside).
#
# NOTE (a promise the conformance suite holds fastlib to, ``fastlib.ops.ROUNDED_ONCE``): the
# VJPs below, in these dtypes, are the exact value rounded once up to float64 rounding.
# (float32 gelu and gelu_tanh round twice; float64 gelu's double-double covers part of the
# line only, so neither is declared.)
ROUNDED_ONCE_VJP_DTYPES = {"sqrt": ("float32",), "sigmoid": ("float32",), "silu": ("float32",)}
#
# The ``*_df`` functions stay as they are for the fused layer kernels (their speed matters
# more there). Pure-Python bodies serve interpreted callers.

def exp_vjp(x, g):
    """g * exp'(x)."""
    return g * exp_df(x)


def tanh_vjp(x, g):
    """g * tanh'(x)."""
    return g * tanh_df(x)


def sigmoid_vjp(x, g):
    """g * sigmoid'(x)."""
    return g * sigmoid_df(x)


def silu_vjp(x, g):
    """g * silu'(x)."""
    return g * silu_df(x)


def gelu_vjp(x, g):
    """g * gelu'(x)."""
    return g * gelu_df(x)


def gelu_tanh_vjp(x, g):
    """g * gelu_tanh'(x)."""
    return g * gelu_tanh_df(x)


# exp(-a) is 0 in float64 beyond this; ``_exp64`` clamps its argument at -700 instead.
_EXP64_ZERO = 745.2


@njit(cache=True, **INLINED)
def _exp_neg64(a):
    """exp(-a) for float64 a >= 0 (0 beyond 745.2, inf included), vectorisable."""
    return _exp64(-a) if a < _EXP64_ZERO else 0.0


@njit(cache=True, **INLINED)
def _sigmoid_vjp32(x, g):
    # g e / (1 + e)^2, e = exp(-|x|), in float64
    e = _exp_neg64(abs(np.float64(x)))
    d = 1.0 + e
    y = np.float32(np.float64(g) * e / (d * d))
    return y if x == x else x


@njit(cache=True, **INLINED)
def _exp_vjp32(x, g):
    # g exp(x) in float64 (``_exp64``: relative error < 1e-14), rounded once to float32; the
    # float32 formula rounds exp(x) and then the product. Beyond float32's exp range ``_exp64``
    # clamps, and the float32 product rounds to 0 or inf as the exact value does; x = +inf
    # keeps IEEE's g * inf.
    y = np.float32(np.float64(g) * _exp64(np.float64(x)))
    y = g * x if x == _INF32 else y
    return y if x == x else x


@njit(cache=True, **INLINED)
def _tanh_vjp32(x, g):
    # g 4e / (1 + e)^2, e = exp(-2|x|), in float64, rounded once (the float32 formula rounds
    # five times); |x| beyond 372.6 gives e = 0 (and 0 for the result in float32 too).
    e = _exp_neg64(2.0 * abs(np.float64(x)))
    d = 1.0 + e
    q = d * d
    # 1 / q as a float32 reciprocal (8 lanes, relative error ~6e-8) and one Newton step in
    # float64 (~4e-15): a float64 division would take twice the whole kernel's time
    r = np.float64(np.float32(1.0) / np.float32(q))
    r = r * (2.0 - q * r)
    y = np.float32(np.float64(g) * (4.0 * e) * r)
    return y if x == x else x


@njit(cache=True, **INLINED)
def _silu_vjp32(x, g):
    # g s (1 + x sigmoid(-x)) in float64; 0 where s is 0 (x = -inf: its limit)
    xd = np.float64(x)
    e = _exp_neg64(abs(xd))
    r = 1.0 / (1.0 + e)
    small = e * r
    s = r if xd >= 0 else small
    sm = small if xd >= 0 else r
    v = s * (1.0 + xd * sm) if s != 0 else 0.0
    y = np.float32(np.float64(g) * v)
    return y if x == x else x


# dd constants: 1/sqrt(2 pi), 2 sqrt(2/pi), a = 0.044715 and 3a (exactly the spec's 44715/10^6)
_INV_SQRT_2PI_DD = (0.3989422804014327, -2.49232720227773e-17)
_TWO_SQRT_2_OVER_PI_DD = (1.5957691216057308, -9.96930880911092e-17)
_GELU_A_DD = (0.044715, 2.1960211427085595e-18)
_GELU_3A_DD = (0.134145, 1.3526957332032908e-17)
_GELU_DD_RANGE = 3.0         # gelu: Phi's series in dd on |x| <= 3 (below -3 the float64
#                              formula cancels by less than 1.3x, and kappa > 8)
_GELU_DD_TOP = 40.0          # gelu: 1 - Q + x phi in dd up to here (phi(40) = 0 in float64)
_GELU_SERIES_TOL = 2.0 ** -88
# 1 / (2k + 1) as dd pairs, k = 0..79 (the series needs at most ~45 terms on |x| <= 3)
_RECIP_ODD_HI = np.array([1.0 / (2 * k + 1) for k in range(80)])
_RECIP_ODD_LO = np.array([float(Fraction(1, 2 * k + 1) - Fraction(1.0 / (2 * k + 1)))
                          for k in range(80)])
_GELU_TANH_DD_RANGE = 30.0   # gelu_tanh: beyond it s is 0 or 1 in float64 (exp(-1974))


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _gelu_vjp64(x, g):
    """g (Phi(x) + x phi(x)) for float64 x, in dd on -3 <= x <= 40, rounded once.

    phi(x) = exp(-x^2 / 2) / sqrt(2 pi) with x^2 exact and ``dd_exp``. On |x| <= 3,
    gelu'(x) = 1/2 + phi(x) (x + sum_k x^(2k+1) / (2k+1)!!) (Phi's series, all terms of x's
    sign), summed until a term is below 2**-88 of the sum (at most ~45 terms at |x| = 3): Phi's
    1/2 + phi S then loses at most a factor 370 (x = -3) of that, and the sum with x phi a
    further factor 1 / |gelu'(x)| <= 90 at the root's edge of kappa <= 8: 1e-21 relative.
    On 3 < x <= 40, gelu'(x) = 1 - Q(x) + x phi(x) with the upper tail Q(x) = Phi(-x) <= 1.4e-3
    in float64 (``_normcdf64``, a few ulp of Q: below 0.01 ulp of the result). Below -3 (kappa >
    8, the float64 formula cancels by at most 1.3x) and above 40 (gelu' = 1), ``gelu_df``.
    """
    if not (x >= -_GELU_DD_RANGE and x <= _GELU_DD_TOP):
        return g * gelu_df(x)
    sh, sl = two_prod(x, x)
    ph, pl = dd_exp(-0.5 * sh, -0.5 * sl)
    ph, pl = dd_mul(ph, pl, _INV_SQRT_2PI_DD[0], _INV_SQRT_2PI_DD[1])
    if x > _GELU_DD_RANGE:
        ah, al = dd_mul_d(ph, pl, x)                 # x phi(x)
        ah, al = dd_add_d(ah, al, -_normcdf64(-x))
        ah, al = dd_add_d(ah, al, 1.0)
        return dd_mul_d(ah, al, g)[0]
    th = x
    tl = 0.0
    ah = x
    al = 0.0
    k = 1
    while abs(th) > _GELU_SERIES_TOL * abs(ah) and k < _RECIP_ODD_HI.size:
        th, tl = dd_mul(th, tl, sh, sl)
        th, tl = dd_mul(th, tl, _RECIP_ODD_HI[k], _RECIP_ODD_LO[k])     # / (2k + 1)
        # the terms all have x's sign: the cheap dd sum (no cancellation to guard against)
        ah, e = two_sum(ah, th)
        ah, al = fast_two_sum(ah, e + (al + tl))
        k += 1
    ah, al = dd_add_d(ah, al, x)                 # x + series
    ah, al = dd_mul(ah, al, ph, pl)
    ah, al = dd_add_d(ah, al, 0.5)
    return dd_mul_d(ah, al, g)[0]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _gelu_tanh_vjp64(x, g):
    """g s (1 + x (1 - s) 2u'(x)) for float64 x, s = sigmoid(2u), in dd on |x| <= 30, rounded
    once (``gelu_tanh_df`` beyond, where s is exactly 0 or 1 in float64)."""
    if not (abs(x) <= _GELU_TANH_DD_RANGE):
        return g * gelu_tanh_df(x)
    x2h, x2l = two_prod(x, x)
    ah, al = dd_mul_d(x2h, x2l, x)                           # x^3
    ah, al = dd_mul(ah, al, _GELU_A_DD[0], _GELU_A_DD[1])
    ah, al = dd_add_d(ah, al, x)                             # x + a x^3
    uh, ul = dd_mul(ah, al, _TWO_SQRT_2_OVER_PI_DD[0], _TWO_SQRT_2_OVER_PI_DD[1])   # 2u
    neg = uh < 0
    eh, el = dd_exp(uh if neg else -uh, ul if neg else -ul)  # exp(-|2u|)
    dh, dl = dd_add_d(eh, el, 1.0)
    bh, bl = dd_div(1.0, 0.0, dh, dl)                        # the larger of s, 1 - s
    mh, ml = dd_mul(eh, el, bh, bl)                          # the smaller
    s_h, s_l = (mh, ml) if neg else (bh, bl)
    c_h, c_l = (bh, bl) if neg else (mh, ml)                 # 1 - s
    qh, ql = dd_mul(x2h, x2l, _GELU_3A_DD[0], _GELU_3A_DD[1])
    qh, ql = dd_add_d(qh, ql, 1.0)
    qh, ql = dd_mul(qh, ql, _TWO_SQRT_2_OVER_PI_DD[0], _TWO_SQRT_2_OVER_PI_DD[1])   # 2u'
    qh, ql = dd_mul(qh, ql, c_h, c_l)
    qh, ql = dd_mul_d(qh, ql, x)
    qh, ql = dd_add_d(qh, ql, 1.0)
    qh, ql = dd_mul(qh, ql, s_h, s_l)
    return dd_mul_d(qh, ql, g)[0]


_SILU_DD_RANGE = 745.2       # silu: beyond it exp(-|x|) is 0 in float64 (s is 0 or 1)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _silu_vjp64(x, g):
    """g s (1 + x (1 - s)) for float64 x, s = sigmoid(x), in dd, rounded once.

    NOTE: 1 + x (1 - s) cancels for x < 0 (to -0.28 at the derivative's root near -1.28, where
    s is rounded too): the float64 formula was 7-9 ulp off on well-conditioned elements. Here
    e = exp(-|x|) in dd, the pair (1 / (1 + e), e / (1 + e)) = (the larger, the smaller of s
    and 1 - s) in dd, so no 1 - s is ever formed by subtraction, and the product is rounded
    once. Beyond |x| = 745.2, s is exactly 0 (the VJP's limit 0) or 1 (the VJP is g).
    """
    if not (abs(x) < _SILU_DD_RANGE):
        if x != x:
            return x
        return g if x > 0 else 0.0 * g
    eh, el = dd_exp(-abs(x), 0.0)
    dh, dl = dd_add_d(eh, el, 1.0)
    bh, bl = dd_div(1.0, 0.0, dh, dl)                   # the larger of s, 1 - s
    mh, ml = dd_mul(eh, el, bh, bl)                     # the smaller
    s_h, s_l = (bh, bl) if x >= 0 else (mh, ml)
    c_h, c_l = (mh, ml) if x >= 0 else (bh, bl)         # 1 - s
    qh, ql = dd_mul_d(c_h, c_l, x)
    qh, ql = dd_add_d(qh, ql, 1.0)
    qh, ql = dd_mul(qh, ql, s_h, s_l)
    return dd_mul_d(qh, ql, g)[0]


def _vjp_typer(f32_impl, f64_impl):
    def typer(x, g):
        if x == types.float32 and g == types.float32:
            return f32_impl
        if x == types.float64 and g == types.float64:
            return f64_impl
        return None
    return typer


overload(exp_vjp, jit_options=INLINED)(_vjp_typer(lambda x, g: _exp_vjp32(x, g),
                                                  lambda x, g: g * exp_df(x)))
overload(tanh_vjp, jit_options=INLINED)(_vjp_typer(lambda x, g: _tanh_vjp32(x, g),
                                                   lambda x, g: g * tanh_df(x)))
overload(sigmoid_vjp, jit_options=INLINED)(_vjp_typer(lambda x, g: _sigmoid_vjp32(x, g),
                                                      lambda x, g: g * sigmoid_df(x)))
overload(silu_vjp, jit_options=INLINED)(_vjp_typer(lambda x, g: _silu_vjp32(x, g),
                                                   lambda x, g: _silu_vjp64(x, g)))
overload(gelu_vjp, jit_options=INLINED)(_vjp_typer(lambda x, g: g * gelu_df(x),
                                                   lambda x, g: _gelu_vjp64(x, g)))
overload(gelu_tanh_vjp, jit_options=INLINED)(_vjp_typer(lambda x, g: g * gelu_tanh_df(x),
                                                        lambda x, g: _gelu_tanh_vjp64(x, g)))
