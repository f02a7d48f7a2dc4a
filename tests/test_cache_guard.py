"""fastlib.cache_guard: stale Numba caches are dropped when any fastlib source changes."""
import pathlib

import numba.core.caching as numba_caching

from fastlib import cache_guard


def fake_package(tmp_path):
    root = tmp_path / "pkg"
    (root / "kernels" / "__pycache__").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "__init__.py").write_text("x = 1\n")
    (root / "kernels" / "scalar.py").write_text("def f(x):\n    return x\n")
    return root


def cached_files(root):
    return sorted(p.name for p in root.rglob("*.nb[ic]"))


def plant_cache(root):
    for name in ("scalar.f-1.py311.nbi", "scalar.f-1.py311.1.nbc"):
        (root / "kernels" / "__pycache__" / name).write_bytes(b"compiled")


def test_unchanged_sources_keep_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    root = fake_package(tmp_path)
    assert cache_guard.ensure_fresh_cache(root)  # first run: no stamp yet
    plant_cache(root)
    assert not cache_guard.ensure_fresh_cache(root)
    assert len(cached_files(root)) == 2


def test_an_edited_callee_drops_every_cached_kernel(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    root = fake_package(tmp_path)
    cache_guard.ensure_fresh_cache(root)
    plant_cache(root)
    (root / "kernels" / "scalar.py").write_text("def f(x):\n    return 2 * x\n")
    assert cache_guard.ensure_fresh_cache(root)
    assert cached_files(root) == []
    # the new stamp matches the new sources: the next import keeps what it compiles
    plant_cache(root)
    assert not cache_guard.ensure_fresh_cache(root)
    assert len(cached_files(root)) == 2


def test_fingerprint_sees_content_and_new_files(tmp_path):
    root = fake_package(tmp_path)
    before = cache_guard.source_fingerprint(root)
    (root / "kernels" / "new.py").write_text("")
    added = cache_guard.source_fingerprint(root)
    (root / "__init__.py").write_text("x = 2\n")
    edited = cache_guard.source_fingerprint(root)
    assert len({before, added, edited}) == 3


def test_numba_cache_dir_layout_is_numbas(tmp_path, monkeypatch):
    # the folders we clean under NUMBA_CACHE_DIR are the ones Numba's own locator computes
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    root = fake_package(tmp_path)
    ours = {str(p) for p in cache_guard.cache_dirs(root)}
    for source in (root / "__init__.py", root / "kernels" / "scalar.py"):
        sub = numba_caching._CacheLocator.get_suitable_cache_subpath(str(source))
        assert str(tmp_path / "cache" / sub) in ours


def test_numba_cache_dir_is_cleaned_too(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    root = fake_package(tmp_path)
    cache_guard.ensure_fresh_cache(root)
    sub = numba_caching._CacheLocator.get_suitable_cache_subpath(str(root / "kernels" / "scalar.py"))
    folder = tmp_path / "cache" / sub
    folder.mkdir(parents=True)
    (folder / "scalar.f-1.py311.nbi").write_bytes(b"compiled")
    (root / "kernels" / "scalar.py").write_text("def f(x):\n    return -x\n")
    assert cache_guard.ensure_fresh_cache(root)
    assert not any(folder.iterdir())


def test_the_package_itself_is_stamped():
    # importing fastlib ran the guard: the stamp beside the cache matches today's sources
    stamp = cache_guard._stamp_path(cache_guard.PACKAGE_DIR)
    assert stamp is not None and stamp.read_text().strip() == cache_guard.stamp_text()
    # the stamp names the BLAS the kernels were compiled to call
    from fastlib import blas_choice

    assert stamp.read_text().strip().endswith(blas_choice.stamp())


def test_another_cache_dir_leaves_the_in_tree_kernels_alone(tmp_path, monkeypatch):
    # a run with its own NUMBA_CACHE_DIR (a first-run measurement, a CI job) has its own stamp:
    # it must not delete the kernels the ordinary runs keep beside the sources
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    root = fake_package(tmp_path)
    cache_guard.ensure_fresh_cache(root)
    plant_cache(root)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache_guard.ensure_fresh_cache(root)     # no stamp there yet: its folders cleaned
    assert len(cached_files(root)) == 2
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert not cache_guard.ensure_fresh_cache(root)
    assert len(cached_files(root)) == 2
