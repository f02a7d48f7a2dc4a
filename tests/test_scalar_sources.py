"""The scalar functions are written once: fastlib.cuda compiles the CPU's own sources.

In this process (no GPU, no simulator needed: device functions compile lazily): every CUDA
activation is the CPU source's code object under another decorator, the retargeting keeps a
source's siblings and constants (shown with a plain-Python target against mpmath), and a
source that reaches for a CPU-only helper is refused with a message naming it. The device
functions' values are checked under the simulator by tests/cuda_sim_check.py (``twin:*``).
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from numba import types

from fastlib.cuda import scalar as device
from fastlib.kernels import scalar as cpu
from fastlib.kernels.vecmath import fexp


def _python_target(fn):
    return fn


def test_every_device_activation_is_the_cpu_source():
    assert device.ACTIVATIONS, "no device activations"
    for name, (f, df) in device.ACTIVATIONS.items():
        for suffix, compiled in (("_f", f), ("_df", df)):
            source = cpu.SOURCES[name + suffix]
            assert compiled.py_func.__code__ is source.__code__, name + suffix
            assert getattr(cpu, name + suffix).py_func is source, name + suffix
    assert device.WITH_PARAM == {"leaky_relu"}


def test_every_cpu_pair_has_a_device_pair():
    cpu_pairs = {n[:-2] for n in cpu.SOURCES if n.endswith("_f")}
    assert cpu_pairs == set(device.ACTIVATIONS)


def _gelu_tanh_df_exact(x):
    """d/dx of x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2, in 50-digit arithmetic."""
    with mpmath.workdps(50):
        a = mpmath.mpf(44715) / 10**6
        c = mpmath.sqrt(2 / mpmath.pi)
        f = lambda t: t * (1 + mpmath.tanh(c * (t + a * t**3))) / 2  # noqa: E731
        return float(mpmath.diff(f, mpmath.mpf(x)))


def test_retargeted_sources_keep_siblings_and_constants():
    # A plain-Python target over math's functions: gelu_tanh_df calls the sigmoid pair (a
    # sibling) and reads two module constants; all must resolve in the new namespace.
    shim = {"exp": math.exp, "log": math.log, "log1p": math.log1p, "sqrt": math.sqrt,
            "tanh": math.tanh, "like": lambda x, v: v,
            "normcdf": lambda x: 0.5 * math.erfc(-x / math.sqrt(2.0)),
            "normpdf": lambda x: math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)}
    compiled = device.compile_sources(cpu.SOURCES, shim, _python_target)
    assert set(compiled) == set(cpu.SOURCES)
    for x in (-3.0, -0.7, 0.0, 0.3, 1.5, 4.0):
        want = _gelu_tanh_df_exact(x)
        # float64 formula, well conditioned at these points: a few ulps
        assert compiled["gelu_tanh_df"](x) == pytest.approx(want, rel=1e-14, abs=1e-300)
        with mpmath.workdps(50):
            phi = mpmath.ncdf(x)
            want_gelu_df = float(phi + x * mpmath.npdf(x))
        assert compiled["gelu_df"](x) == pytest.approx(want_gelu_df, rel=1e-14, abs=1e-300)
    assert compiled["relu_df"](0.0) == 0.0                       # the kink convention survives
    assert compiled["leaky_relu_df"](0.0, 0.25) == 0.25


def bad_f(x):
    return fexp(x)                      # a CPU-only helper, not the shim's ``exp``


def test_a_source_calling_a_cpu_only_helper_is_refused():
    with pytest.raises(ValueError, match=r"bad_f reads 'fexp'.*MATH_SHIM"):
        device.compile_sources({"bad_f": bad_f}, device.SHIM, _python_target)


def test_a_source_with_a_closure_is_refused():
    slope = 0.5

    def closure_f(x):
        return x * slope

    with pytest.raises(ValueError, match="closure_f is a closure"):
        device.compile_sources({"closure_f": closure_f}, device.SHIM, _python_target)


def test_a_shim_missing_a_name_is_refused():
    shim = dict(device.SHIM)
    del shim["normcdf"]
    with pytest.raises(ValueError, match="must bind exactly"):
        device.compile_sources(cpu.SOURCES, shim, _python_target)


def test_the_cpu_compile_is_still_generic_over_float32():
    # the CPU shim's ``like`` keeps constants in x's type: float32 in, float32 out
    for fn in (cpu.relu_f, cpu.gelu_tanh_df, cpu.softplus_f):
        fn(np.float32(-2.5))
        assert fn.overloads[(types.float32,)].signature.return_type == types.float32
