"""A higher derivative an engine cannot take of an op it supports is declared, with the reason,
and its second-order row reads "unsupported", never a failure: Paddle's missing grad ops.

The declaration is tested without Paddle: the adapter's class is read, and an instance whose
op table covers the registry stands in for the engine.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import spec
from reports.commands.conform import row_cells
from reports.conformance.adapters.paddle import NO_GRAD_OP, PaddleEngine
from reports.conformance.engines import FastlibEngine
from reports.conformance.second_order_rows import KINDS, second_order_rows

ADAPTERS = ["paddle", "tinygrad", "mygrad", "autograd", "torch", "jax"]


def _paddle_without_paddle():
    engine = object.__new__(PaddleEngine)          # no paddle import: __init__ is skipped
    engine.ops = {name: None for name in spec.OPS}
    return engine


def test_paddle_declares_relu_and_leaky_relu_j_t_missing_with_the_reason():
    declared = PaddleEngine.unsupported_derivatives["jvp2"]
    for op, grad in (("relu", "relu_double_grad"), ("leaky_relu", "leaky_relu_double_grad")):
        assert grad in declared[op] and "doesn't have any grad op" in declared[op]
        assert "paddle.incubate.autograd.jvp" in declared[op]
    # H t of relu needs no such op (its backward differentiates to 0): it stays checked
    assert "relu" not in PaddleEngine.unsupported_derivatives["hvp"]
    assert PaddleEngine.unsupported_derivatives == {
        kind: {op: PaddleEngine.unsupported_derivatives[kind][op] for op in ops}
        for kind, ops in NO_GRAD_OP.items()}


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_declaration_names_a_registry_op_and_a_second_order_kind(adapter):
    module = importlib.import_module(f"reports.conformance.adapters.{adapter}")
    classes = [c for c in vars(module).values() if isinstance(c, type)
               and hasattr(c, "unsupported_derivatives")]
    for cls in classes:
        for kind, ops in cls.unsupported_derivatives.items():
            assert kind in KINDS, (cls.__name__, kind)
            for op, reason in ops.items():
                assert op in spec.OPS and reason.strip(), (cls.__name__, kind, op)


def test_a_declared_derivative_is_an_unsupported_row_with_its_reason():
    engine = _paddle_without_paddle()
    rows = second_order_rows(engine, "paddle", [np.float32, np.float64], ["relu", "tanh"])
    by = {(r.kind, r.name, r.dtype): r for r in rows}
    assert len(rows) == 2 * 2 * 2
    for dt in ("float32", "float64"):
        row = by[("jvp2", "relu", dt)]
        assert row.result is not None and row.result.status == "unsupported"
        assert row.result.detail == PaddleEngine.unsupported_derivatives["jvp2"]["relu"]
        cells, note = row_cells(row)
        assert cells[-1] == "unsupported" and "relu_double_grad" in note
        # the others are checked: their rows run (no result until they do)
        for key in (("hvp", "relu", dt), ("jvp2", "tanh", dt), ("hvp", "tanh", dt)):
            assert by[key].result is None and by[key].run is not None
    ok, why = engine.supports_derivative("relu", "jvp2")
    assert not ok and "relu_double_grad" in why
    assert engine.supports_derivative("relu", "hvp") == (True, "")


def test_engines_without_declarations_are_unchanged():
    engine = FastlibEngine()
    assert engine.unsupported_derivatives == {}
    assert all(engine.supports_derivative(op, kind) == (True, "")
               for op in spec.OPS for kind in KINDS)
    rows = second_order_rows(engine, "fastlib", [np.float64], ["relu"])
    assert [r.result for r in rows] == [None, None]


def test_the_peer_findings_skip_a_declared_derivative(monkeypatch):
    from reports import peers_findings
    from reports.conformance import engines as registry

    engine = _paddle_without_paddle()
    engine.name = "paddle"
    monkeypatch.setattr(registry, "engine_status",
                        lambda name: registry.EngineStatus(name, True, ""))
    monkeypatch.setattr(registry, "get_engine", lambda name: engine)
    monkeypatch.setattr(peers_findings, "engine_version", lambda name: "3.3.1")
    asked = []
    monkeypatch.setattr(peers_findings, "_findings",
                        lambda engine, name, derivative, op, *a: asked.append((derivative, op))
                        or [])
    doc = peers_findings.find(["paddle"], ops=["relu", "tanh"], derivatives=("jvp2", "hvp"))
    assert ("jvp2", "relu") not in asked
    assert {("jvp2", "tanh"), ("hvp", "relu"), ("hvp", "tanh")} <= set(asked)
    info = doc["engines"]["paddle"]
    assert info["unsupported_derivatives"]["jvp2"]["relu"] == \
        PaddleEngine.unsupported_derivatives["jvp2"]["relu"]
