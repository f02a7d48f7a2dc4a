"""Vectorisable transcendental functions for the kernels, dispatched on the scalar type.

Numba lowers ``math.exp`` and friends to scalar libm calls, which LLVM cannot vectorise (no
SVML here): float32 ``tanh`` through libm runs ~80x slower than NumPy's SIMD loop. So the
float32 path uses branch-free polynomial implementations (Cephes' single-precision
coefficients, range reduction with a bit-cast exponent) that LLVM turns into AVX loops. The
float64 path calls libm: float64 is the accuracy-first dtype and is not benchmarked.

The long story: docs/fastlib.md, section ``fastlib/kernels/vecmath.py``.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from fastlib import config

# NOTE: every function here is compiled with IEEE division (error_model="numpy": no
# zero-division test in the loop, which would stop vectorisation) and FMA contraction only.
# The float32 bodies are ``forceinline``: LLVM inlines each into its caller before the loop
# vectoriser runs, and Numba types and lowers each once per signature.
_FM = config.FASTMATH
_f32 = np.float32


# --- exponent-field intrinsics (32-bit integer lanes, so that loops vectorise 16 wide) -----

def _f32_intrinsic(build):
    """A float32 -> float32 intrinsic whose body ``build(builder, x)`` works on the bits."""
    def typer(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, signature, args):
            return build(builder, args[0])

        return types.float32(types.float32), codegen
    return intrinsic(typer)


_I32 = ir.IntType(32)


def _build_pow2(builder, n):
    # 2**n for an integral float32 n in [-126, 127]: the exponent field (n + 127) << 23
    k = builder.add(builder.fptosi(n, _I32), ir.Constant(_I32, 127))
    return builder.bitcast(builder.shl(k, ir.Constant(_I32, 23)), ir.FloatType())


def _build_exponent(builder, x):
    # e with x = m * 2**e, m in [0.5, 1), for a positive normal x: biased exponent - 126
    bits = builder.bitcast(x, _I32)
    e = builder.and_(builder.lshr(bits, ir.Constant(_I32, 23)), ir.Constant(_I32, 0xFF))
    return builder.sitofp(builder.sub(e, ir.Constant(_I32, 126)), ir.FloatType())


def _build_mantissa(builder, x):
    # m in [0.5, 1) with the mantissa bits of x (exponent field set to 126)
    bits = builder.and_(builder.bitcast(x, _I32), ir.Constant(_I32, 0x007FFFFF))
    return builder.bitcast(builder.or_(bits, ir.Constant(_I32, 0x3F000000)), ir.FloatType())


_pow2 = _f32_intrinsic(_build_pow2)
_exponent = _f32_intrinsic(_build_exponent)
_mantissa = _f32_intrinsic(_build_mantissa)


# --- float32 exp ---------------------------------------------------------------------------

_LOG2E = _f32(1.44269504088896341)
_LN2_HI = _f32(0.693359375)          # few mantissa bits: n * _LN2_HI is exact
_LN2_LO = _f32(-2.12194440e-4)       # ln 2 - _LN2_HI
_EXP_CLAMP_HI = _f32(88.8)           # exp overflows above 88.7228; the clamp keeps n in range
_EXP_CLAMP_LO = _f32(-104.0)         # exp rounds to 0 below -103.9721 (2**-150)
_EP0, _EP1, _EP2 = _f32(1.9875691500e-4), _f32(1.3981999507e-3), _f32(8.3334519073e-3)
_EP3, _EP4, _EP5 = _f32(4.1665795894e-2), _f32(1.6666665459e-1), _f32(5.0000001201e-1)
_ONE = _f32(1.0)
_HALF = _f32(0.5)


@njit(cache=True, error_model="numpy", fastmath=_FM, forceinline=True)
def _exp32(x):
    # exp(x) = 2**n * exp(r), n = round(x / ln 2), |r| <= ln(2)/2 (Cody-Waite two-part ln 2).
    xc = min(max(x, _EXP_CLAMP_LO), _EXP_CLAMP_HI)
    n = np.floor(xc * _LOG2E + _HALF)
    r = xc - n * _LN2_HI - n * _LN2_LO
    p = ((((_EP0 * r + _EP1) * r + _EP2) * r + _EP3) * r + _EP4) * r + _EP5
    y = p * r * r + r + _ONE
    # 2**n in two factors so that results down to the subnormal range round once, correctly.
    n1 = np.floor(n * _HALF)
    y = y * _pow2(n1) * _pow2(n - n1)
    return y if x == x else x


# --- float32 log ---------------------------------------------------------------------------

_SQRT_HALF = _f32(0.707106781186547524)
_FLT_MIN = _f32(1.17549435e-38)
_TWO23 = _f32(8388608.0)
_TWENTY3 = _f32(23.0)
_ZERO = _f32(0.0)
_LP0, _LP1, _LP2 = _f32(7.0376836292e-2), _f32(-1.1514610310e-1), _f32(1.1676998740e-1)
_LP3, _LP4, _LP5 = _f32(-1.2420140846e-1), _f32(1.4249322787e-1), _f32(-1.6668057665e-1)
_LP6, _LP7, _LP8 = _f32(2.0000714765e-1), _f32(-2.4999993993e-1), _f32(3.3333331174e-1)
_INF32 = _f32(np.inf)
_NAN32 = _f32(np.nan)


@njit(cache=True, error_model="numpy", fastmath=_FM, forceinline=True)
def _log32(x):
    # x = m * 2**e with m in [sqrt(1/2), sqrt(2)); log x = e ln 2 + log1p(m - 1), polynomial.
    sub = x < _FLT_MIN                       # subnormal (or <= 0): rescale by 2**23 first
    xs = x * _TWO23 if sub else x
    fe = _exponent(xs) - (_TWENTY3 if sub else _ZERO)
    m = _mantissa(xs)                        # in [0.5, 1)
    low = m < _SQRT_HALF
    fe = fe - _ONE if low else fe
    m = (m + m - _ONE) if low else (m - _ONE)
    z = m * m
    p = ((((((((_LP0 * m + _LP1) * m + _LP2) * m + _LP3) * m + _LP4) * m + _LP5) * m
            + _LP6) * m + _LP7) * m + _LP8)
    y = p * m * z + fe * _LN2_LO - _HALF * z
    y = m + y + fe * _LN2_HI
    # IEEE special cases: log(0) = -inf, log(<0) = nan, log(inf) = inf, nan stays nan.
    y = -_INF32 if x == 0 else y
    y = _NAN32 if x < 0 else y
    y = x if x == _INF32 else y
    return y if x == x else x


@njit(cache=True, error_model="numpy", fastmath=_FM, forceinline=True)
def _log1p32(u):
    # log1p(u) = log(w) + c / w to first order, w = fl(1 + u), c = u - (w - 1) the rounding
    # error of w (exact by Sterbenz while w is in [1/2, 2]; negligible relative to log(w)
    # beyond). NOTE: relies on (1 + u) - 1 being evaluated as written (no reassociation).
    w = _ONE + u
    c = u - (w - _ONE)
    y = _log32(w) + c / w                      # u = -1: -inf + 0/0; selected away below
    y = u if w == _ONE else y
    y = -_INF32 if w == 0 else y
    return w if w == _INF32 else y


# --- float32 tanh ---------------------------------------------------------------------------

# tanh(x) = x P(x^2) / Q(x^2) on |x| <= 7.905 (beyond it tanh rounds to +-1 in float32), the
# rational minimax approximation of Eigen's fast float tanh (degree 13 / 6): one division
# and eleven multiply-adds, half the work of 1 - 2 / (exp(2|x|) + 1). Measured against float64
# tanh on a dense grid: at most 7 ulp (3.5 eps relative, near |x| = 5.8), 0.9 ulp on average.
_TA1, _TA3 = _f32(4.89352455891786e-03), _f32(6.37261928875436e-04)
_TA5 = _f32(1.48572235717979e-05)
_TA7, _TA9 = _f32(5.12229709037114e-08), _f32(-8.60467152213735e-11)
_TA11, _TA13 = _f32(2.00018790482477e-13), _f32(-2.76076847742355e-16)
_TB0, _TB2 = _f32(4.89352518554385e-03), _f32(2.26843463243900e-03)
_TB4, _TB6 = _f32(1.18534705686654e-04), _f32(1.19825839466702e-06)
_TANH_CLAMP = _f32(7.90531110763549805)
_TANH_TINY = _f32(0.0004)                # below it tanh(x) = x to within float32 rounding


@njit(cache=True, error_model="numpy", fastmath=_FM, forceinline=True)
def _tanh32(x):
    xc = min(max(x, -_TANH_CLAMP), _TANH_CLAMP)
    z = xc * xc
    p = ((((((_TA13 * z + _TA11) * z + _TA9) * z + _TA7) * z + _TA5) * z + _TA3) * z + _TA1) * xc
    q = ((_TB6 * z + _TB4) * z + _TB2) * z + _TB0
    y = p / q
    y = x if abs(x) < _TANH_TINY else y
    # beyond the clamp tanh is within 4 ulp of +-1 and rounds to it from |x| = 9.01 on
    y = (_ONE if x > 0 else -_ONE) if abs(x) > _TANH_CLAMP else y
    return y if x == x else x


# --- the normal distribution (GELU) --------------------------------------------------------

@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c with one rounding (llvm.fma; exact error terms of products)."""
    if not (a == b == c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return types.float64(types.float64, types.float64, types.float64), codegen


_SQRT1_2 = 0.70710678118654752440
_SQRT1_2_LO = -4.8336466567264567e-17      # 1/sqrt(2) - _SQRT1_2
_INV_SQRT_2PI = 0.39894228040143267794
_TWO_OVER_SQRT_PI = 1.1283791670955126


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _normcdf64(x):
    # Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation in the lower tail (unlike 1 + erf).
    # NOTE: erfc(z) turns a relative error d of z into 2 z^2 d of the result, so the rounding
    # of z = -x / sqrt 2 alone would cost x^2 ulps (45 at x = -9). z is formed as t + r with
    # r its exact rounding error (fma) and erfc corrected to first order in r.
    t = -x * _SQRT1_2
    r = _fma(-x, _SQRT1_2, -t) - x * _SQRT1_2_LO
    corr = r * _TWO_OVER_SQRT_PI * math.exp(-t * t)
    corr = corr if corr == corr else 0.0        # x = +-inf: inf - inf; erfc(t) is the answer
    return 0.5 * (math.erfc(t) - corr)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _normpdf64(x):
    # exp(-x^2 / 2) with x^2 = s + e exact (fma), so that large |x| keep relative accuracy.
    s = x * x
    if s == math.inf:
        return 0.0
    e = _fma(x, x, -s)
    return _INV_SQRT_2PI * math.exp(-0.5 * s) * (1.0 - 0.5 * e)


# --- float32 Phi and phi, evaluated in float64 without libm (vectorises) -------------------

_I64 = ir.IntType(64)


@intrinsic
def _pow2_f64(typingctx, n):
    """2**n for an integral float64 n in [-1022, 1023] (exponent field (n + 1023) << 52)."""
    if n != types.float64:
        return None

    def codegen(context, builder, signature, args):
        k = builder.add(builder.fptosi(args[0], _I64), ir.Constant(_I64, 1023))
        return builder.bitcast(builder.shl(k, ir.Constant(_I64, 52)), ir.DoubleType())

    return types.float64(types.float64), codegen


_LOG2E64 = 1.4426950408889634
_LN2_HI64 = 6.93147180369123816490e-01     # fdlibm's split of ln 2
_LN2_LO64 = 1.90821492927058770002e-10
(_F2, _F3, _F4, _F5, _F6, _F7, _F8, _F9, _F10, _F11) = (
    1.0 / math.factorial(k) for k in range(2, 12))


@njit(cache=True, error_model="numpy", fastmath=_FM, forceinline=True)
def _exp64(y):
    """exp(y) for float64 y in [-700, 700], relative error < 1e-14 (degree-11 Taylor on
    |r| <= ln(2)/2): enough for results rounded to float32. NaN is not handled."""
    yc = min(max(y, -700.0), 700.0)
    n = np.floor(yc * _LOG2E64 + 0.5)
    r = yc - n * _LN2_HI64 - n * _LN2_LO64
    # written out: a loop over a tuple of constants would not vectorise
    p = ((((((((((_F11 * r + _F10) * r + _F9) * r + _F8) * r + _F7) * r + _F6) * r + _F5)
              * r + _F4) * r + _F3) * r + _F2) * r + 1.0) * r + 1.0
    return p * _pow2_f64(n)


# erfc(z) = t exp(-z^2 + G(t)), t = 1 / (1 + z/2), z in [0, 11] (Numerical Recipes' erfcc form
# with a degree-14 Chebyshev fit of G instead of its degree-9 polynomial): G fitted by least
# squares at 600 Chebyshev nodes against mpmath at 40 digits, max |error| 2.2e-11, so erfc
# has relative error < 3e-11. u = (2t - (T_MIN + 1)) / (1 - T_MIN) maps t to [-1, 1].
_ERFC_ZMAX = 11.0                      # erfc(11) = 1.4e-54: 0 in float32
_ERFC_TMIN = 1.0 / (1.0 + _ERFC_ZMAX / 2)
(_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13, _C14) = (
    -0.5591226861592944, 0.5577013963484134, 0.008046848362563096, -0.006614353692307264,
    -0.00019772143821081392, 0.0001941291541305667, -1.1693709603097952e-06,
    -7.209748678329134e-06, 5.610615388501566e-07, 2.581468147100853e-07,
    -4.8958942863871985e-08, -6.508187654277139e-09, 2.967764356710292e-09,
    -5.619861252549006e-11, -1.3036073659859456e-10)


@njit(cache=True, error_model="numpy", fastmath=_FM, forceinline=True)
def _erfc_small_tail(z):
    """erfc(z) for 0 <= z <= _ERFC_ZMAX, relative error < 3e-11, branch-free.

    G(u) = sum c_k T_k(u) by Clenshaw's recurrence, written out (b_k = 2u b_{k+1} - b_{k+2}
    + c_k) so that it vectorises.
    """
    t = 1.0 / (1.0 + 0.5 * z)
    u = (2.0 * t - (_ERFC_TMIN + 1.0)) / (1.0 - _ERFC_TMIN)
    u2 = u + u
    b14 = _C14
    b13 = u2 * b14 + _C13
    b12 = u2 * b13 - b14 + _C12
    b11 = u2 * b12 - b13 + _C11
    b10 = u2 * b11 - b12 + _C10
    b9 = u2 * b10 - b11 + _C9
    b8 = u2 * b9 - b10 + _C8
    b7 = u2 * b8 - b9 + _C7
    b6 = u2 * b7 - b8 + _C6
    b5 = u2 * b6 - b7 + _C5
    b4 = u2 * b5 - b6 + _C4
    b3 = u2 * b4 - b5 + _C3
    b2 = u2 * b3 - b4 + _C2
    b1 = u2 * b2 - b3 + _C1
    g = u * b1 - b2 + _C0
    return t * _exp64(g - z * z)


@njit(cache=True, error_model="numpy", fastmath=_FM, forceinline=True)
def _normcdf32(x):
    # Phi(x) = erfc(-x / sqrt 2) / 2 below 0, 1 - erfc(x / sqrt 2) / 2 above; x float32, the
    # arithmetic in float64 (x^2 / 2 exact), one rounding to float32 at the end.
    xd = np.float64(x)
    z = min(abs(xd) * _SQRT1_2, _ERFC_ZMAX)
    half = 0.5 * _erfc_small_tail(z)
    y = np.float32(half if xd < 0 else 1.0 - half)
    return y if x == x else x


@njit(cache=True, error_model="numpy", fastmath=_FM, forceinline=True)
def _normpdf32(x):
    xd = np.float64(x)
    y = np.float32(_INV_SQRT_2PI * _exp64(-0.5 * xd * xd))
    return y if x == x else x


# --- double-double arithmetic (float64 accuracy-first paths) ------------------------------
#
# A double-double (dd) number is an unevaluated sum hi + lo of two float64 with |lo| <= ulp(hi)/2:
# about 106 bits. The float64 specialisations of the VJPs whose formulas cancel (softmax,
# log_softmax, categorical_cross_entropy, layer_norm, rms_norm, gelu, gelu_tanh) evaluate them
# in dd and round once, so that a well-conditioned result is within about half an ULP whatever
# the cancellation inside the formula. Error-free transformations (Knuth's TwoSum, Dekker's
# FastTwoSum, TwoProd through a fused multiply-add) and the QD library's "accurate" dd add;
# each dd operation has relative error below ~4 u^2 (u = 2**-53) of its operands' magnitude.
# NOTE: these rely on every operation being evaluated as written: the fastmath flags here are
# contraction only (no reassociation), which leaves error-free transformations exact. They are
# float64-only (a float32 argument is converted by the caller).

@njit(cache=True, error_model="numpy", fastmath=_FM)
def two_sum(a, b):
    """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def fast_two_sum(a, b):
    """(s, e) with s = fl(a + b), s + e = a + b exactly, for |a| >= |b| or a == 0 (Dekker)."""
    s = a + b
    return s, b - (s - a)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def two_prod(a, b):
    """(p, e) with p = fl(a b) and p + e = a b exactly (barring underflow): e by one fma."""
    p = a * b
    return p, _fma(a, b, -p)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def dd_add(ah, al, bh, bl):
    """(ah + al) + (bh + bl) in dd (QD's accurate addition: no loss when the sum cancels)."""
    s, e = two_sum(ah, bh)
    t, f = two_sum(al, bl)
    e += t
    s, e = fast_two_sum(s, e)
    e += f
    return fast_two_sum(s, e)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def dd_add_d(ah, al, b):
    """(ah + al) + b in dd."""
    s, e = two_sum(ah, b)
    e += al
    return fast_two_sum(s, e)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def dd_mul(ah, al, bh, bl):
    """(ah + al)(bh + bl) in dd."""
    p, e = two_prod(ah, bh)
    e += ah * bl + al * bh
    return fast_two_sum(p, e)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def dd_mul_d(ah, al, b):
    """(ah + al) b in dd."""
    p, e = two_prod(ah, b)
    e += al * b
    return fast_two_sum(p, e)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def dd_div(ah, al, bh, bl):
    """(ah + al) / (bh + bl) in dd: the float64 quotient and one correction from the exact
    remainder (relative error below ~3 u^2)."""
    q1 = ah / bh
    ph, pl = dd_mul_d(bh, bl, q1)
    rh, rl = dd_add(ah, al, -ph, -pl)
    q2 = rh / bh
    return fast_two_sum(q1, q2)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def dd_sqrt(ah, al):
    """sqrt(ah + al) in dd for ah >= 0 (one Newton correction from the exact residual)."""
    s = math.sqrt(ah)
    if s == 0.0 or s == math.inf:
        return s, 0.0
    e = _fma(-s, s, ah) + al
    return fast_two_sum(s, e / (s + s))


# ln 2 as a sum of three float64 (hi: 53 bits; the three hold ~160 bits)
_LN2_DD0 = 0.6931471805599453
_LN2_DD1 = 2.3190468138462996e-17
_LN2_DD2 = 5.707708438416212e-34
_EXP_DD_SQUARINGS = 4                     # exp(r) = exp(r / 16)**16
_EXP_DD_SCALE = 1.0 / 16.0
(_E3, _E4, _E5, _E6, _E7, _E8, _E9, _E10) = (
    1.0 / math.factorial(k) for k in range(3, 11))


@njit(cache=True, error_model="numpy", fastmath=_FM)
def dd_exp(ah, al):
    """exp(ah + al) in dd, relative error below ~1e-20 (enough for any result rounded to
    float64 from a formula whose cancellation costs less than 1e4). 0 below -745.2, inf
    above 709.79 (as float64 exp), NaN stays NaN.

    exp(a) = 2**n exp(r), r = a - n ln 2 (|r| <= ln(2)/2, ln 2 in three parts, n ln 2's first
    part by an exact product), then exp(r) = (1 + m(r/16))**16 with m = expm1 by its Taylor
    series (r + r^2/2 in dd, the terms from r^3 on in float64: they are below 2e-6 |r|, so
    their float64 rounding is below 3e-22 relative), squared four times as m <- 2m + m^2.
    """
    if not (ah == ah):
        return ah, ah
    if ah > 709.79:
        return math.inf, 0.0
    if ah < -745.2:
        return 0.0, 0.0
    n = np.floor(ah * _LOG2E64 + 0.5)
    ph, pl = two_prod(n, _LN2_DD0)
    rh, rl = two_sum(ah, -ph)
    rl = rl + (al - pl - n * _LN2_DD1 - n * _LN2_DD2)
    rh, rl = fast_two_sum(rh, rl)
    rh = rh * _EXP_DD_SCALE
    rl = rl * _EXP_DD_SCALE
    # m = r + r^2 / 2 + r^3 q(r)
    sh, sl = dd_mul(rh, rl, rh, rl)
    q = ((((((_E10 * rh + _E9) * rh + _E8) * rh + _E7) * rh + _E6) * rh + _E5) * rh
         + _E4) * rh + _E3
    mh, ml = dd_add_d(0.5 * sh, 0.5 * sl, rh * rh * rh * q)
    mh, ml = dd_add(rh, rl, mh, ml)
    for _ in range(_EXP_DD_SQUARINGS):
        th, tl = dd_mul(mh, ml, mh, ml)
        mh, ml = dd_add(mh + mh, ml + ml, th, tl)
    eh, el = dd_add_d(mh, ml, 1.0)
    # 2**n in two factors (n from -1075 to 1024)
    n1 = np.floor(n * 0.5)
    f1 = _pow2_f64(n1)
    f2 = _pow2_f64(n - n1)
    return eh * f1 * f2, el * f1 * f2


@njit(cache=True, error_model="numpy", fastmath=_FM)
def dd_log(ah, al):
    """log(ah + al) in dd for ah > 0: libm's log and one Newton step through ``dd_exp``
    (log a = y + a exp(-y) - 1 + O((a exp(-y) - 1)^2), and a exp(-y) - 1 is about 1e-16)."""
    y = math.log(ah)
    if not (y == y) or y == math.inf or y == -math.inf:
        return y, 0.0
    eh, el = dd_exp(-y, 0.0)
    th, tl = dd_mul(ah, al, eh, el)
    th, tl = dd_add_d(th, tl, -1.0)
    return dd_add_d(th, tl, y)


# --- generic entry points (pure-Python bodies serve interpreted callers) -------------------

def fexp(x):
    """exp(x) in x's type (float32: polynomial, <= 2 ulp; float64: libm)."""
    return math.exp(x)


def flog(x):
    """log(x) in x's type (float32: polynomial, <= 2 ulp; float64: libm)."""
    return math.log(x)


def flog1p(x):
    """log(1 + x) in x's type, accurate for small x."""
    return math.log1p(x)


def ftanh(x):
    """tanh(x) in x's type (float32: <= 7 ulp, a rational approximation; float64: libm)."""
    return math.tanh(x)


def fnormcdf(x):
    """Standard normal CDF Phi(x) in x's type, accurate in both tails."""
    return 0.5 * math.erfc(-x * _SQRT1_2)


def fnormpdf(x):
    """Standard normal density phi(x) in x's type."""
    return _INV_SQRT_2PI * math.exp(-0.5 * x * x)


def like(x, value):
    """``value`` converted to the floating type of ``x`` (a typed constant for generic code)."""
    return type(x)(value)


def _dispatch(f32_impl, f64_impl):
    """An overload typing function: float32 -> f32_impl, float64 -> f64_impl, else no match."""
    def typer(x):
        if x == types.float32:
            return f32_impl
        if x == types.float64:
            return f64_impl
        return None
    return typer


# NOTE: the entry points are inlined at Numba's IR level: an activation that combines two of
# them (softplus: exp and log1p) grows past LLVM's inlining threshold otherwise, and a call per
# element stops its loop from vectorising.
overload(fexp, inline="always")(_dispatch(lambda x: _exp32(x), lambda x: math.exp(x)))
overload(flog, inline="always")(_dispatch(lambda x: _log32(x), lambda x: math.log(x)))
overload(flog1p, inline="always")(_dispatch(lambda x: _log1p32(x), lambda x: math.log1p(x)))
overload(ftanh, inline="always")(_dispatch(lambda x: _tanh32(x), lambda x: math.tanh(x)))
# NOTE: float32 Phi and phi are evaluated in float64 (the float32 argument squares exactly
# there, so the tails keep their relative accuracy) without libm, and rounded once.
# Their float32 bodies (_normcdf32 and its helpers) are too large for LLVM's inliner, and a
# call per element would stop the loop from vectorising: they carry LLVM's alwaysinline
# (forceinline, below), not Numba's IR inlining, which copied and re-typed each body at every
# call site (three times the compile time of the float32 elementwise family, same code).
overload(fnormcdf, inline="always")(_dispatch(lambda x: _normcdf32(x),
                                              lambda x: _normcdf64(x)))
overload(fnormpdf, inline="always")(_dispatch(lambda x: _normpdf32(x),
                                              lambda x: _normpdf64(x)))


@overload(like)
def _like_overload(x, value):
    if x == types.float32:
        return lambda x, value: np.float32(value)
    if x == types.float64:
        return lambda x, value: np.float64(value)
    return None
