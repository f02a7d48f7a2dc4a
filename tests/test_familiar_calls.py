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
