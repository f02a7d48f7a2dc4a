"""Say so while fastlib compiles its kernels: the first run's long wait, once per install.

Numba compiles a kernel on its first call and keeps the machine code on disk (one ``.nbc``
file per kernel and signature), so a later run loads it in milliseconds. ``CompileWatch``
counts those files, from this process or its worker processes, while a long step runs: on a
terminal a status line ("compiling kernels, one time: 153 so far"), off a terminal exactly one
line when the first new kernel appears, and nothing at all when every kernel was cached.
"""
from __future__ import annotations

import os
import sys
import threading

from fastlib.cache_guard import cache_dirs

__all__ = ["compiled_kernels", "cache_location", "CompileWatch"]


#: seconds between two counts of the cache while a step runs
POLL_SECONDS = 0.5


def _folders():
    """The folders Numba writes fastlib's kernels to now: those under ``NUMBA_CACHE_DIR``
    alone when it is set (Numba then uses no other), else every folder it may use."""
    folders = cache_dirs()
    user_dir = os.environ.get("NUMBA_CACHE_DIR")
    if user_dir:
        folders = [f for f in folders if str(f).startswith(os.path.join(user_dir, ""))]
    return folders


def compiled_kernels() -> int:
    """How many compiled fastlib kernels (kernel and signature) Numba holds on disk."""
    count = 0
    for folder in _folders():
        try:
            with os.scandir(folder) as entries:
                count += sum(entry.name.endswith(".nbc") for entry in entries)
        except OSError:   # not created yet, or unreadable: nothing cached there
            continue
    return count


def cache_location() -> str:
    """Where Numba keeps fastlib's compiled kernels, in words."""
    user_dir = os.environ.get("NUMBA_CACHE_DIR")
    return user_dir if user_dir else "__pycache__ beside fastlib's sources"


class CompileWatch:
    """Report new compiled kernels while a block runs (a context manager).

    Parameters
    ----------
    what : str
        Who compiles, for the message ("verigrad conform").
    stream : file, optional
        Where the line goes (default: stderr).
    show : callable, optional
        ``show(text)`` replaces the terminal status line (e.g. a progress bar's postfix);
        default: a line of its own on ``stream``.
    live : bool, optional
        Whether to draw the status line (default: ``stream`` is a terminal); False prints the
        one line instead.
    interval : float, optional
        Seconds between two counts of the cache (default ``POLL_SECONDS``).
    """

    def __init__(self, what, stream=None, show=None, live=None, interval=None):
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if live is None \
            else bool(live)
        self.show = show
        self.interval = POLL_SECONDS if interval is None else interval
        self.compiled = 0          # kernels compiled since the block began
        self._before = 0
        self._stop = threading.Event()
        self._thread = None
        self._announced = False
        self._width = 0

    def __enter__(self):
        self._before = compiled_kernels()
        self._thread = threading.Thread(target=self._watch, name="compile-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._count()
        if self.compiled and not self.tty and not self._announced:
            # the watcher never looked while kernels compiled (a compiled call that holds the
            # GIL can starve it): the log still gets its one line
            self._announce()
        if self.tty and self.show is None and self._width:
            self.stream.write("\r" + " " * self._width + "\r")   # the next output starts clean
            self.stream.flush()
        return False

    def message(self):
        """The status text for the kernels compiled so far."""
        return (f"compiling kernels, one time: {self.compiled} so far (Numba keeps them in "
                f"{cache_location()}; later runs load them)")

    def _count(self):
        self.compiled = max(0, compiled_kernels() - self._before)

    def _watch(self):
        while not self._stop.wait(self.interval):
            self._count()
            if not self.compiled:
                continue
            if self.tty:
                self._draw(self.message())
            elif not self._announced:   # a log gets one line, not a frame per kernel
                self._announce()
            self._announced = True

    def _announce(self):
        on_terminal = getattr(self.stream, "isatty", lambda: False)()
        self.stream.write(("\r\033[K" if on_terminal else "")
                          + f"{self.what}: first run: compiling fastlib's kernels, one time "
                          f"(Numba keeps them in {cache_location()}; later runs load them)\n")
        self.stream.flush()
        self._announced = True

    def _draw(self, text):
        if self.show is not None:
            self.show(text)
            return
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)
