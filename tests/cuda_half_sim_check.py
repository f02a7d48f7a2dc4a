"""fastlib.cuda.half under numba's CUDA simulator: the device conversions against ml_dtypes.

Run by tests/test_half.py in a subprocess whose environment has ``NUMBA_ENABLE_CUDASIM=1``
(numba reads it at import). Prints one JSON line per check. By default a spread of patterns:
every 17th 16-bit pattern (the zeros, subnormals, infinities and NaNs all added) widened, and
the rounding boundaries of every 61st 16-bit number narrowed (and rounded to the format and
back in float32: ``round_device``); ``--every`` widens all 65536
patterns of each format and narrows every rounding boundary (many minutes: the simulator runs each
device thread in Python). Then fastlib.cuda's ops on 16-bit inputs against fastlib's CPU ops,
bit for bit against the same engine on the widened float32 inputs with each result rounded
once: the 16-bit path is exactly "widen, compute in float32, round once".
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_half import ALL16, FORMATS, _ml_narrow, _ml_widen, boundary_patterns  # noqa: E402


def report(name, ok, detail=""):
    print(json.dumps({"check": name, "ok": bool(ok), "detail": detail}), flush=True)


def main(every):
    from fastlib.cuda import device
    from fastlib.cuda import half as cuda_half

    special = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x007F, 0x0080,
                        0x7C00, 0xFC00, 0x7C01, 0x7E00, 0x7F80, 0xFF80, 0x7F81, 0x7FC0,
                        0x7BFF, 0x7F7F, 0xFFFF], dtype=np.uint16)
    for name in FORMATS:
        bits = ALL16 if every else np.unique(np.concatenate([ALL16[::17], special]))
        got = device.read(cuda_half.widen_device(device.put(bits), name))
        want = _ml_widen(bits, FORMATS[name])
        bad = np.flatnonzero(got != want)
        report(f"widen {name} ({bits.size} patterns)", bad.size == 0,
               str([(hex(bits[i]), hex(got[i]), hex(want[i])) for i in bad[:3]]))
        wide = boundary_patterns(name)
        if not every:   # a spread of the boundaries, and all of them near overflow and zero
            magnitude = wide & 0x7FFFFFFF
            near_ends = (magnitude >= 0x477FE000) & (magnitude <= 0x47800002) | (
                magnitude >= 0x7F7F7FFE) | (magnitude <= 0x00000102) | (
                (magnitude >= 0x33000000) & (magnitude <= 0x33000002))
            wide = np.unique(np.concatenate([wide[::211], wide[near_ends]]))
        got = device.read(cuda_half.narrow_device(device.put(wide), name))
        want = _ml_narrow(wide, FORMATS[name])
        bad = np.flatnonzero(got != want)
        report(f"narrow {name} ({wide.size} patterns)", bad.size == 0,
               str([(hex(wide[i]), hex(got[i]), hex(want[i])) for i in bad[:3]]))
        # the round trip mixed-precision training uses (float32 -> format -> float32, into
        # another buffer and in place): ml_dtypes' narrowing, widened back. Its two halves are
        # the conversions held above; here a sample of the boundaries (the simulator's device
        # function calls are slow), as uint32 patterns and, in place, as a float32 array
        wide = wide[::29]
        want = _ml_widen(_ml_narrow(wide, FORMATS[name]), FORMATS[name])
        d_out = device.empty(wide.size, np.uint32)
        cuda_half.round_device(device.put(wide), d_out, name)
        into = device.read(d_out)
        d_f32 = device.put(wide.view(np.float32))
        cuda_half.round_device(d_f32, d_f32, name)
        in_place = device.read(d_f32).view(np.uint32)
        bad = np.flatnonzero((into != want) | (in_place != want))
        report(f"round trip {name} ({wide.size} patterns)", bad.size == 0,
               str([(hex(wide[i]), hex(into[i]), hex(want[i])) for i in bad[:3]]))
    ops_rounded_once()


def ops_rounded_once():
    import fastlib.cuda as fc
    from fastlib.kernels import half

    rng = np.random.default_rng(5)
    for name, dtype in FORMATS.items():
        x = rng.standard_normal((3, 5)).astype(dtype)
        y = rng.standard_normal((5, 2)).astype(dtype)
        calls = [("tanh", [x], x), ("sum", [x], np.asarray(0.5, dtype)),
                 ("softmax", [x], x), ("layer_norm", [x], x), ("matmul", [x, y], np.ones((3, 2), dtype)),
                 ("cross_entropy", [x, np.array([0, 4, 2])], np.asarray(1.5, dtype))]
        for op, inputs, g in calls:
            wide = [half.widen(a) if a.dtype == dtype else a for a in inputs]
            out = fc.forward(op, inputs)
            once = half.narrow(fc.forward(op, wide), dtype)
            grads = fc.vjp(op, inputs, g)
            grads_once = [None if r is None else half.narrow(r, dtype)
                          for r in fc.vjp(op, wide, half.widen(g))]
            same = out.dtype == dtype and np.array_equal(out.view(np.uint16),
                                                         once.view(np.uint16))
            same = same and all(a is None and b is None or (
                a.dtype == dtype and np.array_equal(a.view(np.uint16), b.view(np.uint16)))
                for a, b in zip(grads, grads_once))
            report(f"fastlib.cuda {op} {name}: float32 on the widened inputs, rounded once",
                   same)


if __name__ == "__main__":
    main("--every" in sys.argv[1:])
