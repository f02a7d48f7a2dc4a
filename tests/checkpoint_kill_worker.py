"""A training run that spends nearly all its time writing checkpoints (killed by a test).

    python tests/checkpoint_kill_worker.py CHECKPOINT EPOCHS

Trains a 1000x1000 layer (4 MB of weights plus 8 MB of Adam state per checkpoint) with a
registered algorithm that changes the weights with NumPy alone (no kernel to compile), one
batch per epoch, a checkpoint after every epoch, resuming from CHECKPOINT when it exists.
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fastlib  # noqa: E402
from fastlib.training.algorithms import BatchResult, register_algorithm  # noqa: E402


def step(ctx, x, y):
    # every weight records the number of steps so far: a checkpoint's epoch can be checked
    # against its content
    ctx.params["0.weight"][...] = ctx.step + 1
    for slot in ctx.opt_state.slots.values():
        for arr in slot.values():
            arr[...] = ctx.step + 1
    return BatchResult(1.0)


def main():
    path, epochs = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    register_algorithm("checkpoint_kill_test", step, needs_targets=False)
    model = fastlib.Sequential([fastlib.Dense(1000, 1000)], dtype=np.float32, seed=0)
    x = np.zeros((4, 1000), np.float32)
    fastlib.train(model, x, None, epochs, 4, 0.1, None, optimizer="Adam",
                  algorithm="checkpoint_kill_test", checkpoint=path,
                  resume=path if path.exists() else None, divergence=False, verbose=False)


if __name__ == "__main__":
    main()
