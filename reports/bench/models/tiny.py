"""tiny: a 6-5-3 ReLU MLP for numba's CUDA simulator only (``--device cuda`` under
``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs every CUDA thread as a Python thread, so the four benchmark models (784-wide
GEMMs, 64-step sequences) take minutes per step there; this one runs the same ``--device cuda``
machinery (engines, losses, counters, the table) in seconds. It is not a benchmark and is
refused anywhere else.
"""
from __future__ import annotations

import numpy as np

from reports.bench.models import common

DESCRIPTION = "6-5-3 relu, cross_entropy, Adam lr=1e-3, float32 (the simulator's model)"
LOSS = "cross_entropy"
BATCH_SIZES = "4"
SAMPLES = 8
SIZES = (6, 5, 3)


def build(seed=0):
    """The fastlib model."""
    import fastlib

    return fastlib.Sequential([fastlib.Dense(SIZES[0], SIZES[1], "relu"),
                               fastlib.Dense(SIZES[1], SIZES[2])], dtype=np.float32, seed=seed)


def data(args):
    """Uniform random inputs and random labels, seed 0."""
    rng = np.random.default_rng(0)
    x = rng.random((args.samples, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[2], size=(args.samples, 1))
    return x, y, "random data (seed 0)"


def bench_fastlib(x, y, bs, max_steps, seed=0):
    return common.bench_fastlib(build, LOSS, x, y, bs, max_steps, seed)


def _torch_setup(seed):
    return common.torch_relu_mlp_setup(build, seed)


_torch_loss = common.torch_loss(LOSS)


def bench_torch(x, y, bs, max_steps, seed=0):
    return common.bench_torch(_torch_setup(seed), _torch_loss, x, common.class_indices(y), bs,
                              max_steps, seed)


CPU_ENGINES = ("fastlib", "torch")
ENGINES = {"fastlib": bench_fastlib, "torch": bench_torch,
           **common.cuda_engines(build, LOSS, _torch_setup, _torch_loss,
                                 common.class_indices)}


def missing(engine):
    """None: every engine of this model runs wherever its library does."""
    return None
