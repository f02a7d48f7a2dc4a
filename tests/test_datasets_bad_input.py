"""fastlib.datasets refuses bad input up front, naming the problem and the fix: a dtype that is
not float32 or float64 (never integer pixels or a numpy error), and an MNIST file that holds no
image or no label (never an empty split that fails only after training)."""
from __future__ import annotations

import numpy as np
import pytest

from fastlib import datasets
from fastlib.errors import CorruptFileError
from tests.test_datasets import write_split

LOADERS = {
    "digits": lambda dtype, folder: datasets.load_digits("train", dtype=dtype),
    "mnist": lambda dtype, folder: datasets.load_mnist("train", folder, dtype=dtype),
}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("dtype, error, shown", [
    (np.int32, ValueError, "int32"),       # digits returned 0/1 integers, mnist a UFuncTypeError
    ("uint8", ValueError, "uint8"),
    (np.float16, ValueError, "float16"),
    (bool, ValueError, "bool"),
    ("flaot32", TypeError, "'flaot32'"),   # numpy's "data type not understood"
    (None, TypeError, "None"),             # numpy reads None as float64: refused, not guessed
])
def test_a_dtype_other_than_float32_or_float64_is_refused_up_front(tmp_path, loader, dtype,
                                                                   error, shown):
    # the folder does not exist: the dtype is refused before any file is looked for
    with pytest.raises(error) as info:
        LOADERS[loader](dtype, tmp_path / "nowhere")
    message = str(info.value)
    assert f"dtype must be float32 or float64, got {shown}" in message, message


@pytest.mark.parametrize("dtype", [np.float32, "float64", np.dtype("float32")])
def test_float32_and_float64_in_any_spelling_still_load(tmp_path, dtype):
    assert datasets.load_digits("test", dtype=dtype).x.dtype == np.dtype(dtype)
    images = np.zeros((2, 28, 28), np.uint8)
    write_split(tmp_path, "test", images, np.array([3, 7], np.uint8))
    assert datasets.load_mnist("test", tmp_path, dtype=dtype).x.dtype == np.dtype(dtype)


@pytest.mark.parametrize("empty, words", [
    ("both", ["t10k-images-idx3-ubyte.gz", "holds 0 images"]),
    ("images", ["t10k-images-idx3-ubyte.gz", "holds 0 images"]),
    ("labels", ["t10k-labels-idx1-ubyte.gz", "holds 0 labels"]),
])
def test_an_mnist_file_with_no_sample_is_refused_naming_it(tmp_path, empty, words):
    # a well-formed IDX header declaring 0 items was read as an empty split: `verigrad train`
    # trained every epoch and failed only on the empty test split
    images = np.zeros((0 if empty in ("both", "images") else 3, 28, 28), np.uint8)
    labels = np.zeros(0 if empty in ("both", "labels") else 3, np.uint8)
    write_split(tmp_path, "test", images, labels)
    with pytest.raises(CorruptFileError) as info:
        datasets.load_mnist("test", tmp_path)
    for word in words:
        assert word in str(info.value), str(info.value)
    assert "fetch" in str(info.value)
