"""Measured tables in README.md and docs/ agree with the files that recorded them.

Each table between ``<!-- results: PATH table=NAME -->`` and ``<!-- /results -->`` is
re-rendered from PATH by ``reports.results_tables``; a hand edit or a stale table fails here.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from pathlib import Path

from reports import results_tables

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250


def test_every_rendered_table_matches_its_source():
    stale = results_tables.check(ROOT)
    assert not stale, "\n".join(stale)


def test_the_docs_hold_results_tables_from_each_source():
    sources = set()
    for doc in [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md")):
        sources |= {path for path, _, _ in results_tables.blocks(doc.read_text("utf-8"))}
    assert {"docs/results/accuracy-quick.json", "tests/peers/findings.json"} <= sources


def test_every_results_file_records_how_it_was_measured():
    files = sorted((ROOT / "docs" / "results").glob("*.json"))
    assert files, "docs/results/ holds no results file"
    for path in files:
        doc = json.loads(path.read_text("utf-8"))
        missing = {"command", "date", "machine", "versions", "load_before", "data"} - set(doc)
        assert not missing, f"{path.name} lacks {sorted(missing)}"
        # a verigrad command, or a script of tools/ that the repository holds
        script = doc["command"].split()[1] if doc["command"].startswith("python ") else ""
        assert doc["command"].startswith("verigrad ") or (
            script.startswith("tools/") and (ROOT / script).is_file()), path.name
        assert doc["machine"].get("cpus"), path.name
        # the record says what was measured, not where a scratch file went
        words = doc["command"].split()
        assert not {"--json", "--out"} & {w.split("=")[0] for w in words}, path.name
        assert "/tmp" not in doc["command"], path.name


def test_record_runs_the_command_with_its_own_scratch_output(tmp_path, monkeypatch):
    # the output flags a user gives are dropped; record names its own scratch file, reads it,
    # and records the command without it
    import subprocess
    import sys

    seen = {}

    real_run = subprocess.run

    def fake_run(argv, **kwargs):
        if argv[1:3] != ["-m", "reports"]:
            return real_run(argv, **kwargs)       # platform's own queries
        seen["argv"] = argv
        path = argv[argv.index("--json") + 1]
        pathlib.Path(path).write_text(json.dumps({"rows": [1]}), encoding="utf-8")
        return subprocess.CompletedProcess(argv, 0, "table\n", "")

    monkeypatch.setattr(results_tables.subprocess, "run", fake_run)
    out = tmp_path / "bench.json"
    doc = results_tables.record(out, ["bench", "ops", "--json", "/tmp/x.json", "--small"])
    assert doc["command"] == "verigrad bench ops --small"
    assert seen["argv"][:3] == [sys.executable, "-m", "reports"]
    assert seen["argv"][3:6] == ["bench", "ops", "--small"] and "/tmp/x.json" not in seen["argv"]
    assert json.loads(out.read_text())["data"] == {"rows": [1]}
    assert results_tables.without_outputs(["report", "--out=acc", "--quick", "--json", "r.json",
                                           "--no-progress"]) == ["report", "--quick",
                                                                 "--no-progress"]


def test_a_hand_edited_table_is_caught(tmp_path):
    # a copy of the repository's docs whose accuracy table has one number typed over
    (tmp_path / "docs").mkdir()
    shutil.copytree(ROOT / "docs" / "results", tmp_path / "docs" / "results")
    (tmp_path / "tests" / "peers").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "peers" / "findings.json", tmp_path / "tests" / "peers")
    text = (ROOT / "docs" / "results.md").read_text("utf-8")
    (tmp_path / "README.md").write_text("# x\n", "utf-8")
    (tmp_path / "docs" / "results.md").write_text(text, "utf-8")
    assert results_tables.check(tmp_path) == []
    rendered = results_tables.render("tests/peers/findings.json", "peers-summary", tmp_path)
    row = rendered.splitlines()[2]
    edited = row[:-2] + "0 |"          # the findings count, ten times over
    (tmp_path / "docs" / "results.md").write_text(text.replace(row, edited, 1), "utf-8")
    stale = results_tables.check(tmp_path)
    assert len(stale) == 1 and "peers-summary" in stale[0]
    assert results_tables.write(tmp_path) == ["docs/results.md"]
    assert results_tables.check(tmp_path) == []


def test_an_unknown_table_or_missing_file_is_a_clear_error(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="unknown results table 'nope'"):
        results_tables.render("tests/peers/findings.json", "nope")
    with pytest.raises(FileNotFoundError, match="record it with"):
        results_tables.render("docs/results/absent.json", "bench-ops", tmp_path)


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES} and move the "
        "rest to docs/")



def test_the_first_run_tables_say_whether_each_run_met_its_target():
    # a record as tools/first_run.py writes it (figures invented for the renderer only)
    run = {"checks": 3, "statuses": {"pass": 2, "unsupported": 1}, "proofs": 2, "workers": 2,
           "load_before": 1.5, "load_after": 2.5, "proof_seconds": 4.0}
    doc = {"command": "python tools/first_run.py", "date": "2026-11-27 18:00 UTC",
           "machine": {"cpus": 2, "system": "Linux x86_64"}, "load_before": 1.5,
           "load_after": 2.5, "seconds": 400.0,
           "data": {"targets": {"cold": 180, "warm": 90}, "runs": [
               {**run, "cache": "cold", "seconds": 181.0, "cpu_seconds": 300.0,
                "kernels_compiled": 7, "compile_seconds": 120.5, "compiled_again_seconds": 30.0,
                "compiles": {"fastlib.kernels.dense": {"kernels": 3, "seconds": 20.0},
                             "fastlib.kernels.elementwise": {"kernels": 4, "seconds": 100.5}},
                "row_seconds": {"exact": 50.0, "train": 90.0}},
               {**run, "cache": "warm", "seconds": 90.0, "cpu_seconds": 120.0,
                "kernels_compiled": 0, "compile_seconds": 0, "compiles": {},
                "row_seconds": {"exact": 10.0, "train": 20.0}}]}}
    runs = results_tables.first_run(doc).splitlines()
    assert runs[2].startswith("| cold | 181 | missed (at most 180 s) | 300 | 3 (2 pass, 1 "
                              "unsupported) | 2 | 7 | 120 | 30 | 2 | 1.5 / 2.5 |")
    # a record from before the compiled-again count shows a dash there
    assert runs[3].startswith("| warm | 90 | met (at most 90 s) | 120 |")
    assert runs[3].endswith("| 0 | 0 | - | 2 | 1.5 / 2.5 |")
    stages = results_tables.first_run_stages(doc).splitlines()
    # compiling by module, the longest first; the proofs; the checks, the longest first
    assert stages[2] == "| compiling `fastlib.kernels.elementwise` | 4 | 100 | - |"
    assert stages[3] == "| compiling `fastlib.kernels.dense` | 3 | 20 | - |"
    assert stages[4] == "| proving the spec (SymPy) | 2 | 4 | 4 |"
    assert stages[5:7] == ["| checks: `train` | - | 90 | 20 |", "| checks: `exact` | - | 50 | 10 |"]


def test_the_first_run_counts_what_a_second_process_compiled_again():
    import importlib.util

    path = ROOT / "tools" / "first_run.py"
    spec = importlib.util.spec_from_file_location("first_run", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    # by hand: a kernel compiled once costs nothing again; twice, the shorter time; three
    # times, the two shorter ones
    by_kernel = {"a(float64,)": {"p1": 3.0, "p2": 2.0}, "b(float32,)": {"p1": 5.0},
                 "c(int64,)": {"p1": 1.0, "p2": 4.0, "p3": 1.5}}
    assert tool.compiled_again(by_kernel) == 2.0 + 0.0 + 2.5
