"""``verigrad bench train --distributed``: data-parallel training at 1, 2, ... MPI ranks.

Each rank count is one ``mpiexec -n K`` launch of :mod:`reports.distributed.bench_worker`,
every rank limited to one thread (BLAS and fastlib's kernels: one core per rank, the usual
way to run MPI, and what makes the rank counts comparable on one machine). The table gives
seconds per epoch (scaled from the steps measured) and samples per second, with the bytes each
rank exchanges per step, the input of the cost model in docs/distributed.md, and the
machine's load average before and after (the ranks share the cores with whatever else runs).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path


def mpiexec_path():
    """``mpiexec`` next to this interpreter (the mpich wheel's), else on PATH, else None."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec")


def exchange_bytes(params, ranks, itemsize=4):
    """Bytes one rank receives per step when K divides the blocks: its chunk of every other
    rank's subtree (all-to-all) and every other chunk of the sum (all-gather), 2 P (K-1)/K
    numbers, as a ring Allreduce."""
    return 2 * params * itemsize * (ranks - 1) / ranks


# the network the README's predictions assume (not measured here: one machine has no network)
BANDWIDTH = 1.25e9     # bytes/s: 10 Gb/s
LATENCY = 30e-6        # s per message: a typical small-message time on 10 Gb/s Ethernet
# (global batch, blocks, ranks) of the prediction table
PREDICTIONS = ((512, 64, 1), (512, 64, 8), (512, 64, 64), (64, 8, 8), (64, 64, 64))


def predict_step(t_block_ms, t_fixed_ms, params, ranks, blocks, bandwidth=BANDWIDTH,
                 latency=LATENCY, itemsize=4):
    """The cost model: ``(compute, transfer, latency, step)`` milliseconds of one step.

    compute = (blocks / ranks) t_block + t_fixed (a rank's blocks, then the work every rank
    does: the optimizer update on all parameters, the tree's adds); transfer =
    :func:`exchange_bytes` / bandwidth; latency = (2 (K - 1) + log2 K) messages (the
    all-to-all and the all-gather in K - 1 rounds each, the losses' allreduce in log2 K).
    """
    compute = blocks / ranks * t_block_ms + t_fixed_ms
    transfer = 1e3 * exchange_bytes(params, ranks, itemsize) / bandwidth
    rounds = 2 * (ranks - 1) + math.log2(ranks) if ranks > 1 else 0.0
    lat = 1e3 * latency * rounds
    return compute, transfer, lat, compute + transfer + lat


def run(args, sizes) -> int:
    """Launch one run per rank count and batch size; print the table (or JSON)."""
    exe = mpiexec_path()
    if exe is None:
        print("verigrad bench train --distributed: no mpiexec found; install the MPI extra: "
              "pip install 'verigrad[mpi]'", file=sys.stderr)
        return 1
    ranks = list(args.ranks)      # counts >= 1, checked by the parser
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", VERIGRAD_THREADS="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    load_before = _load_average()
    rows = []
    for bs in sizes:
        for k in ranks:
            cmd = [exe, "-n", str(k), sys.executable, "-m", "reports.distributed.bench_worker",
                   "--batch", str(bs), "--steps", str(args.max_steps), "--samples",
                   str(args.samples), "--blocks", str(args.blocks)]
            if args.data_dir:
                cmd += ["--data-dir", args.data_dir]
            parts = k == 1 and not any("t_block_ms" in r for r in rows)
            if parts:  # once: the cost model's t_block, timed on one rank
                cmd += ["--parts"]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(f"verigrad bench train: the {k}-rank run failed:\n{proc.stderr[-2000:]}",
                      file=sys.stderr)
                return 1
            r = json.loads(lines[-1])
            steps_per_epoch = -(-args.samples // bs)
            r["s_per_epoch"] = r["seconds"] * steps_per_epoch / r["steps"]
            r["samples_per_s"] = r["samples"] / r["seconds"]
            r["ms_per_step"] = 1e3 * r["seconds"] / r["steps"]
            r["exchange_bytes_per_step"] = exchange_bytes(r["params"], k)
            rows.append(r)
    load = {"before": load_before, "after": _load_average(), "cores": os.cpu_count()}
    model = _cost_model(rows, args)
    if args.json:  # --json FILE: the results as JSON too
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"model": "784-128-10 relu, cross_entropy, Adam lr=1e-3, float32",
                       "blocks": args.blocks, "load_average": load, "results": rows,
                       "cost_model": model}, fh, indent=2)
    print(f"verigrad bench train --distributed: 784-128-10 relu, Adam, float32; "
          f"{rows[0]['source']}; {args.samples} samples per epoch; one thread per rank; "
          f"{args.blocks} blocks per batch")
    print(f"{'batch':>6}  {'ranks':>5}  {'s/epoch':>9}  {'samples/s':>10}  {'ms/step':>8}  "
          f"{'exchanged KB/step':>17}")
    for r in rows:
        print(f"{r['batch']:>6}  {r['ranks']:>5}  {r['s_per_epoch']:>9.2f}  "
              f"{r['samples_per_s']:>10.0f}  {r['ms_per_step']:>8.2f}  "
              f"{r['exchange_bytes_per_step'] / 1e3:>17.0f}")
    print(f"({args.max_steps} steps measured per run, scaled to a full epoch)")
    if model is not None:
        tb = model["t_block_ms"]
        print(f"\ncost model: t_block (one block's forward, loss, backward, one rank, best of "
              f"5 x 50) = {', '.join(f'{v:.3f} ms at {n}' for n, v in tb.items())} samples; "
              f"t_fixed = ms/step at batch {model['from_batch']} on 1 rank - "
              f"{model['from_blocks']} x t_block({model['from_block_size']}) = "
              f"{model['t_fixed_ms']:.3f} ms; network assumed 10 Gb/s, "
              f"{LATENCY * 1e6:.0f} us per message")
        print(f"{'batch':>6}  {'blocks':>6}  {'ranks':>5}  {'compute ms':>10}  "
              f"{'transfer ms':>11}  {'latency ms':>10}  {'step ms':>8}  {'s/epoch':>8}  "
              f"{'speed-up':>8}")
        for p in model["predictions"]:
            print(f"{p['batch']:>6}  {p['blocks']:>6}  {p['ranks']:>5}  {p['compute_ms']:>10.2f}"
                  f"  {p['transfer_ms']:>11.2f}  {p['latency_ms']:>10.2f}  {p['step_ms']:>8.2f}"
                  f"  {p['s_per_epoch']:>8.2f}  {p['speed_up']:>8.2f}")
    print(f"load average (1 min) {_fmt_load(load['before'])} before, {_fmt_load(load['after'])}"
          f" after, on {load['cores']} cores: ranks share them with whatever else runs, so "
          "compare rank counts only on an idle machine")
    return 0


def _cost_model(rows, args):
    """t_block and t_fixed from the measured rows, and the predictions of :data:`PREDICTIONS`
    (None when no one-rank run timed the blocks)."""
    timed = [r for r in rows if "t_block_ms" in r]
    if not timed:
        return None
    base = timed[0]
    tb = base["t_block_ms"]
    m = min(args.blocks, base["batch"])
    size = base["batch"] // m
    if base["batch"] % m or str(size) not in tb:
        return None
    t_fixed = base["ms_per_step"] - m * tb[str(size)]
    predictions = []
    for batch, blocks, ranks in PREDICTIONS:
        block = str(batch // blocks)
        if block not in tb:
            continue
        one = predict_step(tb[block], t_fixed, base["params"], 1, blocks)[3]
        compute, transfer, lat, step = predict_step(tb[block], t_fixed, base["params"], ranks,
                                                    blocks)
        predictions.append({"batch": batch, "blocks": blocks, "ranks": ranks,
                            "compute_ms": compute, "transfer_ms": transfer, "latency_ms": lat,
                            "step_ms": step, "s_per_epoch": step * -(-args.samples // batch) / 1e3,
                            "speed_up": one / step})
    return {"t_block_ms": tb, "t_fixed_ms": t_fixed, "from_batch": base["batch"],
            "from_blocks": m, "from_block_size": size, "bandwidth_bytes_per_s": BANDWIDTH,
            "latency_s": LATENCY, "predictions": predictions}


def _load_average():
    """The 1-minute load average (None where the system does not report one)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _fmt_load(value):
    return "unknown" if value is None else f"{value:.2f}"
