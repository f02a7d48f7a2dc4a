"""Hostile and corrupted files: one clean ``CorruptFileError`` naming file, member and problem,
decided before anything is built (``fastlib.load``, checkpoints, ``read_idx``)."""
from __future__ import annotations

import gzip
import io as pyio
import json
import struct
import time
import zipfile

import numpy as np
import pytest

import fastlib
from fastlib import io
from fastlib.errors import CorruptFileError
from fastlib.training import checkpoint


def _mlp():
    return fastlib.Sequential([fastlib.Dense(4, 3, "relu"), fastlib.Dense(3, 2)],
                              dtype=np.float32, seed=0)


def _rewrite(path, edit_meta=None, edit_members=None):
    """Rewrite a saved file with its metadata dict edited (or replaced by raw JSON text)."""
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    if edit_meta is not None:
        meta = json.loads(str(np.load(pyio.BytesIO(members["__meta__.npy"]))[()]))
        new = edit_meta(meta)
        text = new if isinstance(new, str) else json.dumps(new)
        buf = pyio.BytesIO()
        np.save(buf, np.array(text))
        members["__meta__.npy"] = buf.getvalue()
    if edit_members is not None:
        edit_members(members)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _refused(path, *words, loader=fastlib.load):
    with pytest.raises(CorruptFileError) as info:
        loader(path)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert str(path) in message
    for w in words:
        assert w in message, message
    return info.value


def test_a_tiny_file_declaring_a_huge_layer_is_refused_before_anything_is_built(tmp_path):
    path = _mlp().save(tmp_path / "m.npz")

    def huge(meta):
        meta["architecture"] = {"type": "Sequential", "layers": [
            {"type": "Dense", "in_features": 25000, "out_features": 25000}]}
        meta["parameters"] = ["0.weight", "0.bias"]
        return meta

    _rewrite(path, huge)
    assert path.stat().st_size < 5000
    t0 = time.perf_counter()
    err = _refused(path, "param/0.weight", "(25000, 25000)", "(4, 3)")
    # building first took 39 s and 9.4 GB; checking the declared shapes first takes milliseconds
    assert time.perf_counter() - t0 < 0.5
    assert err.member == "param/0.weight"


def test_declared_size_beyond_the_limit_is_refused_and_the_override_loads_it(tmp_path,
                                                                              monkeypatch):
    model = fastlib.Sequential([fastlib.Dense(64, 64)], dtype=np.float64, seed=1)
    path = model.save(tmp_path / "m.npz")
    need = (64 * 64 + 64) * 8
    with pytest.raises(CorruptFileError, match="max_bytes"):
        fastlib.load(path, max_bytes=need - 1)
    assert np.array_equal(fastlib.load(path, max_bytes=need).parameters()["0.weight"],
                          model.parameters()["0.weight"])
    monkeypatch.setenv(io.MAX_BYTES_ENV, str(need - 1))
    with pytest.raises(CorruptFileError, match=io.MAX_BYTES_ENV):
        fastlib.load(path)
    monkeypatch.setenv(io.MAX_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match="whole number of bytes"):
        fastlib.load(path)


@pytest.mark.parametrize("meta, words", [
    ("[" * 1000 + "]" * 1000, ["__meta__", "nested 1000 deep"]),
    ('{"a": ' * 5000 + "1" + "}" * 5000, ["nested 5000 deep"]),
    ("42", ["must be a JSON object", "int"]),
    ("[1, 2]", ["must be a JSON object", "list"]),
    ("{not json", ["not valid JSON"]),
])
def test_metadata_that_is_not_an_object_or_too_deep(tmp_path, meta, words):
    path = _mlp().save(tmp_path / "m.npz")
    _rewrite(path, lambda m: meta)
    _refused(path, *words)


@pytest.mark.parametrize("edit, words", [
    (lambda m: {**m, "dtype": None}, ["__meta__.dtype", "null"]),
    (lambda m: {**m, "dtype": "float16"}, ["__meta__.dtype", "float16"]),
    (lambda m: {**m, "architecture": {"type": "Conv9D"}}, ["architecture.type", "Conv9D",
                                                           "known types"]),
    (lambda m: {**m, "architecture": 3}, ["__meta__.architecture", "the number 3"]),
    (lambda m: {**m, "architecture": {"type": "Sequential", "layers": 5}},
     ["architecture.layers", "list"]),
    (lambda m: {**m, "architecture": {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": True, "out_features": 3}]}},
     ["architecture.layers[0].in_features", "a boolean"]),
    (lambda m: {**m, "architecture": {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 4, "out_features": 10 ** 30}]}},
     ["out_features", "outside"]),
    (lambda m: {**m, "architecture": {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 4, "out_features": 3, "activation": "relu"},
        {"type": "Dense", "in_features": 3, "out_features": 2, "activation": "nosuch"}]}},
     ["__meta__.architecture", "does not build"]),
    (lambda m: {**m, "parameters": ["0.weight"]}, ["__meta__.parameters"]),
    (lambda m: {k: v for k, v in m.items() if k != "parameters"}, ["lacks 'parameters'"]),
])
def test_metadata_schema_violations_name_the_field(tmp_path, edit, words):
    path = _mlp().save(tmp_path / "m.npz")
    _rewrite(path, edit)
    _refused(path, *words)


def _npy_header(members, name, text):
    payload = members[name]
    hlen = int.from_bytes(payload[8:10], "little")
    raw = text.encode("latin1")
    raw += b" " * ((-(10 + len(raw) + 1)) % 64) + b"\n"
    members[name] = b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw + \
        payload[10 + hlen:]


@pytest.mark.parametrize("header, words", [
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (25000, 25000), }",
     ["param/0.weight", "stores 48 bytes"]),
    ("{'descr': '|O', 'fortran_order': False, 'shape': (4, 3), }",
     ["param/0.weight", "holds dtype |O", "never objects"]),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3", ["malformed .npy header"]),
    ("{'descr': '>f4', 'fortran_order': False, 'shape': (4, 3), }", ["stored as >f4"]),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", ["declares (4, 3)"]),
])
def test_npy_headers_are_checked_against_the_stored_bytes(tmp_path, header, words):
    path = _mlp().save(tmp_path / "m.npz")
    _rewrite(path, edit_members=lambda ms: _npy_header(ms, "param/0.weight.npy", header))
    _refused(path, *words)


def test_zip_level_damage_is_one_error_type(tmp_path):
    path = _mlp().save(tmp_path / "m.npz")
    data = bytearray(path.read_bytes())
    # the compression method of the first local header (offset 8) and of its central
    # directory entry: an unsupported method used to raise NotImplementedError
    central = data.rfind(b"PK\x01\x02", 0, len(data))
    first_central = data.find(b"PK\x01\x02")
    for offset in (8, first_central + 10):
        data[offset] = 99
    path.write_bytes(bytes(data))
    _refused(path, "compression method 99")
    assert central > 0
    # a flipped byte inside a stored weight breaks the member's CRC
    path = _mlp().save(tmp_path / "w.npz")
    data = bytearray(path.read_bytes())
    data[data.find(b"param/0.weight.npy") + 200] ^= 0xFF
    path.write_bytes(bytes(data))
    _refused(path, "param/0.weight", "Bad CRC-32")


def test_checkpoint_fields_are_validated(tmp_path):
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    y = np.arange(8).reshape(-1, 1) % 2
    ck = tmp_path / "ck.npz"
    fastlib.train(_mlp(), x, y, 1, 4, 0.01, "cross_entropy", optimizer="Adam", checkpoint=ck,
                  verbose=False)
    assert checkpoint.load_checkpoint(ck).epoch == 1
    good = ck.read_bytes()
    for edit, words in [
        (lambda m: {**m, "epoch": "three"}, ["__meta__.epoch", "whole number"]),
        (lambda m: {**m, "lr": -1}, ["__meta__.lr"]),
        (lambda m: {**m, "rng_state": {"bit_generator": "os"}}, ["__meta__.rng_state",
                                                                  "cannot be restored"]),
        (lambda m: {**m, "optimizer": {"name": "Adamm"}}, ["__meta__.optimizer"]),
        (lambda m: {**m, "opt_slots": ["m"]}, ["__meta__.opt_slots"]),
        (lambda m: {**m, "history": {**m["history"], "loss": "low"}}, ["history.loss"]),
        # one entry per epoch done: a file claiming more epochs than it records is corrupt
        (lambda m: {**m, "epoch": 5}, ["history.loss", "1 entries", "5 epoch"]),
        (lambda m: {**m, "history": {**m["history"], "lr": []}}, ["history.lr", "0 entries"]),
        (lambda m: {**m, "history": {**m["history"], "val_loss": [1.0, 2.0],
                                     "val_acc": [0.5, 0.5]}}, ["history.val_loss", "2"]),
        (lambda m: {**m, "policy": {"monitor": "vibes"}}, ["__meta__.policy"]),
    ]:
        ck.write_bytes(good)
        _rewrite(ck, edit)
        _refused(ck, *words, loader=checkpoint.load_checkpoint)
    ck.write_bytes(good)

    def shrink_slot(members):
        name = next(n for n in members if n.startswith("opt/"))
        buf = pyio.BytesIO()
        np.save(buf, np.zeros(1, np.float32))
        members[name] = buf.getvalue()

    _rewrite(ck, edit_members=shrink_slot)
    _refused(ck, "opt/", "like its parameter", loader=checkpoint.load_checkpoint)


def _idx(path, dims, body=b"", gz=False):
    data = struct.pack(">i", 2051) + struct.pack(f">{len(dims)}i", *dims) + body
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_idx_dimensions_whose_product_overflows_64_bits_are_refused(tmp_path, gz):
    from fastlib.datasets import read_idx

    # 2**30 * 2**30 * 16 = 2**64, which int64 arithmetic wraps to 0 = the empty body's size
    path = _idx(tmp_path / "images", (2 ** 30, 2 ** 30, 16), gz=gz)
    with pytest.raises(CorruptFileError) as info:
        read_idx(path, 2051)
    assert str(path) in str(info.value) and str(2 ** 64) in str(info.value)
    # and a header within limits still reads
    good = _idx(tmp_path / "ok", (2, 2, 2), bytes(range(8)), gz=gz)
    assert read_idx(good, 2051).shape == (2, 2, 2)


def test_idx_gzip_bomb_is_read_only_as_far_as_the_header_declares(tmp_path):
    from fastlib.datasets import read_idx

    # a 2x2x2 header followed by 64 MB of zeros: refused after reading 9 bytes of data
    path = tmp_path / "bomb"
    data = struct.pack(">i", 2051) + struct.pack(">3i", 2, 2, 2) + bytes(64 * 2 ** 20)
    path.write_bytes(gzip.compress(data))
    with pytest.raises(CorruptFileError, match="unexpected bytes after"):
        read_idx(path, 2051)


def _poison(prefix):
    """A member edit: the first member under ``prefix`` gets a NaN at its first entry."""
    def edit(members):
        name = next(n for n in members if n.startswith(prefix))
        arr = np.load(pyio.BytesIO(members[name])).copy()
        arr.flat[0] = np.nan
        buf = pyio.BytesIO()
        np.save(buf, arr)
        members[name] = buf.getvalue()
    return edit


def test_weights_or_optimizer_state_holding_nan_name_the_file_and_member(tmp_path):
    path = tmp_path / "m.npz"
    _mlp().save(path)
    _rewrite(path, edit_members=_poison("param/"))
    _refused(path, "param/", "holds nan at index (0", "must be finite")
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    y = np.arange(8).reshape(-1, 1) % 2
    ck = tmp_path / "ck.npz"
    fastlib.train(_mlp(), x, y, 1, 4, 0.01, "cross_entropy", optimizer="Adam", checkpoint=ck,
                  verbose=False)
    good = ck.read_bytes()
    for prefix in ("param/", "opt/"):
        ck.write_bytes(good)
        _rewrite(ck, edit_members=_poison(prefix))
        _refused(ck, prefix, "holds nan", loader=checkpoint.load_checkpoint)
        # and through train's resume, before any epoch
        with pytest.raises(CorruptFileError, match=prefix):
            fastlib.train(_mlp(), x, y, 2, 4, 0.01, "cross_entropy", optimizer="Adam",
                          resume=ck, verbose=False)


def test_weights_the_architecture_does_not_declare_are_refused_not_dropped(tmp_path):
    # a model file is loaded exactly or refused: an extra param/ member (a third layer's
    # weights written into a two-layer file) would otherwise be ignored in silence
    path = tmp_path / "m.npz"
    _mlp().save(path)

    def add_member(members):
        buf = pyio.BytesIO()
        np.save(buf, np.ones((2, 2), np.float32))
        members["param/2.weight.npy"] = buf.getvalue()

    _rewrite(path, edit_members=add_member)
    _refused(path, "param/2.weight", "does not declare")
    model = _mlp()
    model.save(path)                       # the untouched file still loads, exactly
    for name, value in fastlib.load(path).parameters().items():
        np.testing.assert_array_equal(value, model.parameters()[name])
