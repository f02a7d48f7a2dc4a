"""fastlib.cuda.simulator_fixes: the simulator's shared arrays and module swap are thread-safe.

Each check forces the interleaving that breaks the unpatched simulator (threads held at a
barrier, then released together; a swap left by one thread while another is still inside), so
a pass means the fix holds for that schedule, not that a race was lucky. They run in a fresh
process because NUMBA_ENABLE_CUDASIM must be set before numba is imported.
"""
from __future__ import annotations

from tests.sim_runs import run_python

_SCRIPT = r"""
import threading, types
import numpy as np
import fastlib.cuda  # installs the fixes under the simulator
from fastlib.cuda import simulator_fixes
from numba import cuda, float64
from numba.cuda.simulator import kernel, kernelapi

assert simulator_fixes.INSTALLED[0]
assert kernel.swapped_cuda_module is simulator_fixes._swapped_cuda_module

# 1. sixteen threads ask for the same shared array at once: one array for all of them
shared = kernelapi.FakeCUDAShared(0)
slow = np.empty  # widen the window between lookup and store, as a loaded machine does
def slow_empty(*a, **k):
    import time; time.sleep(0.01)
    return slow(*a, **k)
np.empty = slow_empty
gate, got = threading.Barrier(16), []
def ask():
    gate.wait()
    got.append(shared.array(8, float64))   # one source line: one allocation
threads = [threading.Thread(target=ask) for _ in range(16)]
[t.start() for t in threads]; [t.join() for t in threads]
np.empty = slow
print("SHARED", len({id(a) for a in got}), len(got))

# 2. a device function's module, entered by two threads: the fake module stays until both left
module = types.ModuleType("elsewhere")
module.cuda = cuda
exec("def f():\n    return cuda", module.__dict__)
fake = object()
a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
seen = {}
def first():
    with kernelapi.swapped_cuda_module(module.f, fake):
        a_in.set(); b_in.wait()
    a_out.set()
def second():
    a_in.wait()
    with kernelapi.swapped_cuda_module(module.f, fake):
        b_in.set(); a_out.wait()
        seen["inside after the first left"] = module.f() is fake
ta, tb = threading.Thread(target=first), threading.Thread(target=second)
ta.start(); tb.start(); ta.join(); tb.join()
print("SWAP", seen["inside after the first left"], module.cuda is cuda)

# 3. a kernel whose block reduces through shared memory gives the exact sum every time
@cuda.jit
def block_total(x, out):
    buf = cuda.shared.array(8, float64)
    t = cuda.threadIdx.x
    buf[t] = x[t]
    cuda.syncthreads()
    step = 4
    while step > 0:
        if t < step:
            buf[t] += buf[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        out[0] = buf[0]
x = np.arange(1.0, 9.0)
sums = set()
for _ in range(20):
    out = np.zeros(1)
    block_total[1, 8](x, out)
    sums.add(float(out[0]))
print("KERNEL", sorted(sums))
"""


def _run():
    proc = run_python(_SCRIPT, {"NUMBA_ENABLE_CUDASIM": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


def test_simulator_fixes_hold_under_forced_interleavings():
    out = _run()
    assert out["SHARED"] == "1 16"           # one array, handed to all sixteen threads
    assert out["SWAP"] == "True True"        # fake while anyone is inside; real once all left
    assert out["KERNEL"] == "[36.0]"         # 1 + 2 + ... + 8, exact in float64, every launch
