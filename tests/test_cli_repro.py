"""A failing row's reproduction command runs as printed, whatever the row's name.

The command is shell-quoted, so a name with spaces (``maximum NaN routing``, ``Dense bias
sum``) stays one ``--ops`` value: every planned row's command parses, passes the usage checks
and selects that row; and a failing row's printed command, run again, fails the same row.
"""
from __future__ import annotations

import re
import shlex

import pytest

from reports.cli import build_parser, main
from reports.commands import conform
from reports.conformance.runner import PROFILES, _command, plan_rows

ROWS, _ = plan_rows(["reflib", "fastlib"])

NAN_DROPPING = '''\
import numpy as np

from reports.conformance.engines import FastlibEngine


class NanDropping(FastlibEngine):
    """fastlib, except that maximum drops a NaN beside a number (NumPy's fmax)."""

    name = "nan-dropping"

    def _forward(self, name, inputs, **params):
        if name == "maximum":
            return np.fmax(*[np.asarray(x) for x in inputs])
        return super()._forward(name, inputs, **params)
'''


def test_some_row_names_hold_spaces():
    # what this file guards: such names exist among the kinds of row
    spaced = {(r.kind, r.name) for r in ROWS if " " in r.name and r.kind != "completeness"}
    assert {"special", "train", "targetprop"} <= {kind for kind, _ in spaced}


@pytest.mark.parametrize("kind", sorted({r.kind for r in ROWS}))
def test_every_rows_command_parses_and_selects_that_row(kind):
    parser = build_parser()
    for row in [r for r in ROWS if r.kind == kind]:
        command = _command(row, PROFILES["dev"], 3)
        words = shlex.split(command)
        assert words[:2] == ["verigrad", "conform"]
        args = parser.parse_args(words[1:])
        assert conform.validate(args) is None, command
        if kind != "completeness":
            assert args.ops == [row.name], command
        selected, _ = plan_rows(conform._engine_names(args.engines), ops=args.ops,
                                dtype=conform.dtype_filter(args))
        assert any((r.kind, r.name, r.engine, r.dtype) == (row.kind, row.name, row.engine,
                                                           row.dtype) for r in selected), command


def test_a_failing_rows_printed_command_fails_it_again(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nan_engine.py").write_text(NAN_DROPPING, encoding="utf-8")
    code = main(["conform", "--engines", "nan_engine.py:NanDropping", "--ops",
                 "maximum NaN routing", "--dtypes", "float64", "--no-proofs", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1, out
    printed = re.findall(r"^reproduce \(command\): (.*)$", out, re.M)
    assert len(printed) == 1 and "'maximum NaN routing'" in printed[0], out
    words = shlex.split(printed[0])
    assert words[0] == "verigrad"
    assert main(words[1:]) == 1
    again = capsys.readouterr().out
    assert "FAILED: special maximum NaN routing [nan-dropping float64]" in again
    # that row alone ran again (the table may wrap its name onto a second line)
    rows = [line for line in again.splitlines() if line.startswith("| ") and "FAIL" in line]
    assert len(rows) == 1 and rows[0].startswith("| special | maximum NaN")
    assert "1 checks (1 FAIL)" in again


def test_an_ops_selection_keeps_the_ops_rows_with_longer_names(tmp_path, capsys, monkeypatch):
    # `--ops maximum` runs maximum's NaN routing row too: an engine that drops a NaN (as
    # torch.where(a > b, a, b) does) passed every row that selection ran
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nan_engine.py").write_text(NAN_DROPPING, encoding="utf-8")
    code = main(["conform", "--engines", "nan_engine.py:NanDropping", "--ops", "maximum",
                 "--dtypes", "float64", "--no-proofs", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "FAILED: special maximum NaN routing [nan-dropping float64]" in out
