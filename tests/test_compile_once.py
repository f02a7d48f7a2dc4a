"""``fastlib.compile_once.compiled_for``: a process that finds another compiling the same kernel
waits for it and loads the machine code from the cache instead of compiling it again."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KERNEL = """
from numba import njit

@njit(cache=True)
def plus_one(x):
    return x + 1.0
"""

# counts the compilations this process makes (a load from the cache is not one)
COUNTING = """
import sys
sys.path[:0] = [{root!r}, {folder!r}]
from numba.core import event
compiles = []
class Count(event.Listener):
    def on_start(self, ev):
        pass
    def on_end(self, ev):
        compiles.append(ev.data["dispatcher"].py_func.__name__)
event.register("numba:compile", Count())
import kernel_module
from fastlib import compile_once
"""

HOLDER = COUNTING + """
sig = compile_once._signature(kernel_module.plus_one, (1.0,))
with compile_once._exclusive(compile_once._lock_path(kernel_module.plus_one, sig)):
    print("locked", flush=True)
    sys.stdin.readline()          # the waiter has started
    kernel_module.plus_one(1.0)   # compiles and writes the cache while holding the lock
print("compiled", compiles, flush=True)
"""

WAITER = COUNTING + """
print("waiting", flush=True)
compile_once.compiled_for(kernel_module.plus_one, 1.0)
assert kernel_module.plus_one(2.0) == 3.0
print("compiled", compiles, flush=True)
"""


@pytest.fixture()
def kernel_folder(tmp_path):
    (tmp_path / "kernel_module.py").write_text(KERNEL)
    return tmp_path


def _start(source, folder, cache):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(source)
                             .format(root=ROOT, folder=str(folder))], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_a_waiting_process_loads_what_the_compiling_one_saved(kernel_folder, tmp_path):
    cache = tmp_path / "cache"
    holder = _start(HOLDER, kernel_folder, cache)
    assert holder.stdout.readline().strip() == "locked"
    waiter = _start(WAITER, kernel_folder, cache)
    assert waiter.stdout.readline().strip() == "waiting"
    holder.stdin.write("go\n")
    holder.stdin.flush()
    held, _ = holder.communicate(timeout=300)
    waited, _ = waiter.communicate(timeout=300)
    assert holder.returncode == 0 and waiter.returncode == 0
    assert held.strip() == "compiled ['plus_one']"
    # the waiter blocked on the lock until the holder had written the cache: no compile
    assert waited.strip() == "compiled []"


def test_without_a_cache_entry_the_kernel_compiles_and_runs(kernel_folder, tmp_path):
    waiter = _start(WAITER, kernel_folder, tmp_path / "cache")
    out, _ = waiter.communicate(timeout=300)
    assert waiter.returncode == 0
    assert out.strip().splitlines()[-1] == "compiled ['plus_one']"


DEFERRING = COUNTING + """
print("waiting", flush=True)
try:
    with compile_once.deferring():
        compile_once.compiled_for(kernel_module.plus_one, 1.0)
    print("no exception", compiles, flush=True)
except compile_once.CompileBusy as exc:
    print("busy", compiles, isinstance(exc, Exception), flush=True)
"""


def test_deferring_raises_at_once_instead_of_waiting(kernel_folder, tmp_path):
    cache = tmp_path / "cache"
    holder = _start(HOLDER, kernel_folder, cache)
    assert holder.stdout.readline().strip() == "locked"
    deferred = _start(DEFERRING, kernel_folder, cache)
    out, _ = deferred.communicate(timeout=300)   # returns while the holder still holds the lock
    holder.stdin.write("go\n")
    holder.stdin.flush()
    holder.communicate(timeout=300)
    # nothing compiled, and not an Exception: checks that report any Exception let it through
    assert out.strip().splitlines()[-1] == "busy [] False"


def test_without_a_writable_temporary_folder_it_compiles_without_a_lock(tmp_path, monkeypatch):
    from numba import njit

    from fastlib import compile_once

    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    # the lock folder would be made under a regular file: every attempt fails with an OSError
    monkeypatch.setattr(compile_once.tempfile, "gettempdir", lambda: str(blocker))

    @njit
    def twice(x):
        return 2.0 * x

    assert compile_once.compiled_for(twice, 1.5) is twice
    assert len(twice.overloads) == 1 and twice(1.5) == 3.0


# ---------------------------------------------------------------------------------------------
# call_typed: the overload the arguments' types choose, found without typing them again

def test_call_typed_picks_the_overload_each_kind_of_argument_types_to():
    import collections

    import numpy as np
    from numba import njit

    from fastlib.compile_once import call_typed

    Pair = collections.namedtuple("Pair", "a b")

    @njit
    def describe(x, pair, k):
        # what Numba typed: the dtype's width, the first column's sum, and k's kind
        return x.itemsize, x[:, 0].sum() + pair.a[0] + pair.b, k * 2

    c = np.arange(6, dtype=np.float32).reshape(3, 2)
    pair = Pair(np.ones(1), 1.5)
    # C-contiguous, Fortran-ordered, strided, read-only and float64 arrays; int and float k
    strided = np.arange(12.0).reshape(3, 4)[:, ::2]
    read_only = c.copy()
    read_only.flags.writeable = False
    cases = [(c, 2), (np.asfortranarray(c), 2), (strided, 2), (read_only, 2),
             (c.astype(np.float64), 2), (c, 2.5), (c, np.float32(2.5))]
    for x, k in cases:
        assert call_typed(describe, x, pair, k) == describe.py_func(x, pair, k)
    # a second round finds each overload by its key (no new one compiled) with the same result
    before = len(describe.overloads)
    for x, k in cases:
        assert call_typed(describe, x, pair, k) == describe.py_func(x, pair, k)
    assert len(describe.overloads) == before
    # every kind got its own overload: the key told them apart
    assert before == len({(a.dtype, a.flags.c_contiguous, a.flags.f_contiguous,
                           a.flags.writeable, type(k)) for a, k in cases})
