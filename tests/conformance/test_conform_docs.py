"""docs/engines.md's tiny example engine, run exactly as printed: `verigrad conform` passes it,
and prints what the page's transcript shows.

The verdicts come from the suite's exact oracle; the engine's code is the documentation's.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from reports.cli import main

TESTS = Path(__file__).resolve().parents[1]
DOC = TESTS.parent / "docs" / "engines.md"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
from doc_outputs import mismatch  # noqa: E402 - tests/ holds the docs' shared helpers
from test_docs_examples import outputs  # noqa: E402


def _example_code():
    text = DOC.read_text()
    section = text[text.index("## A tiny engine that passes"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_docs_example_engine_passes(tmp_path, capsys):
    path = tmp_path / "tiny_engine.py"
    path.write_text(_example_code())
    report = tmp_path / "rows.json"
    code = main(["conform", "--engines", f"{path}:TinyEngine", "--no-proofs", "--no-progress",
                 "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    # the transcript on the page is this run's output (its masks aside)
    (shown,) = [o for o in outputs(DOC.read_text(encoding="utf-8"), DOC)
                if o.commands == ("verigrad conform --engines tiny_engine.py:TinyEngine "
                                  "--no-proofs",)]
    problem = mismatch(shown.text, out)
    assert problem is None, problem
    rows = json.loads(report.read_text())["rows"]
    measured = {(r["check"], r["name"]) for r in rows if r["status"] == "pass"}
    for op in ("tanh", "mul", "sum", "relu"):
        assert {("exact", op), ("jvp", op), ("special", op)} <= measured
    completeness = [r for r in rows if r["check"] == "completeness"]
    assert completeness[0]["status"] == "pass" and "33 declared unsupported" in \
        completeness[0]["detail"]
    unsupported = [r for r in rows if r["status"] == "unsupported"
                   and r["check"] not in ("jvp2", "hvp")]
    assert len(unsupported) == 33 + 7   # 33 ops and the 7 optimizers, each with its reason
    # no jvp/hvp: every second-order row says so, none fails
    second = [r for r in rows if r["check"] in ("jvp2", "hvp")]
    assert len(second) == 2 * 37 and all(
        r["status"] == "unsupported" and r["detail"] == "not provided: no jvp/hvp"
        for r in second)
