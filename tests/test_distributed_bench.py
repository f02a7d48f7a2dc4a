"""``verigrad bench train --distributed`` and its cost model.

The model's arithmetic is checked against a hand computation; the command itself runs at
1 and 2 ranks on a few steps (its timings are not judged here, only that every figure the
README's cost model needs is reported, and the exchanged bytes, which follow from the model's
size alone).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path


from reports.distributed.bench import exchange_bytes, predict_step

ROOT = Path(__file__).resolve().parents[1]
P = 784 * 128 + 128 + 128 * 10 + 10  # the benchmark's 784-128-10 MLP: weights and biases


def test_the_cost_model_by_hand():
    # 8 ranks, 64 blocks of 8 samples: each rank runs 8 blocks of 0.34 ms, then 0.3 ms fixed;
    # it receives 2 P (K-1)/K float32 numbers: 2 * 101770 * 7/8 * 4 bytes = 712,390 bytes,
    # 0.569912 ms at 1.25e9 bytes/s; 2 (K-1) + log2 K = 17 messages of 30 us
    compute, transfer, latency, step = predict_step(0.34, 0.3, P, 8, 64)
    assert P == 101770
    assert math.isclose(compute, 8 * 0.34 + 0.3)
    assert math.isclose(transfer, 712390 / 1.25e9 * 1e3)
    assert math.isclose(latency, 17 * 0.03)
    assert math.isclose(step, 3.02 + 0.569912 + 0.51)
    # one rank: no exchange, no message
    assert predict_step(0.34, 0.3, P, 1, 64) == (64 * 0.34 + 0.3, 0.0, 0.0, 64 * 0.34 + 0.3)
    # 64 ranks: 2 * 101770 * 63/64 * 4 = 801,438.75 bytes; 126 + 6 messages
    _, transfer, latency, _ = predict_step(0.34, 0.3, P, 64, 64)
    assert math.isclose(transfer, 801438.75 / 1.25e9 * 1e3)
    assert math.isclose(latency, 132 * 0.03)
    assert exchange_bytes(P, 2) == P * 4  # two ranks: each receives half of 2 P numbers


def test_bench_train_distributed_reports_one_and_two_ranks(tmp_path):
    env = dict(os.environ, VERIGRAD_MNIST_DIR=str(tmp_path / "none"))  # random data: no I/O
    proc = subprocess.run(
        [sys.executable, "-m", "reports", "bench", "train", "--distributed", "--batch-sizes",
         "64", "--samples", "256", "--max-steps", "2", "--ranks", "1,2", "--json",
         str(tmp_path / "bench.json")],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = report["results"]
    assert [r["ranks"] for r in rows] == [1, 2] and all(r["batch"] == 64 for r in rows)
    for r in rows:
        assert r["params"] == P and r["steps"] == 2 and r["samples"] == 128
        assert r["s_per_epoch"] > 0 and r["samples_per_s"] > 0
        # 256 samples in 4 steps of 64: the epoch is twice the two steps measured
        assert math.isclose(r["s_per_epoch"], 2 * r["seconds"])
        assert math.isclose(r["samples_per_s"], 128 / r["seconds"])
    assert rows[0]["exchange_bytes_per_step"] == 0 and rows[1]["exchange_bytes_per_step"] == 4 * P
    load = report["load_average"]
    assert load["cores"] == os.cpu_count()
    if hasattr(os, "getloadavg"):
        assert load["before"] >= 0 and load["after"] >= 0
    model = report["cost_model"]
    assert set(model["t_block_ms"]) == {"1", "8", "64"}
    # t_fixed is what one rank's step spends beyond its 8 blocks of 8 samples
    assert math.isclose(model["t_fixed_ms"],
                        rows[0]["ms_per_step"] - 8 * model["t_block_ms"]["8"])
    assert [(p["batch"], p["blocks"], p["ranks"]) for p in model["predictions"]] == \
        [(512, 64, 1), (512, 64, 8), (512, 64, 64), (64, 8, 8), (64, 64, 64)]


def test_bench_rejects_bad_rank_counts():
    proc = subprocess.run(
        [sys.executable, "-m", "reports", "bench", "train", "--distributed", "--ranks", "2,0"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: verigrad bench train")
    assert "argument --ranks: expects an integer >= 1, got '0'" in proc.stderr
