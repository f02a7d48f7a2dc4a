"""The kernel launchers hand their inputs to Numba as read-only views.

Numba types a read-only array apart from a writable one, so a kernel called with both (the
tape's values are read-only, a user's arrays are writable, a broadcast operand is read-only)
was compiled twice per dtype. These tests catch a launcher that passes an input as given: the
arguments each kernel receives are recorded, and every input must be read-only (the outputs
writable, the caller's arrays untouched), whatever the caller's flags were.
"""
import numpy as np
import pytest

from fastlib.kernels import binary, elementwise


def _spy(calls):
    def record(*args):
        calls.append(args)
    return record


@pytest.mark.parametrize("writable", [True, False])
def test_unary_launch_passes_read_only_inputs(monkeypatch, writable):
    calls = []
    monkeypatch.setattr(elementwise, "compiled_for", lambda kernel, *args: None)
    monkeypatch.setitem(elementwise.KERNELS, "vjp", (_spy(calls), None))
    x = np.linspace(-1.0, 1.0, 6).astype(np.float32)
    g = np.ones_like(x)
    x.flags.writeable = writable
    elementwise.unary_vjp("tanh", x, g)
    (code, xi, gi, out, slope), = calls
    assert not xi.flags.writeable and not gi.flags.writeable
    assert out.flags.writeable
    assert x.flags.writeable == writable and g.flags.writeable


def test_binary_launches_pass_read_only_inputs(monkeypatch):
    calls = []
    monkeypatch.setattr(binary, "_forward_tasks", _spy(calls))
    monkeypatch.setattr(binary, "_vjp_tasks", _spy(calls))
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    b = np.ones(3, np.float32)
    binary.binary_forward("mul", a, b)
    binary.binary_vjp("mul", a, b, np.ones((2, 3), np.float32))
    forward, vjp = calls
    assert not forward[1].flags.writeable and not forward[3].flags.writeable
    assert forward[5].flags.writeable
    assert not vjp[1].flags.writeable and not vjp[3].flags.writeable
    assert not vjp[5].flags.writeable               # the cotangent is an input too
    assert vjp[6].flags.writeable and vjp[7].flags.writeable
    assert a.flags.writeable and b.flags.writeable


def test_launch_results_match_with_either_flag():
    x = np.linspace(-3.0, 3.0, 11)
    frozen = x.copy()
    frozen.flags.writeable = False
    np.testing.assert_array_equal(elementwise.unary_forward("exp", x),
                                  elementwise.unary_forward("exp", frozen))


def test_float64_broadcast_vjp_passes_read_only_inputs(monkeypatch):
    # float64 with a broadcast operand takes the exact-terms kernel (then sums the pairs)
    calls = []

    def record(op, a, b, g, ga, la, gb, lb):
        calls.append((a, b, g, ga, la, gb, lb))
        for out in (ga, la, gb, lb):
            out[:] = 0.0
    monkeypatch.setattr(binary, "_vjp_terms_dd", record)
    binary.binary_vjp("mul", np.arange(6.0).reshape(2, 3), np.ones(3), np.ones((2, 3)))
    (a, b, g, *outs), = calls
    assert not any(v.flags.writeable for v in (a, b, g))
    assert all(v.flags.writeable for v in outs)
