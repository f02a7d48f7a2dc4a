"""``train(device="cuda")`` under numba's CUDA simulator: the frame's checks, one JSON line each.

Run by tests/test_cuda_train.py in a subprocess whose environment has
``NUMBA_ENABLE_CUDASIM=1`` (numba reads it at import). Standalone::

    NUMBA_ENABLE_CUDASIM=1 python tests/cuda_train_sim_check.py [--only SUBSTRING] [--slow]

On a machine with a GPU, the same command without the variable runs the checks on the GPU.

Each line is ``{"check": name, "ok": bool, "detail": str}``; :func:`check_names` lists the
names without running anything. The simulator is slow (a tiny MLP step takes ~0.3-1 s), so the
default checks train a handful of steps in all; ``--slow`` adds train_sh and every optimizer.

References are independent of the device code: fastlib's CPU training of the same model (a
separate implementation: BLAS GEMMs and Numba CPU kernels, batch by batch except where a check
names the CPU's compiled program) in float64, where both engines round
a few times per op on O(1) values, so 1e-12 relative (~4500 eps64) is far above their rounding
differences and far below any error in the math (a wrong clip, a skipped term: >= 1e-4); the
device's own uninterrupted run for bit-for-bit claims (resume, restored weights); the initial
weights for "nothing changed"; numba's simulator array class (not fastlib's counter) for the
number of device-to-host copies.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
import warnings

import numpy as np

REL = 1e-12  # float64 device vs CPU, relative to the largest parameter (see the docstring)

DEFAULT = ("frame:one readback per step", "frame:one readback per epoch",
           "frame:host stale until synchronised",
           "frame:to_host copies the weights in one readback", "frame:host read synchronises",
           "frame:save synchronises", "frame:resume is bit for bit",
           "guard:non-finite gradient skips the step", "guard:non-finite loss restores",
           "clip:value", "clip:norm", "unsupported:custom layer", "unsupported:algorithm",
           "layers:every Dense activation", "layers:SwiGLU fused, against the CPU",
           "layers:attention flash-style, against the CPU",
           "layers:recurrent persistent, against the CPU",
           "layers:recurrent float32, against the CPU",
           "recurrent:persistent and per-step agree bit for bit",
           "budget:recurrent launches constant in the time steps",
           "compile:only the run's signatures, once",
           "losses:all five", "budget:MLP of L Dense layers", "budget:SwiGLU",
           "budget:transformer block", "budget:every layer kind",
           "budget:epoch traffic", "mode:graph and launches agree",
           "graph:mode and reason reported", "graph:replayed steps equal launches",
           "graph:failed recording falls back to launches",
           "graph:a refused persistent kernel records per step",
           "graph:a copy inside a recorded step is refused",
           "program:MLP", "program:LSTM and RNN", "program:attention block",
           "program:transformer block", "program:Parallel and nesting",
           "unsupported:softmax named, with the fix",
           "mixed:device equals the per-batch CPU path", "mixed:resume is bit for bit",
           "mixed:masters stay float32 on the host", "mixed:graph replays equal launches",
           "mixed:bench train --dtypes on the device")
SLOW = ("slow:train_sh", "slow:optimizers", "slow:every layer type",
        "slow:train_sh resume is bit for bit")


def check_names(slow=False):
    """Every check name a run reports."""
    return list(DEFAULT) + (list(SLOW) if slow else [])


def _mlp(dtype=np.float64, seed=1):
    import fastlib
    return fastlib.Sequential([fastlib.Dense(3, 4, "tanh"), fastlib.Dense(4, 2)], dtype=dtype,
                              seed=seed)


def _data(n=4):
    rng = np.random.default_rng(7)
    return rng.standard_normal((n, 3)), rng.integers(0, 2, n)


def _close(a_params, b_params, rel=REL):
    """(ok, detail): every parameter within ``rel`` of the largest parameter magnitude."""
    scale = max(float(np.max(np.abs(v))) for v in b_params.values())
    worst = max(float(np.max(np.abs(a_params[k] - b_params[k]))) for k in b_params)
    return worst <= rel * scale, f"max |device - reference| = {worst:.3g} (scale {scale:.3g})"


class CopyCounter:
    """Counts device-to-host copies by wrapping the simulator's array class (not fastlib's)."""

    def __init__(self):
        from fastlib.cuda import config
        if config.SIMULATOR:
            from numba.cuda.simulator.cudadrv import devicearray
            self.cls = devicearray.FakeCUDAArray
        else:  # a real GPU: numba's device array class
            from numba.cuda.cudadrv import devicearray
            self.cls = devicearray.DeviceNDArray
        self.count = 0

    def __enter__(self):
        original = self.cls.copy_to_host
        self.original = original

        def counted(array, *args, **kwargs):
            self.count += 1
            return original(array, *args, **kwargs)
        self.cls.copy_to_host = counted
        return self

    def __exit__(self, *exc):
        self.cls.copy_to_host = self.original


def run_frame(report):
    import fastlib

    x, y = _data()
    quiet = dict(optimizer="Adam", verbose=False, shuffle=True, seed=3)
    initial = {k: v.copy() for k, v in _mlp().parameters().items()}
    cpu = _mlp()
    fastlib.train(cpu, x, y, 1, 2, 0.1, "cross_entropy", **quiet)
    want = cpu.parameters()

    from fastlib.cuda.training import DeviceRun

    DeviceRun.default_readback = "step"
    try:
        with CopyCounter() as copies:
            r = fastlib.train(_mlp(), x, y, 1, 2, 0.1, "cross_entropy", device="cuda", **quiet)
    finally:
        DeviceRun.default_readback = "epoch"
    report("frame:one readback per step", copies.count == 2 and len(r.loss_history) == 1,
           f"{copies.count} device-to-host copies for 2 steps (readback='step')")
    m = _mlp()
    with CopyCounter() as copies:
        r2 = fastlib.train(m, x, y, 1, 2, 0.1, "cross_entropy", device="cuda", **quiet)
    same = r2.loss_history == r.loss_history and r2.accuracy_history == r.accuracy_history
    report("frame:one readback per epoch", copies.count == 1 and same,
           f"{copies.count} device-to-host copies for 1 epoch of 2 steps; the same loss and "
           f"accuracy as per-step readback: {same}")
    # the raw host arrays, read without the synchronising property
    store = {f"{i}.{k}": v for i, layer in enumerate(m.layers)
             for k, v in layer.__dict__["_param_store"].items()}
    unchanged = all(np.array_equal(store[k], initial[k]) for k in initial)
    report("frame:host stale until synchronised", m.host_is_stale and unchanged,
           f"host_is_stale={m.host_is_stale}, host arrays still the initial ones: {unchanged}")
    with CopyCounter() as copies:
        m.to_host()
    ok, detail = _close(store, want)
    report("frame:to_host copies the weights in one readback",
           ok and copies.count == 1 and not m.host_is_stale,
           f"{copies.count} copies for {len(initial)} weights (one flat buffer); {detail}")

    m2 = _mlp()
    fastlib.train(m2, x, y, 1, 2, 0.1, "cross_entropy", device="cuda", **quiet)
    out = m2(x)  # a CPU forward on stale weights must synchronise first
    ok, detail = _close({"out": out}, {"out": cpu(x)})
    report("frame:host read synchronises", ok and not m2.host_is_stale, detail)

    m3 = _mlp()
    fastlib.train(m3, x, y, 1, 2, 0.1, "cross_entropy", device="cuda", **quiet)
    with tempfile.TemporaryDirectory() as tmp:
        m3.save(os.path.join(tmp, "m.npz"))
        loaded = fastlib.load(os.path.join(tmp, "m.npz")).parameters()
    ok, detail = _close(loaded, want)
    report("frame:save synchronises", ok, detail)


def run_resume(report):
    import fastlib

    x, y = _data()
    kw = dict(optimizer="Adam", verbose=False, seed=5, device="cuda")
    full = _mlp()
    fastlib.train(full, x, y, 2, 4, 0.1, "cross_entropy", **kw)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ck.npz")
        part = _mlp()
        fastlib.train(part, x, y, 1, 4, 0.1, "cross_entropy", checkpoint=path, **kw)
        resumed = _mlp()
        fastlib.train(resumed, x, y, 2, 4, 0.1, "cross_entropy", resume=path, **kw)
    a, b = full.parameters(), resumed.parameters()
    diff = [k for k in a if not np.array_equal(a[k], b[k])]
    report("frame:resume is bit for bit", not diff, f"parameters that differ: {diff}")


def run_guards(report):
    import fastlib

    # Dense(1, 1) with w x = 1, target -1e8: the loss (1 + 1e8)^2 is finite in float32 but
    # dL/dw = 2 (1 + 1e8) x overflows for x = 1e31 (about 2e39 > 3.4e38).
    m = fastlib.Sequential([fastlib.Dense(1, 1)], dtype=np.float32)
    m.load_parameters({"0.weight": [[1e-31]], "0.bias": [0.0]})
    before = {k: v.copy() for k, v in m.parameters().items()}
    x = np.full((4, 1), 1e31, np.float32)
    t = np.full((4, 1), -1e8, np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = fastlib.train(m, x, t, 1, 2, 0.1, "mse", device="cuda", verbose=False)
    same = all(np.array_equal(v, before[k]) for k, v in m.parameters().items())
    warned = any("skipped 2 optimizer step" in str(w.message) for w in caught)
    loss_ok = abs(r.loss_history[0] / (1 + 1e8) ** 2 - 1) <= 8 * float(np.finfo(np.float32).eps)
    report("guard:non-finite gradient skips the step",
           r.skipped_steps == 2 and same and warned and loss_ok and not r.diverged,
           f"skipped {r.skipped_steps}, unchanged {same}, warned {warned}, loss "
           f"{r.loss_history}")

    # Dense(1, 1), x = 1e3, SGD lr 1: each step multiplies the error by 1 - 2 lr x^2 ~ -2e6,
    # so the float32 loss overflows at the fourth step: epoch 2 of 2-step epochs
    def tiny():
        return fastlib.Sequential([fastlib.Dense(1, 1)], dtype=np.float32, seed=0)
    xd = np.full((2, 1), 1e3, np.float32)
    td = np.ones((2, 1), np.float32)
    kw = dict(optimizer="SGD", shuffle=False, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dev = tiny()
        rd = fastlib.train(dev, xd, td, 5, 1, 1.0, "mse", device="cuda", **kw)
        rc = fastlib.train(tiny(), xd, td, 5, 1, 1.0, "mse", **kw)
    ref = tiny()
    if rd.restored_epoch:
        fastlib.train(ref, xd, td, rd.restored_epoch, 1, 1.0, "mse", device="cuda", **kw)
    same = all(np.array_equal(dev.parameters()[k], v) for k, v in ref.parameters().items())
    report("guard:non-finite loss restores",
           rd.diverged and rc.diverged and rd.restored_epoch == rc.restored_epoch
           and rd.epochs_run == rc.epochs_run and same and "restored" in rd.stop_reason,
           f"device: diverged {rd.diverged} restored_epoch {rd.restored_epoch} "
           f"({rd.stop_reason}); CPU: restored_epoch {rc.restored_epoch}; weights equal to a "
           f"run of that many epochs: {same}")


def run_clip(report):
    import fastlib

    x, y = _data()
    for mode in ("value", "norm"):
        kw = dict(optimizer="Momentum", verbose=False, seed=2, gradient_clip=0.05,
                  clip_mode=mode)
        cpu, dev = _mlp(), _mlp()
        fastlib.train(cpu, x, y, 1, 2, 0.5, "cross_entropy", **kw)
        fastlib.train(dev, x, y, 1, 2, 0.5, "cross_entropy", device="cuda", **kw)
        unclipped = _mlp()
        fastlib.train(unclipped, x, y, 1, 2, 0.5, "cross_entropy", optimizer="Momentum",
                      verbose=False, seed=2)
        ok, detail = _close(dev.parameters(), cpu.parameters())
        # the clip must matter here, or the check could not see a device that ignores it
        matters = not _close(unclipped.parameters(), cpu.parameters(), 1e-6)[0]
        report(f"clip:{mode}", ok and matters, f"{detail}; clipping changes the result: "
                                               f"{matters}")


def run_unsupported(report):
    import fastlib

    class Doubler(fastlib.Layer):
        def forward(self, x):
            return 2 * x

        def backward(self, g, need_input_grad=True):
            return 2 * g, {}

        def infer_shape(self, shape):
            return shape

        def get_config(self):
            return {"type": "Doubler"}

    x, y = _data()
    model = fastlib.Sequential([fastlib.Dense(3, 2), Doubler()])
    before = {k: v.copy() for k, v in model.parameters().items()}
    try:
        fastlib.train(model, x, y, 1, 2, 0.1, "cross_entropy", device="cuda", verbose=False)
        report("unsupported:custom layer", False, "no error")
    except ValueError as exc:
        msg = str(exc)
        same = all(np.array_equal(v, before[k]) for k, v in model.parameters().items())
        report("unsupported:custom layer",
               "model.layers[1]" in msg and "Doubler" in msg and "device='cpu'" in msg and same
               and not model.host_is_stale, msg)
    try:
        fastlib.train(_mlp(), x, None, 1, 2, 0.1, None, device="cuda", algorithm="cd",
                      verbose=False)
        report("unsupported:algorithm", False, "no error")
    except ValueError as exc:
        report("unsupported:algorithm", "'cd'" in str(exc) and "CPU" in str(exc), str(exc))
    msgs = []
    # a softmax runs after the row before it: a Softmax with no layer before it in a
    # Sequential (its input may be read by other rows) and one over another axis have none
    for layers in ([fastlib.Softmax(), fastlib.Dense(3, 2)],
                   [fastlib.Dense(3, 2), fastlib.Softmax(axis=0)]):
        model = fastlib.Sequential(layers)
        try:
            fastlib.train(model, x, y, 1, 2, 0.1, "cross_entropy", device="cuda", verbose=False)
            msgs.append(None)
        except ValueError as exc:
            msgs.append(str(exc))
    report("unsupported:softmax named, with the fix",
           all(m and "Softmax" in m and "device='cpu'" in m for m in msgs)
           and "model.layers[0]" in (msgs[0] or "") and "model.layers[1]" in (msgs[1] or ""),
           msgs)


def run_activations(report):
    import fastlib
    from fastlib.layers import ACTIVATIONS

    # one Parallel branch per activation: a single step runs all ten forward and backward
    # (softmax: the linear row and the device's softmax after it)
    def model():
        branches = [fastlib.Dense(3, 2, a) for a in ACTIVATIONS]
        # and a Softmax layer on the join's columns (the device's softmax after its last row)
        return fastlib.Sequential([fastlib.Parallel(branches), fastlib.Softmax(),
                                   fastlib.Dense(2 * len(branches), 2)],
                                  dtype=np.float64, seed=3)
    x, y = _data()
    cpu, dev = model(), model()
    kw = dict(optimizer="SGD", verbose=False, seed=1)
    fastlib.train(cpu, x, y, 1, 2, 0.5, "cross_entropy", **kw)
    fastlib.train(dev, x, y, 1, 2, 0.5, "cross_entropy", device="cuda", **kw)
    ok, detail = _close(dev.parameters(), cpu.parameters())
    report("layers:every Dense activation", ok, f"{sorted(ACTIVATIONS)}: {detail}")


def run_attention(report):
    """MultiHeadAttention's flash-style core (one block per (batch, head), the log-sum-exp
    kept, the probabilities recomputed in backward), causal and not, against the CPU engine:
    10 positions (more than the simulator's 8 threads: each thread owns two rows) and 6
    (batch, head) blocks (more than its 4-block grid: blocks loop)."""
    import fastlib
    from fastlib import layers as L

    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 10, 4))
    t = rng.standard_normal((3, 10, 4))
    bad, moved = [], True
    for causal in (False, True):
        def model():
            return fastlib.Sequential([L.MultiHeadAttention(4, 2, causal=causal)],
                                      dtype=np.float64, seed=6)
        cpu, dev = model(), model()
        kw = dict(optimizer="SGD", verbose=False, seed=1)
        fastlib.train(cpu, x, t, 1, 3, 0.5, "mse", **kw)
        fastlib.train(dev, x, t, 1, 3, 0.5, "mse", device="cuda", **kw)
        ok, detail = _close(dev.parameters(), cpu.parameters())
        moved = moved and not _close(model().parameters(), cpu.parameters(), 1e-6)[0]
        if not ok:
            bad.append(f"causal={causal}: {detail}")
    report("layers:attention flash-style, against the CPU", not bad and moved,
           "; ".join(bad) or f"causal and not within {REL} of the CPU; training moved the "
                             f"weights: {moved}")


def _recurrent_model(dtype=np.float64):
    """Tiles of every kind under the simulator's constants (recurrent.geometry reports them):
    LSTM(3, 5) has 3 unit tiles each way (weights from L2 in its one-block cooperative grid),
    LSTM(5, 2) and RNN(2, 6)'s forward one (weights in shared memory); 3 samples give products
    split into 2 and 4 shares, and per-step launches of up to 4 blocks loop over 6 tiles."""
    import fastlib
    from fastlib import layers as L

    return fastlib.Sequential([L.LSTM(3, 5, return_sequences=True),
                               L.LSTM(5, 2, return_sequences=True), L.RNN(2, 6),
                               L.Dense(6, 2)], dtype=dtype, seed=9)


def _recurrent_data(steps=4):
    rng = np.random.default_rng(12)
    return rng.standard_normal((3, steps, 3)), rng.integers(0, 2, 3)


def train_keeping_run(*args, **kwargs):
    """``fastlib.train(...)`` on the device and the run's DeviceRun (its recurrent mode)."""
    import fastlib
    from fastlib.cuda.training import DeviceRun

    runs, original = [], DeviceRun.finish

    def finish(self):
        runs.append(self)
        original(self)
    DeviceRun.finish = finish
    try:
        result = fastlib.train(*args, device="cuda", **kwargs)
    finally:
        DeviceRun.finish = original
    return result, runs[-1]


def _tile_kinds(model, n_batch):
    """Per recurrent layer and direction: (cached weights, shares) of its persistent launch in
    the simulator's one-block cooperative grid."""
    from fastlib.cuda import recurrent

    kinds = []
    for layer in model.layers:
        if type(layer).__name__ in ("RNN", "LSTM"):
            gates = 4 if type(layer).__name__ == "LSTM" else 1
            for back in (False, True):
                _, _, shares, _, _, cache = recurrent.geometry(n_batch, layer.hidden_size,
                                                               gates, back, 1)
                kinds.append((bool(cache), shares))
    return kinds


def run_recurrent(report):
    """The persistent recurrent kernels (every time step in one cooperative launch per layer
    and direction) against the CPU engine in float64 and float32, against their own per-step
    launches bit for bit, and their launches per training step at several sequence lengths."""
    import fastlib

    x, y = _recurrent_data()
    kw = dict(optimizer="SGD", verbose=False, seed=1)
    cpu = _recurrent_model()
    fastlib.train(cpu, x, y, 1, 3, 0.5, "cross_entropy", **kw)
    dev = _recurrent_model()
    _, run = train_keeping_run(dev, x, y, 1, 3, 0.5, "cross_entropy", **kw)
    ok, detail = _close(dev.parameters(), cpu.parameters())
    moved = not _close(_recurrent_model().parameters(), cpu.parameters(), 1e-6)[0]
    kinds = _tile_kinds(dev, 3)
    covered = {c for c, _ in kinds} == {True, False} and max(s for _, s in kinds) > 1
    report("layers:recurrent persistent, against the CPU",
           ok and moved and run.recurrent_mode == "persistent" and covered,
           f"{detail}; training moved the weights: {moved}; mode {run.recurrent_mode}; "
           f"(cached weights, shares) per layer and direction {kinds}")

    os.environ["FASTLIB_CUDA_PERSISTENT"] = "0"
    try:
        stepped = _recurrent_model()
        _, run_s = train_keeping_run(stepped, x, y, 1, 3, 0.5, "cross_entropy", **kw)
    finally:
        os.environ.pop("FASTLIB_CUDA_PERSISTENT", None)
    a, b = dev.parameters(), stepped.parameters()
    differ = [k for k in a if not np.array_equal(a[k], b[k])]
    report("recurrent:persistent and per-step agree bit for bit",
           not differ and run_s.recurrent_mode == "per-step"
           and "FASTLIB_CUDA_PERSISTENT=0" in (run_s.recurrent_reason or "")
           and run.recurrent_reason is None,
           f"parameters that differ: {differ}; modes {run.recurrent_mode} / "
           f"{run_s.recurrent_mode} ({run_s.recurrent_reason})")

    run_recurrent_float32(report, x, y, kw)
    run_recurrent_budget(report)


def run_recurrent_float32(report, x, y, kw):
    """float32 on the device (products summed in float32, as the CPU's BLAS does) against the
    CPU engine, both measured against float64 from the same float32 weights: the conformance
    ``train`` rows' rule (docs/CONTRACTS.md), normwise in float32 eps, the device within
    max(4 (L + 1) k, 2 x the CPU's own error) of float64 and max(4 (L + 1) k, 3 x) of the CPU."""
    import fastlib
    from reports.conformance.device_training import float32_bound

    start = _recurrent_model(np.float32).parameters()
    runs = {}
    for name, dtype, device in (("cpu", np.float32, "cpu"), ("cuda", np.float32, "cuda"),
                                ("ref", np.float64, "cpu")):
        m = _recurrent_model(dtype)
        m.load_parameters({k: v.astype(dtype) for k, v in start.items()})
        xs = x.astype(np.float32).astype(dtype)
        fastlib.train(m, xs, y, 1, 3, 0.5, "cross_entropy", device=device, **kw)
        runs[name] = {k: v.astype(np.float64) for k, v in m.parameters().items()}
    eps = float(np.finfo(np.float32).eps)
    floor = max(float(np.linalg.norm(v.astype(np.float64))) for v in start.values())

    def err(a, b):
        return max(float(np.linalg.norm(a[k] - b[k])) / (eps * max(
            float(np.linalg.norm(b[k])), floor)) for k in b)
    lo = float32_bound(_recurrent_model().get_config(), 1)
    cpu_ref, dev_ref, dev_cpu = (err(runs["cpu"], runs["ref"]), err(runs["cuda"], runs["ref"]),
                                 err(runs["cuda"], runs["cpu"]))
    report("layers:recurrent float32, against the CPU",
           dev_ref <= max(lo, 2 * cpu_ref) and dev_cpu <= max(lo, 3 * cpu_ref),
           f"in float32 eps: device vs float64 {dev_ref:.3g}, device vs CPU {dev_cpu:.3g}, CPU "
           f"vs float64 {cpu_ref:.3g}; floor {lo:g}")


def run_recurrent_budget(report):
    """Launches per step of an LSTM and an RNN at 2, 3 and 6 time steps: constant with the
    persistent kernels (the step's 4 + LSTM 9 as the first layer + RNN 12 + Dense 3), 2 per
    step per layer more with per-step launches."""
    import fastlib
    from fastlib import layers as L

    def model():
        return fastlib.Sequential([L.LSTM(2, 3, return_sequences=True), L.RNN(3, 3),
                                   L.Dense(3, 2)], dtype=np.float64, seed=4)
    rng = np.random.default_rng(5)
    kw = dict(optimizer="Adam", verbose=False, seed=1)
    counts, bad = {}, []
    for persistent in ("1", "0"):
        os.environ["FASTLIB_CUDA_PERSISTENT"] = persistent
        try:
            for steps in (2, 3, 6):
                x, y = rng.standard_normal((2, steps, 2)), rng.integers(0, 2, 2)
                m = model()
                r = fastlib.train(m, x, y, 2, 2, 0.1, "cross_entropy", device="cuda", **kw)
                want = step_budget(m, steps, per_step=persistent == "0")
                ok, detail = _held(r, want)
                got = r.device_counts["kernel_launches"]
                counts[(persistent, steps)] = got
                if not ok or (r.cuda_mode == "launches" and got != want):
                    bad.append(f"T={steps}, persistent={persistent}: {detail}")
        finally:
            os.environ.pop("FASTLIB_CUDA_PERSISTENT", None)
    constant = len({counts[("1", t)] for t in (2, 3, 6)}) == 1
    report("budget:recurrent launches constant in the time steps", not bad and constant,
           "; ".join(bad) or "launches per step at T = 2, 3, 6: persistent "
           f"{[counts[('1', t)] for t in (2, 3, 6)]}, per step "
           f"{[counts[('0', t)] for t in (2, 3, 6)]}; no allocation, copy or wait")


def run_compile(report):
    """Kernels compile one signature at their first launch: a float32 run compiles only float32
    signatures (and the fill of its float64 and int64 bookkeeping buffers), each once; the same
    run again compiles nothing; a float64 run then has the float64 ones."""
    import fastlib
    from fastlib.cuda import device

    def model(dtype):
        return fastlib.Sequential([fastlib.Dense(3, 4, "softplus"), fastlib.Dense(4, 2)],
                                  dtype=dtype, seed=4)
    x, y = _data()
    kw = dict(optimizer="RMSprop", verbose=False, seed=2, device="cuda")
    start = len(device.COMPILES)
    fastlib.train(model(np.float32), x.astype(np.float32), y, 1, 2, 0.1, "cross_entropy", **kw)
    first = device.COMPILES[start:]
    again = len(device.COMPILES)
    fastlib.train(model(np.float32), x.astype(np.float32), y, 1, 2, 0.1, "cross_entropy", **kw)
    repeat = device.COMPILES[again:]
    fastlib.train(model(np.float64), x, y, 1, 2, 0.1, "cross_entropy", **kw)
    wide = device.COMPILES[again:]
    # the fill of the run's float64 numbers and int64 arrival counters is the one kernel a
    # float32 run launches on other dtypes
    only32 = all("float32" in sig or name == "fill" for name, sig, _ in first)
    once = len({(n, sig) for n, sig, _ in device.COMPILES}) == len(device.COMPILES)
    # the float64 run compiled no float32 signature, and the float64 twin of every kernel the
    # float32 run compiled exists now (compiled by it, or by an earlier check of this process)
    compiled = {(n, sig) for n, sig, _ in device.COMPILES}
    has64 = all("float32" not in sig for _, sig, _ in wide) and all(
        tuple(v.replace("float32", "float64") for v in (n, sig)) in compiled
        for n, sig, _ in first if n != "fill")
    report("compile:only the run's signatures, once",
           bool(first) and only32 and once and not repeat and has64,
           f"float32 run: {len(first)} signatures, all float32: {only32}; the same run again: "
           f"{len(repeat)}; float64 run: {len(wide)} new, none float32 and every float64 twin "
           f"compiled: {has64}; each compiled "
           f"once: {once}")


def _swiglu_pair():
    import fastlib
    from fastlib import layers as L

    # hidden 5 and 6 straddle the simulator's 4-wide tiles (the fused input-gradient GEMM
    # crosses from the gate's half to the up half inside a tile); 6 rows make two row tiles
    return fastlib.Sequential([L.SwiGLU(3, 5, 4), L.SwiGLU(4, 6, 2)], dtype=np.float64, seed=2)


def run_swiglu(report):
    """Two SwiGLU layers (the first needs no input gradient, the second does): the device's
    fused kernels against the CPU engine, and the launches per step counted exactly."""
    import fastlib

    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((6, 3)), rng.integers(0, 2, 6)
    # SGD: its step is linear in the gradient, so the two engines' rounding differences stay
    # at rounding level (Adam's g / sqrt(v) turns the noise of a near-zero gradient component
    # into a difference of order lr * 1e-11 here, on both the fused and the unfused kernels)
    kw = dict(optimizer="SGD", verbose=False, seed=1)
    cpu, dev = _swiglu_pair(), _swiglu_pair()
    fastlib.train(cpu, x, y, 2, 6, 0.5, "cross_entropy", **kw)
    r = fastlib.train(dev, x, y, 2, 6, 0.5, "cross_entropy", device="cuda", **kw)
    ok, detail = _close(dev.parameters(), cpu.parameters())
    # the check must be able to fail: the trained weights moved well beyond the tolerance
    moved = not _close(_swiglu_pair().parameters(), cpu.parameters(), 1e-6)[0]
    report("layers:SwiGLU fused, against the CPU", ok and moved,
           f"{detail}; training changed the weights: {moved}")
    budget = 4 + 5 + 6
    assert step_budget(dev) == budget
    ok, detail = _held(r, budget)
    exact = r.cuda_mode == "graph" or r.device_counts["kernel_launches"] == budget
    report("budget:SwiGLU", ok and exact,
           f"{detail} (4 per step + SwiGLU 2 forward, 3 backward as the first layer, 4 after)")


def run_losses(report):
    import fastlib

    # 16 rows: enough outputs near every decision threshold that a wrong one changes accuracy
    rng = np.random.default_rng(11)
    n = 16
    x = rng.standard_normal((n, 3))
    targets = {"mse": rng.standard_normal((n, 2)),
               "cross_entropy": rng.integers(0, 2, n),
               "categorical_cross_entropy": np.eye(2)[rng.integers(0, 2, n)],
               "binary_cross_entropy": rng.integers(0, 2, (n, 2)).astype(float),
               "binary_cross_entropy_with_logits": rng.integers(0, 2, (n, 2)).astype(float)}
    bad = []
    for loss, y in targets.items():
        act = "sigmoid" if loss == "binary_cross_entropy" else "linear"

        def model():
            return fastlib.Sequential([fastlib.Dense(3, 2, act)], dtype=np.float64, seed=5)
        cpu, dev = model(), model()
        kw = dict(optimizer="SGD", verbose=False, shuffle=False)
        rc = fastlib.train(cpu, x, y, 1, n, 0.5, loss, **kw)
        rd = fastlib.train(dev, x, y, 1, n, 0.5, loss, device="cuda", **kw)
        ok, detail = _close(dev.parameters(), cpu.parameters())
        loss_ok = abs(rd.loss_history[0] - rc.loss_history[0]) <= REL * abs(rc.loss_history[0])
        acc_ok = rd.accuracy_history == rc.accuracy_history
        if not (ok and loss_ok and acc_ok):
            bad.append(f"{loss}: {detail}; loss {rd.loss_history} vs {rc.loss_history}; "
                       f"accuracy {rd.accuracy_history} vs {rc.accuracy_history}")
    report("losses:all five", not bad, "; ".join(bad) or "weights, loss and accuracy agree")


def run_every_layer(report):
    import fastlib
    from fastlib import layers as L

    def model():
        return fastlib.Sequential([
            L.Embedding(5, 4), L.MultiHeadAttention(4, 2, causal=True),
            L.LSTM(4, 3, return_sequences=True), L.RNN(3, 4, return_sequences=True),
            L.SwiGLU(4, 3, 4), L.LayerNorm(4), L.RMSNorm(4),
            L.Parallel([L.Dense(4, 2, "relu"), L.Sequential([L.Dense(4, 2, "gelu")])]),
            L.RNN(4, 3), L.Dense(3, 3), L.Softmax()], dtype=np.float64, seed=2)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, (4, 3))
    t = np.eye(3)[rng.integers(0, 3, 4)]
    cpu, dev = model(), model()
    kw = dict(optimizer="Adam", verbose=False, seed=1)
    fastlib.train(cpu, x, t, 1, 2, 0.05, "mse", **kw)
    fastlib.train(dev, x, t, 1, 2, 0.05, "mse", device="cuda", **kw)
    ok, detail = _close(dev.parameters(), cpu.parameters(), 1e-9)
    report("slow:every layer type", ok, detail)


# Kernel launches per training step in "launches" mode (docs/gpu.md, "Launch budget"), on top of
# the step's own 4 (batch gather, loss, guard partials, guarded update). ``first`` is the model's
# first layer (it needs no input gradient). T: time steps.
def _dense_budget(layer, first):
    extra = 2 if layer.activation == "softmax" else 0
    return (2 if first else 3) + extra


def _recurrent_budget(layer, steps, first, per_step):
    # forward: layout, input GEMM, the time steps, layout; backward: layout (2 for the last
    # state), the time steps, grad W_ih, grad b, grad W_hh, and grad x with its layout
    through_time = 2 * steps if per_step else 2
    return through_time + (7 if first else 9) + (0 if layer.return_sequences else 1)


def _budget(layer, steps, first, per_step=False):
    kind = type(layer).__name__
    if kind == "Dense":
        return _dense_budget(layer, first)
    if kind in ("RNN", "LSTM"):
        return _recurrent_budget(layer, steps, first, per_step)
    if kind == "MultiHeadAttention":
        # forward: the q, k, v GEMM, the core, the output GEMM; backward: w_o's two, the
        # core's, w_qkv's with b_qkv's, and the input's cotangent
        return 7 if first else 8
    if kind == "Sequential":
        return sum(_budget(c, steps, first and i == 0, per_step)
                   for i, c in enumerate(layer._children))
    if kind == "Parallel":
        n = len(layer._children)
        inner = sum(_budget(c, steps, first, per_step) for c in layer._children)
        # the joins' rows (an Add: 1 forward, a copy of its second input's cotangent; a Columns
        # row: 1 each way) and the adds of the input's cotangent
        glue = 3 * (n - 1) if layer.combine == "add" else 2 * n + (n - 1)
        return inner + glue
    if kind == "SwiGLU":
        return 5 if first else 6
    fixed = {"LayerNorm": 3, "RMSNorm": 3, "Softmax": 2, "Embedding": 2}
    return fixed[kind]


def step_budget(model, steps=1, per_step=False):
    """Launches per step allowed for ``model`` (a Sequential) in "launches" mode (recurrent
    layers through persistent kernels, or ``per_step``)."""
    return 4 + sum(_budget(c, steps, i == 0, per_step) for i, c in enumerate(model._children))


def _held(r, budget):
    """(ok, detail): the last epoch's per-step counts within ``budget`` and nothing else."""
    c = r.device_counts
    quiet = all(c[k] == 0 for k in ("allocations", "h2d_copies", "d2h_copies",
                                     "synchronizations"))
    if r.cuda_mode == "graph":
        ok = c["graph_launches"] == 1 and c["kernel_launches"] == 0 and quiet
    else:
        ok = c["kernel_launches"] <= budget and c["graph_launches"] == 0 and quiet
    return ok, f"mode {r.cuda_mode}, budget {budget}: " + \
        ", ".join(f"{k} {v:g}" for k, v in c.items() if k != "per_epoch")


def run_budget(report):
    import fastlib
    from fastlib import layers as L

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3)), rng.integers(0, 2, 4)
    kw = dict(optimizer="Adam", verbose=False, seed=1, device="cuda")
    bad = []
    for depth in (1, 2, 3):
        acts = ["tanh", "relu"][:depth - 1]
        sizes = [3] + [4] * (depth - 1) + [2]
        layers = [L.Dense(sizes[i], sizes[i + 1], (acts + ["linear"])[i]) for i in range(depth)]
        m = fastlib.Sequential(layers, dtype=np.float64, seed=2)
        r = fastlib.train(m, x, y, 2, 2, 0.1, "cross_entropy", **kw)
        assert step_budget(m) == 3 * depth + 3  # the formula is the 3L + 3
        ok, detail = _held(r, 3 * depth + 3)
        if not ok or (r.cuda_mode == "launches" and r.device_counts["kernel_launches"]
                      != 3 * depth + 3):
            bad.append(f"L={depth}: {detail}")
    report("budget:MLP of L Dense layers", not bad,
           "; ".join(bad) or "at most 3L + 3 launches per step for L = 1, 2, 3, and no "
           "allocation, copy or wait inside the epoch")

    run_transformer_budget(report, kw)

    steps = 2
    m = fastlib.Sequential([
        L.Embedding(5, 4), L.MultiHeadAttention(4, 2, causal=True),
        L.LSTM(4, 4, return_sequences=True), L.RNN(4, 4, return_sequences=True),
        L.SwiGLU(4, 3, 4), L.LayerNorm(4), L.RMSNorm(4),
        L.Parallel([L.Dense(4, 2, "relu"), L.Sequential([L.Dense(4, 2, "gelu")])]),
        L.Parallel([L.Dense(4, 4), L.Dense(4, 4)], combine="add"),
        L.RNN(4, 3), L.Dense(3, 3, "softmax"), L.Softmax()], dtype=np.float64, seed=2)
    xi = rng.integers(0, 5, (2, steps))
    t = np.eye(3)[rng.integers(0, 3, 2)]
    r = fastlib.train(m, xi, t, 2, 2, 0.05, "mse", **kw)
    ok, detail = _held(r, step_budget(m, steps))
    report("budget:every layer kind", ok, detail)
    per = r.device_counts["per_epoch"]
    want = {"kernel_launches": 0, "graph_launches": 0, "allocations": 0, "h2d_copies": 3,
            "d2h_copies": 1, "synchronizations": 1}
    report("budget:epoch traffic", per == want,
           f"{per} (the order, the coefficients and the step state up; the numbers back)")


def run_transformer_budget(report, kw):
    """The benchmark's transformer block (reports/bench/models/transformer.py), built at toy
    widths: launches do not depend on widths, so its per-step count is the benchmark's."""
    import fastlib
    from reports.bench.models import transformer

    full = step_budget(transformer.build())
    sizes = {"VOCAB": 5, "D_MODEL": 4, "HEADS": 2, "HIDDEN": 3}
    saved = {k: getattr(transformer, k) for k in sizes}
    try:
        for k, v in sizes.items():
            setattr(transformer, k, v)
        m = transformer.build(seed=1)
    finally:
        for k, v in saved.items():
            setattr(transformer, k, v)
    rng = np.random.default_rng(3)
    xi = rng.integers(0, 5, (2, 2))
    t = rng.integers(0, 2, (2, 2, 5)).astype(np.float32)
    r = fastlib.train(m, xi, t, 2, 2, 0.01, "binary_cross_entropy_with_logits", **kw)
    ok, detail = _held(r, full)
    exact = r.cuda_mode == "graph" or r.device_counts["kernel_launches"] == full
    report("budget:transformer block", ok and exact and full == 44,
           f"{detail}; the benchmark model's budget {full} (44: Embedding 2, attention "
           f"residual 17, SwiGLU residual 15, LayerNorm 3, Dense 3, the step's 4)")


def run_modes(report):
    """The same run as CUDA graphs and as launches gives the same numbers, bit for bit (on the
    simulator both are launches; on a GPU this holds the recorded graph to the launches)."""
    import fastlib

    x, y = _data(6)
    runs = []
    for graphs_env in ("1", "0"):
        os.environ["FASTLIB_CUDA_GRAPHS"] = graphs_env
        try:
            m = _mlp()
            r = fastlib.train(m, x, y, 2, 4, 0.1, "cross_entropy", optimizer="Adam",
                              verbose=False, seed=3, device="cuda")
        finally:
            os.environ.pop("FASTLIB_CUDA_GRAPHS", None)
        runs.append((r, m.parameters()))
    (rg, pg), (rl, pl) = runs
    same = rg.loss_history == rl.loss_history and all(np.array_equal(pg[k], pl[k]) for k in pl)
    report("mode:graph and launches agree", same and rl.cuda_mode == "launches",
           f"modes {rg.cuda_mode} / {rl.cuda_mode}; losses {rg.loss_history} / "
           f"{rl.loss_history}; weights equal: {same}")


class FakeGraphs:
    """cuda.core's graph builder played under the simulator, as :mod:`fastlib.cuda.graphs`
    uses it: recording stores each launch (the kernel, its grid and block, its argument
    objects) instead of running it, and a replay runs exactly those launches with exactly
    those arguments -- what a CUDA graph does with the pointers and scalars it captured. So a
    kernel that took a per-batch value (the batch's offset, the step count) as an argument
    would replay a stale one, and the run would differ from launches.

    ``fail`` makes ``end_building`` raise, as stream capture does when it was invalidated;
    ``refuse_cooperative`` makes it raise when a recorded launch is cooperative (a driver
    that cannot capture one).
    """

    class Builder:
        def __init__(self, owner):
            self.owner, self.launches, self.state = owner, [], "new"

        def begin_building(self, mode="relaxed"):
            self.mode, self.state = mode, "building"
            return self

        def end_building(self):
            if self.state != "building":
                raise RuntimeError("Graph builder is not building.")
            self.state = "ended"
            if self.owner.fail:
                raise RuntimeError(self.owner.fail)
            if self.owner.refuse_cooperative and any(k.cooperative for k, _, _ in self.launches):
                raise RuntimeError("operation not permitted when stream is capturing (fake: a "
                                   "cooperative launch)")
            return self

        def complete(self):
            return FakeGraphs.Graph(list(self.launches))

        def close(self):
            self.state = "closed"

    class Graph:
        def __init__(self, launches):
            self.launches, self.replays, self.closed = launches, 0, False

        def launch(self, stream):
            self.replays += 1
            for kern, config, args in self.launches:
                kern.dispatcher(kern.key(args))[config](*args)

        def close(self):
            self.closed = True

    def __init__(self, fail=None, refuse_cooperative=False):
        self.fail, self.builders = fail, []
        self.refuse_cooperative = refuse_cooperative

    def __enter__(self):
        from numba import cuda
        from fastlib.cuda import counters, device, graphs
        fake = self

        class Device:
            def set_current(self):
                pass

            def create_stream(self):
                return cuda.stream()

            def create_graph_builder(self):
                fake.builders.append(FakeGraphs.Builder(fake))
                return fake.builders[-1]

        class Recorded:
            def __init__(self, kern, config, builder):
                self.kern, self.config, self.builder = kern, config, builder

            def __call__(self, *args):
                counters.add("kernel_launches")  # as a real launch into a builder counts
                self.builder.launches.append((self.kern, self.config, args))

        original = device.LazyKernel.__getitem__

        def getitem(kern, launch):
            target = device.current_stream()
            if isinstance(target, FakeGraphs.Builder):
                assert target.state == "building", "a launch outside begin/end_building"
                return Recorded(kern, tuple(launch[:2]), target)
            return original(kern, launch)

        self.saved = [(graphs, "_core", graphs._core), (graphs, "support", graphs.support),
                      (device.LazyKernel, "__getitem__", original)]
        graphs._core = lambda: Device
        graphs.support = lambda: (True, None)
        device.LazyKernel.__getitem__ = getitem
        return self

    def __exit__(self, *exc):
        for owner, name, value in self.saved:
            setattr(owner, name, value)


def run_graphs(report):
    import fastlib
    from fastlib.cuda import counters, device, graphs

    x, y = _data(7)
    kw = dict(optimizer="Adam", verbose=False, seed=3, shuffle=True, device="cuda")

    def run():
        m = _mlp()
        # batches of 3, 3 and 1 samples: two graphs, the first replayed at two batch offsets
        # in an epoch (a frozen offset would train on one batch twice), both in epochs 2, 3
        return fastlib.train(m, x, y, 3, 3, 0.1, "cross_entropy", **kw), m.parameters()

    plain, plain_w = run()
    os.environ["FASTLIB_CUDA_GRAPHS"] = "0"
    try:
        off, _ = run()
    finally:
        os.environ.pop("FASTLIB_CUDA_GRAPHS", None)
    from fastlib.cuda import config
    if config.SIMULATOR:
        plain_ok = plain.cuda_mode == "launches" and "simulator" in (plain.cuda_graph_reason
                                                                      or "")
    else:  # a GPU: the real graph path must engage
        plain_ok = plain.cuda_mode == "graph" and plain.cuda_graph_reason is None
    report("graph:mode and reason reported",
           plain_ok and off.cuda_mode == "launches"
           and "FASTLIB_CUDA_GRAPHS=0" in (off.cuda_graph_reason or ""),
           f"default: {plain.cuda_mode} ({plain.cuda_graph_reason}); FASTLIB_CUDA_GRAPHS=0: "
           f"{off.cuda_mode} ({off.cuda_graph_reason})")

    with FakeGraphs() as fake:
        r, w = run()
    same = r.loss_history == plain.loss_history and r.accuracy_history == \
        plain.accuracy_history and all(np.array_equal(w[k], plain_w[k]) for k in w)
    c = r.device_counts
    built = [b for b in fake.builders]
    replays = [len(b.launches) for b in built]
    ok = (same and r.cuda_mode == "graph" and r.cuda_graph_reason is None
          and c["graph_launches"] == 1 and c["kernel_launches"] == 0
          and len(built) == 2 and all(b.mode == "thread_local" and b.state == "closed"
                                      for b in built) and min(replays) > 0)
    report("graph:replayed steps equal launches", ok,
           f"mode {r.cuda_mode}; losses {r.loss_history} vs launches {plain.loss_history}; "
           f"weights equal: {same}; per step {c['graph_launches']:g} graph launch, "
           f"{c['kernel_launches']:g} kernel launches; {len(built)} graphs of {replays} "
           f"launches, capture modes {[b.mode for b in built]}, builders "
           f"{[b.state for b in built]}")

    with FakeGraphs(fail="stream capture invalidated (fake)") as fake:
        r, w = run()
    same = r.loss_history == plain.loss_history and all(
        np.array_equal(w[k], plain_w[k]) for k in w)
    reason = r.cuda_graph_reason or ""
    report("graph:failed recording falls back to launches",
           same and r.cuda_mode == "launches" and "capture invalidated (fake)" in reason
           and "recording" in reason and [b.state for b in fake.builders] == ["closed"]
           and r.device_counts["graph_launches"] == 0,
           f"mode {r.cuda_mode}, reason {reason!r}; same numbers as launches: {same}; "
           f"builders {[b.state for b in fake.builders]}")

    run_graph_fallback_per_step(report)

    buf = device.empty(3, np.float64)
    before = counters.snapshot()
    with FakeGraphs() as fake:
        try:
            graphs.StepGraph(lambda: device.upload(buf, np.ones(3)))
            raised = "nothing raised"
        except graphs.RecordingError as exc:
            raised = str(exc)
    unchanged = counters.difference(counters.snapshot(), before)
    report("graph:a copy inside a recorded step is refused",
           "host-to-device copy" in raised and [b.state for b in fake.builders] == ["closed"]
           and not any(unchanged.values()),
           f"{raised}; builders {[b.state for b in fake.builders]}; counts {unchanged}")


def run_graph_fallback_per_step(report):
    """A driver that refuses to record the cooperative (persistent) recurrent kernels: the run
    keeps CUDA graphs, its recurrent layers step per launch from the next step on, the reason
    is reported, and the numbers are the launched run's bit for bit (3 epochs: the last
    one replays a graph at every step)."""
    import fastlib

    x, y = _recurrent_data(3)
    kw = dict(optimizer="Adam", verbose=False, seed=3, shuffle=True)

    def run():
        m = _recurrent_model()
        r, dev = train_keeping_run(m, x, y, 3, 2, 0.1, "cross_entropy", **kw)
        return r, dev, m.parameters()
    plain, _, plain_w = run()
    with FakeGraphs(refuse_cooperative=True) as fake:
        r, dev, w = run()
    same = r.loss_history == plain.loss_history and all(
        np.array_equal(w[k], plain_w[k]) for k in w)
    recorded = [b for b in fake.builders if b.state == "closed"]
    cooperative_in = [any(k.cooperative for k, _, _ in b.launches) for b in fake.builders]
    c = r.device_counts
    report("graph:a refused persistent kernel records per step",
           same and r.cuda_mode == "graph" and dev.recurrent_mode == "per-step"
           and "cooperative launch" in (dev.recurrent_reason or "")
           and c["graph_launches"] == 1 and c["kernel_launches"] == 0
           and cooperative_in[0] and not any(cooperative_in[1:]) and len(recorded) == len(
               fake.builders),
           f"mode {r.cuda_mode}, recurrent {dev.recurrent_mode} ({dev.recurrent_reason}); "
           f"the same numbers as launches: {same}; recordings with a cooperative launch "
           f"{cooperative_in}; per step {c['graph_launches']:g} graph launch, "
           f"{c['kernel_launches']:g} kernel launches")


def run_sh_resume(report):
    import fastlib

    x, y = _data(6)
    xv, yv = _data(3)
    kw = dict(verbose=False, seed=4, patience=1, min_delta=0.0, x_val=xv, y_val=yv,
              device="cuda")
    full = _mlp()
    hf = fastlib.train_sh(full, x, y, 4, 3, 0.5, "cross_entropy", "Adam", **kw)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ck.npz")
        fastlib.train_sh(_mlp(), x, y, 2, 3, 0.5, "cross_entropy", "Adam", checkpoint=path,
                         **kw)
        resumed = _mlp()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # epochs differ from the checkpoint's run
            hr = fastlib.train_sh(resumed, x, y, 4, 3, 0.5, "cross_entropy", "Adam", resume=path,
                                  **kw)
    a, b = full.parameters(), resumed.parameters()
    diff = [k for k in a if not np.array_equal(a[k], b[k])]
    report("slow:train_sh resume is bit for bit", not diff and hf.lr == hr.lr and
           hf.best_epoch == hr.best_epoch and hf.restored_best,
           f"differ: {diff}; lr {hf.lr} vs {hr.lr}; restored best {hf.restored_best}")


def run_slow(report):
    run_every_layer(report)
    run_sh_resume(report)

    import fastlib

    x, y = _data(6)
    xv, yv = _data(3)
    kw = dict(verbose=False, seed=4, patience=1, min_delta=0.0, x_val=xv, y_val=yv)
    cpu, dev = _mlp(), _mlp()
    hc = fastlib.train_sh(cpu, x, y, 4, 3, 0.5, "cross_entropy", "Adam", **kw)
    hd = fastlib.train_sh(dev, x, y, 4, 3, 0.5, "cross_entropy", "Adam", device="cuda", **kw)
    ok, detail = _close(dev.parameters(), cpu.parameters())
    same_policy = (hc.best_epoch == hd.best_epoch and hc.lr == hd.lr
                   and hc.restored_best == hd.restored_best)
    report("slow:train_sh", ok and same_policy,
           f"{detail}; best epoch {hd.best_epoch} vs {hc.best_epoch}, lr {hd.lr} vs {hc.lr}")
    bad = []
    for opt in ("SGD", "Momentum", "NAG", "Adagrad", "RMSprop", "Adam", "AdamW"):
        cpu, dev = _mlp(), _mlp()
        fastlib.train(cpu, x, y, 1, 3, 0.1, "cross_entropy", optimizer=opt, verbose=False)
        fastlib.train(dev, x, y, 1, 3, 0.1, "cross_entropy", optimizer=opt, verbose=False,
                      device="cuda")
        ok, detail = _close(dev.parameters(), cpu.parameters())
        if not ok:
            bad.append(f"{opt}: {detail}")
    report("slow:optimizers", not bad, "; ".join(bad) or "all seven within 1e-12")


def _program_models():
    """(name, model maker, x, y, loss) per compiled model kind, at toy sizes."""
    import fastlib
    from fastlib import layers as L

    rng = np.random.default_rng(21)
    x, y = _data(4)
    xs = rng.standard_normal((4, 3, 3))
    xa, ya = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 2))
    xi, yi = rng.integers(0, 5, (2, 3)), rng.integers(0, 2, (2, 3, 5)).astype(np.float64)

    def seq(*layers):
        return lambda: fastlib.Sequential(list(layers), dtype=np.float64, seed=5)

    def residual(*inner):
        return L.Parallel([L.Dense(4, 4), L.Sequential(list(inner))], combine="add")
    return [
        ("MLP", lambda: _mlp(), x, y, "cross_entropy"),
        ("LSTM and RNN", lambda: seq(L.LSTM(3, 3, return_sequences=True), L.RNN(3, 2),
                                     L.Dense(2, 2))(), xs, y, "cross_entropy"),
        ("attention block", lambda: seq(residual(L.LayerNorm(4),
                                                 L.MultiHeadAttention(4, 2, causal=True)),
                                        L.Dense(4, 2))(), xa, ya, "mse"),
        ("transformer block", lambda: seq(
            L.Embedding(5, 4), residual(L.LayerNorm(4), L.MultiHeadAttention(4, 2, causal=True)),
            residual(L.RMSNorm(4), L.SwiGLU(4, 3, 4)), L.LayerNorm(4), L.Dense(4, 5))(),
         xi, yi, "binary_cross_entropy_with_logits"),
        ("Parallel and nesting", lambda: seq(
            L.Dense(3, 4, "tanh"),
            L.Parallel([L.Dense(4, 2, "relu"),
                        L.Sequential([L.Dense(4, 3, "gelu"),
                                      L.Parallel([L.Dense(3, 2), L.Dense(3, 2, "silu")],
                                                 combine="add")])]),
            L.Dense(4, 2))(), x, y, "cross_entropy"),
    ]


def run_program(report):
    """Per compiled model kind: the program the device lowers is the one the CPU builds for the
    run (``fastlib.training.program``), and the device's loss per epoch and trained weights
    equal the CPU program's within the float64 bound of the other checks (REL)."""
    # SGD: its step is linear in the gradient, so the engines' rounding differences stay at
    # rounding level (run_swiglu says why Adam would not)
    kw = dict(optimizer="SGD", verbose=False, seed=1)
    from fastlib import config
    schedules, config.SCHEDULES = config.SCHEDULES, None   # the CPU's compiled program here
    try:
        _program_checks(report, kw)
    finally:
        config.SCHEDULES = schedules


def _program_checks(report, kw):
    import fastlib
    from fastlib.cuda.lowering import compile_program
    from fastlib.training import program as prog

    for name, make, x, y, loss in _program_models():
        cpu, dev = make(), make()
        # the CPU trains this model through its compiled program (not the generic loop)
        seen = []
        original = prog._make_program

        def spy(ctx, data):
            built = original(ctx, data)
            seen.append(built)
            return built
        prog._make_program = spy
        try:
            rc = fastlib.train(cpu, x, y, 2, 2, 0.2, loss, **kw)
        finally:
            prog._make_program = original
        rd = fastlib.train(dev, x, y, 2, 2, 0.2, loss, device="cuda", **kw)
        compiled = bool(seen) and all(p is not None for p in seen)
        same_rows = compiled and np.array_equal(
            compile_program(make(), x).tables.rows, seen[0].tables.rows)
        losses = all(abs(a - b) <= REL * abs(b) for a, b in zip(rd.loss_history,
                                                                 rc.loss_history))
        losses = losses and len(rd.loss_history) == len(rc.loss_history) == 2
        ok, detail = _close(dev.parameters(), cpu.parameters())
        report(f"program:{name}", compiled and same_rows and losses and ok,
               f"CPU trained its program: {compiled}, the device lowered the same rows: "
               f"{same_rows}; losses device {rd.loss_history} vs CPU {rc.loss_history}; "
               f"weights {detail}")


def _mixed_models():
    """(name, model maker, x, y, loss) for mixed precision: where units end differs in each
    (a Softmax layer of its own, a Dense with softmax, recurrent layers, residual blocks)."""
    import fastlib
    from fastlib import layers as L

    rng = np.random.default_rng(21)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.integers(0, 2, 4)
    xs = rng.standard_normal((4, 3, 3)).astype(np.float32)
    xi, yi = rng.integers(0, 5, (2, 3)), rng.integers(0, 2, (2, 3, 5)).astype(np.float32)

    def seq(*layers):
        return fastlib.Sequential(list(layers), dtype=np.float32, seed=5)

    def residual(*inner):
        return L.Parallel([L.Dense(4, 4), L.Sequential(list(inner))], combine="add")
    onehot = np.eye(2, dtype=np.float32)[y]
    return [
        ("Softmax layer", lambda: seq(L.Dense(3, 4, "relu"), L.Dense(4, 2), L.Softmax()), x,
         onehot, "categorical_cross_entropy"),
        ("Dense softmax", lambda: seq(L.Dense(3, 4, "tanh"), L.Dense(4, 2, "softmax")), x,
         onehot, "categorical_cross_entropy"),
        ("LSTM and RNN", lambda: seq(L.LSTM(3, 3, return_sequences=True), L.RNN(3, 2),
                                     L.Dense(2, 2)), xs, y, "cross_entropy"),
        ("transformer block", lambda: seq(
            L.Embedding(5, 4), residual(L.LayerNorm(4), L.MultiHeadAttention(4, 2, causal=True)),
            L.Dense(4, 5)), xi, yi, "binary_cross_entropy_with_logits"),
    ]


def _mixed_kw(fmt):
    from fastlib.training.loss_scale import LossScale
    # float16: a scale that overflows at first (skips and back-offs) and grows after every
    # clean step (growths), so the device's scale kernel takes each branch
    scale = LossScale(init_scale=2.0 ** 20, growth_interval=1) if fmt == "float16" else None
    return dict(optimizer="SGD", verbose=False, seed=1, dtype=fmt, loss_scale=scale)


def run_mixed(report):
    """Mixed precision on the device against the CPU's per-batch mixed path (an independent
    implementation of the same rounding points: ``fastlib.training.mixed_precision``).

    The two engines differ in their float32 summation order; where that moves a value across
    a 16-bit rounding boundary, one activation or gradient differs by one unit of the format
    (2**-8 relative for bfloat16, 2**-11 for float16), and the step's update by that fraction.
    So each weight must agree within 8 units of the format times the largest change the CPU
    run made to that parameter, plus 64 float32 eps of the model's largest weight; an unscaled
    gradient or a skipped step that was taken moves the weights by the whole update (>= 1/8
    of it). The loss scale's decisions are discrete: the scale, its skips and the
    steps taken must be equal."""
    import fastlib

    bad = []
    for name, make, x, y, loss in _mixed_models():
        for fmt in ("bfloat16", "float16"):
            cpu, dev = make(), make()
            start = {k: v.copy() for k, v in cpu.parameters().items()}
            kw = _mixed_kw(fmt)
            rc = fastlib.train(cpu, x, y, 3, 2, 0.2, loss, fused=False, **kw)
            rd = fastlib.train(dev, x, y, 3, 2, 0.2, loss, device="cuda", **kw)
            unit = 2.0 ** (-8 if fmt == "bfloat16" else -11)
            eps = float(np.finfo(np.float32).eps)
            size = max(float(np.max(np.abs(w))) for w in cpu.parameters().values())
            for k, w in cpu.parameters().items():
                moved = float(np.max(np.abs(w.astype(np.float64) - start[k])))
                worst = float(np.max(np.abs(dev.parameters()[k].astype(np.float64) - w)))
                if worst > 8 * unit * moved + 64 * eps * size:
                    bad.append(f"{name} {fmt} {k}: {worst:.3g} off (moved {moved:.3g})")
            same = (rd.path, rd.precision, rd.loss_scale, rd.loss_scale_skips,
                    rd.skipped_steps) == ("cuda", fmt, rc.loss_scale, rc.loss_scale_skips,
                                          rc.skipped_steps)
            if not same:
                bad.append(f"{name} {fmt}: device path/precision/scale/skips "
                           f"{(rd.path, rd.precision, rd.loss_scale, rd.loss_scale_skips)}, "
                           f"CPU {(rc.path, rc.precision, rc.loss_scale, rc.loss_scale_skips)}")
            if fmt == "float16" and not 0 < rc.loss_scale_skips < 6:
                bad.append(f"{name}: the float16 run skipped {rc.loss_scale_skips} of 6 steps; "
                           f"the check needs skips and taken steps")
    report("mixed:device equals the per-batch CPU path", not bad, bad or "all within bounds")
    _mixed_resume(report)
    _mixed_graphs(report)
    _mixed_bench(report)


def _mixed_bench(report):
    """``verigrad bench train --dtypes ... --device cuda``'s measuring loop, at a toy size:
    every format trains on the device (path "cuda") and is scored, with no host trace."""
    from reports.bench import precision

    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (8, 64)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    saved = dict(precision.DEFAULTS)
    precision.DEFAULTS.update(hidden=4, batch_size=4)
    try:
        subject = precision.Subject("tiny digits MLP", "random", precision._digits_mlp,
                                    "cross_entropy", (x, y), (x, y), 2)
        rows = precision._measure(precision.case_names(["float32", "float16"]), subject, 1,
                                  lambda text: None, "cuda")
    finally:
        precision.DEFAULTS.clear()
        precision.DEFAULTS.update(saved)
    ok = [r["case"] for r in rows] == ["float32", "float16"] and all(
        r["path"] == "cuda" and r["traced_peak_bytes"] is None and 0 <= r["test_accuracy"] <= 1
        and r["s_per_epoch"] > 0 for r in rows)
    report("mixed:bench train --dtypes on the device", ok,
           [(r["case"], r["path"], r["test_accuracy"], r["traced_peak_bytes"]) for r in rows])


def _mixed_graphs(report):
    """A float16 run whose scale moves at every step (skips, back-offs, growths), recorded as
    graphs and replayed (``FakeGraphs``: a stale scale or step captured at recording would
    replay), equals the same run launched, bit for bit, scale and skips included."""
    import fastlib

    _, make, x, y, loss = _mixed_models()[0]
    kw = _mixed_kw("float16")
    runs = []
    for fake in (True, False):
        m = make()
        if fake:
            with FakeGraphs():
                r = fastlib.train(m, x, y, 3, 2, 0.2, loss, device="cuda", **kw)
        else:
            os.environ["FASTLIB_CUDA_GRAPHS"] = "0"
            try:
                r = fastlib.train(m, x, y, 3, 2, 0.2, loss, device="cuda", **kw)
            finally:
                os.environ.pop("FASTLIB_CUDA_GRAPHS", None)
        runs.append((r, m.parameters()))
    (rg, wg), (rl, wl) = runs
    same = (rg.loss_history == rl.loss_history and all(np.array_equal(wg[k], wl[k]) for k in wl)
            and (rg.loss_scale, rg.loss_scale_skips) == (rl.loss_scale, rl.loss_scale_skips))
    report("mixed:graph replays equal launches",
           same and rg.cuda_mode == "graph" and rl.cuda_mode == "launches"
           and 0 < rl.loss_scale_skips < 6,
           f"modes {rg.cuda_mode}/{rl.cuda_mode}; losses {rg.loss_history} / "
           f"{rl.loss_history}; scale/skips {rg.loss_scale}/{rg.loss_scale_skips} vs "
           f"{rl.loss_scale}/{rl.loss_scale_skips}; same: {same}")


def _mixed_resume(report):
    """A float16 run of 4 epochs equals 2 epochs, a checkpoint and a resumed run of 2 more,
    bit for bit in the weights, the loss scale and its skips (the device's scale state comes
    back into the run's state, which the checkpoint holds); the host's parameters are the
    float32 masters, not their 16-bit copies."""
    import fastlib
    from fastlib.training.mixed_precision import round_to

    _, make, x, y, loss = _mixed_models()[0]
    kw = _mixed_kw("float16")
    whole = make()
    rw = fastlib.train(whole, x, y, 4, 2, 0.2, loss, device="cuda", **kw)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.npz")
        fastlib.train(make(), x, y, 2, 2, 0.2, loss, device="cuda", checkpoint=path, **kw)
        resumed = make()
        rr = fastlib.train(resumed, x, y, 4, 2, 0.2, loss, device="cuda", resume=path, **kw)
    a, b = whole.parameters(), resumed.parameters()
    diff = [k for k in a if not np.array_equal(a[k], b[k])]
    scale = (rw.loss_scale, rw.loss_scale_skips) == (rr.loss_scale, rr.loss_scale_skips)
    report("mixed:resume is bit for bit", not diff and scale and rw.loss_scale_skips > 0,
           f"parameters that differ: {diff}; scale/skips whole {rw.loss_scale}/"
           f"{rw.loss_scale_skips}, resumed {rr.loss_scale}/{rr.loss_scale_skips}")
    masters = all(v.dtype == np.float32 for v in a.values()) and any(
        not np.array_equal(round_to(v, "float16"), v) for v in a.values())
    report("mixed:masters stay float32 on the host", masters,
           {k: (str(v.dtype), bool(np.array_equal(round_to(v, "float16"), v)))
            for k, v in a.items()})


GROUPS = {"frame": run_frame, "resume": run_resume, "guard": run_guards, "clip": run_clip,
          "unsupported": run_unsupported, "layers": run_activations, "swiglu": run_swiglu,
          "attention": run_attention, "recurrent": run_recurrent, "compile": run_compile,
          "losses": run_losses,
          "budget": run_budget, "mode": run_modes, "graph": run_graphs,
          "program": run_program, "mixed": run_mixed}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.setswitchinterval(1e-4)  # the simulator's barriers poll threads (cuda_sim_check.py)
    import fastlib.cuda as fc
    if not fc.is_available():  # without the simulator, the checks run on a real GPU
        sys.exit(f"no device: {fc.unavailable_reason()}")
    from fastlib import config
    # NOTE: the CPU references train batch by batch (the layers' kernels), not through the
    # compiled epoch kernels: those take minutes to compile on a first run and are held against
    # the referee by the conformance train rows; only run_program needs the CPU's program
    config.SCHEDULES = ()

    def report(check, ok, detail):
        print(json.dumps({"check": check, "ok": bool(ok), "detail": str(detail)}), flush=True)

    groups = dict(GROUPS)
    if "--slow" in argv:
        groups["slow"] = run_slow
    for group, run in groups.items():
        if only and not any(part in group for part in only.split(",")):
            continue
        try:
            run(report)
        except Exception:
            report(f"group:{group}", False, traceback.format_exc())


if __name__ == "__main__":
    main()
