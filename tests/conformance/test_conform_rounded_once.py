"""Results an engine declares rounded once are held to half an ulp, not the general bound.

fastlib declares its float32 binary-op VJPs (and sqrt's, sigmoid's and silu's) rounded once
(``fastlib.ops.ROUNDED_ONCE``). A
float32 accumulation of a broadcast VJP sum (``planted_engines.BroadcastVjpFloat32``) stays
inside the general binary-op bound (``P(m)`` roundings of the summed magnitudes) but not inside
the single rounding: the same wrong answer passes an engine that promises nothing and fails
the one that promises it. Expected values come from the exact oracle (spec at 50 digits).
"""
from __future__ import annotations

import numpy as np
import pytest

from reports.conformance import bounds
from reports.conformance.engines import FastlibEngine
from reports.conformance.properties import check_call, declared_rounded_once
from reports.conformance.special_values import special_cases
from tests.conformance import planted_engines as P


def _broadcast_sum(op, dtype):
    (ex,) = [e for e in special_cases(op, dtype) if e.label == "broadcast sum"]
    return ex


class _Undeclared(P.BroadcastVjpFloat32):
    rounded_once = {}


def test_fastlib_declares_its_float32_binary_vjps_rounded_once():
    engine = FastlibEngine()
    for op in ("add", "sub", "mul", "div", "maximum", "sqrt", "sigmoid", "silu"):
        assert declared_rounded_once(engine, op, np.float32) == {"vjp"}
        assert declared_rounded_once(engine, op, np.float64) == set()
    assert declared_rounded_once(engine, "sum", np.float32) == {"forward"}


@pytest.mark.parametrize("op", ["mul", "div"])
def test_honest_fastlib_meets_the_single_rounding(op):
    assert check_call(FastlibEngine(), _broadcast_sum(op, np.float32)).ok


def test_float32_accumulation_fails_only_where_a_single_rounding_is_promised():
    ex = _broadcast_sum("mul", np.float32)
    declared = check_call(P.BroadcastVjpFloat32(), ex)
    assert not declared.ok
    assert "d/d" in declared.describe() and "ulp" in declared.describe()
    assert check_call(_Undeclared(), ex).ok         # the general bound forgives it


def test_a_float32_unary_vjp_fails_only_where_a_single_rounding_is_promised():
    from reports.conformance.strategies import OpExample

    rng = np.random.default_rng(3)
    x = rng.uniform(-6, 6, 256).astype(np.float32)
    ex = OpExample("sigmoid", (x,), rng.standard_normal(256).astype(np.float32), {}, 0, False,
                   "planted")

    class Undeclared(P.SigmoidVjpFloat32):
        rounded_once = {}

    assert check_call(FastlibEngine(), ex).ok
    assert not check_call(P.SigmoidVjpFloat32(), ex).ok
    assert check_call(Undeclared(), ex).ok


def test_single_rounding_bound_is_half_an_ulp_plus_float64_accumulation():
    # hand derivation: grad_b = sum of 3 terms g * a, |terms| = 1, 2, 4 -> exact 1 - 2 + 4 = 3
    a = np.array([[1.0], [2.0], [4.0]])
    b = np.array([[1.0]])
    g = np.array([[1.0], [-1.0], [1.0]])
    _, (A_a, A_b) = bounds.rounded_once("mul", [a, b], g, {}, a * b, [g * b, np.array([[3.0]])],
                                        np.float32)
    ratio = 2.0 ** -52 / 2.0 ** -23
    assert A_b[0, 0] == pytest.approx(0.5 * 3 + ratio * (3 + 3) * 7)
    assert np.allclose(A_a, 0.5 * np.abs(g) + ratio * (1 + 3) * np.abs(g))


def test_a_declaration_the_suite_cannot_hold_is_refused_with_the_ops_it_can():
    class Overpromise(FastlibEngine):
        rounded_once = {"matmul": {"vjp": ("float32",)}, "tanh": {"forward": ("float32",)}}

    for op in ("matmul", "tanh"):
        with pytest.raises(ValueError, match="no rounded-once bound.*mul: forward, vjp"):
            declared_rounded_once(Overpromise(), op, np.float32)
