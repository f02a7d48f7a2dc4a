"""Checks a command runs on its arguments before it starts working.

Each returns None when the argument is fine, or a message naming the option, the value and the
fix; the command prints it and exits 2. They run before any proof, measurement or training, so
a mistyped path costs nothing but the message.
"""
from __future__ import annotations

import os
import pathlib
import tempfile

__all__ = ["writable_dir", "writable_file", "existing_file", "existing_dir", "unknown_names"]


def _can_create_in(folder: pathlib.Path) -> str | None:
    """None when a file can be created in ``folder`` (tried for real, then removed)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".verigrad-check-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(tmp)
    return None


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def writable_dir(path, option: str) -> str | None:
    """``path`` is a folder that exists and takes new files, or can be created."""
    path = pathlib.Path(path)
    if path.exists() and not path.is_dir():
        return f"{option} {path}: exists and is not a folder; pass a folder to write into"
    base = _nearest_existing(path)
    if not base.is_dir():
        return f"{option} {path}: {base} is a file, so the folder cannot be created there"
    return _cannot_write(option, path, base, "folder")


def writable_file(path, option: str) -> str | None:
    """``path`` can be written: its folder exists and takes new files; it is not a folder."""
    path = pathlib.Path(path)
    if path.is_dir():
        return f"{option} {path}: is a folder; pass a file name"
    folder = path.absolute().parent
    if not folder.is_dir():
        return f"{option} {path}: folder {folder} does not exist; create it first"
    return _cannot_write(option, path, folder, "path")


def _cannot_write(option, path, folder, what):
    """Why nothing can be created in the existing ``folder`` (for ``path``), or None."""
    why = _can_create_in(folder)
    if why:
        return f"{option} {path}: cannot write in {folder} ({why}); pass a writable {what}"
    return None


def existing_file(path, option: str) -> str | None:
    """``path`` is an existing file."""
    path = pathlib.Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        return f"{option} {path}: {what}; pass an existing file"
    return None


def existing_dir(path, option: str) -> str | None:
    """``path`` is an existing folder."""
    path = pathlib.Path(path)
    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        return f"{option} {path}: {what}; pass an existing folder"
    return None


def unknown_names(given, valid, option: str, what: str) -> str | None:
    """None when every name in ``given`` is in ``valid``; else a message listing the valid ones.

    ``valid`` is the registry the command actually consumes, never a second list.
    """
    import difflib

    valid = list(dict.fromkeys(valid))
    bad = [g for g in given if g not in valid]
    if not bad:
        return None
    hints = []
    for b in bad:
        close = difflib.get_close_matches(b, valid, n=1)
        hints.append(f"{b!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (f"{option}: unknown {what} {', '.join(hints)}; valid {what}s: "
            f"{', '.join(sorted(valid))}")
