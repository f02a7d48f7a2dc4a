"""The dev profile against planted accuracy bugs (``planted_engines``): each must fail, with a
finding that names the element, its inputs, the engine's and the exact value and the bound;
kink conventions pass under ``--kinks subgradient`` and are reported as such.

Oracles: ``spec.evaluate`` at 50 digits (through the suite); the bugs are written apart from
fastlib in ``planted_engines``, so what the suite reports comes from the suite alone.
"""
from __future__ import annotations

import contextlib
import io
import os

import numpy as np
import pytest

from reports.conformance.runner import PROFILES, plan_rows, run_rows
from tests.conformance import planted_engines as P

HERE = os.path.join("tests", "conformance", "planted_engines.py")


def _run(cls, op, kinds=None, dtype=None, kink_mode=None):
    rows, statuses = plan_rows([f"{HERE}:{cls.__name__}"], ops=[op], kinds=kinds, dtype=dtype,
                               kink_mode=kink_mode)
    assert all(s.available for s in statuses)
    return run_rows(rows, PROFILES["dev"], 0)


def _failed(rows):
    return [r for r in rows if r.result.status == "FAIL"]


# (class, op, the rows that catch it, dtype, text the finding must hold)
CAUGHT = [
    (P.SigmoidCancel, "sigmoid", ["special"], "float64",
     "[saturation x = -80.0] output[] at x = -80.0"),
    (P.SoftplusNoLog1p, "softplus", ["special"], "float32", "[saturation x = -80.0]"),
    (P.SoftplusFlush32, "softplus", ["special"], "float32", "engine 0.0, exact 9.3576"),
    (P.TanhTinyZero, "tanh", ["special"], "float64", "at x = 1e-150, grad ="),
    (P.TanhSmallByExp, "tanh", ["special"], "float64", "[tiny x = 1e-05]"),
    (P.MatmulOneEntryOff, "matmul", ["exact"], "float64", "d/da["),
    (P.SoftmaxLseRounded, "softmax", ["exact"], "float64", "output["),
    (P.MaximumTieDoubled, "maximum", ["special"], "float32",
     "outside the Clarke subdifferential"),
]


@pytest.mark.parametrize("cls, op, kinds, dtype, text", CAUGHT,
                         ids=[c[0].__name__ for c in CAUGHT])
def test_planted_bug_is_caught_with_an_actionable_finding(cls, op, kinds, dtype, text):
    failed = _failed(_run(cls, op, kinds, dtype))
    assert failed, f"{cls.__name__} passed the dev profile"
    detail = failed[0].result.detail
    assert text in detail, detail
    # the worst element: engine value, exact value, error against its bound
    assert "engine " in detail and "exact " in detail and "bound" in detail, detail
    for bad in ("eps >", "inf >"):
        assert bad not in detail, detail


def test_planted_bug_fails_in_every_default_engine_row_kind_that_sees_it():
    """The tie bug fails in both kink modes; the message says it is not a convention."""
    for mode in ("strict", "subgradient"):
        failed = _failed(_run(P.MaximumTieDoubled, "maximum", ["exact"], "float64", mode))
        assert failed and "outside the Clarke subdifferential" in failed[0].result.detail


def test_relu_half_is_a_convention_only_under_subgradient():
    strict = _run(P.ReluHalf, "relu", ["exact", "special"], "float64", "strict")
    assert _failed(strict)
    assert "valid subgradient" in _failed(strict)[0].result.detail
    loose = _run(P.ReluHalf, "relu", ["exact", "special"], "float64", "subgradient")
    assert not _failed(loose), [r.result.detail for r in loose]
    assert any("relu'(0) = 0.5" in r.result.detail for r in loose)


def test_reproduction_pastes_and_prints_the_worst_element():
    failed = _failed(_run(P.TanhSmallByExp, "tanh", ["exact"], "float32"))
    assert failed
    snippet = failed[0].result.reproduction
    assert not snippet.startswith((" ", "\t"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "<reproduction>", "exec"), {})   # runs as printed
    printed = out.getvalue()
    assert "engine " in printed and "exact " in printed and "ulp" in printed, printed
    assert "--no-proofs" in failed[0].result.command


def test_several_distinct_failures_are_reported():
    failed = _failed(_run(P.SoftmaxLseRounded, "softmax", ["exact"], "float64"))
    lines = [ln for ln in failed[0].result.detail.splitlines() if ln.startswith("[")]
    assert 2 <= len(lines) <= 3, lines
    assert len({ln.split("]")[0] for ln in lines}) == len(lines)


def test_an_entry_far_smaller_than_the_rest_keeps_its_own_bound():
    """Norm-wise, an error of 1e-3 in an entry 1e-12 the size of its neighbours vanishes;
    element by element it does not (the one rule: ``bounds.entrywise``)."""
    from reports.conformance import bounds

    hi = np.array([1.0, 1e-12])
    got = hi * np.array([1.0, 1 + 1e-3])
    _, _, ok = bounds.entrywise(got, hi, np.zeros(2), np.abs(hi) * 4, np.float64)
    assert ok.tolist() == [True, False]
    # the floor is the dtype's smallest normal number, whatever the other entries are
    _, allowed, ok = bounds.entrywise(np.array([1e300, 0.0]), np.array([1e300, 1e-150]),
                                      np.zeros(2), np.array([4e300, 4e-150]), np.float64)
    assert not ok[1] and allowed[1] < 1e-160


def test_accuracy_report_and_conformance_judge_by_the_same_rule():
    """``verigrad report``'s ``beyond_bound`` and ``verigrad conform`` agree on the same
    cases: the report counts the elements ``bounds.entrywise`` rejects."""
    from reports import accuracy as A
    from reports.conformance import engines, properties
    from reports.conformance.strategies import OpExample

    config = A.Config(samples=3, ops=("matmul",), dtypes=("float64",), fd_steps=(),
                      sources=("uniform", "special"))
    planted, clean = P.MatmulOneEntryOff(), engines.get_engine("fastlib")
    res = A.measure_op("matmul", [planted, clean], config)
    rows = {r["engine"]: r for r in res["rows"] if r["kind"] == "engine"}
    assert rows["fastlib"]["beyond_bound"] == 0
    assert rows[planted.name]["beyond_bound"] > 0
    table_cases = A.draw_cases("matmul", 3, A.op_rng(0, "matmul"), ("uniform",))
    verdicts = []
    for case in table_cases:
        ex = OpExample("matmul", tuple(case.inputs), case.grad, dict(case.params))
        verdicts.append(properties.check_call(planted, ex).ok)
    big = [c for c in table_cases if c.inputs[0].size >= 8]
    assert big and not all(verdicts)
