"""The 16-bit formats: optable's declarations, and fastlib's conversions bit for bit.

The formats' constants are held against ``ml_dtypes.finfo`` (an independent source); the
conversions of ``fastlib/kernels/half.py`` against ``ml_dtypes``' casts: every one of the
65536 patterns of each format widened to float32, and, narrowing, every float32 pattern on or
one ulp either side of a rounding boundary (each 16-bit number, each midpoint between two, the
overflow threshold, the subnormals) plus a million random patterns; all 2**32 patterns behind
``-m slow``. The CUDA twin runs the same checks under numba's simulator in a subprocess
(tests/cuda_half_sim_check.py; its exhaustive run is ``-m slow`` too).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import optable
from fastlib.kernels import half

ROOT = pathlib.Path(__file__).resolve().parents[1]
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
FORMATS = {"bfloat16": BF16, "float16": F16}
ALL16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)


def _ml_widen(bits, dtype):
    return bits.view(dtype).astype(np.float32).view(np.uint32)


def _ml_narrow(bits32, dtype):
    with np.errstate(all="ignore"):
        return bits32.view(np.float32).astype(dtype).view(np.uint16)


def boundary_patterns(name):
    """float32 bit patterns at every rounding boundary of format ``name``, and one float32 ulp
    either side: each 16-bit number, each midpoint to its successor, both signs, the
    overflow threshold, NaNs with payloads in the kept and in the dropped bits."""
    dtype = FORMATS[name]
    values = ALL16.view(dtype).astype(np.float32)
    finite = values[np.isfinite(values)]
    ordered = np.unique(np.abs(finite.astype(np.float64)))
    mids = (ordered[:-1] + ordered[1:]) / 2         # exact in float32 (one more bit)
    fmt = optable.formats.FORMATS[name]
    points = np.concatenate([ordered, mids, [fmt.overflow, fmt.max, np.inf]])
    base = points.astype(np.float32).view(np.uint32)
    assert np.all(base.view(np.float32).astype(np.float64) == points)   # every point exact
    around = np.concatenate([base, base + 1, base - 1, base + 2, base - 2])
    around = around[(around & 0x7FFFFFFF) <= 0x7F800000]
    signed = np.concatenate([around, around | 0x80000000])
    nans = np.array([0x7F800001, 0x7FC00000, 0x7F812345, 0x7FFFFFFF, 0x7F801FFF, 0x7F802000,
                     0x7FBFFFFF, 0xFF800001, 0xFFC00000, 0xFFFFFFFF], dtype=np.uint32)
    rng = np.random.default_rng(16)
    random = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32)
    return np.unique(np.concatenate([signed, nans, random]).astype(np.uint32))


# ---------------------------------------------------------------------------------------------
# the formats, declared once


@pytest.mark.parametrize("name", optable.formats.names())
def test_the_formats_constants_are_ml_dtypes(name):
    fmt = optable.formats.FORMATS[name]
    info = ml_dtypes.finfo(fmt.dtype)
    assert fmt.eps == float(info.eps)
    assert fmt.unit_roundoff == float(info.eps) / 2
    assert fmt.max == float(info.max)
    assert fmt.tiny == float(info.smallest_normal)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.bits == info.bits
    assert fmt.precision == info.nmant + 1 and fmt.exponent_bits == info.nexp
    # the overflow threshold: the largest number plus half its ulp rounds to inf (a tie, to
    # the even inf), one ulp of the next wider format below it rounds to the largest number
    # (float64's threshold is beyond float64: inf)
    wider = {"float32": np.float64, "bfloat16": np.float32, "float16": np.float32}.get(name)
    if wider is None:
        assert np.isinf(fmt.overflow)
    else:
        with np.errstate(over="ignore"):
            assert np.isinf(wider(fmt.overflow).astype(fmt.dtype))
            below = np.nextafter(wider(fmt.overflow), wider(0.0))
            assert float(below.astype(fmt.dtype)) == fmt.max
    if name == "float16":
        assert fmt.max == 65504.0 and fmt.overflow == 65520.0
    if name == "bfloat16":
        assert fmt.emax == 127 and fmt.precision == 8    # float32's range, 8 bits


def test_ulp_is_the_spacing_of_the_format():
    for name, dtype in FORMATS.items():
        fmt = optable.formats.FORMATS[name]
        with np.errstate(invalid="ignore"):
            values = ALL16.view(dtype).astype(np.float64)
        values = values[np.isfinite(values) & (values >= 0)]
        ordered = np.unique(values)
        assert np.array_equal(fmt.ulp(ordered[:-1]), np.diff(ordered))


def test_storage_formats_and_dtype_lookup():
    assert optable.formats.STORAGE == ("bfloat16", "float16")
    assert optable.formats.format_of(BF16).name == "bfloat16"
    assert optable.formats.is_float(BF16) and optable.formats.is_storage(F16)
    assert not optable.formats.is_storage(np.float32) and not optable.formats.is_float(np.int16)
    with pytest.raises(TypeError, match="not a float format of the suite"):
        optable.formats.format_of(np.int16)
    with pytest.raises(KeyError, match="unknown float format 'float8'"):
        optable.formats.dtype_of("float8")


# ---------------------------------------------------------------------------------------------
# the conversions, bit for bit


@pytest.mark.parametrize("name", list(FORMATS))
def test_widening_every_16_bit_pattern_matches_ml_dtypes(name):
    got = half.widen_bits(ALL16, name)
    assert np.array_equal(got, _ml_widen(ALL16, FORMATS[name]))


@pytest.mark.parametrize("name", list(FORMATS))
def test_narrowing_at_every_rounding_boundary_matches_ml_dtypes(name):
    bits = boundary_patterns(name)
    got = half.narrow_bits(bits, name)
    want = _ml_narrow(bits, FORMATS[name])
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(bits[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMATS))
def test_narrowing_every_float32_pattern_matches_ml_dtypes(name):
    block = 1 << 26
    for start in range(0, 1 << 32, block):
        bits = np.arange(start, start + block, dtype=np.uint64).astype(np.uint32)
        assert np.array_equal(half.narrow_bits(bits, name), _ml_narrow(bits, FORMATS[name]))


def _ml_round(bits32, dtype):
    """float32 bits of float32 bits rounded to ``dtype`` and widened back (ml_dtypes)."""
    return _ml_widen(_ml_narrow(bits32, dtype), dtype)


def _rounded_both_ways(bits, name):
    """``round_float32``'s bits and the compiled kernels' in-place rounding's, of ``bits``."""
    x = bits.view(np.float32)
    kernel = x.copy()
    half.round_in_place(half.CODES[name], kernel)
    return half.round_float32(x, name).view(np.uint32), kernel.view(np.uint32)


@pytest.mark.parametrize("name", list(FORMATS))
def test_rounding_in_float32_at_every_rounding_boundary_is_narrow_then_widen(name):
    # the training kernels' round trip is its own vectorized code: held to ml_dtypes here
    bits = boundary_patterns(name)
    want = _ml_round(bits, FORMATS[name])
    for got in _rounded_both_ways(bits, name):
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, [(hex(bits[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMATS))
def test_rounding_every_float32_pattern_is_narrow_then_widen(name):
    block = 1 << 26
    for start in range(0, 1 << 32, block):
        bits = np.arange(start, start + block, dtype=np.uint64).astype(np.uint32)
        want = _ml_round(bits, FORMATS[name])
        for got in _rounded_both_ways(bits, name):
            assert np.array_equal(got, want)


def test_round_trip_and_special_values_by_hand():
    # hand-derived: bfloat16 1 + 2**-8 is a tie between 1 and 1 + 2**-7: even is 1; 1 + 3 * 2**-8
    # is a tie between 1 + 2**-7 and 1 + 2**-6: even is 1 + 2**-6
    x = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 65519.0, 65520.0, 2.0 ** -25,
                  3 * 2.0 ** -26, -0.0], dtype=np.float32)
    assert half.narrow(x[:2], BF16).astype(np.float64).tolist() == [1.0, 1 + 2.0 ** -6]
    f16 = half.narrow(x[2:], F16).astype(np.float64)
    assert f16[0] == 65504.0 and np.isposinf(f16[1])              # 65520 ties to inf
    assert f16[2] == 0.0 and f16[3] == 2.0 ** -24                 # half the smallest: 0
    assert np.signbit(f16[4]) and f16[4] == 0.0
    for dtype in FORMATS.values():
        values = ALL16.view(dtype)
        back = half.narrow(half.widen(values), dtype).view(np.uint16)
        nan = np.isnan(values.astype(np.float32))
        assert np.array_equal(back[~nan], ALL16[~nan])            # exact both ways
        assert np.all(np.isnan(half.widen(values)[nan]))          # NaN stays NaN


def test_widen_and_narrow_keep_shapes_and_refuse_float64():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = half.narrow(x, BF16)
    assert y.shape == (2, 3) and y.dtype == BF16
    assert half.widen(y).shape == (2, 3) and half.widen(np.float16(2.5)).shape == ()
    with pytest.raises(TypeError, match="narrow rounds float32 values"):
        half.narrow(x.astype(np.float64), BF16)
    with pytest.raises(ValueError, match="no 16-bit storage format 'float32'"):
        half.widen_bits(ALL16[:3], "float32")


def test_parallel_and_serial_conversions_agree():
    from fastlib import config

    n = config.PARALLEL_MIN_SIZE * 2 + 37          # split into chunks, with a ragged tail
    bits = np.random.default_rng(3).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    for name, dtype in FORMATS.items():
        assert np.array_equal(half.narrow_bits(bits, name), _ml_narrow(bits, dtype))
        wide = np.resize(ALL16, n)
        assert np.array_equal(half.widen_bits(wide, name), _ml_widen(wide, dtype))


_PORTABLE = """
import sys
import numpy as np
from numba import njit
sys.path.insert(0, "tests")
import test_half as t
from fastlib.kernels import half
from fastlib.kernels import optim as kopt

@njit
def under_ftz(code, a):
    old = kopt.enter_ftz()
    half.round_in_place(code, a)
    kopt.leave_ftz(old)

assert not half._F16C, "NUMBA_CPU_NAME=generic should take the portable float16 path"
for name, dtype in t.FORMATS.items():
    bits = t.boundary_patterns(name)
    want = t._ml_round(bits, dtype)
    for got in t._rounded_both_ways(bits, name):
        assert np.array_equal(got, want), name
    got = bits.view(np.float32).copy()
    under_ftz(half.CODES[name], got)
    assert np.array_equal(got.view(np.uint32), want), name
print("portable path ok")
"""


def test_the_portable_rounding_path_without_f16c_is_ml_dtypes_rounding():
    # where the target has F16C (x86 since 2012) float16 rounds by its two conversions; a
    # target without them (NUMBA_CPU_NAME=generic here) takes the float32-operations path,
    # held here to the same patterns, with and without flush-to-zero
    env = dict(os.environ, NUMBA_CPU_NAME="generic")
    env.pop("NUMBA_CPU_FEATURES", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _PORTABLE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "portable path ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("name", list(FORMATS))
def test_rounding_under_flush_to_zero_keeps_subnormal_halves(name):
    # the training kernels round with FTZ/DAZ set: float16's subnormals (2**-24 .. 2**-14)
    # are normal float32 numbers and must survive, whichever path rounds them
    from numba import njit

    from fastlib.kernels import optim as kopt

    @njit
    def under_ftz(code, a):
        old = kopt.enter_ftz()
        half.round_in_place(code, a)
        kopt.leave_ftz(old)

    bits = boundary_patterns(name)
    got = bits.view(np.float32).copy()
    under_ftz(half.CODES[name], got)
    want = _ml_round(bits, FORMATS[name])
    assert np.array_equal(got.view(np.uint32), want)


# ---------------------------------------------------------------------------------------------
# the CUDA twin, under the simulator


def _simulate(*args, timeout=900):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "cuda_half_sim_check.py"),
                           *args], env=env, capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return lines


def test_the_cuda_twin_converts_bit_for_bit_under_the_simulator():
    for line in _simulate():
        assert line["ok"], line


@pytest.mark.slow
def test_the_cuda_twin_converts_every_pattern_under_the_simulator():
    for line in _simulate("--every", timeout=3600):
        assert line["ok"], line


@pytest.mark.parametrize("factor", [2.0 ** -10, 0.7, 3.0e4])
@pytest.mark.parametrize("name", list(FORMATS))
def test_round_then_scale_in_one_pass_is_rounding_then_a_float32_product(name, factor):
    # a mixed run's gradient is rounded and unscaled in one pass: it must equal ml_dtypes'
    # rounding followed by NumPy's float32 multiplication, bit for bit (NaN payloads included,
    # as the multiplication quiets them)
    bits = boundary_patterns(name)
    x = bits.view(np.float32)
    f = np.float32(factor)
    with np.errstate(all="ignore"):
        want = (_ml_round(bits, FORMATS[name]).view(np.float32) * f).view(np.uint32)
    got = x.copy()
    half.round_scale_in_place(half.CODES[name], got, f)
    bad = np.flatnonzero(got.view(np.uint32) != want)
    assert bad.size == 0, [(hex(bits[i]), hex(got.view(np.uint32)[i]), hex(want[i]))
                           for i in bad[:5]]
