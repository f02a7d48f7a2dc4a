"""`verigrad bench train --model ...`: every model runs through the harness, and the engines
train the same model (their losses agree), at tiny sizes so the default run stays quick."""
from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import pytest

from reports.bench.models import MODELS, mlp
from reports.cli import main

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None


# one thread: on a loaded machine two-thread barriers make tiny runs slow, and these tests check
# the harness, not the speed


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def bench_json(capsys, model, engines, *extra):
    import tempfile

    path = pathlib.Path(tempfile.mkdtemp(prefix="bench-json-")) / "bench.json"
    code, out, err = run(capsys, "bench", "train", "--model", model, "--samples", "8",
                         "--batch-sizes", "4", "--max-steps", "2", "--repeats", "1",
                         "--threads", "1", "--engines", ",".join(engines), "--json",
                         str(path), *extra)
    assert code == 0, err
    return json.loads(path.read_text())


def check_same_training(report, engines):
    """Every engine measured, and its mean batch loss equals fastlib's.

    The engines start from the same weights and see the batches in the same order, so the
    losses differ only by float32 rounding through different summation orders: relative 1e-4
    is ~1000 float32 ulps, loose for that and tight against a wrong model, initial copy,
    loss or batch order (each moves the loss in the second or third digit).
    """
    assert report["engines"] == list(engines)
    (row,) = report["results"]
    assert row["steps_per_epoch"] == 2
    for e in engines:
        assert row[f"{e}_steps_measured"] == 2 and row[e] > 0
        assert math.isfinite(row[f"{e}_loss"])
        assert row[f"{e}_loss"] == pytest.approx(row["fastlib_loss"], rel=1e-4), e
    assert report["load_average"]["start"] is None or len(report["load_average"]["start"]) == 3


@pytest.mark.parametrize("model", MODELS)
def test_every_model_trains_the_same_in_fastlib_and_torch(capsys, model):
    engines = ["fastlib"] + (["torch"] if HAS_TORCH else [])
    check_same_training(bench_json(capsys, model, engines), engines)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_JAX, reason="JAX not installed (pip install 'jax[cpu]')")
@pytest.mark.parametrize("model", MODELS)
def test_every_model_trains_the_same_in_jax(capsys, model):
    check_same_training(bench_json(capsys, model, ["fastlib", "jax"]), ["fastlib", "jax"])


def test_the_numpy_mlp_trains_the_same_model(capsys):
    check_same_training(bench_json(capsys, "mlp", ["fastlib", "numpy"]), ["fastlib", "numpy"])


def test_an_unknown_model_is_exit_2_listing_the_models(capsys):
    code, _, err = run(capsys, "bench", "train", "--model", "lsmt")
    assert code == 2
    assert err.startswith("usage: verigrad bench train")
    assert "--model" in err and "'lsmt'" in err and "did you mean 'lstm'" in err
    assert "mlp, lstm, attention, transformer" in err


def test_an_engine_the_model_has_not_is_refused(capsys):
    code, _, err = run(capsys, "bench", "train", "--model", "lstm", "--engines", "numpy")
    assert code == 2 and err.startswith("usage: verigrad bench train")
    assert "--engines numpy: not an engine of --model lstm; its engines: fastlib, torch, jax" in err


def test_distributed_runs_are_mlp_only(capsys):
    code, _, err = run(capsys, "bench", "train", "--model", "attention", "--distributed")
    assert code == 2 and "--distributed" in err and "--model mlp" in err


def test_mlp_flops_per_epoch_counted_by_hand():
    # 784-128-10 at 60000 samples: forward x@W1 and h@W2, weight gradients x^T@dh and h^T@dz,
    # the hidden layer's input gradient dz@W2^T; 2 FLOPs per multiply-add
    by_hand = 60000 * 2 * (784 * 128 + 128 * 10 + 784 * 128 + 128 * 10 + 10 * 128)
    assert mlp.flops_per_epoch(60000) == by_hand == 24_545_280_000


def test_the_mlp_report_has_the_floor_at_batch_64(capsys):
    code, out, err = run(capsys, "bench", "train", "--samples", "128", "--batch-sizes", "64",
                         "--max-steps", "1", "--repeats", "1", "--threads", "1",
                         "--engines", "fastlib")
    assert code == 0, err
    assert "arithmetic floor at batch 64: 0.1 GFLOP per epoch" in out
    assert "target: fastlib within 2x of the floor" in out and "load average" in out
    report = bench_json(capsys, "mlp", ["fastlib"], "--batch-sizes", "64", "--samples", "128")
    floor = report["floor"]
    assert floor["flops_per_epoch"] == mlp.flops_per_epoch(128)
    assert floor["gemm_gflops_peak"] > 0 and floor["floor_s"] > 0
    assert floor["fastlib_over_floor"] == pytest.approx(
        report["results"][0]["fastlib"] / floor["floor_s"])
