"""Bad input to `verigrad train`, `conform` and `report` is a usage error naming the fix, never a
traceback: a loss the model's output must fit, a --resume checkpoint of the wrong kind, an empty
--hidden, and a plugin engine path that is not an importable .py file."""
from __future__ import annotations

import sys

import pytest

from reports.cli import main
from reports.commands import train


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err, out.err
    return code, out.out, out.err


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if `verigrad train` gets past its usage checks."""
    monkeypatch.setattr(train, "_run", lambda args: pytest.fail("trained before refusing"))


# -- the model's output fits the loss ---------------------------------------------------------

@pytest.mark.parametrize("loss", train._losses())
def test_every_loss_trains_and_scores_the_test_split(capsys, loss):
    # binary_cross_entropy scores probabilities: a linear output trained every epoch, then
    # failed the test split's check (exit 1); its model now ends in a sigmoid
    code, out, err = run(capsys, "train", "--loss", loss, "--epochs", "2", "--hidden", "16",
                         "--lr", "0.01")
    assert code == 0, out + err
    assert ("(sigmoid output)" in out) == (loss == "binary_cross_entropy"), out
    acc = out.split("test accuracy")[1].split()[0]
    if loss != "mse":
        # one-hot binary accuracy is per element: all-zero guesses already score 0.9
        assert float(acc) > (0.9 if loss.startswith("binary") else 0.5), out


def test_output_activation_is_sigmoid_only_for_probabilities():
    from fastlib import losses

    assert {name: train.output_activation(name) for name in losses.LOSSES} == {
        name: "sigmoid" if name == "binary_cross_entropy" else "linear"
        for name in losses.LOSSES}


# -- --resume: the checkpoint fits the flags, or a usage error before any epoch ----------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(RBM checkpoint, backprop checkpoint), each one epoch of a small model."""
    folder = tmp_path_factory.mktemp("checkpoints")
    rbm, bp = folder / "rbm.npz", folder / "bp.npz"
    assert main(["train", "--algorithm", "cd", "--hidden", "8", "--epochs", "1",
                 "--checkpoint", str(rbm)]) == 0
    assert main(["train", "--hidden", "8", "--epochs", "1", "--checkpoint", str(bp)]) == 0
    return rbm, bp


@pytest.mark.parametrize("which, argv, words", [
    (0, [], ["holds an RBM", "--algorithm bp trains layer models", "--algorithm cd"]),
    (0, ["--algorithm", "targetprop"], ["holds an RBM", "resume it with --algorithm cd"]),
    (1, ["--algorithm", "cd"], ["holds a layer model (Sequential)", "--algorithm cd trains an "
                                "RBM", "resume it with --algorithm bp"]),
    (1, ["--algorithm", "kCD"], ["holds a layer model", "resume it with --algorithm bp"]),
    (1, ["--loss", "binary_cross_entropy"], ["ends in a linear layer", "needs a sigmoid output",
                                             "--loss cross_entropy"]),
    (1, ["--dtype", "float64"], ["holds a float32 model", "pass --dtype float32"]),
    (0, ["--algorithm", "cd", "--dtype", "float64"], ["pass --dtype float32"]),
])
def test_a_checkpoint_that_does_not_fit_the_flags_is_refused(capsys, no_training, checkpoints,
                                                             which, argv, words):
    path = checkpoints[which]
    code, _, err = run(capsys, "train", "--resume", str(path), "--epochs", "2", *argv)
    assert code == 2 and err.startswith("usage: verigrad train"), err
    assert f"--resume {path}: the checkpoint" in err
    for w in words:
        assert w in err, err


def test_a_model_file_is_not_a_checkpoint(capsys, no_training, tmp_path):
    import fastlib

    path = tmp_path / "model.npz"
    fastlib.Sequential([fastlib.Dense(64, 10)], seed=0).save(path)
    code, _, err = run(capsys, "train", "--resume", str(path), "--epochs", "1")
    assert code == 2 and "--resume" in err and "expected 'verigrad-checkpoint'" in err, err


@pytest.mark.parametrize("argv", [["--algorithm", "cd"], []])
def test_a_fitting_checkpoint_resumes(capsys, checkpoints, argv):
    path = checkpoints[0 if argv else 1]
    code, out, err = run(capsys, "train", "--resume", str(path), "--epochs", "2",
                         "--hidden", "8", *argv)
    assert code == 0, out + err
    assert "test " in out


# -- --hidden: at least one width ------------------------------------------------------------

@pytest.mark.parametrize("hidden", ["", ",,", " , "])
@pytest.mark.parametrize("algorithm", ["bp", "cd"])
def test_hidden_without_a_width_is_a_usage_error(capsys, no_training, hidden, algorithm):
    # bp trained a model with no hidden layer; cd crashed taking the first width
    code, _, err = run(capsys, "train", "--algorithm", algorithm, "--hidden", hidden)
    assert code == 2 and err.startswith("usage: verigrad train"), err
    assert f"--hidden needs at least one width, e.g. 128 or 128,64; got {hidden!r}" in err


def test_hidden_takes_spaces_around_its_widths(monkeypatch):
    # an empty width is refused (tests/test_cli_bad_input.py): widths are positional
    seen = {}

    def record(args):
        seen["hidden"] = args.hidden
        return 0

    monkeypatch.setattr(train, "_run", record)
    assert main(["train", "--hidden", " 32, 16 "]) == 0
    assert seen["hidden"] == [32, 16]


# -- plugin engines: one loader, one clear message, exit 2 in conform and report ---------------

def _plugins(folder):
    """{case: (--engines value, words of the refusal)} for broken plugins under ``folder``."""
    (folder / "engine.txt").write_text("class Cls: pass\n")
    (folder / "broken_engine.py").write_text("x = 1\ny = (\n")
    (folder / "raising_engine.py").write_text("raise RuntimeError('needs a licence')\n")
    (folder / "building_raises.py").write_text(
        "class Cls:\n    def __init__(self):\n        raise RuntimeError('needs a key')\n")
    (folder / "a_folder").mkdir()
    return {
        "text file": ("./engine.txt:Cls", ["./engine.txt is not a .py file"]),
        "text file, no separator": ("engine.txt:Cls", ["engine.txt is not a .py file"]),
        "folder": ("./a_folder:Cls", ["./a_folder is a folder, not a .py file"]),
        "syntax error": ("./broken_engine.py:Cls", [
            "./broken_engine.py: cannot import it: SyntaxError at line 2: '(' was never "
            "closed"]),
        "raises on import": ("raising_engine.py:Cls", [
            "raising_engine.py: cannot import it: RuntimeError: needs a licence"]),
        "module with a syntax error": ("broken_engine:Cls", [
            "module 'broken_engine': cannot import it: SyntaxError in ", "at line 2"]),
        "missing file": ("./nowhere.py:Cls", ["./nowhere.py: no such file"]),
        "raises when built": ("./building_raises.py:Cls", [
            "engine './building_raises.py:Cls': cannot build it: RuntimeError: needs a key"]),
    }


@pytest.mark.parametrize("case", ["text file", "text file, no separator", "folder",
                                  "syntax error", "raises on import",
                                  "module with a syntax error", "missing file",
                                  "raises when built"])
@pytest.mark.parametrize("command", [["conform", "--ops", "tanh"], ["report", "--ops", "exp"]])
def test_a_broken_plugin_path_is_a_usage_error(capsys, nothing_runs, monkeypatch, tmp_path,
                                               case, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_engine", raising=False)
    value, words = _plugins(tmp_path)[case]
    extra = ["--out", str(tmp_path / "out")] if command[0] == "report" else []
    code, _, err = run(capsys, *command, "--engines", value, "--no-progress", *extra)
    assert code == 2 and err.startswith(f"usage: verigrad {command[0]}"), err
    assert f"verigrad {command[0]}: error: --engines: " in err, err
    for w in words:
        assert w in err, err
    assert not [m for m in sys.modules if m.startswith("_verigrad_engine_")
                and ("broken" in m or "raising" in m)], "a failed import stayed registered"
