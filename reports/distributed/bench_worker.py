"""One rank of ``verigrad bench train --distributed`` (run under ``mpiexec -n K``).

Trains the benchmark's 784-128-10 ReLU MLP (Adam, float32) data-parallel for one epoch of at
most ``--steps`` batches, after a two-batch warm-up, and has rank 0 print one JSON line:
seconds, samples, steps and the number of ranks (with ``--parts``, also the milliseconds of
one block's work at 1, 8 and 64 samples: the cost model's ``t_block``).
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
    p.add_argument("--parts", action="store_true",
                   help="also time one block's forward, loss and backward (the cost model's "
                        "t_block) at 1, 8 and 64 samples")
    args = p.parse_args(argv)

    import numpy as np

    import fastlib
    from fastlib.training.distributed import DataParallel, world
    from reports.bench.models.mlp import data as _data

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
        line = {"ranks": size, "batch": args.batch, "samples": n,
                "steps": -(-n // args.batch), "seconds": seconds,
                "epoch_seconds": result.epoch_times[0], "source": source,
                "params": int(sum(v.size for v in model.parameters().values()))}
        if args.parts:
            line["t_block_ms"] = time_blocks(model, x, y)
        print(json.dumps(line))
        sys.stdout.flush()


def time_blocks(model, x, y, sizes=(1, 8, 64), repeats=5, inner=50):
    """Milliseconds of one block's work in a data-parallel step, per block size: the forward,
    the loss and its gradient, the backward and the flattening of the gradient (what
    ``distributed._Session.train_one_batch`` does per block); the best of ``repeats`` means of
    ``inner`` runs."""
    import numpy as np

    from fastlib import losses

    out = {}
    for n in sizes:
        xb = x[:n]
        # the targets as train hands them to the loss (validated once, as the loop does)
        yb = np.ascontiguousarray(losses.validate_targets(
            "cross_entropy", np.zeros((n, 10), x.dtype), y[:n]))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                pred = model.forward(xb)
                _, dpred = losses.loss_value_and_grad("cross_entropy", pred, yb, check=False)
                _, grads = model.backward(dpred, need_input_grad=False)
                np.concatenate([np.ascontiguousarray(g).reshape(-1) for g in grads.values()])
            best = min(best, (time.perf_counter() - t0) / inner)
        out[str(n)] = 1e3 * best
    return out


if __name__ == "__main__":
    main()
