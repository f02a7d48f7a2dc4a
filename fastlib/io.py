"""The model file: one ``.npz`` with the architecture as JSON and the weights, written atomically.

File layout (format ``verigrad-model``, version 1): an uncompressed NumPy ``.npz`` archive whose
``__meta__`` entry is a JSON string ``{"format", "version", "architecture", "dtype",
"parameters"}`` and one ``param/<name>`` array per entry of ``model.parameters()``; training
checkpoints use the same container with format ``verigrad-checkpoint``. This module writes
(``save_model``, which ``model.save`` calls) and reads and checks files without knowing the
layers; ``fastlib.loading`` rebuilds the model. The long story: docs/fastlib-training.md, section
``fastlib/io.py``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import re
import signal
import tempfile
import threading
import zipfile
from typing import NamedTuple

import numpy as np

from fastlib.errors import CorruptFileError
from fastlib.model_schema import MAX_DEPTH as _MAX_NESTING

__all__ = ["save_model", "write_archive", "read_archive", "model_entries",
           "check_model_entries", "check_finite", "max_load_bytes", "ArrayHeader",
           "CorruptFileError", "stale_temporaries", "temporary_prefix", "current_umask",
           "json_depth", "short_repr",
           "MODEL_FORMAT", "CHECKPOINT_FORMAT", "VERSION", "DEFAULT_MAX_BYTES", "MAX_BYTES_ENV"]

MODEL_FORMAT = "verigrad-model"
CHECKPOINT_FORMAT = "verigrad-checkpoint"
VERSION = 1
META = "__meta__"
PARAM = "param/"
# The size limit on one file's arrays (and on the parameters its architecture declares), so a
# few bytes of hostile JSON cannot make ``load`` allocate gigabytes; overridden per call with
# ``max_bytes=`` or for a whole process with this environment variable.
DEFAULT_MAX_BYTES = 2 * 2 ** 30
MAX_BYTES_ENV = "FASTLIB_MAX_LOAD_BYTES"
MAX_META_BYTES = 64 * 2 ** 20
# Two brackets per level of containers (the object and its "layers" list), plus the few levels
# of a checkpoint's own metadata.
MAX_JSON_DEPTH = 2 * _MAX_NESTING + 16


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
    entries = {META: np.array(json.dumps(meta))}
    for name, value in arrays.items():
        arr = np.asarray(value)
        if arr.dtype == object:
            raise TypeError(f"entry {name!r} is an object array; only numeric arrays are saved")
        entries[name] = arr
    fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=_TMP_SUFFIX,
                               dir=path.parent)
    with _terminate_as_exception():
        try:
            # mkstemp creates 0600 files; the final file gets the mode any new file would get
            os.fchmod(fd, 0o666 & ~current_umask())
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


_TMP_SUFFIX = ".tmp"


def temporary_prefix(path) -> str:
    """The name prefix of :func:`write_archive`'s temporary files for ``path`` (hidden)."""
    return f".{pathlib.Path(path).name}."


def stale_temporaries(path) -> list:
    """Temporary files of earlier writes of ``path`` left behind by killed processes.

    Only safe to delete while no other process writes ``path`` (the training checkpoint lock
    guarantees that; see ``fastlib.training.checkpoint``).
    """
    path = pathlib.Path(path)
    prefix = temporary_prefix(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return [path.parent / n for n in names if n.startswith(prefix) and n.endswith(_TMP_SUFFIX)
            and len(n) > len(prefix) + len(_TMP_SUFFIX)]


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # NOTE: elsewhere the only way to read the umask is to set it and put it back (a moment in
    # which another thread creating a file would get mode 0o022's permissions).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _Terminated(BaseException):
    """SIGTERM arrived during a write: unwind (removing the temporary file), then die of it."""


@contextlib.contextmanager
def _terminate_as_exception():
    """While writing, turn a SIGTERM with the default action into an exception, then re-raise it.

    The default action kills the process at once, which would leave the temporary file behind;
    this way the ``except`` clause removes it and the process still ends by SIGTERM afterwards.
    A handler installed by the application, a non-main thread, or a platform without SIGTERM
    are left alone.
    """
    if (not hasattr(signal, "SIGTERM") or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def handler(signum, frame):
        raise _Terminated()

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM) from None  # only if the signal did not end us
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def max_load_bytes(max_bytes=None) -> int:
    """The size limit for one file's arrays: ``max_bytes``, else the environment's, else 2 GiB.

    Parameters
    ----------
    max_bytes : int, optional
        An explicit limit in bytes (> 0).

    Returns
    -------
    int
        ``max_bytes`` when given; otherwise ``$FASTLIB_MAX_LOAD_BYTES`` when set; otherwise
        :data:`DEFAULT_MAX_BYTES`.
    """
    source = "max_bytes"
    if max_bytes is None:
        env = os.environ.get(MAX_BYTES_ENV)
        if env is None:
            return DEFAULT_MAX_BYTES
        source = f"${MAX_BYTES_ENV}"
        try:
            max_bytes = int(env)
        except ValueError:
            raise ValueError(f"{source}={env!r} is not a whole number of bytes") from None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"{source} must be a whole number of bytes > 0, got {max_bytes!r}")
    return max_bytes


class ArrayHeader(NamedTuple):
    """What an ``.npy`` member's header declares (read before any of its data)."""

    shape: tuple
    fortran: bool
    dtype: np.dtype
    header_bytes: int

    @property
    def nbytes(self) -> int:
        """Bytes of data the header declares, in Python integers (no overflow)."""
        return math.prod(self.shape) * self.dtype.itemsize


def describe(exc: BaseException) -> str:
    text = str(exc).strip() or "no details"
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}"


def read_archive(path, formats=(MODEL_FORMAT, CHECKPOINT_FORMAT), *, max_bytes=None,
                 check=None) -> tuple[dict, dict]:
    """Read a file written by :func:`write_archive`, validating all of it before its data.

    In order, each step only once the previous one passed: the zip container and its member
    list (NumPy ``.npy`` members only, none duplicated or encrypted, known compression); the
    ``__meta__`` member (a JSON object nested at most :data:`MAX_JSON_DEPTH` deep) with its
    format and version; every other member's ``.npy`` header (a numeric dtype, a shape whose
    size matches the bytes stored); the total against the size limit; then ``check(meta,
    headers)``; and only then the arrays' data (each member's CRC is verified).

    Parameters
    ----------
    path : str or path-like
    formats : tuple of str
        The accepted ``format`` values.
    max_bytes : int, optional
        Refuse files whose arrays hold more bytes than this (see :func:`max_load_bytes`).
    check : callable, optional
        ``check(meta, headers)`` with ``headers`` ``{name: ArrayHeader}``; raises
        :class:`~fastlib.errors.CorruptFileError` to refuse the file before its data is read.

    Returns
    -------
    (meta, arrays)
        The metadata dict and every other member as an ndarray, keyed by name (no ``.npy``).

    Raises
    ------
    FileNotFoundError
        No such file.
    IsADirectoryError
        ``path`` is a folder.
    fastlib.errors.CorruptFileError
        Anything else wrong with the file; the message names the file, the member and the
        problem.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder, not a file; pass the path of the "
                                ".npz file to read")
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    limit = max_load_bytes(max_bytes)
    with open(path, "rb") as f:
        head = f.read(6)
    if not head.startswith(b"PK"):
        what = "a bare .npy array" if head.startswith(b"\x93NUMPY") else "not a zip archive"
        raise CorruptFileError(path, "archive", f"not a readable .npz archive ({what}); "
                               "verigrad model files are .npz archives written by model.save()")
    try:
        archive = zipfile.ZipFile(path)
    except Exception as exc:  # noqa: BLE001 - any failure to parse the container is corruption
        raise CorruptFileError(path, "archive", f"not a readable .npz archive ({describe(exc)})"
                               "; verigrad model files are .npz archives written by "
                               "model.save()") from None
    with archive:
        members = _members(archive, path, limit)
        if META not in members:
            raise CorruptFileError(path, "archive", f"an .npz archive without a {META} entry, "
                                   "so not a file written by model.save() or a training "
                                   "checkpoint")
        meta = _read_meta(archive, members.pop(META), path)
        _check_format(meta, formats, path)
        headers = {name: _read_header(archive, info, name, path)
                   for name, info in members.items()}
        total = sum(h.nbytes for h in headers.values())
        if total > limit:
            raise CorruptFileError(path, "archive", f"its arrays hold {total} bytes, more than "
                                   f"the limit of {limit}; for a genuinely large model pass "
                                   f"max_bytes= or set ${MAX_BYTES_ENV}")
        if check is not None:
            check(meta, headers)
        arrays = {name: _read_data(archive, members[name], headers[name], name, path)
                  for name in members}
    return meta, arrays


def _members(archive, path, limit) -> dict:
    """``{name without .npy: ZipInfo}``, refusing what ``np.savez`` never writes."""
    try:
        infos = archive.infolist()
    except Exception as exc:  # noqa: BLE001
        raise CorruptFileError(path, "archive", f"unreadable member list ({describe(exc)})") \
            from None
    members = {}
    for info in infos:
        raw_name = info.filename
        if not raw_name.endswith(".npy"):
            raise CorruptFileError(path, raw_name, "not a NumPy .npy member; verigrad archives "
                                   "hold only .npy arrays")
        name = raw_name[:-4]
        if name in members:
            raise CorruptFileError(path, raw_name, "appears twice in the archive")
        if info.flag_bits & 0x1:
            raise CorruptFileError(path, raw_name, "is encrypted; verigrad never writes "
                                   "encrypted members")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise CorruptFileError(path, raw_name, f"uses zip compression method "
                                   f"{info.compress_type}; only stored and deflated members "
                                   "are read")
        if info.file_size > limit:
            raise CorruptFileError(path, raw_name, f"declares {info.file_size} bytes, more than "
                                   f"the limit of {limit}; for a genuinely large model pass "
                                   f"max_bytes= or set ${MAX_BYTES_ENV}")
        members[name] = info
    return members


def _open_npy(archive, info, name, path):
    """Open a member and parse its ``.npy`` header; return (stream, ArrayHeader)."""
    try:
        stream = archive.open(info)
    except Exception as exc:  # noqa: BLE001
        raise CorruptFileError(path, name, f"cannot be opened ({describe(exc)})") from None
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f".npy format version {version} is not one np.savez writes here")
        header = ArrayHeader(tuple(shape), bool(fortran), np.dtype(dtype), stream.tell())
    except zipfile.BadZipFile as exc:  # a small member is read whole: its CRC is checked here
        stream.close()
        raise CorruptFileError(path, name, f"damaged member ({describe(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - a malformed header, whatever NumPy raises for it
        stream.close()
        raise CorruptFileError(path, name, f"malformed .npy header ({describe(exc)})") from None
    return stream, header


def _read_header(archive, info, name, path) -> ArrayHeader:
    stream, header = _open_npy(archive, info, name, path)
    stream.close()
    if header.dtype.hasobject or header.dtype.kind not in "biuf" or header.dtype.fields:
        raise CorruptFileError(path, name, f"holds dtype {header.dtype.str}; only plain numeric "
                               "arrays are read (never objects: files are not unpickled)")
    if any(not isinstance(d, int) or d < 0 for d in header.shape):
        raise CorruptFileError(path, name, f"declares the invalid shape {header.shape}")
    stored = info.file_size - header.header_bytes
    if header.nbytes != stored:
        raise CorruptFileError(path, name, f"its header declares shape {header.shape} of "
                               f"{header.dtype.name} ({header.nbytes} bytes) but the member "
                               f"stores {stored} bytes of data")
    return header


def _read_meta(archive, info, path) -> dict:
    stream, header = _open_npy(archive, info, META, path)
    stream.close()
    if header.dtype.kind != "U" or header.shape != ():
        raise CorruptFileError(path, META, f"must be one JSON string, got an array of dtype "
                               f"{header.dtype.str} and shape {header.shape}")
    if header.dtype.itemsize > MAX_META_BYTES or info.file_size > MAX_META_BYTES:
        raise CorruptFileError(path, META, f"holds more than {MAX_META_BYTES} bytes of "
                               "metadata; real metadata is a few kilobytes")
    text = str(_read_data(archive, info, header, META, path)[()])
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise CorruptFileError(path, META, f"JSON nested {depth} deep, more than the "
                               f"{MAX_JSON_DEPTH} a model can need")
    try:
        meta = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - JSONDecodeError, huge integers, ...
        raise CorruptFileError(path, META, f"not valid JSON ({describe(exc)})") from None
    if not isinstance(meta, dict):
        raise CorruptFileError(path, META, f"must be a JSON object, got "
                               f"{type(meta).__name__}")
    return meta


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in ``text``, strings skipped (no recursion)."""
    depth = deepest = 0
    for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _check_format(meta, formats, path):
    fmt, version = meta.get("format"), meta.get("version")
    if fmt not in formats:
        raise CorruptFileError(path, f"{META}.format", f"file format {str(fmt)[:60]!r}, "
                               f"expected {' or '.join(map(repr, formats))}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CorruptFileError(path, f"{META}.version",
                               f"invalid format version {str(version)[:60]!r}")
    if version > VERSION:
        raise CorruptFileError(path, f"{META}.version", f"format version {version} was "
                               f"written by a newer verigrad; this one reads versions up to "
                               f"{VERSION}: upgrade verigrad")


def check_finite(path, arrays: dict) -> None:
    """Refuse the file at ``path`` when a float array of ``arrays`` (``{member: array}``) holds
    NaN or Inf: weights and optimizer state that cannot train (a run that diverges keeps its
    last good weights, so a checkpoint of one is finite).

    Raises
    ------
    fastlib.errors.CorruptFileError
        Naming the member and the first such entry.
    """
    for name, arr in arrays.items():
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            at = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
            raise CorruptFileError(path, name, f"holds {arr[at]} at index {at}: saved weights "
                                   "and optimizer state must be finite; load an earlier "
                                   "checkpoint or a model saved before the values broke")


def _read_data(archive, info, header, name, path) -> np.ndarray:
    """The member's array (writable), its CRC checked; after :func:`_read_header` passed."""
    stream, _ = _open_npy(archive, info, name, path)
    try:
        with stream:
            raw = bytearray(header.nbytes)
            got = stream.readinto(raw) if header.nbytes else 0
            extra = stream.read(1)  # reaching the end makes zipfile check the CRC
    except MemoryError:
        raise CorruptFileError(path, name, f"needs {header.nbytes} bytes, more memory than is "
                               "available here") from None
    except Exception as exc:  # noqa: BLE001 - bad CRC, truncated or corrupt deflate stream
        raise CorruptFileError(path, name, f"unreadable data ({describe(exc)})") from None
    if got != header.nbytes or extra:
        raise CorruptFileError(path, name, f"holds {got} bytes of data, its header declares "
                               f"{header.nbytes}")
    flat = np.frombuffer(raw, dtype=header.dtype)
    return flat.reshape(header.shape, order="F" if header.fortran else "C")


def model_entries(model) -> tuple[dict, dict]:
    """The metadata and arrays that describe ``model`` (shared by models and checkpoints)."""
    params = model.parameters()
    meta = {"architecture": model.get_config(), "dtype": np.dtype(model.dtype).name,
            "parameters": list(params)}
    return meta, {PARAM + k: np.ascontiguousarray(v) for k, v in params.items()}


def check_model_entries(meta: dict, headers: dict, path, max_bytes=None) -> dict:
    """Validate the model part of a file against its stored arrays, before anything is built.

    Checks the ``architecture`` (known layer types, integer sizes, nesting; see
    :mod:`fastlib.model_schema`), the ``dtype`` (float32 or float64), the ``parameters`` list
    (the names the architecture declares, in order), every declared shape and dtype against the
    stored ``param/`` arrays, and the declared size against the limit.

    Parameters
    ----------
    meta : dict
        The file's metadata.
    headers : dict
        ``{member name: ArrayHeader}`` (or anything with ``shape`` and ``dtype``).
    path : str or path-like
        For messages.
    max_bytes : int, optional
        The size limit (see :func:`max_load_bytes`).

    Returns
    -------
    dict
        ``{parameter name: shape}`` the architecture declares.

    Raises
    ------
    fastlib.errors.CorruptFileError
    """
    from fastlib.model_schema import SchemaError, declared_parameters

    for key in ("architecture", "dtype", "parameters"):
        if key not in meta:
            raise CorruptFileError(path, META, f"model metadata lacks {key!r}; the file is "
                                   "incomplete")
    dtype_name = meta["dtype"]
    if dtype_name not in ("float32", "float64"):
        raise CorruptFileError(path, f"{META}.dtype", f"must be \"float32\" or \"float64\", "
                               f"got {json.dumps(dtype_name)[:60]}")
    dtype = np.dtype(dtype_name)
    names = meta["parameters"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CorruptFileError(path, f"{META}.parameters", "must be a list of parameter names")
    try:
        declared = declared_parameters(meta["architecture"])
    except SchemaError as exc:
        raise CorruptFileError(path, f"{META}.{exc.where}", exc.problem) from None
    if names != list(declared):
        raise CorruptFileError(path, f"{META}.parameters", f"lists {short_repr(names)} but "
                               f"the architecture declares {short_repr(list(declared))}")
    missing = [n for n in names if PARAM + n not in headers]
    if missing:
        raise CorruptFileError(path, PARAM + missing[0], f"weights missing for parameters "
                               f"{short_repr(missing)}")
    for name, shape in declared.items():
        h = headers[PARAM + name]
        if tuple(h.shape) != shape:
            raise CorruptFileError(path, PARAM + name, f"stored with shape {tuple(h.shape)}, "
                                   f"the architecture declares {shape}")
        if h.dtype != dtype:
            raise CorruptFileError(path, PARAM + name, f"stored as {h.dtype.str}, the "
                                   f"metadata says {dtype_name}")
    # loaded exactly or refused: weights the architecture has no place for are not dropped
    extra = [m for m in headers if m.startswith(PARAM) and m[len(PARAM):] not in declared]
    if extra:
        raise CorruptFileError(path, extra[0], f"weights of a parameter the architecture does "
                               f"not declare (it declares {short_repr(list(declared))}); the "
                               "file was edited or written by another program")
    limit = max_load_bytes(max_bytes)
    need = sum(math.prod(shape) for shape in declared.values()) * dtype.itemsize
    if need > limit:
        raise CorruptFileError(path, f"{META}.architecture", f"declares {need} bytes of "
                               f"parameters, more than the limit of {limit}; for a genuinely "
                               f"large model pass max_bytes= or set ${MAX_BYTES_ENV}")
    return declared


def short_repr(value, limit=120) -> str:
    """``repr(value)``, cut to ``limit`` characters (and "...") for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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

    Raises
    ------
    TypeError
        ``model`` is not a layer (a layer class, or an object without ``get_config()`` and
        ``parameters()``).
    """
    _check_savable(model)
    meta, arrays = model_entries(model)
    return write_archive(path, {"format": MODEL_FORMAT, "version": VERSION, **meta}, arrays)


def _check_savable(model):
    # NOTE: by what a layer does, not isinstance: the layers import this module
    if isinstance(model, type):
        raise TypeError(f"save_model: model is the class {model.__name__}, not a layer; build "
                        f"one first, e.g. {model.__name__}(...) with its sizes, and save that")
    if not all(callable(getattr(model, m, None)) for m in ("get_config", "parameters")):
        raise TypeError(f"save_model: model must be a fastlib layer or container (with "
                        f"get_config() and parameters()), got {type(model).__name__}")
