"""Bad input to `verigrad train` and `verigrad conform` is refused before the work it would spoil,
naming the value and the fix: a --plot format matplotlib cannot write, an empty --hidden width,
a --resume checkpoint built for other data, MNIST files holding no sample, and an engine named
with --engines that cannot run here."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from reports.cli import build_parser
from reports.commands import train
from tests.test_cli_bad_inputs_more import no_training, run  # noqa: F401 - a fixture
from tests.test_datasets import write_split


@pytest.fixture
def no_fit(monkeypatch):
    """Fail the test if `verigrad train` starts an epoch (data may be read first)."""
    monkeypatch.setattr(train, "_fit", lambda *a, **k: pytest.fail("trained before refusing"))


# -- --plot: a format matplotlib writes, checked before any data is read ----------------------

@pytest.mark.parametrize("name, words", [
    ("out.txtx", ["--plot", "out.txtx", "'txtx'", "png", "pdf", "svg"]),
    ("curves", ["--plot", "curves", "no file extension", "png"]),
])
def test_a_plot_format_matplotlib_cannot_write_is_a_usage_error(capsys, tmp_path, no_training,
                                                                name, words):
    # the run trained every epoch and then failed in savefig ("Format 'txtx' is not
    # supported"); a name without an extension was written under another name (curves.png)
    code, _, err = run(capsys, "train", "--plot", str(tmp_path / name))
    assert code == 2 and err.startswith("usage: verigrad train"), err
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("name", ["c.png", "c.PDF", "c.svg", "c.jpeg"])
def test_a_plot_format_matplotlib_writes_passes_the_checks(tmp_path, name):
    assert train._check_paths(train_args(plot=str(tmp_path / name))) is None


def train_args(**given):
    args = build_parser().parse_args(["train"])
    vars(args).update(given)
    return args


# -- --hidden: every width given --------------------------------------------------------------

@pytest.mark.parametrize("hidden", ["12,,4", "12,4,", ",12", "12, ,4"])
def test_an_empty_hidden_width_is_a_usage_error(capsys, no_training, hidden):
    # "12,,4" trained 64-12-4-10: the missing width was dropped without a word
    code, _, err = run(capsys, "train", "--hidden", hidden)
    assert code == 2 and err.startswith("usage: verigrad train"), err
    assert f"--hidden {hidden!r} has an empty width" in err, err


# -- --resume: the checkpoint's model takes the data's features -------------------------------

@pytest.fixture(scope="module")
def four_feature_checkpoints(tmp_path_factory):
    """{algorithm: checkpoint} of a 4-8-10 MLP (bp) and a 4-8 RBM (cd), one epoch on 20 random
    rows each: models of 4 features, not of the digits' 64."""
    import fastlib

    folder = tmp_path_factory.mktemp("ckpt")
    rng = np.random.default_rng(0)
    x = rng.random((20, 4), np.float32)
    y = rng.integers(0, 10, (20, 1))
    mlp = fastlib.Sequential([fastlib.Dense(4, 8, "relu"), fastlib.Dense(8, 10)], seed=0)
    fastlib.train(mlp, x, y, 1, 10, 1e-3, "cross_entropy", optimizer="Adam", verbose=False,
                  checkpoint=str(folder / "bp.npz"))
    fastlib.train(fastlib.RBM(4, 8, seed=0), x, None, 1, 10, 0.1, None, optimizer="Adam",
                  verbose=False, algorithm="cd", checkpoint=str(folder / "cd.npz"))
    return {"bp": folder / "bp.npz", "cd": folder / "cd.npz"}


@pytest.mark.parametrize("algorithm", ["bp", "cd"])
def test_a_checkpoint_for_other_features_is_refused_before_training(capsys, no_fit, monkeypatch,
                                                                    four_feature_checkpoints,
                                                                    algorithm):
    # it failed only after compiling, inside the first layer, without naming the checkpoint
    import fastlib

    # --algorithm cd calls fastlib.train itself, not _fit
    monkeypatch.setattr(fastlib, "train", lambda *a, **k: pytest.fail("trained before refusing"))
    path = four_feature_checkpoints[algorithm]
    code, out, err = run(capsys, "train", "--resume", str(path), "--epochs", "1",
                         "--algorithm", algorithm)
    assert code == 2, out + err
    assert (f"--resume {path}: its model takes 4 input features but the digits data has 64; "
            "resume with the data it was trained on") in err, err
    assert "verigrad train: digits" not in out      # refused before the banner


# -- MNIST files with no sample ----------------------------------------------------------------

def test_mnist_files_with_no_image_are_refused_before_training(capsys, tmp_path, no_fit):
    # the train split loaded, every epoch ran, and the empty test split failed at the end
    images = np.zeros((20, 28, 28), np.uint8)
    write_split(tmp_path, "train", images, np.arange(20, dtype=np.uint8) % 10)
    write_split(tmp_path, "test", images[:0], np.zeros(0, np.uint8))
    code, _, err = run(capsys, "train", "--data", "mnist", "--data-dir", str(tmp_path),
                       "--epochs", "1")
    assert code == 1, err
    assert "t10k-images-idx3-ubyte.gz" in err and "holds 0 images" in err, err


# -- conform: an engine named with --engines that cannot run here ------------------------------

def test_an_unavailable_engine_named_with_engines_is_named_with_its_reason(capsys, monkeypatch):
    # "nothing to check: no available engine has a row that matches the filters" did not say
    # that the one engine asked for cannot run here, or why
    from reports.conformance import engines

    reason = "no CUDA GPU found (planted by the test)"
    monkeypatch.setitem(engines.ENGINES, "fastlib-cuda", dataclasses.replace(
        engines.ENGINES["fastlib-cuda"], reason=lambda: reason))
    code, out, err = run(capsys, "conform", "--engines", "fastlib-cuda", "--ops", "tanh",
                         "--no-proofs", "--workers", "1", "--no-progress")
    assert code == 1, out + err     # docs/cli.md: nothing checked of an engine asked for
    assert f"nothing to check: engine fastlib-cuda is unavailable: {reason}" in out, out
    assert out.count(reason) == 1, out      # said once, where it explains the empty run
