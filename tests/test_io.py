"""fastlib.io: model.save / fastlib.load round trips, atomic writes, clear errors on bad files."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import fastlib
from fastlib import io


def _models():
    return {
        "mlp32": fastlib.Sequential([fastlib.Dense(6, 8, "relu"), fastlib.Dense(8, 3)],
                                    dtype=np.float32, seed=4),
        "nested64": fastlib.Sequential([fastlib.Dense(5, 4, "tanh"),
                                        fastlib.Sequential([fastlib.Dense(4, 4, "sigmoid"),
                                                            fastlib.Dense(4, 2)])],
                                       dtype=np.float64, seed=5),
        "lstm": fastlib.Sequential([fastlib.LSTM(3, 4), fastlib.Dense(4, 2)], dtype=np.float64,
                                   seed=6),
        "parallel": fastlib.Parallel([fastlib.Dense(3, 2), fastlib.Dense(3, 4, "relu")],
                                     combine="concat", dtype=np.float32, seed=7),
    }


@pytest.mark.parametrize("key", ["mlp32", "nested64", "lstm", "parallel"])
def test_round_trip_keeps_architecture_dtype_weights_and_outputs(tmp_path, key):
    model = _models()[key]
    # move the weights away from their initial draw so a loader that re-initialised would fail
    for p in model.parameters().values():
        p += np.linspace(-0.5, 0.5, p.size, dtype=p.dtype).reshape(p.shape)
    path = model.save(tmp_path / "model.npz")
    assert path == tmp_path / "model.npz" and sorted(os.listdir(tmp_path)) == ["model.npz"]
    loaded = fastlib.load(path)
    assert type(loaded) is type(model)
    assert loaded.get_config() == model.get_config()
    assert loaded.dtype == model.dtype
    a, b = model.parameters(), loaded.parameters()
    assert list(a) == list(b)
    for k in a:
        assert b[k].dtype == a[k].dtype and np.array_equal(a[k], b[k]), k
    x = np.random.default_rng(0).standard_normal((2, 4, 3) if key == "lstm" else
                                                 (2, 6 if key == "mlp32" else
                                                  5 if key == "nested64" else 3))
    assert np.array_equal(model(x), loaded(x))


def test_file_is_an_npz_with_json_architecture(tmp_path):
    model = _models()["mlp32"]
    model.save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as data:  # readable without pickle
        meta = json.loads(str(data["__meta__"][()]))
        assert meta["format"] == "verigrad-model" and meta["version"] == 1
        assert meta["architecture"] == model.get_config() and meta["dtype"] == "float32"
        assert np.array_equal(data["param/0.weight"], model.parameters()["0.weight"])


def test_write_is_atomic_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "m.npz"
    model = _models()["mlp32"]
    model.save(path)
    before = path.read_bytes()

    def exploding_savez(f, **entries):
        f.write(b"partial garbage")
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(np, "savez", exploding_savez)
    with pytest.raises(KeyboardInterrupt):
        model.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before  # the old file is intact
    assert sorted(os.listdir(tmp_path)) == ["m.npz"]  # and no temporary file is left behind


def test_overwrite_replaces_the_file(tmp_path):
    path = tmp_path / "m.npz"
    a, b = _models()["mlp32"], _models()["nested64"]
    a.save(path)
    b.save(path)
    assert fastlib.load(path).get_config() == b.get_config()


def _raw_npz(path, meta=None, **arrays):
    entries = dict(arrays)
    if meta is not None:
        entries["__meta__"] = np.array(json.dumps(meta))
    np.savez(path, **entries)


@pytest.mark.parametrize("make, err, words", [
    (lambda p: None, FileNotFoundError, ["no such file"]),
    (lambda p: p.write_text("hello"), ValueError, ["not a readable .npz"]),
    (lambda p: _raw_npz(p, None, w=np.zeros(3)), ValueError, ["without a __meta__"]),
    (lambda p: _raw_npz(p, {"format": "keras-h5", "version": 1}), ValueError,
     ["file format 'keras-h5'", "verigrad-model"]),
    (lambda p: _raw_npz(p, {"format": "verigrad-model", "version": 99}), ValueError,
     ["version 99", "newer verigrad"]),
    (lambda p: _raw_npz(p, {"format": "verigrad-model", "version": "1"}), ValueError,
     ["invalid format version"]),
    (lambda p: _raw_npz(p, {"format": "verigrad-model", "version": 1}), ValueError,
     ["lacks 'architecture'"]),
    (lambda p: _raw_npz(p, {"format": "verigrad-model", "version": 1, "dtype": "float32",
                            "architecture": {"type": "Dense", "in_features": 2,
                                             "out_features": 1},
                            "parameters": ["weight", "bias"]}, **{"param/weight":
                                                                  np.zeros((2, 1))}),
     ValueError, ["weights missing", "bias"]),
])
def test_bad_files_get_clear_errors(tmp_path, make, err, words):
    path = tmp_path / "bad.npz"
    make(path)
    with pytest.raises(err) as info:
        fastlib.load(path)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_truncated_archive_is_a_clear_error(tmp_path):
    path = tmp_path / "m.npz"
    _models()["mlp32"].save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable .npz"):
        fastlib.load(path)


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _models()["mlp32"].save(tmp_path / "no" / "m.npz")


def test_object_arrays_are_refused(tmp_path):
    with pytest.raises(TypeError, match="object array"):
        io.write_archive(tmp_path / "x.npz", {"format": "x"}, {"a": np.array([None])})
