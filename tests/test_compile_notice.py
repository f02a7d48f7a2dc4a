"""The first run says that it compiles: a status line on a terminal, one line in a log, nothing
when every kernel is cached.

The kernel count is the number of Numba's ``.nbc`` files in fastlib's cache folders, so the
unit tests write such files into a private ``NUMBA_CACHE_DIR`` (where ``cache_guard`` says Numba
keeps them); the last test compiles a real kernel in a fresh process.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _kernel_folder(monkeypatch, tmp_path):
    from fastlib import cache_guard

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    folder = next(d for d in cache_guard.cache_dirs() if str(d).startswith(str(tmp_path)))
    folder.mkdir(parents=True)
    return folder


def _compile(folder, n, start=0):
    for i in range(start, start + n):
        (folder / f"kernels.k{i}-1.py311.1.nbc").write_bytes(b"")


def _wait_for(predicate, seconds=5.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end and not predicate():
        time.sleep(0.01)


def test_a_log_gets_exactly_one_line(monkeypatch, tmp_path):
    from fastlib.compile_notice import CompileWatch, compiled_kernels

    folder = _kernel_folder(monkeypatch, tmp_path)
    _compile(folder, 2)                      # cached before: not this run's
    assert compiled_kernels() == 2
    log = io.StringIO()
    with CompileWatch("verigrad conform", stream=log, interval=0.01) as watch:
        for k in range(3):
            _compile(folder, 1, start=10 + k)
            _wait_for(lambda k=k: watch.compiled == k + 1)
    assert watch.compiled == 3
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and "\r" not in log.getvalue()
    assert lines[0].startswith("verigrad conform: first run: compiling fastlib's kernels, one time")
    assert str(tmp_path) in lines[0]


def test_nothing_is_said_when_every_kernel_is_cached(monkeypatch, tmp_path):
    from fastlib.compile_notice import CompileWatch

    _compile(_kernel_folder(monkeypatch, tmp_path), 5)
    for stream in (io.StringIO(), _Terminal()):
        with CompileWatch("verigrad train", stream=stream, interval=0.01) as watch:
            time.sleep(0.05)
        assert watch.compiled == 0 and stream.getvalue() == ""


def test_a_terminal_gets_a_status_line_with_the_count(monkeypatch, tmp_path):
    from fastlib.compile_notice import CompileWatch

    folder = _kernel_folder(monkeypatch, tmp_path)
    term = _Terminal()
    with CompileWatch("verigrad conform", stream=term, interval=0.01) as watch:
        _compile(folder, 4)
        _wait_for(lambda: "4 so far" in term.getvalue())
    text = term.getvalue()
    assert "\rcompiling kernels, one time: 4 so far" in text and watch.compiled == 4
    assert text.endswith("\r")              # the line is erased: what follows starts clean
    shown = []
    with CompileWatch("verigrad conform", stream=_Terminal(), show=shown.append,
                      interval=0.01):
        _compile(folder, 1, start=20)
        _wait_for(lambda: bool(shown))
    assert shown and shown[-1].startswith("compiling kernels, one time: 1 so far")


def test_live_false_prints_one_line_on_a_terminal_too(monkeypatch, tmp_path):
    from fastlib.compile_notice import CompileWatch

    folder = _kernel_folder(monkeypatch, tmp_path)
    term = _Terminal()
    with CompileWatch("verigrad train", stream=term, live=False, interval=0.01) as watch:
        _compile(folder, 3)
        _wait_for(lambda: watch.compiled == 3 and term.getvalue())
        time.sleep(0.05)
    assert term.getvalue().count("\n") == 1
    assert "verigrad train: first run: compiling fastlib's kernels" in term.getvalue()


def test_a_real_first_compile_is_announced_once_and_a_second_run_is_silent(tmp_path):
    script = ("import numpy as np, sys\n"
              "from fastlib.compile_notice import CompileWatch\n"
              "from fastlib import ops\n"
              "with CompileWatch('probe', interval=0.05) as w:\n"
              "    ops.forward('sum', [np.arange(5.0)])\n"
              "print(w.compiled)\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    runs = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = runs
    assert int(first.stdout.split()[-1]) >= 1
    notices = [line for line in first.stderr.splitlines() if "compiling" in line]
    assert len(notices) == 1 and notices[0].startswith("probe: first run: compiling")
    assert int(second.stdout.split()[-1]) == 0
    assert "compiling" not in second.stderr


def _compiling_cache(monkeypatch):
    """``compiled_kernels`` as a cache that gains a kernel at every look (a first run)."""
    from fastlib import compile_notice

    counter = iter(range(10 ** 6))
    monkeypatch.setattr(compile_notice, "compiled_kernels", lambda: next(counter))
    monkeypatch.setattr(compile_notice, "POLL_SECONDS", 0.01)


def test_a_first_train_says_so_in_one_line_when_redirected(monkeypatch, capsys):
    from reports.cli import main

    _compiling_cache(monkeypatch)
    code = main(["train", "--epochs", "2", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    notices = [line for line in err.splitlines() if "compiling" in line]
    assert notices == [line for line in err.splitlines() if line.strip()]   # nothing else
    assert len(notices) == 1 and notices[0].startswith(
        "verigrad train: first run: compiling fastlib's kernels, one time")
    assert "compiling" not in out                   # the table's stream stays clean


def test_a_first_conform_says_so_in_one_line_and_counts_in_the_summary(monkeypatch, capsys):
    from reports.cli import main

    _compiling_cache(monkeypatch)
    code = main(["conform", "--ops", "mul", "--dtypes", "float64", "--engines", "reflib",
                 "--no-proofs", "--workers", "1", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    notices = [line for line in err.splitlines() if "compiling" in line]
    assert len(notices) == 1 and notices[0].startswith(
        "verigrad conform: first run: compiling fastlib's kernels, one time")
    assert re.search(r"\d+ kernels? compiled, one time$", out.strip().splitlines()[-1])
