"""The jvp2 / hvp rows of ``verigrad conform``: selected by kind, "not provided" for an engine
without jvp/hvp, bounds derived by hand, and the planted second-order mutants of
``reports.conformance.mutants`` caught by the rows while the unmutated fastlib passes them.

The mutants here are applied in-process to fastlib's pure-NumPy second-order module (the same
target text the mutant harness patches), and only the mutated op's rows run; the harness's own
run of every mutant through the whole dev profile is ``test_conform_mutants.py -m slow``.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

from reports.conformance.engines import Engine, FastlibEngine
from reports.conformance.mutant_runner import fastlib_source
from reports.conformance.mutants import MUTANTS
from reports.conformance.rows import PROFILES
from reports.conformance.runner import _command, plan_rows, run_rows
from reports.conformance.second_order_bounds import running_error
from reports.conformance.second_order_rows import second_order_rows

SECOND_ORDER_MUTANTS = [m for m in MUTANTS if m.path == "second_order.py"]


def _mutated_fastlib(mutant):
    """fastlib with ``mutant`` applied to a fresh copy of its second-order module."""
    source = (fastlib_source() / mutant.path).read_text()
    assert source.count(mutant.old) == 1, f"{mutant.key}: stale target"
    module = types.ModuleType(f"mutated_{mutant.key.replace('-', '_')}")
    exec(compile(source.replace(mutant.old, mutant.new), f"<{mutant.key}>", "exec"),
         module.__dict__)

    class Mutated(FastlibEngine):
        name = f"fastlib+{mutant.key}"

        def _jvp(self, name, inputs, tangents, **params):
            return module.jvp(name, inputs, tangents, params)

        def _hvp(self, name, inputs, cotangent, tangents, **params):
            return module.hvp(name, inputs, cotangent, tangents, params)

    return Mutated()


def _run(engine, op):
    rows = second_order_rows(engine, "fastlib", [np.dtype(np.float64)], [op])
    return {row.kind: row.result for row in run_rows(rows, PROFILES["dev"], 0)}


def test_the_three_kinds_of_planted_second_order_bug_are_registered():
    keys = {m.key for m in SECOND_ORDER_MUTANTS}
    assert {"mul-hvp-cross-term", "softmax-hvp-sign", "norm-sigma-f32"} <= keys


@pytest.mark.parametrize("mutant", SECOND_ORDER_MUTANTS, ids=lambda m: m.key)
def test_a_planted_second_order_bug_fails_its_rows_and_fastlib_passes_them(mutant):
    op = mutant.first[0]
    mutated = _run(_mutated_fastlib(mutant), op)
    assert any(r.status == "FAIL" for r in mutated.values()), \
        {k: (r.status, r.detail[:200]) for k, r in mutated.items()}
    clean = _run(FastlibEngine(), op)
    assert all(r.status == "pass" for r in clean.values()), \
        {k: (r.status, r.detail[:300]) for k, r in clean.items()}


def test_an_engine_without_jvp_and_hvp_gets_not_provided_rows_never_failed():
    class FirstOrderOnly(Engine):
        name = "first-order-only"

    engine = FirstOrderOnly()
    assert not engine.second_order
    rows = second_order_rows(engine, "first-order-only", [np.dtype(np.float64)],
                             ["tanh", "mul"])
    assert [(r.kind, r.name) for r in rows] == [("jvp2", "tanh"), ("hvp", "tanh"),
                                                ("jvp2", "mul"), ("hvp", "mul")]
    for r in rows:
        assert r.result.status == "unsupported"
        assert r.result.detail == "not provided: no jvp/hvp"


def test_ops_selects_the_second_order_kinds_and_the_command_reruns_the_op():
    rows, _ = plan_rows(["fastlib"], ops=["hvp"])
    import spec

    assert {r.kind for r in rows} == {"hvp"}
    assert sorted({r.name for r in rows}) == sorted(spec.OPS)
    assert {r.dtype for r in rows} == {"float32", "float64"}
    both, _ = plan_rows(["fastlib"], ops=["jvp2", "hvp"], dtype="float64")
    assert len(both) == 2 * len(spec.OPS)
    row = next(r for r in rows if r.name == "softmax" and r.dtype == "float64")
    assert _command(row, PROFILES["dev"], 3) == (
        "verigrad conform --profile dev --engines fastlib --ops softmax --seed 3 "
        "--dtypes float64 --no-proofs")


def test_running_error_of_mul_matches_the_hand_derivation():
    # J t = t_a·b + a·t_b: two products rounded, then their sum: |t_a b| + |a t_b| + |J t|
    # H t per input differentiates the VJPs g·b and g·a: one product each, |g t_b|, |g t_a|
    a, b, ta, tb, g = (np.array([v]) for v in (3.0, 5.0, 1.0, -2.0, 0.5))
    jvp_e, (ha, hb) = running_error("mul", [a, b], g, [ta, tb])
    assert jvp_e.tolist() == [5.0 + 6.0 + 1.0]
    assert ha.tolist() == [1.0] and hb.tolist() == [0.5]


def test_running_error_sees_the_cancellation_of_a_narrow_layer_norm_row():
    # centring a row whose spread is 1e-6 of its mean keeps the error of the mean (≈ |x| u)
    # while σ ≈ 1e-6: the bound per entry grows by about 1/spread over a well-spread row
    rng = np.random.default_rng(0)
    t, g = rng.standard_normal((1, 4)), rng.standard_normal((1, 4))
    spread = rng.standard_normal((1, 4))
    wide, _ = running_error("layer_norm", [spread], g, [t], {"eps": 1e-12})
    narrow, _ = running_error("layer_norm", [1.0 + 1e-6 * spread], g, [t], {"eps": 1e-12})
    assert np.all(narrow > 1e5 * wide)


class _ReluSlope(FastlibEngine):
    """fastlib, except that relu's J t at x == 0 is ``slope · t``."""

    slope = 0.5

    def _jvp(self, name, inputs, tangents, **params):
        out, jt = FastlibEngine._jvp(self, name, inputs, tangents, **params)
        if name == "relu":
            x, t = np.asarray(inputs[0]), np.asarray(tangents[0])
            jt = np.where(x == 0, self.slope * t, jt).astype(jt.dtype)
        return out, jt


def test_kinks_per_policy_for_the_jvp():
    """relu'(0) = 0.5 is a valid subgradient: strict fails it naming the convention,
    subgradient passes and reports it; relu'(0) = 2 is outside [0, 1] and fails both."""
    from reports.conformance.second_order import check_jvp2
    from reports.conformance.strategies import OpExample

    x = np.array([0.0, -0.0, 1.5, -2.0])
    ex = OpExample("relu", (x,), np.array([0.3, -1.2, 0.7, 2.0]), {}, 5)
    assert check_jvp2(FastlibEngine(), ex, "strict").ok
    half = _ReluSlope()
    strict, loose = check_jvp2(half, ex, "strict"), check_jvp2(half, ex, "subgradient")
    assert not strict.ok and "not the registry's convention" in strict.describe()
    assert loose.ok and loose.conventions
    half.slope = 2.0
    for mode in ("strict", "subgradient"):
        r = check_jvp2(half, ex, mode)
        assert not r.ok and "outside the Clarke subdifferential" in r.describe()
