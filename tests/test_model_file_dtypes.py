"""A model file whose parameter is stored in another dtype than its metadata declares is refused
(``CorruptFileError`` naming the file, the member and both dtypes), never converted on the way
in: the weights a model loads are exactly the weights its file stores."""
from __future__ import annotations

import io as pyio
import zipfile

import numpy as np
import pytest

import fastlib
from fastlib.errors import CorruptFileError


def _store_param_as(src, dst, member, dtype):
    """Copy the archive, rewriting one ``param/`` member's array in ``dtype`` (a valid .npy,
    CRC and all, so only the dtype check can refuse it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename == member:
                buf = pyio.BytesIO()
                np.save(buf, np.load(pyio.BytesIO(data)).astype(dtype))
                data = buf.getvalue()
            zout.writestr(info.filename, data)


@pytest.mark.parametrize("model_dtype, stored", [
    (np.float32, "<f8"),   # lossless widening: refused all the same, nothing is converted
    (np.float32, ">f4"),   # the same values, byte-swapped
    (np.float32, "<f2"),
    (np.float32, "<i8"),
    (np.float64, "<f4"),
    (np.float64, ">f8"),
])
def test_a_parameter_in_another_dtype_is_refused(tmp_path, model_dtype, stored):
    model = fastlib.Sequential([fastlib.Dense(3, 2)], dtype=model_dtype, seed=0)
    good = tmp_path / "good.npz"
    model.save(good)
    for name in model.parameters():
        bad = tmp_path / f"bad-{name}.npz"
        _store_param_as(good, bad, f"param/{name}.npy", stored)
        with pytest.raises(CorruptFileError) as info:
            fastlib.load(bad)
        message = str(info.value)
        assert str(bad) in message and f"param/{name}" in message
        assert np.dtype(stored).str in message and np.dtype(model_dtype).name in message
    # the file as saved loads bit for bit
    again = fastlib.load(good).parameters()
    for name, value in model.parameters().items():
        assert again[name].dtype == value.dtype and np.array_equal(again[name], value)
