"""The runner and ``verigrad conform``: rows, filters, exit codes, the JSON twin of the table,
and failures shrunk into reproductions that fail again when pasted.

The planted defects here are known by construction (a VJP scaled by 1 + 1e-3, a sign flip), so
the expected verdicts are independent of the code under test.
"""
from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import strategies as st

import optable
from reports.cli import main
from reports.conformance import properties, runner
from reports.conformance.oracle import Measure

PLANTED = textwrap.dedent('''
    import numpy as np
    import fastlib
    from reports.conformance.engines import Engine

    class Noisy(Engine):
        """fastlib, except that tanh's VJP is 1e-3 too large and neg's forward flips sign."""
        name = "noisy"
        dtypes = (np.dtype(np.float32), np.dtype(np.float64))

        def _forward(self, name, inputs, **params):
            out = fastlib.forward(name, inputs, **params)
            return -out if name == "neg" else out

        def _vjp(self, name, inputs, grad, **params):
            grads = fastlib.vjp(name, inputs, grad, **params)
            if name == "tanh":
                grads = tuple(g * g.dtype.type(1 + 1e-3) for g in grads)
            return grads
''')


@pytest.fixture
def planted(tmp_path, monkeypatch):
    (tmp_path / "planted_engine_mod.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "planted_engine_mod:Noisy"
    sys.modules.pop("planted_engine_mod", None)


def test_run_property_keeps_the_shrunk_case():
    seen = []

    def check(x):
        result = properties.Result()
        result.measures.append(Measure("x", float(x), 10.0, x <= 10))
        return result

    out = runner.run_property(st.integers(0, 10**6), check, 200, seed=3,
                              reproduce=lambda x: seen.append(x) or f"x = {x}")
    assert out.status == "FAIL"
    assert seen == [11], "Hypothesis shrinks to the smallest failing value, 11"
    assert out.reproduction == "x = 11" and out.error == 11.0 and out.bound == 10.0


def test_run_property_reports_the_worst_passing_ratio():
    def check(x):
        result = properties.Result()
        result.measures.append(Measure("x", float(x), 100.0, True))
        return result

    out = runner.run_property(st.integers(0, 50), check, 30, seed=0)
    assert out.status == "pass" and out.examples == 30
    assert 0 < out.error <= 50 and out.bound == 100.0


def test_planted_defects_fail_with_reproductions(planted, capsys, tmp_path):
    report = tmp_path / "rows.json"
    code = main(["conform", "--engines", planted, "--ops", "tanh", "neg", "exp",
                 "--no-proofs", "--no-progress", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED: exact tanh [noisy float32]" in out
    assert "FAILED: jvp tanh [noisy float64]" in out
    assert "FAILED: exact neg [noisy float64]" in out
    assert "reproduce (command): verigrad conform --profile dev --engines " + planted in out
    rows = json.loads(report.read_text())["rows"]
    by_key = {(r["check"], r["name"], r["dtype"]): r for r in rows}
    assert by_key[("exact", "exp", "float32")]["status"] == "pass"
    assert by_key[("special", "tanh", "float64")]["status"] == "FAIL"
    # the JSON holds the table's rows: every row of the table is there with the same status
    table = [line for line in out.splitlines() if line.startswith("| ") and "noisy" in line]
    assert len(table) == len(rows)
    # the Python reproduction fails again when pasted (and so names the defect)
    snippet = by_key[("exact", "tanh", "float32")]["reproduction"]
    assert f"engines.get_engine({planted!r})" in snippet
    namespace = {}
    exec(compile(snippet, "<reproduction>", "exec"), namespace)
    again = properties.check_call(namespace["engine"], namespace["ex"])
    assert not again.ok and "d/dx" in again.describe()
    # the shrunk example is small: Hypothesis minimised the shape
    assert np.size(namespace["ex"].inputs[0]) <= 1


def test_a_clean_engine_passes_and_filters_apply(capsys, tmp_path):
    report = tmp_path / "rows.json"
    code = main(["conform", "--engines", "reflib", "--ops", "tanh", "Adam", "--dtypes",
                 "float64", "--no-proofs", "--no-progress", "--json", str(report)])
    assert code == 0, capsys.readouterr().out
    rows = json.loads(report.read_text())["rows"]
    second = {("jvp2", "tanh"), ("hvp", "tanh")}
    assert {(r["check"], r["name"]) for r in rows} == {
        ("exact", "tanh"), ("jvp", "tanh"), ("special", "tanh"), ("optimizer", "Adam")} | second
    for r in rows:
        if (r["check"], r["name"]) in second and r["status"] == "unsupported":
            assert r["detail"] == "not provided: no jvp/hvp"   # an engine without jvp/hvp
        else:
            assert r["status"] == "pass" and r["examples"] > 0, r


def test_unknown_and_unavailable_engines(capsys):
    assert main(["conform", "--engines", "fastlb", "--no-proofs", "--no-progress"]) == 2
    assert "did you mean 'fastlib'" in capsys.readouterr().err
    import fastlib.cuda as fc

    if not fc.is_available():
        code = main(["conform", "--engines", "fastlib-cuda", "--no-proofs", "--no-progress"])
        out = capsys.readouterr().out
        assert code == 1 and "engine fastlib-cuda is unavailable" in out
        assert fc.unavailable_reason() in out


def test_profiles_grow():
    dev, ci, thorough = (runner.PROFILES[n] for n in ("dev", "ci", "thorough"))
    for field in ("examples", "optimizer", "tape", "train", "algorithms"):
        assert getattr(dev, field) <= getattr(ci, field) < getattr(thorough, field)


def test_plan_covers_every_op_and_check_for_the_default_engines():
    import spec

    rows, statuses = runner.plan_rows(["reflib", "fastlib"])
    kinds = {r.kind for r in rows}
    assert kinds == set(runner.KINDS)
    # fastlib stores every format of the suite (the 16-bit ones computed in float32)
    every_format = set(optable.formats.names())
    for engine, dtypes in (("reflib", {"float64"}), ("fastlib", every_format)):
        for check in ("exact", "jvp", "special"):
            covered = {(r.name, r.dtype) for r in rows if r.engine == engine and r.kind == check
                       and r.name != "maximum NaN routing"}
            assert covered == {(n, d) for n in spec.OPS for d in dtypes}
    trains = {r.name for r in rows if r.kind == "train"}
    from reports.conformance.strategies import LAYER_KINDS
    assert trains == set(LAYER_KINDS) | {"fused MLP", "generic", "boundaries",
                                           "compiled recurrent", "compiled attention",
                                           "Dense bias sum", "mixed MLP", "loss scale",
                                           "rounding points", "kinked Dense"}
    assert {(r.engine, r.name) for r in rows if r.kind == "program"} == {
        ("reflib", "program random networks"), ("fastlib", "program random networks")}
    nan_rows = {(r.engine, r.dtype) for r in rows if r.name == "maximum NaN routing"}
    assert nan_rows == {("reflib", "float64")} | {("fastlib", d) for d in every_format}


def test_proofs_come_first_and_follow_ops(capsys):
    code = main(["conform", "--engines", "reflib", "--ops", "tanh", "SGD", "--dtypes", "float64",
                 "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out
    proofs, _, checks = out.partition("| check")
    assert "| op        | tanh" in proofs and "| optimizer | SGD" in proofs
    assert "sigmoid" not in proofs                      # only the named subjects are proven
    assert "2 proofs" in checks and "| exact " in checks
