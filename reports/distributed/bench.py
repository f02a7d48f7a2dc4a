"""``verigrad bench train --distributed``: data-parallel training at 1, 2, ... MPI ranks.

Each rank count is one ``mpiexec -n K`` launch of :mod:`reports.distributed.bench_worker`,
every rank limited to one thread (BLAS and fastlib's kernels: one core per rank, the usual
way to run MPI, and what makes the rank counts comparable on one machine). The table gives
seconds per epoch (scaled from the steps measured) and samples per second, with the bytes each
rank exchanges per step, the input of the README's cost model.
"""
from __future__ import annotations

import json
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


def run(args, sizes) -> int:
    """Launch one run per rank count and batch size; print the table (or JSON)."""
    exe = mpiexec_path()
    if exe is None:
        print("verigrad bench train --distributed: no mpiexec found; install the MPI extra: "
              "pip install 'verigrad[mpi]'", file=sys.stderr)
        return 1
    try:
        ranks = [int(k) for k in args.ranks.split(",") if k.strip()]
        if not ranks or min(ranks) < 1:
            raise ValueError
    except ValueError:
        print(f"verigrad bench train: --ranks takes comma-separated counts >= 1, got "
              f"{args.ranks!r}", file=sys.stderr)
        return 1
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", VERIGRAD_THREADS="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    for bs in sizes:
        for k in ranks:
            cmd = [exe, "-n", str(k), sys.executable, "-m", "reports.distributed.bench_worker",
                   "--batch", str(bs), "--steps", str(args.max_steps), "--samples",
                   str(args.samples), "--blocks", str(args.blocks)]
            if args.data_dir:
                cmd += ["--data-dir", args.data_dir]
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
    if args.json:
        print(json.dumps({"model": "784-128-10 relu, cross_entropy, Adam lr=1e-3, float32",
                          "blocks": args.blocks, "results": rows}, indent=2))
        return 0
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
    return 0
