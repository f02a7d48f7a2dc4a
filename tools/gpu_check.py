#!/usr/bin/env python
"""The first-GPU checklist as one command, in one process, in under 10 minutes on one GPU.

    python tools/gpu_check.py                 # on a GPU machine, from the checkout's root
    python tools/gpu_check.py --simulate      # here: numba's CUDA simulator, tiny sizes

The stages run one after another in ONE child process (each kernel compiles once, and numba's
on-disk cache keeps it for the next run), each time-boxed inside it: a stage that overruns
its box is stopped and reported as ``timeout``; the child is stopped at the budget, and a
stage it did not reach is ``skipped``. Stages: ``versions`` (the GPU, driver, numba,
numba-cuda, NumPy, PyTorch; whether fastlib.cuda can compile, and whether it bridged NumPy
2.5's missing ``row_stack``); ``warmup`` (one short run of every benchmark model, compiling
what the later stages launch); ``conform-seed0`` (``verigrad conform`` of fastlib-cuda),
``conform-16bit`` (the same in bfloat16 and float16: ops and mixed-precision training rows);
``frame-ops``, ``frame-train`` (tests/cuda_sim_check.py's GEMM checks, tests/cuda_train_sim_check.py
on the device); ``digits`` (CPU and GPU test accuracy within one sample); ``bench-<model>``
(``verigrad bench train --device cuda``, steady state, with the per-step counts).

Writes ``<out>/gpu-check-<date>-<gpu>.json`` and a ``.md`` summary (default docs/results/);
exits 1 if a stage failed. ``--simulate`` runs it all under ``NUMBA_ENABLE_CUDASIM=1`` at tiny
sizes (tests/test_gpu_check.py). The boxes' origin: docs/gpu.md, "The checklist".
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_MODELS = ("mlp", "lstm", "attention", "transformer")
DIGITS_EPOCHS = 5

# stage -> seconds it may take on a GPU (docs/gpu.md, "The checklist", derives them): the
# compiles dominate a first run, so the stages that compile come first and get the long boxes
# (the warm-up: the bench models' float32 kernels; conform-seed0: every op and layer kind in
# float32 and float64), and the later stages find their kernels compiled
BOXES = {"versions": 30, "warmup": 150, "conform-seed0": 170, "conform-16bit": 40,
         "frame-ops": 20, "frame-train": 60, "digits": 30, "bench-mlp": 15, "bench-lstm": 15,
         "bench-attention": 15, "bench-transformer": 15}
BUDGET_S = 570  # the whole checklist: the boxes and the process's start, in one 10-min command
# under the simulator: the same stages, tiny; one bench model
SIMULATED_BOXES = {"versions": 60, "warmup": 120, "conform-seed0": 120, "conform-16bit": 120,
                   "frame-ops": 120, "frame-train": 240, "digits": 120, "bench-tiny": 120}
SIMULATED_BUDGET_S = 1200


# ---------------------------------------------------------------------------------------------
# what the stages run in their own processes (``gpu_check.py --exec ...``)

VERSIONS_CODE = r"""
import json, os, importlib.metadata as md
out = {}
import numpy, numba
out["numpy"], out["numba"] = numpy.__version__, numba.__version__
try:
    out["numba_cuda"] = md.version("numba-cuda")
except md.PackageNotFoundError:
    out["numba_cuda"] = None
import fastlib.cuda as fc
out["fastlib_cuda_available"] = fc.is_available()
out["fastlib_cuda_reason"] = fc.unavailable_reason()
from fastlib.cuda import compat
out["row_stack_bridge"] = compat.BRIDGED[0] or None
out["row_stack_shim"] = bool(compat.BRIDGED[0])
out["simulator"] = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
from numba import cuda
if out["simulator"]:
    out["gpu"] = "simulator"
elif fc.is_available():
    dev = cuda.get_current_device()
    name = dev.name
    out["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
    out["compute_capability"] = list(dev.compute_capability)
    try:
        out["driver"] = list(cuda.cudadrv.driver.driver.get_version())
    except Exception as exc:
        out["driver"] = f"unknown ({exc})"
    try:
        out["runtime"] = list(cuda.runtime.get_version())
    except Exception as exc:
        out["runtime"] = f"unknown ({exc})"
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["torch_sees_gpu"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        out["torch_gpu"] = torch.cuda.get_device_name(0)
except ImportError:
    out["torch"] = None
print("GPU_CHECK " + json.dumps(out))
raise SystemExit(0 if out["fastlib_cuda_available"] else 1)
"""

DIGITS_CODE = r"""
import json, sys
import numpy as np, fastlib
from fastlib.datasets import load_digits
epochs, limit, hidden = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
data = load_digits()
x, y = data.x_train[:limit], data.y_train[:limit]
out = {"epochs": epochs, "train_samples": len(x), "test_samples": len(data.x_test),
       "model": f"64-{hidden}-10 relu, Adam, batch 32, float32, seed 0"}
for device in ("cpu", "cuda"):
    model = fastlib.Sequential([fastlib.Dense(64, hidden, "relu"), fastlib.Dense(hidden, 10)],
                               dtype=np.float32, seed=0)
    result = fastlib.train(model, x, y, epochs, 32, 1e-3, "cross_entropy", optimizer="Adam",
                           verbose=False, seed=0, device=device)
    pred = np.argmax(np.asarray(model(data.x_test)), axis=1)
    out[device] = {"test_accuracy": float(np.mean(pred == data.y_test.reshape(-1))),
                   "final_loss": float(result.loss_history[-1]),
                   "seconds_per_epoch": [float(t) for t in result.epoch_times],
                   "cuda_mode": getattr(result, "cuda_mode", None),
                   "cuda_graph_reason": getattr(result, "cuda_graph_reason", None)}
# within one test sample: the engines round differently (FMA contraction, summation order),
# so a sample on the decision boundary may flip; more than one would be a real difference
out["samples_apart"] = round(abs(out["cpu"]["test_accuracy"] - out["cuda"]["test_accuracy"])
                             * len(data.x_test))
out["same_accuracy"] = out["samples_apart"] <= 1
print("GPU_CHECK " + json.dumps(out))
raise SystemExit(0 if out["same_accuracy"] else 1)
"""

WARMUP_CODE = r"""
import json, sys, time
import fastlib
from fastlib.cuda import device
from reports.bench.models import load
models = sys.argv[1].split(",")
t0 = time.perf_counter()
for name in models:
    model = load(name)
    class Args:
        samples, data_dir = 8, None
    x, y, _ = model.data(Args)
    fastlib.train(model.build(0), x[:4], y[:4], 1, 2, 1e-3, model.LOSS, optimizer="Adam",
                  verbose=False, device="cuda")
out = {"models": models, "seconds": round(time.perf_counter() - t0, 2),
       "signatures_compiled": len(device.COMPILES),
       "compile_seconds": round(sum(c[2] for c in device.COMPILES), 2),
       "compiled": [[n, str(sig), round(t, 3)] for n, sig, t in device.COMPILES]}
print("GPU_CHECK " + json.dumps(out))
"""

#: What tests/cuda_sim_check.py prints when started without the simulator.
SIMULATOR_ONLY = "run with NUMBA_ENABLE_CUDASIM=1"

BROKEN_CODE = "raise SystemExit('deliberately broken by --break (a test of the report)')"


def _conform_engine_flag():
    """``--engines`` where ``verigrad conform`` takes it, else the older ``--engine``."""
    sys.path.insert(0, ROOT)
    try:
        from reports.cli import build_parser
        parser = build_parser()
    except Exception:
        return "--engines"
    with open(os.devnull, "w") as null:
        old, sys.stderr = sys.stderr, null
        try:
            parser.parse_args(["conform", "--engines", "fastlib-cuda"])
            return "--engines"
        except SystemExit:
            return "--engine"
        finally:
            sys.stderr = old


def stage_commands(simulate, tmp):
    """``{stage: argv after "gpu_check.py --exec"}`` for every stage, in order."""
    flag = _conform_engine_flag()
    stages = {"versions": ["-c", VERSIONS_CODE],
              "warmup": ["-c", WARMUP_CODE, ",".join(("tiny",) if simulate else BENCH_MODELS)]}
    # float32 and float64, then the 16-bit formats (their kernels are float32's, compiled by
    # then, plus the rounding and the loss scale's)
    for stage, dtypes in (("conform-seed0", ()), ("conform-16bit", ("bfloat16", "float16"))):
        cmd = ["-m", "reports", "conform", flag, "fastlib-cuda", "--no-proofs", "--seed", "0",
               "--json", os.path.join(tmp, f"{stage}.json"), "--no-progress"]
        if dtypes:
            cmd += ["--dtypes", *dtypes]
        if simulate:
            cmd += ["--ops", "relu"]
        stages[stage] = cmd
    ops = ["tests/cuda_sim_check.py"] + (["--only", "relu"] if simulate else [])
    frame = ["tests/cuda_train_sim_check.py"] + (["--only", "frame"] if simulate else [])
    stages["frame-ops"], stages["frame-train"] = ops, frame
    # the simulator: one step of a narrow model (each simulated CUDA thread is a Python thread)
    stages["digits"] = ["-c", DIGITS_CODE] + (["1", "16", "8"] if simulate else
                                              [str(DIGITS_EPOCHS), "100000", "128"])
    for model in (("tiny",) if simulate else BENCH_MODELS):
        sizes = {"mlp": ["--batch-sizes", "64,1024", "--max-steps", "50"]}.get(
            model, ["--batch-sizes", "32", "--max-steps", "20"])
        cmd = ["-m", "reports", "bench", "train", "--device", "cuda", "--model", model,
               "--repeats", "1", "--json", os.path.join(tmp, f"bench-{model}.json")]
        stages[f"bench-{model}"] = cmd + ([] if simulate else sizes)
    return stages


# ---------------------------------------------------------------------------------------------
# running the stages: one child process, a box per stage inside it

class StageTimeout(BaseException):
    """A stage ran past its box (raised by the alarm inside the child; a BaseException, so a
    stage's own ``except Exception`` cannot swallow it)."""


def _command_text(name, argv):
    if argv[0] == "-m":
        return "python -m " + " ".join(argv[1:])
    if argv[0] == "-c":
        return "python -c <" + name + " code> " + " ".join(argv[2:])
    return "python " + " ".join(argv)


def run_stage(name, argv, box):
    """Run one stage's command in this process, stopped after ``box`` seconds (an alarm);
    the raw outcome: exit code, whether it timed out, seconds, its captured output."""
    out, err = io.StringIO(), io.StringIO()
    saved_argv, code, timed_out = list(sys.argv), 0, False

    def alarm(signum, frame):
        raise StageTimeout

    before = signal.signal(signal.SIGALRM, alarm)
    t0 = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, max(box, 1))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                _exec(argv)
            except SystemExit as exc:  # a stage's exit: its code, a message to stderr
                if isinstance(exc.code, int) or exc.code is None:
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except StageTimeout:
                timed_out, code = True, -9
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        sys.argv = saved_argv
    return {"stage": name, "returncode": code, "timed_out": timed_out,
            "seconds": round(time.perf_counter() - t0, 2), "box_s": box,
            "command": _command_text(name, argv), "stdout": out.getvalue(),
            "stderr": err.getvalue()}


MARK = "GPU_CHECK_STAGE "


def _child(plan, tmp, simulate, broken):
    """The child process: every stage of ``plan`` ([name, box] pairs) in turn, each judged
    and printed as one marked JSON line as soon as it ends."""
    sys.path.insert(0, ROOT)
    commands = stage_commands(simulate, tmp)
    for name, box in plan:
        print(f"gpu_check: {name} (box {box:.0f} s) ...", file=sys.stderr, flush=True)
        cmd = ["-c", BROKEN_CODE] if name == broken else commands[name]
        stage = judge(run_stage(name, cmd, box), tmp)
        print(f"gpu_check: {name}: {stage['status']}: {stage['detail']}", file=sys.stderr,
              flush=True)
        print(MARK + json.dumps(stage), flush=True)
    return 0


def _read_lines(stream, sink, echo):
    for line in stream:
        sink.append(line)
        if echo:
            sys.stderr.write(line)
            sys.stderr.flush()


def run_child(plan, tmp, simulate, broken, budget):
    """Run the child for ``plan``, stopped at ``budget`` seconds; (stage reports by name,
    whether it was stopped, its exit code, the tail of its stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    if simulate:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(plan), tmp,
           "1" if simulate else "0", broken or ""]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = [], []
    readers = [threading.Thread(target=_read_lines, args=(proc.stdout, out, False)),
               threading.Thread(target=_read_lines, args=(proc.stderr, err, True))]
    for r in readers:
        r.start()
    stopped = False
    try:
        proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
        proc.wait()
        stopped = True
    for r in readers:
        r.join()
    reports = {}
    for line in out:
        if line.startswith(MARK):
            stage = json.loads(line[len(MARK):])
            reports[stage["stage"]] = stage
    return reports, stopped, proc.returncode, _tail("".join(err))


def _tail(text, n=1500):
    return text.strip()[-n:]


def _marked_json(stdout):
    for line in reversed(stdout.splitlines()):
        if line.startswith("GPU_CHECK "):
            return json.loads(line[len("GPU_CHECK "):])
    return None


def _check_lines(stdout):
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"check"')]
    failed = [f"{r['check']}: {r['detail'][:300]}" for r in rows if not r["ok"]]
    return {"checks": len(rows), "passed": len(rows) - len(failed), "failed": failed}


def judge(raw, tmp):
    """A stage's report: status (pass, fail, timeout, refused), detail, and its data."""
    name, data, detail = raw["stage"], None, ""
    ok = raw["returncode"] == 0 and not raw["timed_out"]
    try:
        if name in ("versions", "digits", "warmup"):
            data = _marked_json(raw["stdout"])
            ok = ok and data is not None
            if name == "versions" and data is not None:
                detail = (f"{data.get('gpu', 'no GPU')}; numba {data['numba']}, numba-cuda "
                          f"{data['numba_cuda']}, NumPy {data['numpy']}, torch "
                          f"{data.get('torch')} (CUDA {data.get('torch_cuda')})")
                if not data["fastlib_cuda_available"]:
                    detail += f"; fastlib.cuda unavailable: {data['fastlib_cuda_reason']}"
            if name == "digits" and data is not None:
                detail = (f"test accuracy CPU {data['cpu']['test_accuracy']:.4f}, GPU "
                          f"{data['cuda']['test_accuracy']:.4f} ({data['samples_apart']} "
                          f"test samples apart)"
                          + ("" if data["same_accuracy"] else ": MORE THAN ONE SAMPLE APART"))
            if name == "warmup" and data is not None:
                detail = (f"{data['signatures_compiled']} kernel signatures compiled in "
                          f"{data['compile_seconds']} s ({data['seconds']} s for "
                          f"{', '.join(data['models'])})")
        elif name.startswith("conform-"):
            path = os.path.join(tmp, f"{name}.json")
            if os.path.exists(path):
                with open(path) as fh:
                    rows = json.load(fh)
                rows = rows["rows"] if isinstance(rows, dict) else rows
                rows = [r for r in rows if r.get("engine") == "fastlib-cuda"]
                # "unsupported": a row kind the engine declares it does not provide (second
                # order: fastlib-cuda has no jvp / hvp); conform counts it apart, not failed
                fine = ("pass", "skip", "unsupported")
                bad = [f"{r.get('name')} {r.get('dtype')} {r.get('check')}: {r.get('status')}"
                       for r in rows if r.get("status") not in fine]
                unsupported = sum(r.get("status") == "unsupported" for r in rows)
                data = {"rows": len(rows), "unsupported": unsupported, "not_passed": bad[:50]}
                ok = ok and rows and not bad
                detail = (f"{len(rows) - len(bad) - unsupported}/{len(rows)} fastlib-cuda rows "
                          f"pass, {unsupported} unsupported (no jvp / hvp), {len(bad)} failed")
        elif name.startswith("frame-"):
            data = _check_lines(raw["stdout"])
            ok = ok and data["checks"] > 0 and not data["failed"]
            detail = f"{data['passed']}/{data['checks']} checks pass"
        elif name.startswith("bench-"):
            path = os.path.join(tmp, f"{name}.json")
            if os.path.exists(path):
                with open(path) as fh:
                    data = bench_summary(json.load(fh))
                detail = "; ".join(f"batch {r['batch_size']}: " + ", ".join(
                    f"{e} {s:.3f} s" for e, s in r["s_per_epoch"].items())
                    for r in data["rows"])
            ok = ok and data is not None
    except Exception as exc:  # a stage whose output cannot be read failed, and says why
        ok, detail = False, f"its output could not be read: {type(exc).__name__}: {exc}"
    status = "timeout" if raw["timed_out"] else ("pass" if ok else "fail")
    if status == "fail" and SIMULATOR_ONLY in raw["stderr"]:
        status = "refused"
        detail = (f"{name}'s script runs only under numba's simulator (it exits without "
                  "NUMBA_ENABLE_CUDASIM=1: some of its checks call device functions from the "
                  "host, which only the simulator allows); the device's op rows are the "
                  "conform stages'")
    if raw["timed_out"]:
        detail = f"stopped after its {raw['box_s']} s box; " + detail
    elif not ok and SIMULATOR_ONLY not in raw["stderr"]:
        last = (raw["stderr"].strip().splitlines() or [""])[-1][:300]
        detail = f"exit {raw['returncode']}: {last}" + (f"; {detail}" if detail else "")
    report = {k: raw[k] for k in ("stage", "returncode", "seconds", "box_s", "command")}
    report.update(status=status, detail=detail, data=data)
    if status != "pass":
        report["stderr_tail"] = _tail(raw["stderr"])
        report["stdout_tail"] = _tail(raw["stdout"])
    return report


def bench_summary(report):
    """The bench stage's figures: s/epoch, ratios to PyTorch CUDA eager, losses, counts."""
    rows = []
    for r in report["results"]:
        engines = report["engines"]
        rows.append({"batch_size": r["batch_size"],
                     "s_per_epoch": {e: r[e] for e in engines},
                     "over_torch_cuda": {e: r[f"{e}_over_torch-cuda"] for e in engines
                                         if f"{e}_over_torch-cuda" in r},
                     "mean_loss": {e: r[f"{e}_loss"] for e in engines},
                     "device": {e: r[f"{e}_device"] for e in engines if f"{e}_device" in r}})
    return {"model": report["model"], "model_name": report["model_name"],
            "simulator": report.get("simulator"), "skipped": report["skipped"], "rows": rows}


# ---------------------------------------------------------------------------------------------
# the files

def gpu_slug(versions, simulate):
    """The GPU's name for the file name: "NVIDIA H200" -> "H200"."""
    if simulate:
        return "simulator"
    name = (versions or {}).get("gpu") or "unknown-gpu"
    name = re.sub(r"^NVIDIA\s+", "", name)
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "unknown-gpu"


def markdown(result):
    """The short summary: one line per stage, then the benchmark figures and counts."""
    lines = [f"# GPU check {result['date']}: {result['gpu']}", "",
             f"`python tools/gpu_check.py{' --simulate' if result['simulate'] else ''}`: "
             f"{result['passed']}/{len(result['stages'])} stages passed in "
             f"{result['seconds']:.0f} s (budget {result['budget_s']} s). "
             + ("**All passed.**" if result["ok"] else "**FAILED: see the stages below.**"),
             ""]
    if result["simulate"]:
        lines += ["Numba's CUDA simulator, not a GPU: tiny sizes, timings meaningless.", ""]
    if result["row_stack_shim"]:
        lines += ["NumPy lacks `row_stack` (removed in 2.5; numba-cuda 0.30 registers it at "
                  "its first compile): fastlib.cuda imported that numba-cuda module with "
                  "`numpy.row_stack = numpy.vstack` for its import only.", ""]
    lines += ["| stage | status | seconds (box) | detail |", "| --- | --- | --- | --- |"]
    for s in result["stages"]:
        detail = s["detail"].replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {s['stage']} | {s['status']} | {s['seconds']} ({s['box_s']}) | "
                     f"{detail} |")
    for s in result["stages"]:
        if not s["stage"].startswith("bench-") or not s["data"]:
            continue
        lines += ["", f"**{s['stage']}** ({s['data']['model']})", ""]
        for r in s["data"]["rows"]:
            lines.append(f"- batch {r['batch_size']}: " + ", ".join(
                f"{e} {t:.4g} s/epoch" + (f" ({r['over_torch_cuda'][e]:.2f}x PyTorch eager)"
                                          if e in r["over_torch_cuda"] else "")
                for e, t in r["s_per_epoch"].items()))
            lines.append("  mean loss: " + ", ".join(f"{e} {v:.5f}"
                                                     for e, v in r["mean_loss"].items()))
            for e, d in r["device"].items():
                counts = d.get("device_counts")
                why = (f" (not graphs: {d['cuda_graph_reason']})"
                       if d.get("cuda_graph_reason") else "")
                lines.append(f"  {e}: mode {d.get('cuda_mode') or 'not reported'}{why}, per step "
                             + (json.dumps(counts) if counts else
                                "not counted (fastlib.cuda has no counters here)"))
        for e, why in s["data"]["skipped"].items():
            lines.append(f"- {e}: {why}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(prog="python tools/gpu_check.py",
                                description="The first-GPU checklist in at most 5 minutes.")
    p.add_argument("--simulate", action="store_true",
                   help="run under numba's CUDA simulator at tiny sizes (no GPU needed)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "results"),
                   help="folder for the JSON and Markdown files (default docs/results)")
    p.add_argument("--stages", default=None,
                   help="comma-separated stages to run (default all; the others are listed "
                        "as skipped)")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds for the whole check (default {BUDGET_S}; "
                        f"{SIMULATED_BUDGET_S} with --simulate)")
    p.add_argument("--ptx", default=None, metavar="MAJOR.MINOR",
                   help="instead of the checklist: compile every kernel to PTX for this compute "
                        "capability (9.0: H100, H200) without a GPU, and write "
                        "ptx-check-<date>-sm<cc>.json (needs numba-cuda, not the simulator)")
    p.add_argument("--dtypes", default="float32,float64",
                   help="with --ptx: the dtypes whose signatures are compiled")
    p.add_argument("--only", default=None,
                   help="with --ptx: only kernels whose name contains this")
    # tests only: make one stage fail, to see the failure reported
    p.add_argument("--break", dest="broken", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# every kernel compiled to PTX, without a GPU (numba-cuda and its NVVM only)

def catalogue(dtypes):
    """Every fastlib.cuda kernel a training run or an op can launch, made now: the module
    kernels, and the factories' kernels for every activation (and none), epilogue and load."""
    import importlib
    import pkgutil

    import fastlib.cuda as fc
    from fastlib.cuda import (dense, dense_grad, device, elementwise, linalg, recurrent, scalar,
                              swiglu)

    for info in pkgutil.iter_modules(fc.__path__):
        importlib.import_module(f"fastlib.cuda.{info.name}")
    acts = sorted(scalar.ACTIVATIONS)
    # Dense's activations by their scalar twins (softmax is a row kernel after an identity)
    dense_acts = sorted({a for a in dense.DENSE_ACTIVATIONS.values() if a in scalar.ACTIVATIONS}
                        | {"identity"})
    for name in acts:
        elementwise.unary_kernels(name)
    for dt in dtypes:
        linalg.gemm_kernel(dt)
        linalg.gemm_kernel(dt, swiglu.gate_vjp_epilogue)
        for name in dense_acts:
            linalg.gemm_kernel(dt, dense.bias_activation_epilogue(name))
        for name in [None] + [a for a in dense_acts if a != "identity"]:
            load = dense_grad.gpre_loader(name)
            linalg.gemm_kernel(dt, linalg.store_plain, load, linalg.load_plain)
            linalg.gemm_kernel(dt, linalg.store_plain, linalg.load_plain, load)
        swiglu.gate_up_kernel(dt)
        for lstm in (False, True):
            for persistent in (True, False):
                recurrent.forward_kernel(dt, lstm, persistent)
                recurrent.backward_kernel(dt, lstm, persistent)
    return list(device.KERNELS)


def ptx_check(cc, dtypes, only, out, argv=()):
    """Compile every signature (of ``dtypes``) of every kernel of :func:`catalogue` to PTX for
    compute capability ``cc`` without a GPU; write the seconds, local-memory accesses and any
    failure per signature to ``out`` (JSON). Returns the exit code (1 if one failed)."""
    import platform
    import re
    import types

    load_before = round(os.getloadavg()[0], 2)
    from numba import cuda
    import numba.cuda.dispatcher as dispatcher

    # device functions compile for the current device's capability; there is none here
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    from fastlib.cuda import compat
    compat.bridge_row_stack()
    rows, failed = [], 0
    for kern in catalogue(dtypes):
        if only and only not in kern.__name__:
            continue
        for sig in kern.signatures:
            if not any(dt in sig for dt in dtypes):
                continue
            t0 = time.perf_counter()
            try:
                ptx, _ = cuda.compile_ptx(kern.fn, sig, cc=cc)
                row = {"kernel": kern.__name__, "signature": sig, "ok": True,
                       "local_accesses": len(re.findall(r"\b(?:ld|st)\.local", ptx)),
                       "grid_barrier": "cudaCGSynchronize" in ptx}
                if row["grid_barrier"] != kern.cooperative:
                    raise RuntimeError(f"a grid-wide barrier in the PTX: {row['grid_barrier']}, "
                                       f"but the kernel declares cooperative={kern.cooperative}")
                row["cubin_bytes"] = _assemble(ptx, cc, kern.cooperative)
            except Exception as exc:
                failed += 1
                row = {"kernel": kern.__name__, "signature": sig, "ok": False,
                       "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            row["seconds"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
            print(f"ptx sm_{cc[0]}{cc[1]}: {row['kernel']} {sig}: "
                  f"{'ok' if row['ok'] else 'FAILED'} in {row['seconds']} s", flush=True)
    result = {"date": datetime.date.today().isoformat(), "compute_capability": list(cc),
              "dtypes": list(dtypes), "signatures": len(rows), "failed": failed,
              "seconds": round(sum(r["seconds"] for r in rows), 1),
              "load_average": list(os.getloadavg()), "cpus": os.cpu_count(),
              "machine": platform.machine(), "rows": rows}
    with open(out, "w") as fh:
        json.dump(recorded(argv, result, result["seconds"], load_before), fh, indent=2)
    print(f"ptx: {len(rows) - failed}/{len(rows)} signatures compiled in {result['seconds']} s; "
          f"wrote {out}")
    return 1 if failed else 0


def _assemble(ptx, cc, cooperative):
    """Assemble a kernel's PTX into a cubin for ``cc`` (and link a cooperative one with the
    CUDA device runtime, its grid barrier), as numba-cuda does when it loads the kernel:
    nvJitLink, no GPU needed; this is what checks inline assembly such as the 128-bit loads.
    Returns the cubin's size in bytes."""
    from cuda.core import Linker, LinkerOptions, ObjectCode
    from numba.cuda.cudadrv import libs

    codes = [ObjectCode.from_ptx(ptx.encode())]
    if cooperative:
        with open(libs.get_cudalib("cudadevrt", static=True), "rb") as fh:
            codes.append(ObjectCode.from_library(fh.read()))
    linker = Linker(*codes, options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}"))
    return len(linker.link("cubin").code)


def _not_run(name, box, status, detail):
    return {"stage": name, "status": status, "seconds": 0, "box_s": box, "detail": detail,
            "data": None, "returncode": None, "command": None}


def recorded(argv, data, seconds, load_before):
    """``data`` in the envelope every file under docs/results/ carries: the command that wrote
    it (its output folder left out), the date, machine, versions and load
    (:mod:`reports.provenance`)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from reports import provenance

    words, skip = [], False
    for word in argv:
        if skip or word.split("=", 1)[0] == "--out":
            skip = not skip and "=" not in word
            continue
        words.append(word)
    return {"command": " ".join(["python tools/gpu_check.py", *words]), "date": provenance.now(),
            "machine": provenance.machine(), "versions": provenance.versions(),
            "load_before": load_before, "load_after": provenance.load_average(),
            "seconds": seconds, "data": data}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--exec"]:
        return _exec(argv[1:])
    if argv[:1] == ["--child"]:
        return _child(json.loads(argv[1]), argv[2], argv[3] == "1", argv[4] or None)
    args = parse_args(argv)
    load_before = round(os.getloadavg()[0], 2)
    if args.ptx:
        sys.path.insert(0, ROOT)
        cc = tuple(int(v) for v in args.ptx.split("."))
        dtypes = args.dtypes.split(",")
        os.makedirs(args.out, exist_ok=True)
        out = os.path.join(args.out, f"ptx-check-{datetime.date.today().isoformat()}-sm"
                                     f"{cc[0]}{cc[1]}.json")
        return ptx_check(cc, dtypes, args.only, out, argv)
    boxes = SIMULATED_BOXES if args.simulate else BOXES
    budget = args.budget or (SIMULATED_BUDGET_S if args.simulate else BUDGET_S)
    chosen = set(boxes) if args.stages is None else {s.strip() for s in args.stages.split(",")}
    unknown = sorted((chosen | ({args.broken} if args.broken else set())) - set(boxes))
    if unknown:
        print(f"gpu_check: unknown stage(s) {unknown}; "
              f"the stages are {', '.join(boxes)}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    plan = [[name, box] for name, box in boxes.items() if name in chosen]
    with tempfile.TemporaryDirectory() as tmp:
        reports, stopped, code, err_tail = run_child(plan, tmp, args.simulate, args.broken,
                                                     budget)
    stages, cut = [], False
    for name, box in boxes.items():
        if name not in chosen:
            stages.append(_not_run(name, box, "skipped", "not selected (--stages)"))
        elif name in reports:
            stages.append(reports[name])
        elif not cut:  # the stage the child was in when it was stopped, or died
            cut = True
            stage = _not_run(name, box, "timeout" if stopped else "fail",
                             f"the check's process was stopped at the {budget:.0f} s budget "
                             f"during this stage" if stopped else
                             f"the check's process ended (exit {code}) during this stage")
            stage["stderr_tail"] = err_tail
            stages.append(stage)
        else:
            stages.append(_not_run(name, box, "skipped",
                                   f"not run: the {budget:.0f} s budget was spent before it"
                                   if stopped else "not run: the check's process had ended"))
    versions = next((s["data"] for s in stages if s["stage"] == "versions"), None)
    ran = [s for s in stages if s["status"] != "skipped" or "not run" in s["detail"]]
    result = {"date": datetime.date.today().isoformat(),
              "gpu": (versions or {}).get("gpu", "unknown"), "simulate": args.simulate,
              "row_stack_shim": bool((versions or {}).get("row_stack_shim")),
              "budget_s": budget, "seconds": round(time.perf_counter() - start, 1),
              "versions": versions, "stages": stages,
              "passed": sum(s["status"] == "pass" for s in stages),
              "failed": [s["stage"] for s in ran if s["status"] not in ("pass", "refused")],
              "refused": [s["stage"] for s in stages if s["status"] == "refused"]}
    result["ok"] = not result["failed"]
    base = os.path.join(args.out, f"gpu-check-{result['date']}-"
                                  f"{gpu_slug(versions, args.simulate)}")
    with open(base + ".json", "w") as fh:
        json.dump(recorded(argv, result, result["seconds"], load_before), fh, indent=2)
    with open(base + ".md", "w") as fh:
        fh.write(markdown(result))
    print(f"gpu_check: {result['passed']}/{len(stages)} stages passed"
          + ("" if result["ok"] else f"; FAILED: {', '.join(result['failed'])}")
          + (f"; refused to run here: {', '.join(result['refused'])}" if result["refused"]
             else "")
          + f"; wrote {base}.json and {base}.md")
    return 0 if result["ok"] else 1


def _exec(argv):
    """Run a stage's command in this process (``-m module``, ``-c code`` or a script)."""
    import runpy

    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<gpu_check stage>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
