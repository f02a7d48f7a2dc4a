"""tools/gpu_check.py, the first-GPU checklist, run end to end under numba's CUDA simulator
(``--simulate``) into a temporary folder: the JSON's structure, the Markdown summary, and a
failing stage reported (status, detail, output tail, exit 1), never hidden."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

STAGE_KEYS = {"stage", "status", "seconds", "box_s", "detail", "data", "returncode", "command"}


def simulate(tmp_path, *extra, timeout=900):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--simulate", "--out", str(tmp_path),
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    files = sorted(tmp_path.glob("gpu-check-*-simulator.json"))
    assert len(files) == 1, (proc.stdout, proc.stderr[-3000:])
    md = files[0].with_suffix(".md")
    assert md.exists()
    recorded = json.loads(files[0].read_text())
    # the envelope of every results file: how it was measured, the check's own data inside
    assert recorded["command"].startswith("python tools/gpu_check.py --simulate")
    assert "--out" not in recorded["command"] and recorded["machine"]["cpus"]
    return proc, recorded["data"], md.read_text()


def test_the_gpu_boxes_fit_the_budget_and_one_device_command():
    # the boxes leave time to start the process; the whole check fits one 10-minute command
    assert sum(gpu_check.BOXES.values()) <= gpu_check.BUDGET_S - 10
    assert gpu_check.BUDGET_S <= 580
    assert list(gpu_check.BOXES)[:2] == ["versions", "warmup"]  # the compiles come first
    assert [s for s in gpu_check.BOXES if s.startswith("bench-")] == [
        f"bench-{m}" for m in gpu_check.BENCH_MODELS]


def test_the_file_is_named_by_date_and_gpu():
    assert gpu_check.gpu_slug({"gpu": "NVIDIA H200"}, False) == "H200"
    assert gpu_check.gpu_slug({"gpu": "NVIDIA GeForce RTX 4090"}, False) == "GeForce-RTX-4090"
    assert gpu_check.gpu_slug(None, False) == "unknown-gpu"
    assert gpu_check.gpu_slug({"gpu": "x"}, True) == "simulator"


def test_a_broken_stage_is_reported_and_the_run_fails(tmp_path):
    # two stages only (the bench stage's machinery is tests/test_bench_cuda.py's): cheap
    proc, result, md = simulate(tmp_path, "--stages", "versions,warmup,digits", "--break",
                                "digits")
    assert proc.returncode == 1
    assert set(result) >= {"date", "gpu", "simulate", "row_stack_shim", "budget_s", "seconds",
                           "versions", "stages", "passed", "failed", "ok"}
    assert result["simulate"] and result["gpu"] == "simulator" and not result["ok"]
    stages = {s["stage"]: s for s in result["stages"]}
    assert list(stages) == list(gpu_check.SIMULATED_BOXES)  # every stage listed, in order
    for s in result["stages"]:
        assert STAGE_KEYS <= set(s), s["stage"]
    # the broken stage: failed, with its exit code and its output's tail
    digits = stages["digits"]
    assert digits["status"] == "fail" and digits["returncode"] == 1
    assert "deliberately broken" in digits["stderr_tail"]
    assert result["failed"] == ["digits"]
    # the stages that ran passed and carry their data
    versions = stages["versions"]
    assert versions["status"] == "pass", versions
    assert versions["data"]["fastlib_cuda_available"] and versions["data"]["numpy"]
    warmup = stages["warmup"]   # its record of the compiles must be JSON (a Signature was not)
    assert warmup["status"] == "pass", warmup
    assert warmup["data"]["models"] == ["tiny"] and warmup["data"]["signatures_compiled"] > 0
    # stages not selected are listed as skipped, not dropped
    assert stages["conform-seed0"]["status"] == "skipped"
    assert "not selected" in stages["conform-seed0"]["detail"]
    # the summary says it failed and names the stage
    assert "FAILED" in md and "| digits | fail |" in md and "| versions | pass |" in md
    assert "FAILED: digits" in proc.stdout


def test_the_bench_summary_keeps_times_ratios_losses_and_counts():
    counts = {"kernel_launches": 9, "per_epoch": {"d2h_copies": 1}}
    report = {"model": "m", "model_name": "mlp", "simulator": False,
              "engines": ["fastlib-cuda", "torch-cuda"], "skipped": {"torch-cuda-graph": "x"},
              "results": [{"batch_size": 64, "fastlib-cuda": 0.5, "torch-cuda": 1.0,
                           "fastlib-cuda_over_torch-cuda": 0.5, "fastlib-cuda_loss": 2.3,
                           "torch-cuda_loss": 2.3,
                           "fastlib-cuda_device": {"cuda_mode": "graph",
                                                   "device_counts": counts}}]}
    summary = gpu_check.bench_summary(report)
    (row,) = summary["rows"]
    assert row["s_per_epoch"] == {"fastlib-cuda": 0.5, "torch-cuda": 1.0}
    assert row["over_torch_cuda"] == {"fastlib-cuda": 0.5}
    assert row["mean_loss"] == {"fastlib-cuda": 2.3, "torch-cuda": 2.3}
    assert row["device"]["fastlib-cuda"]["device_counts"] == counts
    assert summary["skipped"] == {"torch-cuda-graph": "x"}
    text = gpu_check.markdown({"date": "d", "gpu": "g", "simulate": False,
                               "row_stack_shim": True, "passed": 1, "seconds": 3.0,
                               "budget_s": 300, "ok": True, "stages": [
                                   {"stage": "bench-mlp", "status": "pass", "seconds": 3,
                                    "box_s": 22, "detail": "", "data": summary}]})
    assert "0.50x PyTorch eager" in text and "kernel_launches" in text
    assert "numpy.row_stack = numpy.vstack` for its import only" in text


def test_an_unknown_stage_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--simulate", "--out", str(tmp_path),
                           "--stages", "benchh"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "benchh" in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_every_stage_passes_under_the_simulator(tmp_path):
    proc, result, md = simulate(tmp_path, timeout=1800)
    bad = {s["stage"]: (s["status"], s["detail"], s.get("stderr_tail", "")[-500:])
           for s in result["stages"] if s["status"] != "pass"}
    assert not bad and proc.returncode == 0, bad
    assert "All passed" in md


def _raw(stage, returncode=0, timed_out=False, stdout="", stderr=""):
    return {"stage": stage, "returncode": returncode, "timed_out": timed_out, "seconds": 1.0,
            "box_s": 20, "command": "python x", "stdout": stdout, "stderr": stderr}


def test_a_timeout_a_failed_check_and_a_simulator_only_script_are_told_apart(tmp_path):
    late = gpu_check.judge(_raw("frame-train", -9, True, '{"check": "a", "ok": true, '
                                                         '"detail": ""}'), str(tmp_path))
    assert late["status"] == "timeout" and "20 s box" in late["detail"]
    lines = ('{"check": "a", "ok": true, "detail": ""}\n'
             '{"check": "b", "ok": false, "detail": "off by 2 ulp"}\n')
    failed = gpu_check.judge(_raw("frame-train", 0, stdout=lines), str(tmp_path))
    assert failed["status"] == "fail" and failed["data"]["failed"] == ["b: off by 2 ulp"]
    assert "1/2 checks pass" in failed["detail"] and "stdout_tail" in failed
    refused = gpu_check.judge(_raw("frame-ops", 1, stderr="run with NUMBA_ENABLE_CUDASIM=1 "
                                                          "in the environment"), str(tmp_path))
    assert refused["status"] == "refused" and "only under numba's simulator" in refused["detail"]
    empty = gpu_check.judge(_raw("frame-ops", 0), str(tmp_path))
    assert empty["status"] == "fail"  # no check reported is not a pass


def test_a_conform_stage_fails_on_a_failed_row_not_on_an_unsupported_one(tmp_path):
    rows = [{"engine": "fastlib-cuda", "name": "relu", "dtype": "float32", "check": "vjp",
             "status": "pass"},
            {"engine": "fastlib-cuda", "name": "relu", "dtype": "float64", "check": "hvp",
             "status": "unsupported"},
            {"engine": "fastlib", "name": "relu", "dtype": "float64", "check": "vjp",
             "status": "fail"}]  # another engine's row: not this stage's
    (tmp_path / "conform-seed0.json").write_text(json.dumps({"rows": rows}))
    ok = gpu_check.judge(_raw("conform-seed0"), str(tmp_path))
    assert ok["status"] == "pass" and "1/2 fastlib-cuda rows pass, 1 unsupported" in ok["detail"]
    rows.append({"engine": "fastlib-cuda", "name": "tanh", "dtype": "float32", "check": "vjp",
                 "status": "fail"})
    (tmp_path / "conform-seed0.json").write_text(json.dumps({"rows": rows}))
    bad = gpu_check.judge(_raw("conform-seed0"), str(tmp_path))
    assert bad["status"] == "fail" and bad["data"]["not_passed"] == ["tanh float32 vjp: fail"]
