"""docs/engines.md's tiny example engine, run exactly as printed: `verigrad conform` passes it.

The verdicts come from the suite's exact oracle; the engine's code is the documentation's.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from reports.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "engines.md"


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
