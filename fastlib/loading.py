"""Loading a saved model: read and check a ``fastlib.io`` file, then rebuild the layers.

The one module of the model file that needs ``fastlib.layers`` (``from_config``); writing and
the checks of the container live in ``fastlib.io``, which the layers use for ``model.save``.
So the arrow points one way: loading -> layers -> io. docs/fastlib.md describes the format.
"""
from __future__ import annotations

import numpy as np

from fastlib import io
from fastlib.errors import CorruptFileError
from fastlib.layers import from_config

__all__ = ["load", "build_model"]


def build_model(meta: dict, arrays: dict, path="<memory>"):
    """Rebuild a fastlib model from the metadata and arrays of ``fastlib.io.model_entries``.

    Call after ``fastlib.io.check_model_entries`` passed (``load`` does): the constructors
    then only see sizes already checked against the stored arrays and the size limit.
    """
    io.check_model_entries(meta, arrays, path)
    names = meta["parameters"]
    try:
        model = from_config(meta["architecture"], dtype=np.dtype(meta["dtype"]))
    except Exception as exc:  # noqa: BLE001 - a constructor refusing a value from the file
        raise CorruptFileError(path, f"{io.META}.architecture", f"does not build a model "
                               f"({io.describe(exc)})") from None
    io.check_finite(path, {io.PARAM + n: arrays[io.PARAM + n] for n in names})
    model.load_parameters({n: arrays[io.PARAM + n] for n in names})
    return model


def load(path, *, max_bytes=None):
    """Load a model saved by ``model.save(path)`` (or the model inside a training checkpoint).

    The whole file is validated before anything is built (``fastlib.io.read_archive`` and
    ``fastlib.io.check_model_entries``): a corrupt or hostile file costs a few milliseconds
    and one clear error, never a large allocation.

    Parameters
    ----------
    path : str or path-like
    max_bytes : int, optional
        Refuse files whose arrays, or whose declared parameters, exceed this many bytes. Default:
        ``$FASTLIB_MAX_LOAD_BYTES`` when set, else 2 GiB; raise it for genuinely large models.

    Returns
    -------
    fastlib.Layer
        A new model with the saved architecture, dtype and weights.

    Raises
    ------
    FileNotFoundError
        No such file.
    IsADirectoryError
        ``path`` is a folder.
    fastlib.errors.CorruptFileError
        (a ``ValueError``) anything wrong with the file: the message names the file, the member
        or metadata field, and the problem.
    """
    def check(meta, headers):
        return io.check_model_entries(meta, headers, path, max_bytes)

    meta, arrays = io.read_archive(path, max_bytes=max_bytes, check=check)
    return build_model(meta, arrays, path)
