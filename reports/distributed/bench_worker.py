"""One rank of ``verigrad bench train --distributed`` (run under ``mpiexec -n K``).

Trains the benchmark's 784-128-10 ReLU MLP (Adam, float32) data-parallel for one epoch of at
most ``--steps`` batches, after a two-batch warm-up, and has rank 0 print one JSON line:
seconds, samples, steps and the number of ranks.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--samples", type=int, default=60000)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)

    import numpy as np

    import fastlib
    from fastlib.training.distributed import DataParallel, world
    from reports.bench.train import _data

    rank, size = world()
    x, y, source = _data(argparse.Namespace(data_dir=args.data_dir, samples=args.samples))
    n = min(len(x), args.steps * args.batch)
    model = fastlib.Sequential([fastlib.Dense(784, 128, "relu"), fastlib.Dense(128, 10)],
                               dtype=np.float32, seed=0)
    dist = DataParallel(blocks=args.blocks)
    fastlib.train(model, x[:2 * args.batch], y[:2 * args.batch], 1, args.batch, 1e-3,
                  "cross_entropy", optimizer="Adam", verbose=False, distributed=dist)
    t0 = time.perf_counter()
    result = fastlib.train(model, x[:n], y[:n], 1, args.batch, 1e-3, "cross_entropy",
                           optimizer="Adam", verbose=False, distributed=dist)
    seconds = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"ranks": size, "batch": args.batch, "samples": n,
                          "steps": -(-n // args.batch), "seconds": seconds,
                          "epoch_seconds": result.epoch_times[0], "source": source,
                          "params": int(sum(v.size for v in model.parameters().values()))}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
