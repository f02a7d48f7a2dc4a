"""Drop Numba's on-disk cache of fastlib when any fastlib source file has changed.

NOTE: Numba keys a cached kernel on its own source file only. fastlib's kernels inline
functions from other modules (``fastlib.kernels.scalar`` into every activation, the optimizer
rules into the fused epoch, ...), so after an edit or an upgrade that touches a callee, a
caller's cached machine code is stale, and loading it has crashed the interpreter with a
segmentation fault. This module fingerprints every ``.py`` file of the package (path, size and
content hash) and, when the fingerprint differs from the one recorded beside the cache, deletes
fastlib's ``*.nbi`` / ``*.nbc`` files before any kernel is loaded: the next calls compile afresh
(a cold start) instead of running stale code. Hashing the sources takes about a millisecond.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import sys

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
STAMP_NAME = "verigrad-numba-sources.sha256"


#: The op table's package: the kernels compile its codes in as constants, so it is hashed too.
OPTABLE_DIR = PACKAGE_DIR.parent / "optable"


def source_fingerprint(root: pathlib.Path = PACKAGE_DIR) -> str:
    """SHA-256 over the relative path and bytes of every ``.py`` file under ``root`` (and, for
    fastlib itself, under the op table's package, whose codes the kernels compile in)."""
    digest = hashlib.sha256()
    roots = [root] + ([OPTABLE_DIR] if root == PACKAGE_DIR and OPTABLE_DIR.is_dir() else [])
    for base in roots:
        for path in sorted(base.rglob("*.py")):
            digest.update(str(path.relative_to(base.parent)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def stamp_text(root: pathlib.Path = PACKAGE_DIR) -> str:
    """What the stamp beside the cache records: the sources' fingerprint and, for fastlib, the
    BLAS its kernels call (``fastlib.blas_choice``: machine code compiled for one library's
    integer width must not be loaded under another's)."""
    text = source_fingerprint(root)
    if root == PACKAGE_DIR:
        from fastlib import blas_choice

        text += " | " + blas_choice.stamp()
    return text


def _user_wide_dir() -> pathlib.Path | None:
    """Numba's fallback cache root when the package folder is read-only (its ``appdirs``
    user cache folder), computed here so that ``import fastlib`` does not import Numba."""
    if sys.platform == "darwin":
        return pathlib.Path.home() / "Library" / "Caches" / "numba"
    if os.name == "posix":
        base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
        return pathlib.Path(base) / "numba"
    local = os.environ.get("LOCALAPPDATA")
    return pathlib.Path(local) / "numba" / "Cache" if local else None


def _source_dirs(root):
    return sorted({p.parent for p in root.rglob("*.py")})


def _dirs_under(base, root):
    """The folders Numba derives under cache root ``base`` for each source directory of
    ``root``: ``numba.core.caching``'s ``<dirname>_<sha1 of the directory path>`` layout."""
    dirs = []
    for d in _source_dirs(root):
        absolute = str(d.resolve())
        hashed = hashlib.sha1(absolute.encode()).hexdigest()
        dirs.append(base / f"{os.path.basename(absolute)}_{hashed}")
    return dirs


def cache_dirs(root: pathlib.Path = PACKAGE_DIR) -> list[pathlib.Path]:
    """Every directory where Numba may keep cached kernels of the modules under ``root``.

    The in-tree ``__pycache__`` folders (Numba's default), and the folders Numba derives from
    each source directory under ``NUMBA_CACHE_DIR`` (when set) and under its user-wide cache
    (used when the package folder is read-only).
    """
    dirs = [d / "__pycache__" for d in _source_dirs(root)]
    bases = [pathlib.Path(os.environ["NUMBA_CACHE_DIR"])] if os.environ.get("NUMBA_CACHE_DIR") \
        else []
    user_wide = _user_wide_dir()
    if user_wide is not None:
        bases.append(user_wide)
    for base in bases:
        dirs.extend(_dirs_under(base, root))
    return dirs


def _dirs_stamped_by(stamp, root):
    """The folders whose kernels ``stamp`` vouches for: the in-tree ones for the stamp in the
    package's ``__pycache__``, else those under the stamp's own cache root. Each place Numba
    may cache in has its own stamp, so a run with another ``NUMBA_CACHE_DIR`` leaves the
    kernels of the others alone (it used to delete them: the next ordinary run was cold)."""
    if stamp.parent == root / "__pycache__":
        return [d / "__pycache__" for d in _source_dirs(root)]
    return _dirs_under(stamp.parent, root)


def _stamp_path(root: pathlib.Path) -> pathlib.Path | None:
    """Where the fingerprint is kept: beside the cache Numba will use, if writable."""
    user_dir = os.environ.get("NUMBA_CACHE_DIR")
    candidates = [pathlib.Path(user_dir)] if user_dir else [root / "__pycache__"]
    user_wide = _user_wide_dir()
    if user_wide is not None:
        candidates.append(user_wide)
    for base in candidates:
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(base, os.W_OK):
            return base / STAMP_NAME
    return None


def ensure_fresh_cache(root: pathlib.Path = PACKAGE_DIR) -> bool:
    """Delete the cached kernels if the sources changed since they were written.

    Returns True when stale files were removed (or no stamp existed), False when the cache
    matched. Never raises for an unwritable location: then Numba itself cannot cache there
    either, and there is nothing stale to remove.
    """
    stamp = _stamp_path(root)
    if stamp is None:
        return False  # nowhere writable: Numba cannot cache either
    fingerprint = stamp_text(root)
    try:
        if stamp.read_text().strip() == fingerprint:
            return False
    except OSError:
        pass
    for folder in _dirs_stamped_by(stamp, root):
        if not folder.is_dir():
            continue
        for pattern in ("*.nbi", "*.nbc"):
            for path in folder.glob(pattern):
                try:
                    path.unlink()
                except OSError:
                    pass  # another process removed it first, or the folder is read-only
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
        tmp.write_text(fingerprint + "\n")
        os.replace(tmp, stamp)  # atomic: a concurrent reader sees the old or the new stamp
    except OSError:
        pass
    return True
