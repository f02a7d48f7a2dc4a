"""Calls a user of DataCode or SINGA knows work here the way they read there.

- DataCode: ``(loss_history, accuracy_history) = model.train(...)``; ``load_mnist("train")``
  without a path; the fields ``dataset_features`` / ``dataset_targets``;
- SINGA: the algorithm names ``kBP`` and ``kCD``;
- the refusal of an unknown algorithm names every algorithm there is, once, with one guess.

Expected values come from the data written by the test itself (the IDX files) or from the
fields of the same result object, never from a recomputation by the code under test.
"""
from __future__ import annotations

import gzip
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastlib
from fastlib import datasets
from fastlib.training import ALGORITHMS, algorithm_names, get_algorithm, register_algorithm

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# DataCode: unpacking the result of train

def test_training_result_unpacks_as_loss_and_accuracy_histories():
    data = datasets.load_digits("train", dtype=np.float64)
    model = fastlib.Sequential([fastlib.Dense(64, 10)], dtype=np.float64, seed=0)
    result = fastlib.train(model, data.x[:200], data.y[:200], 3, 50, 0.1, "cross_entropy",
                           verbose=False)
    loss_history, accuracy_history = result
    assert loss_history is result.loss_history and accuracy_history is result.accuracy_history
    assert len(loss_history) == len(accuracy_history) == 3
    assert result.final_loss == loss_history[-1]          # the fields are all still there
    with pytest.raises(ValueError, match="too many values|not enough values"):
        a, b, c = result                                  # a pair, as in DataCode


# ---------------------------------------------------------------------------------------------
# SINGA: kBP and kCD; the unknown-algorithm message

def test_singa_names_are_aliases():
    assert get_algorithm("kBP") is get_algorithm("bp")
    assert get_algorithm("kCD") is get_algorithm("cd")
    assert get_algorithm(" kcd ") is get_algorithm("CD")
    with pytest.raises(ValueError, match="alias of the algorithm 'bp'"):
        register_algorithm("kBP", lambda ctx, x, y: None)
    assert "kbp" not in ALGORITHMS


def test_train_accepts_kbp_and_trains_like_bp():
    data = datasets.load_digits("train", dtype=np.float64)
    runs = []
    for name in ("bp", "kBP"):
        model = fastlib.Sequential([fastlib.Dense(64, 10)], dtype=np.float64, seed=0)
        runs.append(fastlib.train(model, data.x[:100], data.y[:100], 2, 25, 0.1,
                                  "cross_entropy", verbose=False, algorithm=name).loss_history)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("typo, guess", [("targetprob", "targetprop"), ("bpp", "bp"),
                                         ("kcdd", "cd"), ("qqqq", None)])
def test_unknown_algorithm_lists_every_algorithm_once_with_one_guess(typo, guess):
    with pytest.raises(ValueError) as info:
        get_algorithm(typo)
    message = str(info.value)
    listed = re.search(r"known: ([^(;]*)", message).group(1).strip().split(", ")
    # targetprop and cd register themselves on first use: they are known all the same (other
    # tests may have registered more by now); each is listed once
    assert {"bp", "cd", "targetprop"} <= set(listed)
    assert listed == sorted(set(listed)) == algorithm_names()
    assert "kBP = bp" in message and "kCD = cd" in message
    hint = re.search(r"\(did you mean ([^?]*)\?\)", message)
    guesses = re.findall(r"'([^']*)'", hint.group(1)) if hint else []
    assert guesses == ([] if guess is None else [guess]), message


def test_a_fresh_process_lists_the_lazily_registered_algorithms():
    # in a fresh interpreter only bp is registered until targetprop or cd is first asked for
    code = ("from fastlib.training import ALGORITHMS, get_algorithm\n"
            "assert sorted(ALGORITHMS) == ['bp'], sorted(ALGORITHMS)\n"
            "get_algorithm('qqqq')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "known: bp, cd, targetprop (" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# DataCode: load_mnist("train") without a path; dataset_features / dataset_targets

def _idx(array, magic):
    return struct.pack(">i", magic) + struct.pack(f">{array.ndim}i", *array.shape) + \
        array.astype(np.uint8).tobytes()


def _write_mnist(folder, rng):
    folder.mkdir(parents=True)
    out = {}
    for split, (images_name, labels_name), n in (("train", datasets.MNIST_FILES["train"], 5),
                                                 ("test", datasets.MNIST_FILES["test"], 3)):
        images = rng.integers(0, 256, size=(n, 28, 28))
        labels = rng.integers(0, 10, size=n)
        (folder / (images_name + ".gz")).write_bytes(gzip.compress(_idx(images, 2051)))
        (folder / (labels_name + ".gz")).write_bytes(gzip.compress(_idx(labels, 2049)))
        out[split] = (images, labels)
    return out


def test_load_mnist_finds_the_folder_through_the_environment(tmp_path, monkeypatch):
    written = _write_mnist(tmp_path / "somewhere", np.random.default_rng(0))
    monkeypatch.setenv(datasets.MNIST_DIR_ENV, str(tmp_path / "somewhere"))
    monkeypatch.chdir(tmp_path)                       # no ../shared/data/mnist from here
    train = datasets.load_mnist("train")
    images, labels = written["train"]
    np.testing.assert_array_equal(train.x * 255, images.reshape(5, 784).astype(np.float32))
    np.testing.assert_array_equal(train.y[:, 0], labels)
    # DataCode's names for the same arrays, as fields and as functions
    assert train.dataset_features is train.x and train.dataset_targets is train.y
    assert datasets.dataset_features(train) is train.x
    assert datasets.dataset_targets(train) is train.y
    with pytest.raises(TypeError, match="load_mnist\\('train'\\)"):
        datasets.dataset_features((train.x, train.y, train.x, train.y))


def test_load_mnist_default_folder_and_how_to_get_the_files(tmp_path, monkeypatch):
    monkeypatch.delenv(datasets.MNIST_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))    # an empty user cache
    work = tmp_path / "repo"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(FileNotFoundError) as info:
        datasets.load_mnist("test")
    message = str(info.value)
    for part in ("VERIGRAD_MNIST_DIR", "shared/data/mnist", "t10k-images-idx3-ubyte.gz",
                 "https://"):
        assert part in message, message
    written = _write_mnist(tmp_path / "shared" / "data" / "mnist", np.random.default_rng(1))
    test = datasets.load_mnist("test")
    np.testing.assert_array_equal(test.dataset_targets[:, 0], written["test"][1])


# ---------------------------------------------------------------------------------------------
# Keras and PyTorch keywords beside DataCode's positional order

def _digits_run(*args, **kwargs):
    data = datasets.load_digits("train", dtype=np.float64)
    model = fastlib.Sequential([fastlib.Dense(64, 10)], dtype=np.float64, seed=0)
    result = fastlib.train(model, data.x[:120], data.y[:120], *args, verbose=False, **kwargs)
    return result, model


def test_keras_and_pytorch_keywords_train_exactly_like_datacodes_order():
    data = datasets.load_digits("train", dtype=np.float64)
    xv, yv = data.x[120:160], data.y[120:160]
    positional, m1 = _digits_run(2, 30, 0.1, "cross_entropy", xv, yv, "Momentum")
    keywords, m2 = _digits_run(epochs=2, batch_size=30, lr=0.1, loss="cross_entropy",
                               validation_data=(xv, yv), optimizer="Momentum")
    assert positional.loss_history == keywords.loss_history
    assert positional.val_loss_history == keywords.val_loss_history
    assert len(keywords.val_loss_history) == 2
    for k, v in m1.parameters().items():
        assert np.array_equal(v, m2.parameters()[k]), k


@pytest.mark.parametrize("args, kwargs, names", [
    ((2, 30, 0.1, "cross_entropy"), {"lr": 0.1}, ["learning_rate=0.1", "lr=0.1"]),
    ((2, 30), {"learning_rate": 0.1, "lr": 0.2, "loss": "mse"}, ["learning_rate", "lr"]),
    ((2, 30, 0.1, "cross_entropy"), {"loss": "mse"}, ["loss_type='cross_entropy'", "loss="]),
    ((2, 30, 0.1, "cross_entropy", np.zeros((2, 64))), {"validation_data": (1, 2)},
     ["validation_data", "x_val"]),
])
def test_one_thing_given_twice_is_a_type_error_naming_both(args, kwargs, names):
    with pytest.raises(TypeError) as info:
        _digits_run(*args, **kwargs)
    for name in names:
        assert name in str(info.value)


def test_a_positional_and_a_keyword_for_the_same_parameter_is_pythons_type_error():
    with pytest.raises(TypeError, match="multiple values for argument 'epochs'"):
        _digits_run(2, 30, 0.1, "cross_entropy", epochs=3)


@pytest.mark.parametrize("kwargs, missing", [({"batch_size": 8, "loss": "mse"}, "'epochs'"),
                                             ({"epochs": 1, "loss": "mse"}, "'batch_size'"),
                                             ({"epochs": 1, "batch_size": 8}, "'loss_type'")])
def test_a_missing_argument_is_named(kwargs, missing):
    with pytest.raises(TypeError, match=f"missing required argument {missing}"):
        _digits_run(**kwargs)


def test_validation_data_must_be_a_pair():
    with pytest.raises(ValueError, match=r"pair \(x_val, y_val\)"):
        _digits_run(1, 30, 0.1, "cross_entropy", validation_data=(1, 2, 3))


def test_an_optimizer_objects_own_rate_is_used_and_a_different_one_refused():
    from fastlib import optim

    # its own rate when none is given. By hand: a step of SGD moves a weight by lr x its
    # gradient, a batch mean of x * (softmax - onehot) with the digits' x in [0, 1] and each
    # |softmax - onehot| <= 1, so at most 1 (the bias's too); 4 steps of 30 of the 120 rows
    # move any weight by at most 4e-9 at lr=1e-9 (learning_rate=0.5 moved them by 0.79)
    start = fastlib.Sequential([fastlib.Dense(64, 10)], dtype=np.float64, seed=0).parameters()
    _, model = _digits_run(1, 30, None, "cross_entropy", optimizer=optim.SGD(lr=1e-9))
    moved = max(float(np.max(np.abs(v - start[k]))) for k, v in model.parameters().items())
    assert 0 < moved <= 4 * 1e-9
    # the same rate twice is no conflict; a different one is refused before training
    _digits_run(1, 30, 1e-9, "cross_entropy", optimizer=optim.SGD(lr=1e-9))
    with pytest.raises(ValueError, match="has its own learning rate 1e-09, and learning_rate"
                                         "=0.5 differs"):
        _digits_run(1, 30, 0.5, "cross_entropy", optimizer=optim.SGD(lr=1e-9))
    with pytest.raises(ValueError, match="own learning rate"):
        _digits_run(epochs=1, batch_size=30, lr=0.5, loss="cross_entropy",
                    optimizer=optim.Adam(lr=1e-3))


def test_train_sh_takes_the_same_keywords():
    data = datasets.load_digits("train", dtype=np.float64)
    model = fastlib.Sequential([fastlib.Dense(64, 10)], dtype=np.float64, seed=0)
    hist = fastlib.train_sh(model, data.x[:120], data.y[:120], epochs=2, batch_size=30, lr=0.1,
                            loss="cross_entropy", validation_data=(data.x[120:160],
                                                                   data.y[120:160]),
                            verbose=False)
    assert len(hist.val_loss) == 2
    with pytest.raises(TypeError, match="lr"):
        fastlib.train_sh(model, data.x[:120], data.y[:120], 2, 30, 0.1, "cross_entropy",
                         lr=0.2, verbose=False)


def test_the_default_optimizers_are_stated_in_both_helps():
    from reports.cli import build_parser

    assert "(the CLI's default is Adam; fastlib.train's is SGD" in " ".join(
        build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())
    doc = " ".join(fastlib.train.__doc__.split())
    assert "The default is SGD, DataCode's (``verigrad train``'s is Adam)" in doc
