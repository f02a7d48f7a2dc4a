"""The 16-bit storage formats and float32, converted both ways bit for bit: written once.

bfloat16 and float16 values are stored as 16-bit patterns and computed on as float32. The four
conversions are plain Python on integer bit patterns (``SOURCES``), compiled here with
``@njit`` for CPU kernels and by ``fastlib.cuda.half`` as CUDA device functions: widening is
exact (NaN payloads kept), narrowing rounds to nearest, ties to even, through the subnormals,
with overflow to inf and NaN kept NaN, matching ``ml_dtypes`` on every pattern. ``widen`` and
``narrow`` convert whole arrays. docs/fastlib.md, section ``fastlib/kernels/half.py``.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic

from fastlib import config

__all__ = ["SOURCES", "CODES", "widen", "narrow", "widen_bits", "narrow_bits", "round_float32",
           "round_in_place", "round_scale_in_place", "round_into",
           "bfloat16_to_float32", "float32_to_bfloat16", "float16_to_float32",
           "float32_to_float16"]

#: storage format name -> the code the array kernels switch on
CODES = {"bfloat16": 0, "float16": 1}
_BF16, _F16 = CODES["bfloat16"], CODES["float16"]

#: name -> the plain Python function of each conversion, compiled for each target
SOURCES = {}


def _source(fn):
    SOURCES[fn.__name__] = fn
    return njit(cache=True, nogil=True, inline="always")(fn)


# The integer constants of the sources (module-level numbers: the CUDA twin reads them too).
_SIGN32 = 0x80000000
_ABS32 = 0x7FFFFFFF
_INF32 = 0x7F800000
_BF16_QUIET_NAN = 0x7FC0
# float16: |x| >= 65520 (max + half an ulp) rounds to inf; |x| >= 2**-14 is normal there;
# |x| <= 2**-25 (half the smallest subnormal) rounds to zero
_F16_OVERFLOW = 0x477FF000
_F16_NORMAL = 0x38800000
_F16_HALF_SUBNORMAL = 0x33000000
_REBIAS = 0x38000000          # (127 - 15) << 23: float32's exponent bias over float16's


@_source
def bfloat16_to_float32(h):
    """float32 bits of the bfloat16 bits ``h``: the same number (bfloat16 is float32's top half)."""
    return int(h) << 16


@_source
def float32_to_bfloat16(b):
    """bfloat16 bits of float32 bits ``b``, rounded to nearest even; NaN becomes the quiet NaN
    of its sign (as ``ml_dtypes`` does)."""
    b = int(b)
    if (b & _ABS32) > _INF32:
        return ((b >> 16) & 0x8000) | _BF16_QUIET_NAN
    # adding 0x7FFF plus the kept part's lowest bit rounds the dropped half to nearest even;
    # a carry runs into the exponent (and past the largest number, to inf) as it should
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


@_source
def float16_to_float32(h):
    """float32 bits of the float16 bits ``h`` (exact: subnormals become normal numbers, a NaN
    keeps its payload)."""
    h = int(h)
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        return sign | _INF32 | (m << 13)
    if e != 0:
        return sign | ((e + 112) << 23) | (m << 13)
    if m == 0:
        return sign
    k = 0                      # the subnormal's significant bits: m * 2**-24 = 2**(k - 25) ...
    t = m
    while t != 0:
        t >>= 1
        k += 1
    return sign | ((k + 102) << 23) | ((m << (24 - k)) & 0x7FFFFF)


@_source
def float32_to_float16(b):
    """float16 bits of float32 bits ``b``, rounded to nearest even, through the subnormals;
    overflow gives inf, NaN stays NaN with the top of its payload (as NumPy does)."""
    b = int(b)
    sign = (b >> 16) & 0x8000
    a = b & _ABS32
    if a > _INF32:
        m = (a >> 13) & 0x3FF
        return sign | 0x7C00 | (m if m != 0 else 1)
    if a >= _F16_OVERFLOW:
        return sign | 0x7C00
    if a >= _F16_NORMAL:
        a -= _REBIAS
        return sign | ((a + 0xFFF + ((a >> 13) & 1)) >> 13)
    if a <= _F16_HALF_SUBNORMAL:
        return sign
    # a subnormal result: the significand (implicit one included) in units of 2**-24
    shift = 126 - (a >> 23)
    m = (a & 0x7FFFFF) | 0x800000
    q = m >> shift
    rest = m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rest > half or (rest == half and (q & 1) == 1):
        q += 1                 # a carry into 0x400 is the smallest normal number: right
    return sign | q


# ---------------------------------------------------------------------------------------------
# whole arrays


@njit(cache=True, nogil=True)
def _widen_chunk(code, src, dst, lo, hi):
    if code == _BF16:
        for i in range(lo, hi):
            dst[i] = bfloat16_to_float32(src[i])
    else:
        for i in range(lo, hi):
            dst[i] = float16_to_float32(src[i])


@njit(cache=True, nogil=True)
def _narrow_chunk(code, src, dst, lo, hi):
    if code == _BF16:
        for i in range(lo, hi):
            dst[i] = float32_to_bfloat16(src[i])
    else:
        for i in range(lo, hi):
            dst[i] = float32_to_float16(src[i])


@njit(cache=True, parallel=True)
def _widen_parallel(code, src, dst, nchunks):
    n = src.size
    for c in prange(nchunks):
        _widen_chunk(code, src, dst, n * c // nchunks, n * (c + 1) // nchunks)


@njit(cache=True, parallel=True)
def _narrow_parallel(code, src, dst, nchunks):
    n = src.size
    for c in prange(nchunks):
        _narrow_chunk(code, src, dst, n * c // nchunks, n * (c + 1) // nchunks)


# The round trip float32 -> format -> float32, as straight-line selects on 32-bit lanes that
# the compiler vectorizes (the training kernels round every output, cotangent, gradient and
# weight of a step: the conversions above, one value at a time, cost 1.5 ns (bfloat16) and
# 6 ns (float16) a value; these 0.2 and 0.4 ns, float16 0.2 ns by F16C's conversions where
# the target has them). Written as LLVM instructions because Numba widens uint32 arithmetic
# to 64 bits, which halves the lanes. Each equals widening the narrowed value on every
# float32 (tests/test_half.py, against ml_dtypes; both float16 paths, with flush-to-zero).

_I32 = ir.IntType(32)


def _k(value):
    return ir.Constant(_I32, value)


@intrinsic
def _round_bfloat16_bits(typingctx, bits):
    """float32 bits of the float32 bits ``bits`` (uint32) rounded to bfloat16: nearest even by
    adding 0x7FFF plus the kept part's lowest bit, as the narrowing; NaN becomes the quiet NaN
    of its sign."""
    if bits != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        b = args[0]
        lowest = builder.and_(builder.lshr(b, _k(16)), _k(1))
        kept = builder.and_(builder.add(builder.add(b, _k(0x7FFF)), lowest), _k(0xFFFF0000))
        nan = builder.or_(builder.and_(b, _k(_SIGN32)), _k(_BF16_QUIET_NAN << 16))
        is_nan = builder.icmp_unsigned(">", builder.and_(b, _k(_ABS32)), _k(_INF32))
        return builder.select(is_nan, nan, kept)

    return types.uint32(types.uint32), codegen


def _target_has_f16c():
    """Whether the code Numba generates may use x86's F16C conversions (VCVTPS2PH, VCVTPH2PS):
    the host has them and Numba targets the host (a CPU named by ``NUMBA_CPU_NAME`` without
    ``NUMBA_CPU_FEATURES`` listing them is taken to lack them: the portable path then)."""
    from llvmlite import binding as llvm
    from numba.core import config as numba_config

    if numba_config.CPU_FEATURES is not None:
        return "+f16c" in numba_config.CPU_FEATURES
    if numba_config.CPU_NAME is not None:
        return False
    try:
        return bool(llvm.get_host_cpu_features().get("f16c", False))
    except RuntimeError:      # pragma: no cover - a host LLVM cannot describe
        return False


_F16C = _target_has_f16c()


def _f16c_round(builder, b):
    """float16 rounding by the hardware: float32 -> half -> float32 (nearest even from MXCSR,
    which fastlib leaves at it; the narrowing ignores FTZ and the widening DAZ, so subnormal
    halves survive a kernel's flush-to-zero mode), NaN set as the bit path sets it."""
    f32 = ir.FloatType()
    rounded = builder.bitcast(builder.fpext(builder.fptrunc(builder.bitcast(b, f32),
                                                            ir.HalfType()), f32), _I32)
    a = builder.and_(b, _k(_ABS32))
    # a NaN keeps the top 10 bits of its payload, the lowest of them set when all are clear:
    # its top bits are at least inf's, so the larger of them and inf's with that bit
    top = builder.and_(a, _k(0xFFFFE000))
    quiet = _k(_INF32 | 0x2000)
    nan = builder.or_(builder.xor(b, a),
                      builder.select(builder.icmp_unsigned(">", top, quiet), top, quiet))
    return builder.select(builder.icmp_unsigned(">", a, _k(_INF32)), nan, rounded)


@intrinsic
def _round_float16_bits(typingctx, bits):
    """float32 bits of the float32 bits ``bits`` (uint32) rounded to float16: nearest even,
    through the subnormals; from 65520 on inf; NaN keeps the top of its payload (as the
    conversions do). By F16C's two conversions where the target has them (:data:`_F16C`),
    else by the float32 operations below; the two agree on every pattern (tests/test_half.py)."""
    if bits != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        if _F16C:
            return _f16c_round(builder, args[0])
        f32 = ir.FloatType()
        b = args[0]
        a = builder.and_(b, _k(_ABS32))
        sign = builder.xor(b, a)
        # |x| + c, with c = 2**13 times |x|'s power of two (at least 2**-14, float16's
        # smallest normal), has its last place at float16's quantum for |x|: the sum rounds
        # |x| to nearest even there and subtracting c is exact (DAZ, where set, reads a
        # float32 subnormal as 0, which rounds to 0 anyway)
        power = builder.and_(a, _k(_INF32))
        power = builder.select(builder.icmp_unsigned("<", power, _k(_F16_NORMAL)),
                               _k(_F16_NORMAL), power)
        c = builder.bitcast(builder.add(power, _k(13 << 23)), f32)
        rounded = builder.bitcast(builder.fsub(builder.fadd(builder.bitcast(a, f32), c), c),
                                  _I32)
        # from the overflow edge on: inf, or a NaN keeping the top 10 bits of its payload
        # (the lowest of them set when all are clear, so that it stays a NaN)
        top = builder.and_(a, _k(0xFFFFE000))
        nan = builder.select(builder.icmp_unsigned("==", top, _k(_INF32)),
                             _k(_INF32 | 0x2000), top)
        big = builder.select(builder.icmp_unsigned(">", a, _k(_INF32)), nan, _k(_INF32))
        return builder.or_(sign, builder.select(
            builder.icmp_unsigned("<", a, _k(_F16_OVERFLOW)), rounded, big))

    return types.uint32(types.uint32), codegen


@njit(cache=True, nogil=True)
def _round_bits(code, bits):
    """The float32 bit patterns ``bits`` (1-D, uint32) rounded to the format ``code`` in place.

    NOTE: one array read and written, looped from 0: two arrays the compiler must assume may
    overlap, or an index it cannot prove non-negative (its negative-index check stays in the
    loop), stop it vectorizing (4x slower).
    """
    if code == _BF16:
        for i in range(bits.size):
            bits[i] = _round_bfloat16_bits(bits[i])
    else:
        for i in range(bits.size):
            bits[i] = _round_float16_bits(bits[i])


@intrinsic
def _scaled_bits(typingctx, bits, factor):
    """float32 bits of the float32 whose bits are ``bits`` (uint32) times ``factor`` (one
    float32 multiplication, as ``value * factor`` is)."""
    if bits != types.uint32 or factor != types.float32:
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        return builder.bitcast(builder.fmul(builder.bitcast(args[0], f32), args[1]), _I32)

    return types.uint32(types.uint32, types.float32), codegen


@njit(cache=True, nogil=True)
def _round_scale_bits(code, bits, factor):
    """:func:`_round_bits`, each rounded value then multiplied by ``factor``: one pass."""
    if code == _BF16:
        for i in range(bits.size):
            bits[i] = _scaled_bits(_round_bfloat16_bits(bits[i]), factor)
    else:
        for i in range(bits.size):
            bits[i] = _scaled_bits(_round_float16_bits(bits[i]), factor)


@njit(cache=True, nogil=True)
def _round_chunk(code, src, dst, lo, hi):
    """``dst[lo:hi]`` = ``src[lo:hi]`` rounded (bit patterns): one pass, which LLVM vectorizes
    behind its own overlap check (a copy, then :func:`_round_bits` in place, took 1.5x as
    long)."""
    s, d = src[lo:hi], dst[lo:hi]
    if code == _BF16:
        for i in range(d.size):
            d[i] = _round_bfloat16_bits(s[i])
    else:
        for i in range(d.size):
            d[i] = _round_float16_bits(s[i])


@njit(cache=True, nogil=True)
def round_in_place(code, a):
    """Round the float32 entries of the 1-D contiguous ``a`` to the format ``code``
    (:data:`CODES`) in place, to nearest even; a negative ``code`` (a run in the model's own
    dtype, float32 or float64) leaves ``a`` as it is. For compiled kernels."""
    if code >= 0:
        _round_bits(code, a.view(np.uint32))


@njit(cache=True, nogil=True)
def round_scale_in_place(code, a, factor):
    """``a`` (1-D contiguous float32) rounded to the format ``code``, each value then
    multiplied by the float32 ``factor`` (a mixed run's gradient, unscaled), in place and in
    one pass over ``a``; a negative ``code`` leaves ``a`` as it is. For compiled kernels."""
    if code >= 0:
        _round_scale_bits(code, a.view(np.uint32), np.float32(factor))


@njit(cache=True, nogil=True)
def round_into(code, src, dst):
    """``dst = src`` rounded to the format ``code`` (1-D contiguous float32 arrays of one
    size; a negative ``code`` copies nothing). For compiled kernels."""
    if code >= 0:
        _round_chunk(code, src.view(np.uint32), dst.view(np.uint32), 0, src.size)


@njit(cache=True, parallel=True)
def _round_parallel(code, src, dst, nchunks):
    n = src.size
    for c in prange(nchunks):
        _round_chunk(code, src, dst, n * c // nchunks, n * (c + 1) // nchunks)


def _code(name):
    code = CODES.get(name)
    if code is None:
        raise ValueError(f"no 16-bit storage format {name!r}; formats: {', '.join(CODES)}")
    return code


def widen_bits(bits, name):
    """float32 bit patterns (uint32) of 16-bit patterns ``bits`` (uint16, flat) in format
    ``name``."""
    code = _code(name)
    src = np.ascontiguousarray(bits, dtype=np.uint16).reshape(-1)
    dst = np.empty(src.size, np.uint32)
    nchunks = config.num_chunks(src.size)
    if nchunks == 1:
        _widen_chunk(code, src, dst, 0, src.size)
    else:
        _widen_parallel(code, src, dst, nchunks)
    return dst


def narrow_bits(bits, name):
    """16-bit patterns (uint16) in format ``name`` of float32 bit patterns ``bits`` (uint32)."""
    code = _code(name)
    src = np.ascontiguousarray(bits, dtype=np.uint32).reshape(-1)
    dst = np.empty(src.size, np.uint16)
    nchunks = config.num_chunks(src.size)
    if nchunks == 1:
        _narrow_chunk(code, src, dst, 0, src.size)
    else:
        _narrow_parallel(code, src, dst, nchunks)
    return dst


def widen(x):
    """A bfloat16 or float16 array as float32, exactly (a new C-contiguous array, same shape).

    Parameters
    ----------
    x : numpy.ndarray
        Of dtype bfloat16 (``ml_dtypes``) or float16.

    Returns
    -------
    numpy.ndarray
        float32, every value (NaN payloads included) the same number.
    """
    x = np.asarray(x)
    bits = np.ascontiguousarray(x).view(np.uint16)
    return widen_bits(bits, x.dtype.name).view(np.float32).reshape(x.shape)


def narrow(x, dtype):
    """A float32 array rounded to the 16-bit ``dtype`` (bfloat16 or float16), to nearest even.

    Parameters
    ----------
    x : numpy.ndarray
        float32 values.
    dtype : numpy dtype
        bfloat16 (``ml_dtypes``) or float16.

    Returns
    -------
    numpy.ndarray
        A new array of ``dtype`` and ``x``'s shape.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"narrow rounds float32 values; got {x.dtype} (round float64 to "
                        f"float32 first only if that double rounding is intended)")
    dtype = np.dtype(dtype)
    bits = narrow_bits(np.ascontiguousarray(x).view(np.uint32), dtype.name)
    return bits.view(dtype).reshape(x.shape)


def round_float32(x, name, out=None):
    """float32 ``x`` rounded to the 16-bit format ``name`` and kept as float32: ``narrow`` then
    ``widen`` in one pass, without the 16-bit array between them.

    Parameters
    ----------
    x : numpy.ndarray
        float32, C-contiguous.
    name : {"bfloat16", "float16"}
    out : numpy.ndarray, optional
        float32 of ``x``'s shape, C-contiguous (``x`` itself rounds in place); default new.

    Returns
    -------
    numpy.ndarray
        ``out``.
    """
    code = _code(name)
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        raise TypeError(f"round_float32 rounds C-contiguous float32 arrays; got {x.dtype}")
    out = np.empty_like(x) if out is None else out
    src, dst = x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint32)
    nchunks = config.num_chunks(src.size)
    if nchunks == 1:
        _round_chunk(code, src, dst, 0, src.size)
    else:
        _round_parallel(code, src, dst, nchunks)
    return out
