"""`verigrad bench train --device cuda`: refused without a device, runs tiny under numba's CUDA
simulator, PyTorch's CUDA columns say why they are empty, the CUDA-graph engine trains the same
model as every other engine, and fastlib.cuda's counters are printed (or their absence said)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from reports.bench import train
from reports.bench.models import common, tiny
from tests.sim_runs import run_python

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("model", ["mlp", "attention"])
def test_without_a_device_cuda_is_a_usage_error_naming_the_reason(model):
    proc = run_python(["-m", "reports", "bench", "train", "--device", "cuda", "--model", model],
                      {}, drop=("NUMBA_ENABLE_CUDASIM",), timeout=600)
    if proc.returncode == 0:
        pytest.skip("a CUDA GPU is present: the benchmark ran")
    assert proc.returncode == 2, proc.stderr[-2000:]
    # the shared validation step names fastlib.cuda's own reason before any work
    assert "--device cuda: no usable GPU here" in proc.stderr and "pass --device cpu" in proc.stderr
    assert proc.stdout == ""


def test_under_the_simulator_it_runs_tiny_with_losses_and_the_torch_cuda_reason(tmp_path):
    out = tmp_path / "cuda.json"
    proc = run_python(["-m", "reports", "bench", "train", "--device", "cuda", "--profile",
                       "--json", str(out)], {"NUMBA_ENABLE_CUDASIM": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["model_name"] == "tiny" and report["simulator"] and report["device"] == "cuda"
    (row,) = report["results"]
    # fastlib on the (simulated) device and on the CPU train the same model from the same start
    assert row["fastlib-cuda_loss"] == pytest.approx(row["fastlib_loss"], rel=1e-4)
    device = row["fastlib-cuda_device"]
    assert set(device) >= {"cuda_mode", "device_counts", "run_counts"}
    if not torch.cuda.is_available():
        for engine in ("torch-cuda", "torch-cuda-graph"):
            assert report["skipped"][engine].startswith("torch has no CUDA")
        assert "torch has no CUDA" in proc.stdout
    assert "mean batch loss" in proc.stdout and "fastlib-cuda: mode " in proc.stdout
    assert "numba's CUDA simulator" in proc.stdout
    # the steady epoch's counts show the zeros, and --profile's table holds the same launches:
    # the tiny MLP's 3L + 3 = 9 per step, each kernel with its grid and block
    counts = device["device_counts"]
    assert counts["kernel_launches"] == 9 and all(
        counts[k] == 0 for k in ("allocations", "h2d_copies", "d2h_copies", "synchronizations"))
    prof = report["profile"]["4"]
    assert sum(r["launches_per_step"] for r in prof["rows"]) == 9
    names = {r["kernel"] for r in prof["rows"]}
    assert {"gather_rows", "loss_rows", "guard_partials", "guard_update",
            "gemm[float32,bias_relu,load_plain,load_plain]"} <= names
    assert all(r["ms_per_step"] is None and r["grid"] and r["block"] for r in prof["rows"])
    assert "profile, batch 4: 9 launches per step" in proc.stdout


def test_the_tiny_model_is_refused_off_the_simulator(capsys):
    from reports.cli import main

    assert main(["bench", "train", "--model", "tiny"]) == 2
    assert "'tiny'" in capsys.readouterr().err


def test_torch_cuda_engines_say_why_they_cannot_run_instead_of_using_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    why = common.torch_cuda_missing()
    assert why.startswith("torch has no CUDA") and "not run on the CPU" in why


def _tiny_data(n):
    rng = np.random.default_rng(1)
    x = rng.random((n, tiny.SIZES[0]), dtype=np.float32)
    y = rng.integers(0, tiny.SIZES[2], size=(n, 1))
    return x, y


@pytest.mark.parametrize("n, bs", [(12, 4), (10, 4)])  # whole batches; and an incomplete last
def test_the_cuda_graph_engine_trains_the_same_model_as_torch_eager_and_fastlib(n, bs):
    """The graph engine's bookkeeping (warm-up then reset to the seed's weights and a fresh
    Adam, static index copies, the loss summed inside the graph, the eager last batch, the
    warm-up epoch before the timed one), run on the CPU with a replay that re-executes the
    captured step. Its timed epoch's mean loss must equal PyTorch eager's and fastlib's under
    the same protocol: a warm-up that leaked into the weights, a stale index, a gradient
    accumulated across replays or another epoch's order moves it in the third digit."""
    x, y = _tiny_data(n)
    setup, loss = tiny._torch_setup(0), tiny._torch_loss
    graph = common.bench_torch_graph(setup, loss, x, common.class_indices(y), bs, 100,
                                     device="cpu", graph=common.ReplayByCall)
    eager = common.bench_torch_steady(setup, loss, x, common.class_indices(y), bs, 100,
                                      device="cpu")
    fast = common.bench_fastlib_steady(tiny.build, "cross_entropy", x, y, bs, 100)
    assert graph.steps == eager.steps == fast.steps == -(-n // bs)
    assert graph.loss == pytest.approx(eager.loss, rel=1e-6)
    assert graph.loss == pytest.approx(fast.loss, rel=1e-4)
    # the timed epoch is the second: its loss is not the first epoch's
    first = common.bench_fastlib(tiny.build, "cross_entropy", x, y, bs, 100)
    assert fast.loss != pytest.approx(first.loss, rel=1e-6)


def test_counters_are_printed_per_step_and_their_absence_is_said():
    counts = {"kernel_launches": 9, "graph_launches": 1, "allocations": 0, "h2d_copies": 0,
              "d2h_copies": 0, "synchronizations": 0,
              "per_epoch": {"kernel_launches": 18, "h2d_copies": 1, "d2h_copies": 1}}
    line = train.counters_line({"cuda_mode": "graph", "device_counts": counts})
    assert line.startswith("mode graph; per step: kernel_launches 9, graph_launches 1, "
                           "allocations 0, h2d_copies 0, d2h_copies 0, synchronizations 0")
    assert "per epoch: kernel_launches 18, h2d_copies 1, d2h_copies 1" in line
    missing = train.counters_line({"cuda_mode": None, "device_counts": None,
                                   "note": common.NO_COUNTERS})
    assert "mode not reported" in missing and "does not count" in missing
