"""Saving and loading models: one ``.npz`` file with the architecture as JSON and the weights.

File layout (format ``verigrad-model``, version 1): an uncompressed NumPy ``.npz`` archive whose
``__meta__`` entry is a JSON string ``{"format", "version", "architecture", "dtype",
"parameters"}`` (``architecture`` is ``model.get_config()``, rebuilt by
``fastlib.layers.from_config``) and one ``param/<name>`` array per entry of
``model.parameters()``. Training checkpoints (``fastlib.training.checkpoint``) use the same
container with format ``verigrad-checkpoint``; :func:`load` reads the model out of either.

Files are written atomically: to a temporary file in the same folder, flushed to disk, then
renamed over the target, so a crash never leaves a half-written file under the final name.
"""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
import zipfile

import numpy as np

__all__ = ["save_model", "load", "write_archive", "read_archive", "model_entries", "build_model",
           "MODEL_FORMAT", "CHECKPOINT_FORMAT", "VERSION"]

MODEL_FORMAT = "verigrad-model"
CHECKPOINT_FORMAT = "verigrad-checkpoint"
VERSION = 1
_META = "__meta__"
_PARAM = "param/"


def write_archive(path, meta: dict, arrays: dict) -> pathlib.Path:
    """Write ``meta`` (JSON-able) and ``arrays`` to one ``.npz`` file, atomically.

    Parameters
    ----------
    path : str or path-like
        The file to write (its folder must exist); written exactly under this name.
    meta : dict
        JSON-able metadata, stored as the ``__meta__`` entry.
    arrays : dict of str to ndarray
        Numeric arrays; names must not start with ``__``.

    Returns
    -------
    pathlib.Path
    """
    path = pathlib.Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {str(path)!r}: folder {str(path.parent)!r} does "
                                "not exist")
    entries = {_META: np.array(json.dumps(meta))}
    for name, value in arrays.items():
        arr = np.asarray(value)
        if arr.dtype == object:
            raise TypeError(f"entry {name!r} is an object array; only numeric arrays are saved")
        entries[name] = arr
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **entries)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_archive(path, formats=(MODEL_FORMAT, CHECKPOINT_FORMAT)) -> tuple[dict, dict]:
    """Read a file written by :func:`write_archive`; check its format and version.

    Returns
    -------
    (meta, arrays)
        The metadata dict and every other entry as an ndarray.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        Not an ``.npz`` archive, not a verigrad file, another format, or a newer version.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    with open(path, "rb") as f:
        head = f.read(6)
    if not head.startswith(b"PK"):
        what = "a bare .npy array" if head.startswith(b"\x93NUMPY") else "not a zip archive"
        raise ValueError(f"{path}: not a readable .npz archive ({what}); verigrad model files "
                         "are .npz archives written by model.save()")
    try:
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
            if _META not in names:
                raise ValueError(f"{path}: an .npz archive without a {_META} entry, so not a "
                                 "file written by model.save() or a training checkpoint")
            meta = json.loads(str(data[_META][()]))
            arrays = {k: data[k] for k in names if k != _META}
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npz archive ({exc}); verigrad model files are "
                         ".npz archives written by model.save()") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: the {_META} entry is not valid JSON ({exc})") from None
    fmt, version = meta.get("format"), meta.get("version")
    if fmt not in formats:
        raise ValueError(f"{path}: file format {fmt!r}, expected "
                         f"{' or '.join(map(repr, formats))}")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"{path}: invalid format version {version!r}")
    if version > VERSION:
        raise ValueError(f"{path}: format version {version} was written by a newer verigrad; "
                         f"this one reads versions up to {VERSION}: upgrade verigrad")
    return meta, arrays


def model_entries(model) -> tuple[dict, dict]:
    """The metadata and arrays that describe ``model`` (shared by models and checkpoints)."""
    params = model.parameters()
    meta = {"architecture": model.get_config(), "dtype": np.dtype(model.dtype).name,
            "parameters": list(params)}
    return meta, {_PARAM + k: np.ascontiguousarray(v) for k, v in params.items()}


def build_model(meta: dict, arrays: dict, path="<memory>"):
    """Rebuild a fastlib model from :func:`model_entries`'s metadata and arrays."""
    from fastlib.layers import from_config

    try:
        arch, dtype, names = meta["architecture"], meta["dtype"], meta["parameters"]
    except KeyError as exc:
        raise ValueError(f"{path}: model metadata lacks {exc.args[0]!r}; the file is "
                         "incomplete") from None
    missing = [n for n in names if _PARAM + n not in arrays]
    if missing:
        raise ValueError(f"{path}: weights missing for parameters {missing}")
    model = from_config(arch, dtype=np.dtype(dtype))
    model.load_parameters({n: arrays[_PARAM + n] for n in names})
    return model


def save_model(model, path) -> pathlib.Path:
    """Save ``model``'s architecture and weights to one ``.npz`` file, atomically.

    Parameters
    ----------
    model : fastlib.Layer
        Any fastlib layer or container (it needs ``get_config()`` and ``parameters()``).
    path : str or path-like
        The file to write, exactly under this name (``.npz`` is the usual suffix).

    Returns
    -------
    pathlib.Path
        The path written.
    """
    meta, arrays = model_entries(model)
    return write_archive(path, {"format": MODEL_FORMAT, "version": VERSION, **meta}, arrays)


def load(path):
    """Load a model saved by ``model.save(path)`` (or the model inside a training checkpoint).

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    fastlib.Layer
        A new model with the saved architecture, dtype and weights.

    Raises
    ------
    FileNotFoundError, ValueError
        Missing file; not a verigrad file; another format or a newer version (see
        :func:`read_archive`).
    """
    meta, arrays = read_archive(path)
    return build_model(meta, arrays, path)
