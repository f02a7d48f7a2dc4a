"""A small data-parallel training run, launched by tests/test_distributed_mpi.py.

Run as ``mpiexec -n K python tests/mpi_train_script.py OUT.npz [options]`` (or without mpiexec:
one rank). Rank 0 writes the final parameters and the histories to OUT.npz, every other rank
``r`` its parameters to OUT.rank{r}.npz. ``--both`` runs the configurations of ``RUNS`` one after
the other (train in float64 / Adam and float32 / Momentum, train_sh in float32 / Adam; OUT.NAME.npz:
one launch instead of three); ``--with-plain`` first runs plain ``train`` (no
MPI; its per-batch path, ``fused=False``) and writes it to OUT.plain.npz. ``--fail MODE``
makes rank ``--fail-rank`` misbehave at the start of epoch 2: ``raise`` (a Python exception),
``hang`` (stops answering: sleeps for an hour) or ``kill`` (SIGKILL to itself); ``early``
makes it leave (exit 1) before it calls train at all; ``--warm-up``
first runs one quiet epoch so that the kernels are compiled before a short timeout counts.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


# --both: (name, dtype, optimizer, train_sh instead of train)
RUNS = (("float64", "float64", "Adam", False), ("float32", "float32", "Momentum", False),
        ("sh-float32", "float32", "Adam", True))


def build(dtype, widths, seed):
    import fastlib

    layers = [fastlib.Dense(widths[i], widths[i + 1], "tanh" if i < len(widths) - 2 else
                            "linear") for i in range(len(widths) - 1)]
    return fastlib.Sequential(layers, dtype=dtype, seed=seed)


def data(n, d, classes, seed, dtype):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(dtype)
    y = (x[:, :classes].argmax(axis=1) + (x[:, -1] > 1)).astype(np.int64) % classes
    return x, y


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--widths", type=int, nargs="+", default=[6, 5, 3])
    p.add_argument("--n", type=int, default=45)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--optimizer", default="Adam")
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--plain", action="store_true",
                   help="serial train: distributed=False, fused=False")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--sh", action="store_true", help="train_sh instead of train")
    p.add_argument("--fail", choices=("raise", "hang", "kill", "early"), default=None)
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--both", action="store_true")
    p.add_argument("--with-plain", action="store_true")
    p.add_argument("--warm-up", action="store_true",
                   help="first one quiet epoch with the default timeout (the kernels compile or "
                        "load), so that a short --timeout measures the failure, not the start-up")
    args = p.parse_args(argv)
    if args.warm_up:
        quiet = argparse.Namespace(**dict(vars(args), fail=None, epochs=1, timeout=120.0,
                                          checkpoint=None, resume=None))
        train_once(quiet, args.out[:-4] + ".warm-up.npz")
    if args.both:
        for name, dtype, opt, sh in RUNS:
            args.dtype, args.optimizer, args.sh = dtype, opt, sh
            train_once(args, args.out[:-4] + f".{name}.npz")
        return
    if args.with_plain:
        args.plain = True
        train_once(args, args.out[:-4] + ".plain.npz")
        args.plain = False
    train_once(args, args.out)


def train_once(args, out):
    import fastlib
    from fastlib.training.distributed import DataParallel

    dtype = np.dtype(args.dtype)
    model = build(dtype, args.widths, seed=3)
    x, y = data(args.n, args.widths[0], args.widths[-1], 11, dtype)
    xv, yv = data(17, args.widths[0], args.widths[-1], 12, dtype)
    rank = 0
    callbacks = []
    if not args.plain:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
        # a different init on every rank: the broadcast from rank 0 must overwrite it
        model.reset_parameters(seed=100 + rank) if rank else None

    def misbehave(epoch, logs):
        if args.fail and epoch == 1 and rank == args.fail_rank:
            if args.fail == "raise":
                raise ValueError("planted failure")
            if args.fail == "hang":
                time.sleep(3600)
            if args.fail == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
    callbacks.append(misbehave)
    if args.fail == "early" and rank == args.fail_rank:
        sys.exit("planted failure: this rank leaves before train")
    dist = False if args.plain else DataParallel(blocks=args.blocks, timeout=args.timeout)
    common = dict(seed=5, verbose=False, distributed=dist, callbacks=callbacks,
                  checkpoint=args.checkpoint, resume=args.resume)
    if args.plain:  # the per-batch path: one matrix product over the batch (the bound's subject)
        common["fused"] = False
    if args.sh:
        h = fastlib.train_sh(model, x, y, args.epochs, args.batch, 0.05, "cross_entropy",
                             args.optimizer, monitor="val_loss", patience=1, x_val=xv,
                             y_val=yv, min_delta=50.0, **common)  # 50%: the rate is cut
        result = h.result
    else:
        result = fastlib.train(model, x, y, args.epochs, args.batch, 0.05, "cross_entropy", xv,
                               yv, args.optimizer, **common)
    if rank != 0:  # every rank's parameters: they must be rank 0's
        np.savez(out[:-4] + f".rank{rank}.npz",
                 **{f"p:{k}": v for k, v in model.parameters().items()})
    if rank == 0:
        arrays = {f"p:{k}": v for k, v in model.parameters().items()}
        arrays.update(loss=np.array(result.loss_history), acc=np.array(result.accuracy_history),
                      val_loss=np.array(result.val_loss_history),
                      val_acc=np.array(result.val_accuracy_history),
                      lr=np.array(result.lr_history), fused=np.array(result.fused))
        np.savez(out, **arrays)


if __name__ == "__main__":
    main()
