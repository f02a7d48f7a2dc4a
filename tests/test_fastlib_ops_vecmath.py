"""The float32 polynomial primitives of fastlib.kernels.vecmath on dense grids.

Reference: NumPy's float64 functions (correctly rounded to within 1 float64 ulp, i.e. 2**-29
of a float32 ulp), an independent implementation. The error is measured in float32 ulps of the
reference: |got - ref| / ulp32(ref), with ulp32 the spacing of float32 at the reference
(the smallest subnormal below the normal range). The bounds are the ones vecmath's docstring
states: exp, log, log1p within 2 ulp, tanh within 7 ulp, and exact IEEE special values.
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import fastlib
from fastlib.kernels.vecmath import flog1p, fnormcdf, fnormpdf


def _via_op(name):
    """exp, log and tanh through the elementwise kernels (compiled once for the whole suite);
    they call the vecmath primitives through kernels.scalar, with nothing in between."""
    def kernel(x, out):
        out[...] = fastlib.forward(name, [x])
    return kernel


_map_exp = _via_op("exp")
_map_log = _via_op("log")
_map_tanh = _via_op("tanh")


@njit(error_model="numpy")
def _map_log1p(x, out):
    for i in range(x.size):
        out[i] = flog1p(x[i])


@njit(error_model="numpy")
def _map_normcdf(x, out):
    for i in range(x.size):
        out[i] = fnormcdf(x[i])


@njit(error_model="numpy")
def _map_normpdf(x, out):
    for i in range(x.size):
        out[i] = fnormpdf(x[i])


def _apply(kernel, x):
    out = np.empty_like(x)
    kernel(x, out)
    return out


def _ulps(got, ref):
    """|got - ref| in float32 ulps at ref (ref float64; inf/nan must match exactly)."""
    ref32 = ref.astype(np.float32)
    special = ~np.isfinite(ref32)
    assert np.array_equal(got[special], ref32[special], equal_nan=True)
    spacing = np.spacing(np.abs(ref32[~special])).astype(np.float64)
    return np.abs(got[~special].astype(np.float64) - ref[~special]) / spacing


def _grid(lo, hi, n=200_001):
    return np.linspace(lo, hi, n).astype(np.float32)


def test_exp_within_2_ulp():
    x = np.concatenate([_grid(-103.9, 88.7), _grid(-1, 1, 20_001)])
    assert _ulps(_apply(_map_exp, x), np.exp(x.astype(np.float64))).max() <= 2


def test_log_within_2_ulp_including_subnormals():
    x = np.concatenate([np.logspace(-45, 38, 200_001).astype(np.float32), _grid(0.5, 2.0),
                        np.array([1.4e-45, 1.1754942e-38, 1.0], np.float32)])
    x = x[x > 0]
    assert _ulps(_apply(_map_log, x), np.log(x.astype(np.float64))).max() <= 2


def test_log1p_within_2_ulp():
    x = np.concatenate([_grid(-0.999, 10.0), np.logspace(-30, 0, 50_001).astype(np.float32),
                        -np.logspace(-30, -0.001, 50_001).astype(np.float32)])
    assert _ulps(_apply(_map_log1p, x), np.log1p(x.astype(np.float64))).max() <= 2


def test_tanh_within_7_ulp():
    """A rational approximation: <= 7 ulp worst case (3.5 eps relative), < 1 ulp on average."""
    x = np.concatenate([_grid(-12, 12), np.logspace(-30, 0, 50_001).astype(np.float32)])
    ulps = _ulps(_apply(_map_tanh, x), np.tanh(x.astype(np.float64)))
    assert ulps.max() <= 7 and ulps.mean() <= 1


def test_normal_cdf_and_pdf_within_1_ulp():
    """float32 Phi and phi go through float64 and round once: within 1 ulp down to 1e-38."""
    from scipy.special import ndtr
    x = _grid(-13, 8, 50_001)
    x64 = x.astype(np.float64)
    # scipy's ndtr and the textbook phi in float64: independent float64 references
    assert _ulps(_apply(_map_normcdf, x), ndtr(x64)).max() <= 1
    assert _ulps(_apply(_map_normpdf, x), np.exp(-x64 * x64 / 2) / np.sqrt(2 * np.pi)).max() <= 1


@pytest.mark.parametrize("kernel, cases", [
    (_map_exp, [(np.inf, np.inf), (-np.inf, 0.0), (np.nan, np.nan), (89.0, np.inf),
                (-104.0, 0.0), (0.0, 1.0)]),
    (_map_log, [(0.0, -np.inf), (-1.0, np.nan), (np.inf, np.inf), (np.nan, np.nan),
                (-np.inf, np.nan), (1.0, 0.0)]),
    (_map_log1p, [(-1.0, -np.inf), (np.inf, np.inf), (np.nan, np.nan), (0.0, 0.0),
                  (-2.0, np.nan)]),
    (_map_tanh, [(np.inf, 1.0), (-np.inf, -1.0), (np.nan, np.nan), (0.0, 0.0), (50.0, 1.0)]),
])
def test_ieee_special_values(kernel, cases):
    x = np.array([c[0] for c in cases], np.float32)
    want = np.array([c[1] for c in cases], np.float32)
    np.testing.assert_array_equal(_apply(kernel, x), want)


def test_float64_path_is_libm():
    """float64 goes through libm; libm and NumPy are each within 1 ulp of the exact value, so
    they agree to within 2 ulp."""
    x = np.linspace(-30, 30, 10_001)
    for kernel, ref in ((_map_exp, np.exp), (_map_tanh, np.tanh), (_map_log1p, np.log1p)):
        xs = x[x > -1] if kernel is _map_log1p else x
        got = _apply(kernel, xs)
        assert np.all(np.abs(got - ref(xs)) <= 2 * np.spacing(np.abs(ref(xs))))
    xp = np.logspace(-300, 300, 10_001)
    assert np.all(np.abs(_apply(_map_log, xp) - np.log(xp))
                  <= 2 * np.spacing(np.abs(np.log(xp))))
