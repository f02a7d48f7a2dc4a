"""fastlib.datasets: the bundled digits, MNIST's IDX files (real and hand-made, corrupt ones too)."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from fastlib import datasets


# ---------------------------------------------------------------------------------------------
# digits

def test_digits_shapes_range_and_fixed_stratified_split():
    from sklearn.datasets import load_digits as sk_digits

    sk = sk_digits()
    d = datasets.load_digits()
    counts = np.bincount(sk.target, minlength=10)
    # every fifth sample of each class is a test sample: count // 5 per class
    assert np.array_equal(np.bincount(d.y_test[:, 0], minlength=10), counts // 5)
    assert np.array_equal(np.bincount(d.y_train[:, 0], minlength=10), counts - counts // 5)
    assert d.x_train.shape == (1797 - 355, 64) and d.x_test.shape == (355, 64)
    assert d.y_train.shape == (1442, 1) and d.y_train.dtype == np.int64
    assert d.x_train.dtype == np.float32
    assert d.x_train.min() == 0.0 and d.x_train.max() == 1.0
    # the split is a partition of sklearn's data / 16 (compare as sorted multisets of rows)
    ours = np.concatenate([np.hstack([d.x_train, d.y_train]), np.hstack([d.x_test, d.y_test])])
    theirs = np.hstack([sk.data / 16.0, sk.target[:, None]]).astype(np.float32)
    assert np.array_equal(ours[np.lexsort(ours.T)], theirs[np.lexsort(theirs.T)])
    # and the 5th sample of class 0 in sklearn's order is the first test sample of class 0
    fifth_zero = sk.data[np.flatnonzero(sk.target == 0)[4]] / 16.0
    assert np.array_equal(d.x_test[np.flatnonzero(d.y_test[:, 0] == 0)[0]],
                          fifth_zero.astype(np.float32))


def test_digits_is_deterministic_and_splits_by_name():
    a, b = datasets.load_digits(), datasets.load_digits()
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    train = datasets.load_digits("train", dtype=np.float64)
    assert train.x.dtype == np.float64 and np.array_equal(train.y, a.y_train)
    assert np.array_equal(datasets.load_digits("test").x, a.x_test)
    with pytest.raises(ValueError, match="'train' or 'test'"):
        datasets.load_digits("validation")


def test_train_val_split_is_stratified_and_deterministic():
    y = np.repeat(np.arange(3), [10, 20, 30]).reshape(-1, 1)
    x = np.arange(60, dtype=np.float32).reshape(-1, 1)
    (xt, yt), (xv, yv) = datasets.train_val_split(x, y, 0.1)
    # round(0.1 * count) per class, the last ones in order: 1, 2 and 3 samples
    assert np.array_equal(np.bincount(yv[:, 0]), [1, 2, 3])
    assert np.array_equal(xv[:, 0], [9, 28, 29, 57, 58, 59])
    assert len(xt) + len(xv) == 60 and not set(xt[:, 0]) & set(xv[:, 0])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        datasets.train_val_split(x, y, 1.0)
    with pytest.raises(ValueError, match="class indices"):
        datasets.train_val_split(x, np.zeros((60, 2)), 0.1)


# ---------------------------------------------------------------------------------------------
# IDX files written here

def idx_bytes(array, magic):
    array = np.asarray(array, dtype=np.uint8)
    return struct.pack(">i", magic) + struct.pack(f">{array.ndim}i", *array.shape) + \
        array.tobytes()


def write_split(folder, split, images, labels, gz=True, images_bytes=None, labels_bytes=None):
    img_name, lbl_name = datasets.MNIST_FILES[split]
    img = images_bytes if images_bytes is not None else idx_bytes(images, 2051)
    lbl = labels_bytes if labels_bytes is not None else idx_bytes(labels, 2049)
    for name, data in ((img_name, img), (lbl_name, lbl)):
        if gz:
            (folder / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


@pytest.fixture
def tiny(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    images[0, 0, 0], images[1, 0, 0] = 0, 255  # both ends of the range
    labels = np.array([5, 0, 4, 1, 9, 2, 1], np.uint8)
    return tmp_path, images, labels


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_reads_gzipped_and_raw_idx(tiny, gz):
    folder, images, labels = tiny
    write_split(folder, "test", images, labels, gz=gz)
    x, y = datasets.load_mnist("test", folder)
    assert x.shape == (7, 784) and x.dtype == np.float32
    assert y.shape == (7, 1) and y.dtype == np.int64
    # pixel / 255, computed here in float64 and rounded once to float32
    assert np.array_equal(x, (images.reshape(7, 784) / 255.0).astype(np.float32))
    assert x[0, 0] == 0.0 and x[1, 0] == 1.0
    assert np.array_equal(y[:, 0], labels)


def test_mnist_both_splits_and_dtype(tiny):
    folder, images, labels = tiny
    write_split(folder, "train", images, labels)
    write_split(folder, "test", images[:3], labels[:3], gz=False)
    both = datasets.load_mnist(None, folder, dtype=np.float64)
    assert both.x_train.shape == (7, 784) and both.x_test.shape == (3, 784)
    assert both.x_train.dtype == np.float64


def test_mnist_missing_folder_and_files_are_named(tmp_path, tiny, monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.load_mnist("train", tmp_path / "nowhere")
    monkeypatch.setenv("VERIGRAD_MNIST_DIR", str(tmp_path / "unset"))
    with pytest.raises(FileNotFoundError, match="VERIGRAD_MNIST_DIR.*does not exist.*download"):
        datasets.load_mnist("train")
    folder, images, labels = tiny
    write_split(folder, "test", images, labels)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte.gz"):
        datasets.load_mnist("test", folder)
    with pytest.raises(ValueError, match="'train' or 'test'"):
        datasets.load_mnist("valid", folder)


def _corrupt_cases(images, labels):
    img, lbl = idx_bytes(images, 2051), idx_bytes(labels, 2049)
    gz_img = gzip.compress(img)
    flipped = bytearray(gz_img)
    flipped[len(flipped) // 2] ^= 0xFF
    return {
        # name: (images bytes, labels bytes, gzip them?, words in the message)
        "truncated raw images": (img[:-100], lbl, False, ["t10k-images-idx3-ubyte",
                                                          "truncated"]),
        "truncated gzip": (None, lbl, "cut", ["t10k-images-idx3-ubyte.gz", "truncated"]),
        "corrupt gzip": (None, lbl, "flip", ["t10k-images-idx3-ubyte.gz", "corrupt gzip"]),
        "labels in place of images": (lbl, lbl, False, ["magic number 2049, expected 2051",
                                                        "a label file"]),
        "not idx at all": (b"hello world, not MNIST", lbl, False, ["magic number"]),
        "header only": (img[:10], lbl, False, ["too short for an IDX header"]),
        "trailing bytes": (img + b"\x00\x01", lbl, False, ["2 unexpected bytes"]),
        "count mismatch": (img, idx_bytes(labels[:5], 2049), False, ["7 images", "5 labels"]),
        "label out of range": (img, idx_bytes(np.array([5, 0, 4, 1, 12, 2, 1]), 2049), False,
                               ["label 12", "outside 0..9"]),
        "wrong image size": (idx_bytes(np.zeros((7, 10, 10)), 2051), lbl, False, ["10x10"]),
    }, gz_img, bytes(flipped)


@pytest.mark.parametrize("case", ["truncated raw images", "truncated gzip", "corrupt gzip",
                                  "labels in place of images", "not idx at all", "header only",
                                  "trailing bytes", "count mismatch", "label out of range",
                                  "wrong image size"])
def test_mnist_corrupt_files_get_errors_naming_file_and_problem(tiny, case):
    folder, images, labels = tiny
    cases, gz_img, flipped = _corrupt_cases(images, labels)
    img, lbl, mode, words = cases[case]
    img_name, lbl_name = datasets.MNIST_FILES["test"]
    if mode == "cut":
        (folder / (img_name + ".gz")).write_bytes(gz_img[:len(gz_img) // 2])
        (folder / lbl_name).write_bytes(lbl)
    elif mode == "flip":
        (folder / (img_name + ".gz")).write_bytes(flipped)
        (folder / lbl_name).write_bytes(lbl)
    else:
        write_split(folder, "test", None, None, gz=False, images_bytes=img, labels_bytes=lbl)
    with pytest.raises(ValueError) as info:
        datasets.load_mnist("test", folder)
    for w in words:
        assert w in str(info.value), str(info.value)


# ---------------------------------------------------------------------------------------------
# the real files (../shared/data/mnist; the fixture skips when they are absent)

@pytest.mark.mnist
def test_real_mnist(mnist_dir):
    train = datasets.load_mnist("train", mnist_dir)
    test = datasets.load_mnist("test", mnist_dir)
    assert train.x.shape == (60000, 784) and test.x.shape == (10000, 784)
    assert train.x.dtype == np.float32 and train.y.shape == (60000, 1)
    assert 0.0 == train.x.min() and train.x.max() == 1.0
    # label counts from ../shared/data/mnist/README.md, typed in by hand
    assert list(np.bincount(train.y[:, 0])) == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265,
                                                5851, 5949]
    assert list(np.bincount(test.y[:, 0])) == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974,
                                               1009]
    # the famous first digits: a 5 in train, a 7 in test
    assert train.y[0, 0] == 5 and test.y[0, 0] == 7


# ---------------------------------------------------------------------------------------------
# where MNIST is found: the variable, the user cache, ../shared/data/mnist

@pytest.mark.parametrize("platform, env, expected", [
    ("linux", {"XDG_CACHE_HOME": "/xdg"}, "/xdg/verigrad"),
    ("linux", {"XDG_CACHE_HOME": "relative/not/allowed"}, "HOME/.cache/verigrad"),
    ("linux", {}, "HOME/.cache/verigrad"),
    ("freebsd13", {}, "HOME/.cache/verigrad"),
    ("darwin", {"XDG_CACHE_HOME": "/xdg"}, "HOME/Library/Caches/verigrad"),
    ("win32", {"LOCALAPPDATA": "/appdata"}, "/appdata/verigrad/Cache"),
    ("win32", {}, "HOME/AppData/Local/verigrad/Cache"),
])
def test_the_user_cache_folder_follows_the_platform(platform, env, expected, tmp_path,
                                                    monkeypatch):
    monkeypatch.setattr(datasets.sys, "platform", platform)
    monkeypatch.setattr(datasets.pathlib.Path, "home", classmethod(lambda cls: tmp_path))
    for name in ("XDG_CACHE_HOME", "LOCALAPPDATA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    want = expected.replace("HOME", str(tmp_path))
    assert datasets.user_cache_dir() == datasets.pathlib.Path(want)
    assert datasets.mnist_cache_dir() == datasets.pathlib.Path(want) / "mnist"


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A working folder with its own ../shared/data/mnist, a user cache, and no variable."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(datasets.MNIST_DIR_ENV, raising=False)
    monkeypatch.delenv(datasets.MNIST_URL_ENV, raising=False)
    work = tmp_path / "repo"
    work.mkdir()
    monkeypatch.chdir(work)
    return {"cache": tmp_path / "cache" / "verigrad" / "mnist",
            "shared": tmp_path / "shared" / "data" / "mnist", "env": tmp_path / "elsewhere"}


def _fill(folder, seed):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    labels = {}
    for split in ("train", "test"):
        labels[split] = rng.integers(0, 10, size=4, dtype=np.uint8)
        write_split(folder, split, rng.integers(0, 256, size=(4, 28, 28)), labels[split])
    return labels["test"]


def test_the_lookup_order_is_variable_cache_then_shared(places, monkeypatch):
    with pytest.raises(FileNotFoundError) as info:
        datasets.load_mnist("test")
    message = str(info.value)
    for words in (str(places["cache"]), "shared/data/mnist", "VERIGRAD_MNIST_DIR",
                  "--data-dir", "path=", "--download", "download=True"):
        assert words in message, message
    shared = _fill(places["shared"], 1)
    assert np.array_equal(datasets.load_mnist("test").y[:, 0], shared)
    cached = _fill(places["cache"], 2)
    assert np.array_equal(datasets.load_mnist("test").y[:, 0], cached)     # the cache first
    named = _fill(places["env"], 3)
    monkeypatch.setenv(datasets.MNIST_DIR_ENV, str(places["env"]))
    assert np.array_equal(datasets.load_mnist("test").y[:, 0], named)      # the variable first


# ---------------------------------------------------------------------------------------------
# fetching: a server on the loopback address, with good, truncated and corrupted files

class _Files:
    """What the loopback server answers: name -> (body, declared length or None, status)."""

    def __init__(self):
        self.answers, self.asked = {}, []


@pytest.fixture
def server():
    import http.server
    import threading

    files = _Files()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            name = self.path.rsplit("/", 1)[-1]
            files.asked.append(name)
            body, length, status = files.answers.get(name, (b"", None, 404))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)          # fewer bytes than declared: a cut connection

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    files.url = f"http://127.0.0.1:{httpd.server_address[1]}/mnist/"
    yield files
    httpd.shutdown()
    httpd.server_close()


def _published(tmp_path):
    """Four small IDX files and their SHA-256 (the checksums a test passes for them)."""
    import hashlib

    folder = tmp_path / "published"
    _fill(folder, 7)
    bodies = {p.name: p.read_bytes() for p in folder.iterdir()}
    return bodies, {n: hashlib.sha256(b).hexdigest() for n, b in bodies.items()}


def test_a_good_download_lands_verified_and_loads(server, tmp_path):
    bodies, sums = _published(tmp_path)
    for name, body in bodies.items():
        server.answers[name] = (body, None, 200)
    target = tmp_path / "cache"
    assert datasets.download_mnist(target, server.url, sums) == target
    assert sorted(p.name for p in target.iterdir()) == sorted(bodies)
    for name, body in bodies.items():
        assert (target / name).read_bytes() == body
    test = datasets.load_mnist("test", target)
    assert test.x.shape == (4, 784)
    # a second call finds the files verified in place and asks for nothing
    server.asked.clear()
    datasets.download_mnist(target, server.url, sums)
    assert server.asked == []


@pytest.mark.parametrize("fault", ["truncated", "cut connection", "corrupted", "missing"])
def test_a_bad_download_is_refused_and_leaves_nothing(fault, server, tmp_path):
    bodies, sums = _published(tmp_path)
    for name, body in bodies.items():
        server.answers[name] = (body, None, 200)
    bad = "t10k-images-idx3-ubyte.gz"
    body = bodies[bad]
    if fault == "truncated":          # the server sends a shorter file, honestly declared
        server.answers[bad] = (body[:len(body) // 2], None, 200)
    elif fault == "cut connection":   # the connection ends before the declared length
        server.answers[bad] = (body[:len(body) // 2], len(body), 200)
    elif fault == "corrupted":        # the right length, one byte flipped
        flipped = bytearray(body)
        flipped[len(flipped) // 3] ^= 0x01
        server.answers[bad] = (bytes(flipped), None, 200)
    else:
        server.answers[bad] = (b"no such file", None, 404)
    target = tmp_path / "cache"
    error = OSError if fault == "missing" else ValueError
    with pytest.raises(error) as info:
        datasets.download_mnist(target, server.url, sums)
    message = str(info.value)
    assert server.url + bad in message, message
    expected = {"truncated": [sums[bad], "SHA-256"], "cut connection": ["cut short"],
                "corrupted": [sums[bad], "SHA-256", "nothing was kept"],
                "missing": ["404"]}[fault]
    for words in expected:
        assert words in message, message
    # the files verified before the bad one stay; nothing half-written, no temporary
    left = sorted(p.name for p in target.iterdir())
    assert bad not in left and not [n for n in left if n.startswith(".")]
    for name in left:
        assert (target / name).read_bytes() == bodies[name]


def test_a_wrong_file_in_the_cache_is_fetched_again(server, tmp_path):
    bodies, sums = _published(tmp_path)
    for name, body in bodies.items():
        server.answers[name] = (body, None, 200)
    target = tmp_path / "cache"
    target.mkdir()
    (target / "train-labels-idx1-ubyte.gz").write_bytes(b"stale")
    datasets.download_mnist(target, server.url, sums)
    assert (target / "train-labels-idx1-ubyte.gz").read_bytes() == \
        bodies["train-labels-idx1-ubyte.gz"]


def test_load_mnist_download_fills_the_cache_from_the_variables_url(server, places,
                                                                    monkeypatch, tmp_path):
    bodies, sums = _published(tmp_path)
    for name, body in bodies.items():
        server.answers[name] = (body, None, 200)
    monkeypatch.setattr(datasets, "MNIST_SHA256", sums)
    monkeypatch.setenv(datasets.MNIST_URL_ENV, server.url)
    test = datasets.load_mnist("test", download=True)
    assert test.x.shape == (4, 784)
    assert sorted(p.name for p in places["cache"].iterdir()) == sorted(bodies)


@pytest.mark.mnist
def test_the_published_checksums_are_the_real_files(mnist_dir):
    # the four files of ../shared/data/mnist are LeCun's (byte counts as published) and hash
    # to the SHA-256 the downloader checks; a download of them is accepted
    import hashlib

    sizes = {"train-images-idx3-ubyte.gz": 9912422, "train-labels-idx1-ubyte.gz": 28881,
             "t10k-images-idx3-ubyte.gz": 1648877, "t10k-labels-idx1-ubyte.gz": 4542}
    for name, digest in datasets.MNIST_SHA256.items():
        data = (mnist_dir / name).read_bytes()
        assert len(data) == sizes[name]
        assert hashlib.sha256(data).hexdigest() == digest


def test_the_cli_names_data_dir_and_download(places, capsys):
    from reports.cli import main

    assert main(["train", "--data", "mnist", "--epochs", "1"]) == 1
    err = capsys.readouterr().err
    assert "--data-dir" in err and "--download" in err and "no MNIST files" in err
    assert main(["train", "--data-dir", "x"]) == 2
    assert "--data-dir applies only with --data mnist" in capsys.readouterr().err
