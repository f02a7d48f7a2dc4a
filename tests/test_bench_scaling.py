"""`verigrad bench train --threads 1,2,4`: per-thread-count epochs, each engine's speedup, the
BLAS header and its warnings about kernel-forcing variables. Cheap: the scaling arithmetic and
the header are tested on hand-made inputs; one tiny end-to-end run is ``-m slow`` (a process
per thread count)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reports.bench import environment, scaling, train
from reports.cli import build_parser, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------------------------------
# the header

def test_a_forced_openblas_kernel_is_warned_about_by_name_with_the_fix():
    lines = environment.kernel_warnings({"OPENBLAS_CORETYPE": "Haswell", "HOME": "/root"})
    assert len(lines) == 1
    assert lines[0].startswith("WARNING: OPENBLAS_CORETYPE=Haswell")
    assert "unset OPENBLAS_CORETYPE" in lines[0]


@pytest.mark.parametrize("name", ["OPENBLAS_L2_SIZE", "MKL_ENABLE_INSTRUCTIONS",
                                  "ATEN_CPU_CAPABILITY", "NUMBA_CPU_NAME"])
def test_every_kernel_variable_is_warned_about(name):
    (line,) = environment.kernel_warnings({name: "x"})
    assert f"{name}=x" in line and f"unset {name}" in line


def test_no_warning_without_such_variables():
    assert environment.kernel_warnings({"OPENBLAS_NUM_THREADS": "2", "PATH": "/bin"}) == []
    assert environment.kernel_warnings({"OPENBLAS_CORETYPE": ""}) == []


def test_the_header_names_numpys_blas_as_threadpoolctl_sees_it():
    from threadpoolctl import threadpool_info

    import numpy  # noqa: F401

    expected = {(i["internal_api"], i["version"], i["architecture"])
                for i in threadpool_info() if i["user_api"] == "blas"}
    libs = environment.blas_libraries()
    assert expected and expected <= {(b["internal_api"], b["version"], b["architecture"])
                                     for b in libs}
    header = environment.header_lines({"blas": libs, "usable_cores": 2, "warnings": []})
    for api, version, arch in expected:
        assert f"{api} {version}" in header[0] and f"kernel {arch}" in header[0]
    assert header[1] == "cores this process may use: 2"


def test_bench_train_prints_the_blas_header_and_the_warning(capsys, monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    code, out, err = run(capsys, "bench", "train", "--samples", "8", "--batch-sizes", "4",
                         "--max-steps", "1", "--repeats", "1", "--threads", "1",
                         "--engines", "numpy")
    assert code == 0, err
    assert "\nBLAS: " in out and "kernel " in out
    assert "WARNING: OPENBLAS_CORETYPE=Haswell" in out and "unset OPENBLAS_CORETYPE" in out


# ---------------------------------------------------------------------------------------------
# --threads

@pytest.mark.parametrize("suite", ["train", "ops"])
def test_thread_lists_parse_and_bad_ones_are_refused(suite, capsys):
    parser = build_parser()
    assert parser.parse_args(["bench", suite, "--threads", "1,2,4,8,16"]).threads == \
        [1, 2, 4, 8, 16]
    assert parser.parse_args(["bench", suite, "--threads", "1", "2"]).threads == [1, 2]
    assert parser.parse_args(["bench", suite, "--threads", "2"]).threads == [2]
    for bad, why in (("0", "expects an integer >= 1, got '0'"),
                     ("two", "expects an integer >= 1, got 'two'"),
                     (",", "expects at least one name"),
                     ("2,2", "2 is given twice"),
                     ("1,-1", "expects an integer >= 1, got '-1'")):
        code, _, err = run(capsys, "bench", suite, "--threads", bad)
        assert code == 2 and err.startswith(f"usage: verigrad bench {suite}"), bad
        assert f"argument --threads: {why}" in err, (bad, err)


def _fake_runs():
    """Three thread counts' child reports, the times chosen by hand."""
    def report(fastlib, torch, load):
        return {"engines": ["fastlib", "torch"], "results": [
            {"batch_size": 32, "fastlib": fastlib, "torch": torch, "fastlib_loss": 2.5,
             "torch_loss": 2.5, "load_1min": load}]}
    return {1: report(0.8, 1.2, 1.0), 2: report(0.5, 0.6, 1.5), 4: report(0.4, 0.8, 2.0)}


def test_speedup_is_each_engines_own_one_thread_time_over_its_time_at_n():
    rows = scaling.scaling_rows(_fake_runs(), [32], ["fastlib", "torch"], cores=2)
    assert [r["threads"] for r in rows] == [1, 2, 4]
    assert [r["fastlib_speedup"] for r in rows] == pytest.approx([1.0, 1.6, 2.0])
    assert [r["torch_speedup"] for r in rows] == pytest.approx([1.0, 2.0, 1.5])
    assert [r["fastlib_over_torch"] for r in rows] == pytest.approx([0.8 / 1.2, 0.5 / 0.6,
                                                                     0.4 / 0.8])
    assert [r["oversubscribed"] for r in rows] == [False, False, True]


def test_the_table_flags_counts_above_the_cores_and_reports_a_failed_count():
    runs = _fake_runs()
    runs[8] = {"error": "exit 1: boom"}
    rows = scaling.scaling_rows(runs, [32], ["fastlib", "torch"], cores=2)
    assert rows[-1]["fastlib"] is None and rows[-1]["oversubscribed"]
    report = {"model": "m", "model_name": "mlp", "threads": [1, 2, 4, 8], "usable_cores": 2,
              "environment": {"blas": [], "usable_cores": 2, "warnings": []},
              "engines": ["fastlib", "torch"], "skipped": {}, "scaling": rows,
              "errors": {"8": "exit 1: boom"}}
    args = build_parser().parse_args(["bench", "train", "--samples", "8", "--repeats", "1"])
    text = scaling.render(report, args)
    cells = {tuple(t.split()[:2]): t for t in text.splitlines()}
    assert ("32", "4*") in cells and ("32", "2") in cells
    assert "* more threads than the 2 cores" in text
    assert "FAILED at 8 threads: exit 1: boom" in text
    line_2 = cells[("32", "2")]
    assert "1.60x" in line_2 and "2.00x" in line_2


def test_the_child_command_is_the_same_benchmark_at_one_thread_count():
    args = build_parser().parse_args(["bench", "train", "--model", "lstm", "--samples", "16",
                                      "--max-steps", "3", "--repeats", "2"])
    argv = scaling.child_command(args, [4, 8], ["fastlib", "torch"], 4, "/tmp/x.json")
    assert argv[1:3] == ["-m", "reports"]
    child = build_parser().parse_args(argv[3:])
    assert (child.model, child.batch_sizes, child.samples, child.max_steps, child.repeats,
            child.engines, child.threads, child.json) == (
        "lstm", [4, 8], 16, 3, 2, ["fastlib", "torch"], [4], "/tmp/x.json")
    env = scaling.child_environment(16, cores=2)
    assert env["NUMBA_NUM_THREADS"] == "16"
    assert scaling.child_environment(1, cores=2)["NUMBA_NUM_THREADS"] == "2"


@pytest.mark.slow
def test_a_thread_list_runs_each_count_and_reports_scaling(tmp_path):
    out = tmp_path / "scaling.json"
    proc = subprocess.run(
        [sys.executable, "-m", "reports", "bench", "train", "--samples", "8", "--batch-sizes",
         "4", "--max-steps", "2", "--repeats", "1", "--engines", "fastlib,numpy", "--threads",
         "1,3", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["threads"] == [1, 3] and not report["errors"]
    assert set(report["runs"]) == {"1", "3"}
    assert [r["threads"] for r in report["scaling"]] == [1, 3]
    assert report["runs"]["3"]["threads"] == 3
    one, three = report["scaling"]
    assert one["fastlib_speedup"] == 1.0
    assert three["fastlib_speedup"] == pytest.approx(one["fastlib"] / three["fastlib"])
    # the same model at every thread count
    assert three["fastlib_loss"] == pytest.approx(one["fastlib_loss"], rel=1e-4)
    assert "speedup" in proc.stdout and "BLAS: " in proc.stdout
