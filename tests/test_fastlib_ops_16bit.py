"""fastlib's ops in bfloat16 and float16: stored in 16 bits, computed in float32, rounded once.

The definition is checked literally: every 16-bit result equals the float32 result on the
exactly widened inputs, rounded once to the format by ``ml_dtypes`` (an independent rounding),
bit for bit; the boundary accepts and refuses 16-bit inputs with messages that name the fix.
How close to exact the results are is the conformance suite's job
(tests/conformance/test_conform_lowp.py).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fastlib
from fastlib import ops

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
CALLS = [("tanh", lambda r, d: [r.standard_normal((3, 4)).astype(d)], {}),
         ("mul", lambda r, d: [r.standard_normal((3, 1)).astype(d),
                               r.standard_normal((1, 4)).astype(d)], {}),
         ("sum", lambda r, d: [r.standard_normal((3, 4)).astype(d)], {"axis": 1}),
         ("softmax", lambda r, d: [r.standard_normal((3, 4)).astype(d)], {}),
         ("matmul", lambda r, d: [r.standard_normal((3, 5)).astype(d),
                                  r.standard_normal((5, 2)).astype(d)], {}),
         ("layer_norm", lambda r, d: [r.standard_normal((2, 6)).astype(d)], {}),
         ("cross_entropy", lambda r, d: [r.standard_normal((3, 4)).astype(d),
                                         np.array([0, 3, 1])], {})]


def _once(value, dtype):
    """A float32 result rounded once to ``dtype`` by ml_dtypes (not fastlib's conversion)."""
    return None if value is None else np.asarray(value, np.float32).astype(dtype)


def _same(a, b):
    return a is None and b is None or (a.dtype == b.dtype and a.shape == b.shape
                                       and np.array_equal(a.view(np.uint16), b.view(np.uint16)))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name, make, params", CALLS, ids=[c[0] for c in CALLS])
def test_results_are_float32_results_rounded_once(name, make, params, dtype):
    rng = np.random.default_rng(7)
    inputs = make(rng, dtype)
    wide = [x.astype(np.float32) if x.dtype == dtype else x for x in inputs]
    out = fastlib.forward(name, inputs, **params)
    assert _same(out, _once(fastlib.forward(name, wide, **params), dtype))
    grad = rng.standard_normal(np.shape(out)).astype(dtype)
    grads = fastlib.vjp(name, inputs, grad, **params)
    wide_grads = fastlib.vjp(name, wide, grad.astype(np.float32), **params)
    assert all(_same(g, _once(w, dtype)) for g, w in zip(grads, wide_grads))
    value, both = ops.value_and_vjp(name, inputs, grad, **params)
    assert _same(value, out) and all(_same(a, b) for a, b in zip(both, grads))
    bound = ops.bind(name, inputs, **params)
    assert _same(bound.forward(), out)
    assert all(_same(a, b) for a, b in zip(bound.vjp(grad), grads))
    assert all(_same(a, b) for a, b in zip(bound.vjp(grad, check=False), grads))


def test_the_storage_promise_is_declared():
    assert dict(ops.COMPUTES_IN) == {"bfloat16": "float32", "float16": "float32"}


def test_16_bit_boundary_messages():
    x = np.ones(3, BF16)
    with pytest.raises(TypeError, match=r"add: inputs have mixed dtypes \(a bfloat16, b "
                                        r"float32\)"):
        fastlib.forward("add", [x, np.ones(3, np.float32)])
    with pytest.raises(TypeError, match="tanh: grad has dtype float16 but the inputs are "
                                        "bfloat16"):
        fastlib.vjp("tanh", [x], np.ones(3, F16))
    with pytest.raises(ValueError, match=r"softmax: input 'x' holds a non-finite value nan at "
                                         r"index \[1\]"):
        fastlib.forward("softmax", [np.array([1.0, np.nan, 2.0], BF16)])
    with pytest.raises(TypeError, match="forward mode and second order run in float32 and "
                                        "float64"):
        fastlib.jvp("tanh", [x], [x], {})
    with pytest.raises(TypeError, match="takes bfloat16 and float16 storage"):
        fastlib.forward("exp", [np.ones(3, np.int16)])
    big_endian = np.array([1.0, 2.0], dtype=">f2")
    assert fastlib.forward("exp", [big_endian]).dtype == F16


def test_overflow_and_subnormal_results_round_like_the_format():
    # by hand: float16's 11.1 is 11.1015625 and exp of it 66264, past the 65520 threshold:
    # inf; exp(-16) = 1.125e-7 is 1.89 of float16's smallest subnormal 2**-24: 2 of them;
    # exp(11) = 59874.14 lies between 59872 and 59904 (spacing 32 there): 59872
    out = fastlib.forward("exp", [np.array([11.1, -16.0, 11.0], F16)])
    assert np.isposinf(out[0])
    assert out[1] == 2.0 ** -23
    assert out[2] == 59872.0
