"""`verigrad bench train`: seconds per training epoch, fastlib against plain NumPy and PyTorch.

The benchmark model: a 784-128-10 ReLU MLP, cross_entropy, Adam (lr 1e-3), float32, on
MNIST-shaped data (the real MNIST training images when ``--data-dir`` or
``../shared/data/mnist`` has them, else random data of the same shape), at batch sizes 1, 64
and 256, with every engine limited to ``--threads`` threads (default 2). Every engine runs the
same loop: shuffle, forward, loss, backward, Adam step, the last incomplete batch included.

A measurement runs at most ``--max-steps`` steps and scales the time to a full epoch (said so in
the output): batch 1 means 60000 steps per epoch, about a minute in PyTorch eager.

The long story: docs/reports.md, section ``reports/bench/train.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

TARGETS = {64: 0.4, 1: 6.0}  # seconds per epoch: the targets the README reports against
DEFAULT_MNIST_DIR = pathlib.Path("..") / "shared" / "data" / "mnist"
ENGINES = ("fastlib", "numpy", "torch")


def add_arguments(parser):
    """Options of ``verigrad bench train``."""
    a = parser.add_argument
    a("--batch-sizes", default="1,64,256", help="comma-separated batch sizes (default 1,64,256)")
    a("--samples", type=int, default=60000, help="samples per epoch (default 60000)")
    a("--max-steps", type=int, default=6000,
      help="steps measured per case; longer epochs are scaled from them (default 6000)")
    a("--threads", type=int, default=2, help="threads for every engine (default 2)")
    a("--engines", default="fastlib,numpy,torch", help="engines to run (default all)")
    a("--data-dir", default=None, help="MNIST folder (default $VERIGRAD_MNIST_DIR or "
                                       "../shared/data/mnist; random data when absent)")
    a("--json", action="store_true", help="print the results as JSON instead of a table")
    a("--device", choices=("cpu", "cuda"), default="cpu",
      help="cuda: fastlib on the GPU beside the CPU engine and PyTorch CUDA (default cpu)")
    # tests only: let --device cuda run on numba's simulator (tiny sizes; timings meaningless)
    a("--allow-simulator", action="store_true", help=argparse.SUPPRESS)
    a("--distributed", action="store_true",
      help="data-parallel fastlib under mpiexec at each of --ranks (needs verigrad[mpi])")
    a("--ranks", default="1,2", help="with --distributed: rank counts (default 1,2)")
    a("--blocks", type=int, default=8, help="with --distributed: blocks per batch (default 8)")


# ---------------------------------------------------------------------------------------------
# the engines: each returns seconds for `steps` steps of batch `bs`

def _steps_for(n, bs, max_steps):
    steps = -(-n // bs)
    return min(steps, max_steps), steps


def _bench_fastlib(x, y, bs, max_steps, seed=0):
    import fastlib

    used, _ = _steps_for(len(x), bs, max_steps)
    n = min(len(x), used * bs)
    model = fastlib.Sequential([fastlib.Dense(784, 128, "relu"), fastlib.Dense(128, 10)],
                               dtype=np.float32, seed=seed)
    # warm-up: compile (or load the cached kernels) outside the timing
    fastlib.train(model, x[:2 * bs], y[:2 * bs], 1, bs, 1e-3, "cross_entropy", optimizer="Adam",
                  verbose=False)
    result = fastlib.train(model, x[:n], y[:n], 1, bs, 1e-3, "cross_entropy", optimizer="Adam",
                           verbose=False, seed=seed)
    return result.epoch_times[0], used


def _bench_fastlib_cuda(x, y, bs, max_steps, seed=0):
    """fastlib.train(device="cuda"); the data's one upload per run is outside the epoch time."""
    import fastlib

    used, _ = _steps_for(len(x), bs, max_steps)
    n = min(len(x), used * bs)
    model = fastlib.Sequential([fastlib.Dense(784, 128, "relu"), fastlib.Dense(128, 10)],
                               dtype=np.float32, seed=seed)
    fastlib.train(model, x[:2 * bs], y[:2 * bs], 1, bs, 1e-3, "cross_entropy", optimizer="Adam",
                  verbose=False, device="cuda")  # warm-up: kernels compile at first launch
    result = fastlib.train(model, x[:n], y[:n], 1, bs, 1e-3, "cross_entropy", optimizer="Adam",
                           verbose=False, seed=seed, device="cuda")
    return result.epoch_times[0], used


def _bench_torch_cuda(x, y, bs, max_steps, seed=0):
    import torch

    used, _ = _steps_for(len(x), bs, max_steps)
    n = min(len(x), used * bs)
    torch.manual_seed(seed)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt = torch.from_numpy(np.ascontiguousarray(x[:n])).to(dev)
    yt = torch.from_numpy(np.ascontiguousarray(y[:n].reshape(-1))).to(dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    order = torch.randperm(n, device=dev)
    for s in range(0, n, bs):
        idx = order[s:s + bs]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xt[idx]), yt[idx])
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, used


def _cuda_engines(args):
    """(engines for --device cuda, None) or (None, the one line saying why nothing runs)."""
    import fastlib.cuda as fc
    from fastlib.cuda import config

    if not fc.is_available():
        return None, ("verigrad bench train --device cuda: no CUDA GPU here (numba.cuda."
                      "is_available() is False); nothing measured")
    if config.SIMULATOR and not args.allow_simulator:
        return None, ("verigrad bench train --device cuda: no GPU here: only numba's CUDA "
                      "simulator (NUMBA_ENABLE_CUDASIM=1), whose timings would measure Python")
    engines = ["fastlib-cuda", "fastlib"]
    try:
        import torch

        if torch.cuda.is_available():
            engines.append("torch-cuda")
    except ImportError:
        pass
    return engines, None


def _bench_numpy(x, y, bs, max_steps, seed=0):
    rng = np.random.default_rng(seed)
    used, _ = _steps_for(len(x), bs, max_steps)
    n = min(len(x), used * bs)
    f32 = np.float32
    w1 = (rng.standard_normal((784, 128)) * np.sqrt(2 / 784)).astype(f32)
    w2 = (rng.standard_normal((128, 10)) * np.sqrt(2 / 128)).astype(f32)
    params = [w1, np.zeros(128, f32), w2, np.zeros(10, f32)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    labels = y.reshape(-1)
    t0 = time.perf_counter()
    order = rng.permutation(n)
    t = 0
    for s in range(0, n, bs):
        idx = order[s:s + bs]
        xb, yb = x[idx], labels[idx]
        h_pre = xb @ params[0] + params[1]
        h = np.maximum(h_pre, 0)
        z = h @ params[2] + params[3]
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(idx)), yb] -= 1
        dz = p / f32(len(idx))
        dh = (dz @ params[2].T) * (h_pre > 0)
        grads = [xb.T @ dh, dh.sum(0), h.T @ dz, dz.sum(0)]
        t += 1
        bc1, bc2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        for p_, g, m_, v_ in zip(params, grads, m, v):
            m_ *= f32(0.9)
            m_ += f32(0.1) * g
            v_ *= f32(0.999)
            v_ += f32(0.001) * g * g
            p_ -= f32(1e-3) * (m_ / f32(bc1)) / (np.sqrt(v_ / f32(bc2)) + f32(1e-8))
    return time.perf_counter() - t0, used


def _bench_torch(x, y, bs, max_steps, seed=0):
    import torch

    used, _ = _steps_for(len(x), bs, max_steps)
    n = min(len(x), used * bs)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt = torch.from_numpy(np.ascontiguousarray(x[:n]))
    yt = torch.from_numpy(np.ascontiguousarray(y[:n].reshape(-1)))
    t0 = time.perf_counter()
    order = torch.randperm(n)
    for s in range(0, n, bs):
        idx = order[s:s + bs]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xt[idx]), yt[idx])
        loss.backward()
        opt.step()
    return time.perf_counter() - t0, used


BENCH = {"fastlib": _bench_fastlib, "numpy": _bench_numpy, "torch": _bench_torch,
         "fastlib-cuda": _bench_fastlib_cuda, "torch-cuda": _bench_torch_cuda}


# ---------------------------------------------------------------------------------------------

def _data(args):
    from fastlib import datasets

    folder = args.data_dir or os.environ.get("VERIGRAD_MNIST_DIR") or DEFAULT_MNIST_DIR
    try:
        x, y = datasets.load_mnist("train", folder)
        source = f"MNIST train images from {folder}"
    except (FileNotFoundError, ValueError):
        rng = np.random.default_rng(0)
        x = rng.random((60000, 784), dtype=np.float32)
        y = rng.integers(0, 10, size=(60000, 1))
        source = "random MNIST-shaped data (no MNIST folder found)"
    reps = -(-args.samples // len(x))
    x, y = np.concatenate([x] * reps)[:args.samples], np.concatenate([y] * reps)[:args.samples]
    return np.ascontiguousarray(x), np.ascontiguousarray(y), source


def _limit_threads(threads):
    import numba
    from threadpoolctl import threadpool_limits

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    limiter = threadpool_limits(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    return limiter


def run(args) -> int:
    """Run the benchmark; print a table (or JSON); 0 on success, 1 on bad options."""
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
        engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        bad = [e for e in engines if e not in BENCH]
        if bad or not sizes or min(sizes) < 1 or args.max_steps < 1 or args.samples < 1:
            raise ValueError(f"engines must be among {', '.join(ENGINES)} (got {bad}); batch "
                             "sizes, --samples and --max-steps must be >= 1")
    except ValueError as exc:
        print(f"verigrad bench train: error: {exc}", file=sys.stderr)
        return 1
    if args.device == "cuda":
        engines, why = _cuda_engines(args)
        if engines is None:
            print(why)
            return 1
    if getattr(args, "distributed", False):
        from reports.distributed import bench

        return bench.run(args, sizes)
    if "torch" in engines:
        try:
            import torch  # noqa: F401
        except ImportError:
            engines.remove("torch")
            print("verigrad bench train: PyTorch is not installed; skipping it "
                  "(pip install torch==2.13.0)", file=sys.stderr)
    _limit_threads(args.threads)
    x, y, source = _data(args)
    rows = []
    for bs in sizes:
        row = {"batch_size": bs, "steps_per_epoch": -(-len(x) // bs)}
        for engine in engines:
            seconds, used = BENCH[engine](x, y, bs, args.max_steps)
            row[engine] = seconds * row["steps_per_epoch"] / used
            row[f"{engine}_steps_measured"] = used
        for engine in engines:
            if engine != "fastlib" and "fastlib" in row:
                row[f"{engine}_over_fastlib"] = row[engine] / row["fastlib"]
        if bs in TARGETS and "fastlib" in row:
            row["target_s"] = TARGETS[bs]
            row["meets_target"] = row["fastlib"] < TARGETS[bs]
        rows.append(row)
    report = {"model": "784-128-10 relu, cross_entropy, Adam lr=1e-3, float32",
              "data": source, "samples": len(x), "threads": args.threads, "engines": engines,
              "results": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"verigrad bench train: {report['model']}; {source}; {len(x)} samples per epoch; "
          f"{args.threads} threads")
    head = f"{'batch':>6}" + "".join(f"  {e + ' s/epoch':>16}" for e in engines)
    head += "".join(f"  {e + '/fastlib':>15}" for e in engines if e != "fastlib")
    print(head + "  target")
    for row in rows:
        line = f"{row['batch_size']:>6}" + "".join(f"  {row[e]:>16.3f}" for e in engines)
        line += "".join(f"  {row[e + '_over_fastlib']:>15.1f}" for e in engines
                        if e != "fastlib" and "fastlib" in row)
        if "target_s" in row:
            line += f"  < {row['target_s']} s: {'yes' if row['meets_target'] else 'NO'}"
        print(line)
    scaled = [r["batch_size"] for r in rows
              if any(r[f"{e}_steps_measured"] < r["steps_per_epoch"] for e in engines)]
    if scaled:
        print(f"(batch sizes {scaled}: {args.max_steps} steps measured, scaled to a full epoch)")
    return 0
