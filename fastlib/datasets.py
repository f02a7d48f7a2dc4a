"""Data sets: scikit-learn's bundled 8x8 digits (no download) and MNIST from IDX files.

Both loaders return features as float arrays in [0, 1] of shape ``[N, D]`` and labels as
int64 class indices of shape ``[N, 1]``, the format ``cross_entropy`` takes (DataCode's
``dataset_features`` / ``dataset_targets``; use :func:`fastlib.onehot` for one-hot targets).
MNIST is found in ``$VERIGRAD_MNIST_DIR``, the user cache folder or ``../shared/data/mnist``,
or fetched once into the cache with SHA-256 checks (:func:`download_mnist`).
"""
from __future__ import annotations

import gzip
import hashlib
import math
import os
import pathlib
import struct
import sys
import tempfile
import zlib
from typing import NamedTuple

import numpy as np

__all__ = ["Split", "Splits", "load_digits", "load_mnist", "read_idx", "train_val_split",
           "MNIST_FILES", "MNIST_DIR_ENV", "MNIST_URL_ENV", "MNIST_URL", "MNIST_SHA256",
           "DEFAULT_MNIST_DIR", "mnist_dir", "mnist_cache_dir", "user_cache_dir",
           "download_mnist", "dataset_features", "dataset_targets"]


class Split(NamedTuple):
    """One split of a data set: features ``x [N, D]`` and labels ``y [N, 1]``.

    ``dataset_features`` and ``dataset_targets`` are DataCode's names for ``x`` and ``y``.
    """

    x: np.ndarray
    y: np.ndarray

    @property
    def dataset_features(self) -> np.ndarray:
        """``x``, under DataCode's name."""
        return self.x

    @property
    def dataset_targets(self) -> np.ndarray:
        """``y``, under DataCode's name."""
        return self.y


def dataset_features(dataset: Split) -> np.ndarray:
    """The features ``[N, D]`` of a split (DataCode's ``ml.dataset_features(dataset)``)."""
    return _as_split(dataset).x


def dataset_targets(dataset: Split) -> np.ndarray:
    """The class indices ``[N, 1]`` of a split (DataCode's ``ml.dataset_targets(dataset)``)."""
    return _as_split(dataset).y


def _as_split(dataset) -> Split:
    if not isinstance(dataset, Split):
        raise TypeError(f"expected one split (load_mnist('train') or load_digits('train')), got "
                        f"{type(dataset).__name__}; pick a split by name, e.g. "
                        "load_mnist('train')")
    return dataset


class Splits(NamedTuple):
    """A train and a test split."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


# Every DIGITS_TEST_EVERY-th sample of each class (in the bundled order) goes to the test split.
DIGITS_TEST_EVERY = 5


def load_digits(split: str | None = None, dtype=np.float32):
    """scikit-learn's bundled 8x8 handwritten digits, scaled to [0, 1], fixed stratified split.

    1797 images of 64 pixels (values 0..16 divided by 16), labels 0..9. The split is a pure
    function of the bundled order: within each class, every fifth sample (positions 4, 9, ...
    among that class's samples) is a test sample, so 20% of every class is held out and the split
    never depends on a random generator or a library version.

    Parameters
    ----------
    split : {"train", "test"} or None
        None returns both splits as :class:`Splits`; a name returns that :class:`Split`.
    dtype : {float32, float64}
        dtype of the features (float32 by default, float64 for reference comparisons), as a
        numpy type, a ``np.dtype`` or its name.

    Returns
    -------
    Splits or Split

    Raises
    ------
    TypeError, ValueError
        ``dtype`` is not a dtype, or not float32 or float64; ``split`` is not a split's name.
    """
    from sklearn.datasets import load_digits as _sk_load_digits  # bundled with scikit-learn

    dtype = _check_dtype(dtype)
    _check_split(split, allow_none=True)
    bunch = _sk_load_digits()
    x = (bunch.data / 16.0).astype(dtype)
    labels = bunch.target.astype(np.int64)
    test = np.zeros(labels.shape[0], bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        test[idx[DIGITS_TEST_EVERY - 1::DIGITS_TEST_EVERY]] = True
    y = labels.reshape(-1, 1)
    out = Splits(x[~test], y[~test], x[test], y[test])
    if split is None:
        return out
    return Split(out.x_train, out.y_train) if split == "train" else Split(out.x_test, out.y_test)


def train_val_split(x, y, fraction: float = 0.1) -> tuple[Split, Split]:
    """Hold out a stratified, deterministic validation part of a training split.

    Within each class (``y`` as class indices ``[N, 1]`` or ``[N]``), the last
    ``round(fraction * count)`` samples in the given order go to validation.

    Parameters
    ----------
    x : array_like
        The samples ``[N, ...]`` (a list is converted to an array).
    y : array_like
        Their class indices, ``[N, 1]`` or ``[N]``.
    fraction : float, default 0.1
        The share of each class held out, in [0, 1).

    Returns
    -------
    (Split, Split)
        The remaining training samples and the validation samples, in their original order.

    Raises
    ------
    TypeError, ValueError
        A fraction that is not a number in [0, 1), x and y of different lengths, labels that
        are not class indices, or a fraction that leaves no sample to train on.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.number)):
        raise TypeError(f"train_val_split: fraction must be a number in [0, 1), got "
                        f"{fraction!r}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction}")
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
        raise ValueError(f"train_val_split: x of shape {x.shape} and y of shape {y.shape} need "
                         "the same number of rows: one label per sample")
    labels = y.reshape(len(x), -1)
    if labels.shape[1] != 1:
        raise ValueError(f"train_val_split stratifies on class indices [N, 1], got labels of "
                         f"shape {np.shape(y)}")
    val = _held_out(labels[:, 0], fraction)
    if len(x) and val.all():
        raise ValueError(f"train_val_split: fraction={fraction} holds out all {len(x)} samples "
                         "(round(fraction * count) of each class), leaving none to train on; "
                         "use a smaller fraction")
    return Split(x[~val], y[~val]), Split(x[val], y[val])


def _held_out(labels, fraction):
    """Which samples go to validation: the last ``round(fraction * count)`` of each class."""
    val = np.zeros(len(labels), bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = int(round(fraction * len(idx)))
        if k:
            val[idx[len(idx) - k:]] = True
    return val


# split -> (images file, labels file), the names LeCun's site publishes (".gz" optional).
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
MNIST_COUNTS = {"train": 60000, "test": 10000}

# Where load_mnist looks when no path is given, first match: this environment variable, the
# user cache folder (where download_mnist puts the files), the repository's sibling data folder
# (relative to the working directory, as `verigrad train --data mnist` is run from a checkout).
MNIST_DIR_ENV = "VERIGRAD_MNIST_DIR"
DEFAULT_MNIST_DIR = pathlib.Path("..") / "shared" / "data" / "mnist"
# Where download_mnist fetches from: this environment variable (a folder URL), else the mirror
# torchvision uses. The SHA-256 of each published file (they match torchvision's MD5 list and
# LeCun's byte counts): a download that does not hash to it is refused and removed.
MNIST_URL_ENV = "VERIGRAD_MNIST_URL"
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz":
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz":
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz":
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz":
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}


def _how_to_get(cache):
    return ("put the four files (" + ", ".join(MNIST_SHA256) + ") in one folder and name it: "
            "--data-dir DIR on the command line, load_mnist(path=DIR) in Python, or "
            f"${MNIST_DIR_ENV}=DIR; or fetch them once into {cache}, checked by SHA-256: "
            "--download on the command line, load_mnist(download=True) in Python (from "
            f"${MNIST_URL_ENV}, default {MNIST_URL})")


def user_cache_dir(app: str = "verigrad") -> pathlib.Path:
    """This user's cache folder for ``app``, by the platform's convention.

    Linux and other Unix: ``$XDG_CACHE_HOME/app`` (default ``~/.cache/app``); macOS:
    ``~/Library/Caches/app``; Windows: ``%LOCALAPPDATA%\\app\\Cache`` (default
    ``~\\AppData\\Local``). The folder is not created here.
    """
    home = pathlib.Path.home()
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
        return pathlib.Path(base) / app / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / app
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else home / ".cache"
    return base / app


def mnist_cache_dir() -> pathlib.Path:
    """The folder :func:`download_mnist` fills and :func:`load_mnist` looks in:
    ``user_cache_dir() / "mnist"``."""
    return user_cache_dir() / "mnist"


def _holds_mnist(folder: pathlib.Path) -> bool:
    return all(any((folder / (n + ext)).is_file() for ext in (".gz", ""))
               for pair in MNIST_FILES.values() for n in pair)


def mnist_dir(path=None, download: bool = False, url=None) -> pathlib.Path:
    """The folder ``load_mnist`` reads.

    ``path`` when given; else ``$VERIGRAD_MNIST_DIR`` when set; else the first of the user
    cache folder (:func:`mnist_cache_dir`) and :data:`DEFAULT_MNIST_DIR`
    (``../shared/data/mnist``, relative to the working directory) that holds the four files.
    With ``download``, files missing from that folder (the cache, when none was named) are
    fetched first (:func:`download_mnist`, from ``url``).

    Raises
    ------
    FileNotFoundError
        The named folder does not exist, or no folder holds the files; the message says where
        it looked and how to get the files (``--data-dir``, ``path=``, the variable, or
        ``--download`` / ``download=True``).
    """
    cache = mnist_cache_dir()
    if path is not None:
        folder, source = pathlib.Path(path), "the folder named (--data-dir, or path=)"
    elif os.environ.get(MNIST_DIR_ENV):
        folder, source = pathlib.Path(os.environ[MNIST_DIR_ENV]), f"${MNIST_DIR_ENV}"
    else:
        folder = next((f for f in (cache, DEFAULT_MNIST_DIR) if _holds_mnist(f)), None)
        source = "the default folders"
        if folder is None and download:
            folder = cache
        if folder is None:
            raise FileNotFoundError(
                f"no MNIST files in the user cache {str(cache)!r} or in "
                f"{str(DEFAULT_MNIST_DIR)!r} (relative to {os.getcwd()!r}), and "
                f"${MNIST_DIR_ENV} is not set; {_how_to_get(cache)}")
    if download and not _holds_mnist(folder):
        download_mnist(folder, url)
    if not folder.is_dir():
        raise FileNotFoundError(f"MNIST folder {str(folder)!r} (from {source}) does not exist or "
                                f"is not a folder; {_how_to_get(cache)}")
    return folder


def download_mnist(folder=None, url=None, checksums=None, timeout: float = 60.0
                   ) -> pathlib.Path:
    """Fetch the four MNIST files into ``folder``, each checked against its SHA-256.

    A file already there with the right hash is kept. Each download goes to a temporary file
    in ``folder`` and is renamed into place only once complete and verified, so an interrupted,
    truncated or corrupted download leaves nothing behind.

    Parameters
    ----------
    folder : path-like, optional
        Where to put the files (created if needed); default :func:`mnist_cache_dir`.
    url : str, optional
        The folder URL the files are under; default ``$VERIGRAD_MNIST_URL``, else
        :data:`MNIST_URL`.
    checksums : dict, optional
        File name -> SHA-256 hex digest; default :data:`MNIST_SHA256` (the published files).
    timeout : float
        Seconds to wait for the server on each read.

    Returns
    -------
    pathlib.Path
        The folder.

    Raises
    ------
    OSError
        The server cannot be reached or answers with an error (the message names the URL).
    fastlib.errors.CorruptFileError
        A download is cut short or does not hash to its checksum (a ``ValueError``; the
        message names the URL, the expected and the received digest).
    """
    folder = pathlib.Path(folder) if folder is not None else mnist_cache_dir()
    base = url or os.environ.get(MNIST_URL_ENV) or MNIST_URL
    checksums = MNIST_SHA256 if checksums is None else checksums
    folder.mkdir(parents=True, exist_ok=True)
    for name, digest in checksums.items():
        target = folder / name
        if target.is_file() and _sha256(target) == digest:
            continue
        _fetch(base.rstrip("/") + "/" + name, target, digest, timeout)
    return folder


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch(url, target: pathlib.Path, digest: str, timeout: float) -> None:
    """Download ``url`` to ``target`` through a temporary file beside it, verified first."""
    import http.client
    import urllib.error
    import urllib.request

    from fastlib.errors import CorruptFileError

    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        h, received = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    expected = response.headers.get("Content-Length")
                    while True:
                        chunk = response.read(1 << 16)
                        if not chunk:
                            break
                        out.write(chunk)
                        h.update(chunk)
                        received += len(chunk)
            except urllib.error.HTTPError as exc:
                raise OSError(f"cannot download {url}: the server answered {exc.code} "
                              f"{exc.reason}") from None
            except http.client.IncompleteRead as exc:
                raise CorruptFileError(url, "download", f"cut short after "
                                       f"{received + len(exc.partial)} bytes; nothing was kept, "
                                       "run it again") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise OSError(f"cannot download {url}: {reason}") from None
            out.flush()
            os.fsync(out.fileno())
        if expected is not None and received != int(expected):
            raise CorruptFileError(url, "download", f"cut short: {received} of {expected} bytes; "
                                   "nothing was kept, run it again")
        if h.hexdigest() != digest:
            raise CorruptFileError(url, "download", f"SHA-256 {h.hexdigest()}, expected "
                                   f"{digest} ({received} bytes): not the published file; "
                                   "nothing was kept (check the URL, or the mirror)")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_mnist(split: str | None = "train", path=None, dtype=np.float32, download=False,
               url=None):
    """MNIST from the four IDX files in a folder (gzipped or raw), DataCode's
    ``load_mnist("train")``.

    Parameters
    ----------
    split : {"train", "test"} or None
        Which split; None returns both as :class:`Splits`.
    path : str or path-like, optional
        Folder holding ``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``,
        ``t10k-images-idx3-ubyte[.gz]`` and ``t10k-labels-idx1-ubyte[.gz]``. Default: the
        environment variable ``VERIGRAD_MNIST_DIR``, else the user cache folder
        (:func:`mnist_cache_dir`), else ``../shared/data/mnist`` relative to the working
        directory, the first that holds the files (:func:`mnist_dir`).
    dtype : {float32, float64}
        dtype of the images (float32 by default), as a numpy type, a ``np.dtype`` or its name.
    download : bool
        Fetch the files missing from that folder (the cache when none holds them) first, each
        checked against its published SHA-256 (:func:`download_mnist`).
    url : str, optional
        Where to fetch from (default ``$VERIGRAD_MNIST_URL``, else :data:`MNIST_URL`).

    Returns
    -------
    Split or Splits
        Images ``[N, 784]`` scaled to [0, 1] (pixel / 255), labels int64 ``[N, 1]``.

    Raises
    ------
    FileNotFoundError
        The folder or a file is missing (the message names what was looked for and how to get
        the files).
    OSError, fastlib.errors.CorruptFileError
        With ``download``: the server cannot be reached, or a file is cut short or does not
        hash to its published SHA-256 (nothing is kept).
    TypeError, ValueError
        ``dtype`` is not a dtype, or not float32 or float64 (checked before any file is looked
        for); ``split`` is not a split's name.
    ValueError, fastlib.errors.CorruptFileError
        A file is truncated, not gzip/IDX, has the wrong magic number, wrong sizes, no image or
        no label, labels out of 0..9, or image and label counts that differ (the message names
        the file).
    """
    dtype = _check_dtype(dtype)
    _check_split(split, allow_none=True)
    folder = mnist_dir(path, download=download, url=url)
    if split is None:
        train, test = _load_mnist_split(folder, "train", dtype), _load_mnist_split(folder, "test",
                                                                                    dtype)
        return Splits(train.x, train.y, test.x, test.y)
    return _load_mnist_split(folder, split, dtype)


def _load_mnist_split(folder: pathlib.Path, split: str, dtype) -> Split:
    from fastlib.errors import CorruptFileError

    images_name, labels_name = MNIST_FILES[split]
    images_file, labels_file = _find(folder, images_name), _find(folder, labels_name)
    images = read_idx(images_file, IDX_IMAGES_MAGIC)
    labels = read_idx(labels_file, IDX_LABELS_MAGIC)
    # an IDX header may declare 0 items, but an empty split is no data set: read as one, a
    # training run would go through every epoch and fail only on the empty test split
    for file, held, what in ((images_file, images, "images"), (labels_file, labels, "labels")):
        if held.shape[0] == 0:
            raise CorruptFileError(file, "header", f"holds 0 {what} (the published {split} "
                                   f"split has {MNIST_COUNTS[split]}); the file is cut short "
                                   "or not MNIST: fetch it again")
    if images.shape[1:] != (28, 28):
        raise ValueError(f"{images_file}: MNIST images are 28x28, this file holds "
                         f"{images.shape[1]}x{images.shape[2]} images")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images_file} holds {images.shape[0]} images but {labels_file} holds "
                         f"{labels.shape[0]} labels: the two files do not belong together")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{labels_file}: label {int(labels.max())} is outside 0..9; "
                         "the file is corrupt or not MNIST")
    # NOTE: integer pixels are exact in any float dtype and IEEE division is correctly
    # rounded, so pixel / 255 in the target dtype is the correctly rounded value.
    x = images.reshape(images.shape[0], 784).astype(dtype)
    x /= np.dtype(dtype).type(255.0)
    return Split(x, labels.astype(np.int64).reshape(-1, 1))


def _find(folder: pathlib.Path, name: str) -> pathlib.Path:
    for candidate in (folder / (name + ".gz"), folder / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"MNIST file {name}.gz (or {name}) not found in {str(folder)!r}; "
                            f"the folder holds: {sorted(os.listdir(folder))}; "
                            f"{_how_to_get(mnist_cache_dir())}")


def read_idx(file, magic: int) -> np.ndarray:
    """Read one IDX file of unsigned bytes (gzipped or raw) and check it thoroughly.

    The header is read first and the data size it declares is computed in Python integers (so
    dimensions whose product overflows 64 bits cannot pass as a small size); only that many
    bytes (plus one, to detect trailing data) are then read or decompressed, so neither a
    hostile header nor a gzip bomb makes the reader allocate more than the file claims.

    Parameters
    ----------
    file : path-like
        The file; gzip is recognised by its first two bytes, not by the name.
    magic : int
        The expected magic number (2051 for image files, 2049 for label files). Its low byte is
        the number of dimensions.

    Returns
    -------
    ndarray of uint8
        Shaped by the header's dimensions.

    Raises
    ------
    FileNotFoundError
        No such file.
    fastlib.errors.CorruptFileError
        (a ``ValueError``) truncated, not gzip/IDX, wrong magic number, sizes that do not match
        the data; the message names the file.
    """
    from fastlib.errors import CorruptFileError

    file = pathlib.Path(file)
    try:
        with open(file, "rb") as raw_file:
            gzipped = raw_file.read(2) == b"\x1f\x8b"
    except FileNotFoundError:
        raise FileNotFoundError(f"IDX file {str(file)!r} does not exist") from None
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    with (gzip.open(file, "rb") if gzipped else open(file, "rb")) as f:
        def read(n, what):
            try:
                return f.read(n)
            except EOFError:
                raise CorruptFileError(file, what, "gzip stream is truncated (the download or "
                                       "copy was cut short); fetch the file again") from None
            except (gzip.BadGzipFile, zlib.error, OSError) as exc:
                raise CorruptFileError(file, what, f"corrupt gzip data ({exc}); fetch the file "
                                       "again") from None

        head = read(header, "header")
        if len(head) < 4:
            raise CorruptFileError(file, "header", f"{len(head)} bytes is too short for an IDX "
                                   f"header ({header} bytes); the file is truncated or not an "
                                   "IDX file")
        (found,) = struct.unpack(">i", head[:4])
        if found != magic:
            kind = {IDX_IMAGES_MAGIC: "an image file (2051)", IDX_LABELS_MAGIC:
                    "a label file (2049)"}.get(found, "not an MNIST IDX file")
            raise CorruptFileError(file, "header", f"magic number {found}, expected {magic}; "
                                   f"this is {kind}")
        if len(head) < header:
            raise CorruptFileError(file, "header", f"{len(head)} bytes is too short for an IDX "
                                   f"header ({header} bytes); the file is truncated or not an "
                                   "IDX file")
        dims = struct.unpack(f">{ndim}i", head[4:header])
        if any(d < 0 for d in dims):
            raise CorruptFileError(file, "header", f"negative dimension in header {dims}; the "
                                   "file is corrupt")
        expected = math.prod(dims)  # Python integers: no overflow
        shape = "x".join(map(str, dims))
        if not gzipped:
            body = os.fstat(f.fileno()).st_size - header
            if body != expected:
                raise CorruptFileError(file, "data", _size_problem(shape, expected, body))
        data = read(expected + 1, "data") if expected < _IDX_MAX_BYTES else b""
    if expected >= _IDX_MAX_BYTES:
        raise CorruptFileError(file, "header", f"declares {shape} = {expected} bytes of data, "
                               f"more than an IDX file of this reader's ({_IDX_MAX_BYTES})")
    if len(data) != expected:
        raise CorruptFileError(file, "data", _size_problem(shape, expected, len(data), gzipped))
    return np.frombuffer(data, np.uint8, expected).reshape(dims)


# Larger than any IDX data set in use (MNIST's training images are 47 MB, EMNIST's 700 MB).
_IDX_MAX_BYTES = 2 ** 30


def _size_problem(shape, expected, body, gzipped=False):
    if body < expected:
        return (f"truncated: header promises {shape} = {expected} bytes of data, the file has "
                f"{body}")
    extra = "more" if gzipped else body - expected
    return f"{extra} unexpected bytes after the {shape} data; the file is corrupt"


#: the feature dtypes the loaders return: the formats models compute in (a 16-bit model trains
#: in mixed precision over float32 data)
FEATURE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_dtype(dtype) -> np.dtype:
    """``dtype`` as a ``np.dtype``, refused unless it is float32 or float64.

    An integer dtype would truncate the [0, 1] pixels to 0/1 (or fail in numpy's division),
    and ``np.dtype(None)`` would quietly mean float64, so both are refused here, before any
    file is read.
    """
    wanted = "dtype must be float32 or float64"
    if dtype is None:
        raise TypeError(f"{wanted}, got None; pass np.float32 (the default) or np.float64")
    try:
        found = np.dtype(dtype)
    except (TypeError, ValueError):
        raise TypeError(f"{wanted}, got {dtype!r}, which is not a dtype; pass np.float32 or "
                        "'float32' (the default), np.float64 or 'float64'") from None
    if found not in FEATURE_DTYPES:
        raise ValueError(f"{wanted}, got {found.name}: the features are pixels scaled to "
                         "[0, 1]; pass np.float32 (the default) or np.float64")
    return found


def _check_split(split, allow_none: bool) -> None:
    if split is None and allow_none:
        return
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test'{' or None' if allow_none else ''}, "
                         f"got {split!r}")
