"""The exact oracle's values on disk: where they go, that a later process reads instead of
recomputing, that a corrupt or unwritable file costs a recomputation and nothing else, and that
an edit to the referee's code starts a fresh folder."""
import os
import pathlib
import sys

import numpy as np
import pytest

from reports.conformance import oracle


@pytest.fixture
def fresh(monkeypatch):
    """An empty in-process cache (restored after the test)."""
    monkeypatch.setattr(oracle, "_MEMORY", {})
    return oracle


def test_the_folder_is_the_user_cache_unless_moved_or_off(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(oracle.CACHE_ENV, raising=False)
    version = oracle.referee_version()
    assert len(version) == 16
    if sys.platform.startswith("linux"):
        assert oracle.cache_dir() == tmp_path / "xdg" / "verigrad" / "exact" / version
    monkeypatch.setenv(oracle.CACHE_ENV, str(tmp_path / "mine"))
    assert oracle.cache_dir() == tmp_path / "mine" / version
    for off in ("off", "0", "none", "OFF "):
        monkeypatch.setenv(oracle.CACHE_ENV, off)
        assert oracle.cache_dir() is None


def test_a_later_process_reads_the_value_instead_of_computing_it(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv(oracle.CACHE_ENV, str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return oracle.Exact((np.array([1.0, 2.0]), np.array([1e-20, 0.0])), (None,))

    key = oracle._key("vjp", "exp", [np.array([0.5, 1.5])], None)
    first = fresh._cached(key, compute)
    fresh._MEMORY.clear()                   # what a new process starts with
    again = fresh._cached(key, compute)
    assert calls == [1]
    assert np.array_equal(again.out[0], first.out[0]) and again.grads == (None,)
    assert list(tmp_path.rglob("*.pkz")) and not list(tmp_path.rglob("*.tmp"))


def test_a_corrupt_file_is_recomputed_and_rewritten(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv(oracle.CACHE_ENV, str(tmp_path))
    key = oracle._key("vjp", "tanh", [np.array([3.0])], None)
    fresh._cached(key, lambda: 7)
    (path,) = tmp_path.rglob("*.pkz")
    path.write_bytes(b"\x80\x04not a pickle")
    fresh._MEMORY.clear()
    assert fresh._cached(key, lambda: 8) == 8
    fresh._MEMORY.clear()
    assert fresh._cached(key, lambda: 9) == 8      # the rewritten value


def test_an_unwritable_folder_still_gives_the_value(fresh, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(oracle.CACHE_ENV, str(blocker / "below"))
    key = oracle._key("vjp", "exp", [np.array([1.0])], None)
    assert fresh._cached(key, lambda: 5) == 5


def test_an_edit_to_the_referee_starts_a_fresh_folder(monkeypatch, tmp_path):
    for part in oracle._REFEREE_CODE:
        target = tmp_path / part
        if part.endswith(".py"):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("x = 1\n")
        else:
            target.mkdir(parents=True, exist_ok=True)
            (target / "module.py").write_text("y = 2\n")
    monkeypatch.setattr(oracle, "_ROOT", pathlib.Path(tmp_path))
    monkeypatch.setattr(oracle, "_VERSION", [])
    before = oracle.referee_version()
    monkeypatch.setattr(oracle, "_VERSION", [])
    assert oracle.referee_version() == before                 # nothing changed
    (tmp_path / "spec" / "module.py").write_text("y = 3\n")    # a formula edited
    monkeypatch.setattr(oracle, "_VERSION", [])
    assert oracle.referee_version() != before
    import mpmath

    edited = oracle.referee_version()
    # pickles over GMP's integers load only where gmpy2 does: another backend, another folder
    other = "python" if mpmath.libmp.BACKEND != "python" else "gmpy"
    monkeypatch.setattr(mpmath.libmp, "BACKEND", other)
    monkeypatch.setattr(oracle, "_VERSION", [])
    assert oracle.referee_version() != edited


def test_other_versions_unused_for_a_week_are_removed(monkeypatch, tmp_path):
    import time

    monkeypatch.setenv(oracle.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(oracle, "_PRUNED", set())
    old, recent, other = tmp_path / "0123456789abcdef", tmp_path / "fedcba9876543210", \
        tmp_path / "not-a-version"
    for folder in (old, recent, other):
        (folder / "ab").mkdir(parents=True)
    week_ago = time.time() - (oracle.STALE_DAYS + 1) * 86400
    for path in (old / "ab", old, other / "ab", other):
        os.utime(path, (week_ago, week_ago))
    current = oracle.cache_dir()
    assert current == tmp_path / oracle.referee_version()
    assert not old.exists() and recent.exists() and other.exists()
