"""`verigrad bench train --dtypes`: its refusals, and what one small run measures and counts."""
import json

import numpy as np
import pytest

from reports.cli import main


@pytest.mark.parametrize("argv, message", [
    (["bench", "train", "--dtypes", "bfloat61"], "did you mean 'bfloat16'"),
    (["bench", "train", "--dtypes", "float16", "--batch-sizes", "64"], "drop --batch-sizes"),
    (["bench", "train", "--dtypes", "float16", "--max-steps", "9"], "drop --max-steps"),
    (["bench", "train", "--dtypes", "float16", "--samples", "9"], "drop --samples (the digits"),
    (["bench", "train", "--dtypes", "float16", "--model", "lstm", "--batch-sizes", "8"],
     "drop --batch-sizes"),
    (["bench", "train", "--dtypes", "float16", "--engines", "torch"], "drop --engines"),
    (["bench", "train", "--dtypes", "float16", "--threads", "1,2"],
     "drop --threads with several counts"),
])
def test_bad_dtypes_runs_are_refused_before_any_work(argv, message, capsys, monkeypatch):
    from fastlib import datasets

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the usage error")

    monkeypatch.setattr(datasets, "load_digits", no_work)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: verigrad bench train") and message in err, err[-400:]


def test_on_the_device_without_one_the_run_is_refused_before_any_work(capsys, monkeypatch):
    import fastlib.cuda
    from fastlib import datasets
    from reports.bench import train

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the device was refused")

    monkeypatch.setattr(datasets, "load_digits", no_work)
    monkeypatch.setattr(train, "on_simulator", lambda: False)
    monkeypatch.setattr(fastlib.cuda, "unavailable_reason", lambda: "no CUDA driver (test)")
    assert main(["bench", "train", "--dtypes", "float16", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: verigrad bench train") and "no usable GPU here: no CUDA " \
        "driver (test)" in err, err


def test_on_the_simulator_the_device_run_is_refused_with_the_reason(capsys, monkeypatch):
    import fastlib.cuda
    from reports.bench import train

    monkeypatch.setattr(fastlib.cuda, "unavailable_reason", lambda: None)   # the simulator
    monkeypatch.setattr(train, "on_simulator", lambda: True)
    assert main(["bench", "train", "--dtypes", "float16", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: verigrad bench train") and "run it on a GPU" in err, err


def test_a_small_run_reports_every_format_and_counts_its_bytes(tmp_path, monkeypatch, capsys):
    from reports.bench import precision
    from reports.results_tables import bench_precision

    monkeypatch.setitem(precision.DEFAULTS, "hidden", 8)
    monkeypatch.setitem(precision.DEFAULTS, "epochs", 2)
    out = tmp_path / "p.json"
    assert main(["bench", "train", "--dtypes", "float32", "bfloat16", "float16", "--repeats",
                 "1", "--no-progress", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {r["case"]: r for r in report["results"]}
    assert list(rows) == ["float32", "bfloat16", "float16"]
    assert {r["path"] for r in rows.values()} == {"program"}
    params = 64 * 8 + 8 + 8 * 10 + 10                  # the 64-8-10 MLP
    acts = 32 * (8 + 10)                                 # both layers' outputs, 32 rows
    assert rows["float32"]["parameter_bytes"] == 4 * params
    assert rows["float32"]["activation_bytes"] == 4 * acts
    for fmt in ("bfloat16", "float16"):                  # 16-bit copies plus float32 masters
        assert rows[fmt]["parameter_bytes"] == (2 + 4) * params
        assert rows[fmt]["activation_bytes"] == 2 * acts
        assert 0.0 <= rows[fmt]["test_accuracy"] <= 1.0
        assert rows[fmt]["traced_peak_bytes"] > 0
    assert np.isclose(rows["bfloat16"]["bytes_over_float32"],
                      (6 * params + 2 * acts) / (4 * params + 4 * acts))
    table = bench_precision({"data": report, "command": "verigrad bench train --dtypes",
                             "date": "now", "machine": {}})
    assert "| float16 | program |" in table


def test_a_sequence_model_is_measured_in_every_format_and_its_bytes_counted(tmp_path,
                                                                              monkeypatch):
    """``--model lstm``: the benchmark's LSTM on its generated sequences, every format on the
    compiled program; its bytes counted by hand from the layers' sizes."""
    from reports.bench import precision

    monkeypatch.setattr(precision, "SEQUENCE_EPOCHS", 2)
    out = tmp_path / "lstm.json"
    assert main(["bench", "train", "--dtypes", "float32", "bfloat16", "float16", "--model",
                 "lstm", "--samples", "40", "--repeats", "1", "--no-progress", "--json",
                 str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["model"].startswith("LSTM(32 -> 128")
    assert report["settings"]["samples"] == 40 and report["settings"]["test_samples"] == 8
    rows = {r["case"]: r for r in report["results"]}
    assert {r["path"] for r in rows.values()} == {"program"}
    # LSTM(32 -> 128): four gates' input and recurrent weights and one bias each; Dense 128->10
    params = 4 * 128 * (32 + 128) + 4 * 128 + 128 * 10 + 10
    acts = 32 * (128 + 10)          # the last state and the logits, 32 sequences
    assert rows["float32"]["parameter_bytes"] == 4 * params
    assert rows["float32"]["activation_bytes"] == 4 * acts
    for fmt in ("bfloat16", "float16"):
        assert rows[fmt]["parameter_bytes"] == (2 + 4) * params
        assert rows[fmt]["activation_bytes"] == 2 * acts
        assert np.isfinite(rows[fmt]["test_loss"]) and 0.0 <= rows[fmt]["test_accuracy"] <= 1.0


def test_a_regression_model_reports_its_loss_and_no_accuracy(tmp_path, monkeypatch, capsys):
    from reports.bench import precision
    from reports.results_tables import bench_precision

    monkeypatch.setattr(precision, "SEQUENCE_EPOCHS", 2)
    out = tmp_path / "att.json"
    assert main(["bench", "train", "--dtypes", "float32", "bfloat16", "--model", "attention",
                 "--samples", "10", "--repeats", "1", "--no-progress", "--json",
                 str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {r["case"]: r for r in report["results"]}
    assert rows["bfloat16"]["test_accuracy"] is None               # mse: no accuracy
    assert rows["bfloat16"]["accuracy_minus_float32"] is None
    assert np.isclose(rows["bfloat16"]["test_loss_over_float32"],
                      rows["bfloat16"]["test_loss"] / rows["float32"]["test_loss"])
    # every layer's output: 32 sequences of 64 positions of width 64, three layers
    assert rows["float32"]["activation_bytes"] == 4 * 3 * 32 * 64 * 64
    table = bench_precision({"data": report, "command": "verigrad bench train --dtypes",
                             "date": "now", "machine": {}})
    assert "| bfloat16 | program |" in table and report["model"] in table
