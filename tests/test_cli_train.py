"""`verigrad train` and `verigrad bench train`, run in-process through reports.cli.main."""
from __future__ import annotations

import json

import numpy as np
import pytest

import fastlib
from reports.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def table_rows(out):
    return [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]


def test_default_run_trains_digits_and_reports_test_accuracy(capsys):
    code, out, _ = run(capsys, "train")
    assert code == 0
    assert "digits (1299 train, 143 validation, 355 test)" in out
    assert "MLP 64-128-10 relu" in out and "Adam" in out and "float32" in out
    rows = table_rows(out)
    assert [int(r[0]) for r in rows] == list(range(1, 21))  # 20 epochs by default
    assert float(rows[-1][1]) < float(rows[0][1])  # the training loss went down
    acc = float(out.split("test accuracy")[1].split()[0])
    # a 64-128-10 MLP reaches ~97% on the digits test split; 0.93 catches a broken pipeline
    assert acc > 0.93


def test_options_shape_the_model_and_the_run(capsys):
    code, out, _ = run(capsys, "train", "--hidden", "32,16", "--activation", "tanh",
                       "--optimizer", "momentum", "--lr", "0.1", "--epochs", "2",
                       "--batch-size", "16", "--dtype", "float64", "--loss",
                       "categorical_cross_entropy", "--val-fraction", "0")
    assert code == 0, out
    assert "MLP 64-32-16-10 tanh" in out and "categorical_cross_entropy" in out
    assert "0 validation" in out and "float64" in out and "batch 16" in out
    rows = table_rows(out)
    assert len(rows) == 2 and rows[0][3] == "-"  # no validation columns without validation


def test_early_stopping_uses_train_sh(capsys):
    code, out, _ = run(capsys, "train", "--early-stopping", "--epochs", "30", "--patience",
                       "1", "--min-delta", "100", "--monitor", "loss")
    # min_delta 100%: nothing improves on epoch 1, so it stops at 1 + 2 x patience = 3
    assert code == 0
    assert "best loss" in out and "at epoch 1" in out and "stopped:" in out
    assert len(table_rows(out)) == 3


@pytest.mark.parametrize("early_stopping", [False, True])
def test_a_diverging_run_keeps_its_epoch_says_why_once_and_exits_3(capsys, early_stopping):
    extra = ["--early-stopping", "--monitor", "loss"] if early_stopping else []
    code, out, err = run(capsys, "train", "--lr", "1000", "--optimizer", "sgd", "--epochs", "3",
                         *extra)
    assert code == 3, out + err        # docs/cli.md: 3, train stopped because it diverged
    rows = table_rows(out)
    # the first epoch ran and tripped a rule: it stays in the table with its loss (SGD at rate
    # 1000 from a loss of 2.6 jumps past 1e5), its validation not evaluated
    assert len(rows) == 1 and rows[0][0] == "1" and float(rows[0][1]) > 1e5
    assert rows[0][3] == "nan" and rows[0][4] == "nan"
    # the stop is said once, as the command's own line, never as a Python warning
    both = out + err
    assert both.count("stopped:") == 1 and both.count("divergence rule") == 1
    assert "Warning" not in err and "restored" in out
    assert "test accuracy" in out      # the restored weights are still scored


def test_warnings_while_training_are_one_line_each(capsys):
    import warnings

    from fastlib.errors import DivergenceWarning
    from reports.commands import train as train_command

    with train_command._training_warnings(__import__("sys").stderr):
        warnings.warn("epoch 3: skipped 2 optimizer step(s)", RuntimeWarning)
        warnings.warn("said by the stop line", DivergenceWarning)
    err = capsys.readouterr().err
    assert err == "verigrad train: warning: epoch 3: skipped 2 optimizer step(s)\n"


def test_save_checkpoint_resume_reproduce_an_uninterrupted_run(capsys, tmp_path):
    full, part, resumed = (tmp_path / n for n in ("full.npz", "part.npz", "resumed.npz"))
    ck = tmp_path / "ck.npz"
    common = ["--epochs", "4", "--dtype", "float64", "--hidden", "16"]
    assert run(capsys, "train", *common, "--save", str(full))[0] == 0
    assert run(capsys, "train", "--epochs", "2", "--dtype", "float64", "--hidden", "16",
               "--checkpoint", str(ck))[0] == 0
    code, out, _ = run(capsys, "train", *common, "--resume", str(ck), "--save", str(resumed))
    assert code == 0
    assert [int(r[0]) for r in table_rows(out)] == [3, 4]
    a, b = fastlib.load(full).parameters(), fastlib.load(resumed).parameters()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_plot_writes_a_png(capsys, tmp_path):
    path = tmp_path / "curves.png"
    code, out, _ = run(capsys, "train", "--epochs", "2", "--plot", str(path))
    assert code == 0 and f"wrote {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, words", [
    (["--optimizer", "adamm"], "did you mean 'Adam'?"),
    (["--loss", "crossentropy"], "did you mean 'cross_entropy'?"),
    (["--activation", "relux"], "did you mean 'relu'?"),
    (["--algorithm", "targetprob"], "did you mean 'targetprop'?"),
    (["--data", "mnsit"], "did you mean 'mnist'?"),
    (["--lr", "-1"], "--lr: expects a finite number > 0"),
    (["--epochs", "0"], "--epochs: expects an integer >= 1"),
    (["--batch-size", "-3"], "--batch-size: expects an integer >= 1"),
    (["--pure"], "--pure only applies to --algorithm targetprop"),
])
def test_usage_errors_exit_2_before_the_banner(capsys, monkeypatch, argv, words):
    from reports.commands import train

    monkeypatch.setattr(train, "_run", lambda args: pytest.fail("started before refusing"))
    code, out, err = run(capsys, "train", *argv)
    assert code == 2 and out == "" and words in err, err
    assert err.startswith("usage: verigrad train")


def test_device_cuda_without_a_gpu_names_the_reason(capsys, monkeypatch):
    import fastlib.cuda
    from reports.commands import train

    reason = fastlib.cuda.unavailable_reason()
    if reason is None:
        pytest.skip("a GPU (or the simulator) is usable here: --device cuda is not refused")
    monkeypatch.setattr(train, "_run", lambda args: pytest.fail("started before refusing"))
    code, out, err = run(capsys, "train", "--device", "cuda")
    assert code == 2 and out == "" and reason in err and "--device cpu" in err


def test_a_missing_data_dir_is_a_usage_error_before_any_data_is_read(capsys):
    code, _, err = run(capsys, "train", "--epochs", "1", "--data", "mnist", "--data-dir",
                       "/nonexistent/mnist")
    assert code == 2 and "--data-dir /nonexistent/mnist: does not exist" in err


def test_malformed_hidden_is_a_usage_error(capsys):
    assert main(["train", "--hidden", "12,abc"]) == 2
    assert "comma-separated" in capsys.readouterr().err


def test_bench_train_json_and_table(capsys, tmp_path):
    path = tmp_path / "bench.json"
    code, out, _ = run(capsys, "bench", "train", "--batch-sizes", "8,64", "--samples", "512",
                       "--max-steps", "4", "--engines", "fastlib", "numpy", "--repeats", "1",
                       "--json", str(path))
    assert code == 0 and "fastlib/numpy" in out   # the table is printed too
    report = json.loads(path.read_text())
    assert report["engines"] == ["fastlib", "numpy"] and report["samples"] == 512
    by_bs = {r["batch_size"]: r for r in report["results"]}
    assert by_bs[8]["steps_per_epoch"] == 64 and by_bs[8]["fastlib_steps_measured"] == 4
    for r in report["results"]:
        assert r["fastlib"] > 0 and r["numpy_over_fastlib"] == pytest.approx(
            r["numpy"] / r["fastlib"])
    assert "meets_target" in by_bs[64]
    code, out, _ = run(capsys, "bench", "train", "--batch-sizes", "16", "--samples", "64",
                       "--engines", "numpy,fastlib")
    assert code == 0 and "fastlib/numpy" in out and "s/epoch" in out
    code, _, err = run(capsys, "bench", "train", "--engines", "nosuch")
    assert code == 2 and err.startswith("usage: verigrad bench train")
    assert "--engines: invalid choice: 'nosuch'" in err and "fastlib, numpy, torch, jax" in err


@pytest.mark.slow
@pytest.mark.mnist
def test_mnist_reaches_97_5_percent_in_5_epochs(capsys, mnist_dir):
    """The documented MNIST run: `verigrad train --data mnist` (784-128-10 ReLU, Adam 1e-3,
    5 epochs)."""
    code, out, _ = run(capsys, "train", "--data", "mnist", "--data-dir", str(mnist_dir))
    assert code == 0
    assert "mnist (54000 train" in out or "mnist (54001 train" in out
    assert len(table_rows(out)) == 5
    assert float(out.split("test accuracy")[1].split()[0]) >= 0.975
