"""mlp: a 784-128-10 ReLU MLP, cross_entropy, Adam lr 1e-3, float32, on MNIST-shaped data.

Data: the real MNIST training images when ``--data-dir`` (or ``load_mnist``'s own lookup:
``$VERIGRAD_MNIST_DIR``, the user cache, ``../shared/data/mnist``) has them, else uniform random images of the same shape with random
labels; 60000 samples per epoch. Weights: fastlib's ``Dense`` draws (He-normal for the ReLU
layer, Xavier-uniform for the output, zero biases, seed 0), copied into every engine.

Engines: fastlib (its whole-epoch compiled MLP path), plain NumPy (the loop a competent NumPy
user writes), PyTorch eager, JAX (``jax.jit`` + ``lax.scan``); on ``--device cuda``
fastlib on the GPU, PyTorch CUDA eager and PyTorch with the step as one CUDA graph. :func:`arithmetic_floor` is the machine's float32 GEMM
time for the epoch's arithmetic (see its docstring).
"""
from __future__ import annotations

import time

import numpy as np

from reports.bench.models import common

DESCRIPTION = "784-128-10 relu, cross_entropy, Adam lr=1e-3, float32"
LOSS = "cross_entropy"
BATCH_SIZES = "1,32,64,128"
SAMPLES = 60000
SIZES = (784, 128, 10)


def build(seed=0):
    """The fastlib model."""
    import fastlib

    return fastlib.Sequential([fastlib.Dense(784, 128, "relu"), fastlib.Dense(128, 10)],
                              dtype=np.float32, seed=seed)


def data(args):
    """MNIST training images (or random data of their shape), repeated or cut to --samples."""
    from fastlib import datasets

    try:
        folder = datasets.mnist_dir(args.data_dir)      # the loader's own lookup
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


# ---------------------------------------------------------------------------------------------

def bench_fastlib(x, y, bs, max_steps, seed=0):
    return common.bench_fastlib(build, LOSS, x, y, bs, max_steps, seed)


def bench_numpy(x, y, bs, max_steps, seed=0):
    """The plain NumPy loop: BLAS GEMMs, NumPy elementwise, a hand-written Adam."""
    rng = np.random.default_rng(seed)
    used, n = common.measured_samples(len(x), bs, max_steps)
    f32 = np.float32
    init = common.initial_parameters(build, seed)
    params = [init["0.weight"], init["0.bias"], init["1.weight"], init["1.bias"]]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    labels = y.reshape(-1)
    total = 0.0
    t0 = time.perf_counter()
    order = rng.permutation(n)
    t = 0
    for s in range(0, n, bs):
        idx = order[s:s + bs]
        xb, yb = x[idx], labels[idx]
        rows = np.arange(len(idx))
        h_pre = xb @ params[0] + params[1]
        h = np.maximum(h_pre, 0)
        z = h @ params[2] + params[3]
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        sums = p.sum(axis=1, keepdims=True)
        total -= float(np.sum(z[rows, yb] - np.log(sums[:, 0])))
        p /= sums
        p[rows, yb] -= 1
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
    return common.Run(time.perf_counter() - t0, used, total / n)


def _torch_setup(seed):
    return common.torch_relu_mlp_setup(build, seed)


_torch_loss = common.torch_loss(LOSS)


def bench_torch(x, y, bs, max_steps, seed=0):
    return common.bench_torch(_torch_setup(seed), _torch_loss, x, common.class_indices(y), bs,
                              max_steps, seed)


def jax_forward(p, xb):
    import jax.numpy as jnp

    h = jnp.maximum(xb @ p["0.weight"] + p["0.bias"], 0)
    return h @ p["1.weight"] + p["1.bias"]


def jax_cross_entropy(z, yb):
    """Mean cross-entropy of logits ``z (B, C)`` against class indices ``yb (B,)``."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(z, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=-1))


def bench_jax(x, y, bs, max_steps, seed=0):
    return common.bench_jax("mlp", jax_forward, jax_cross_entropy,
                            common.initial_parameters(build, seed), x,
                            common.class_indices(y).astype(np.int32), bs, max_steps, seed)


ENGINES = {"fastlib": bench_fastlib, "numpy": bench_numpy, "torch": bench_torch,
           "jax": bench_jax,
           **common.cuda_engines(build, LOSS, _torch_setup, _torch_loss,
                                 common.class_indices)}
CPU_ENGINES = ("fastlib", "numpy", "torch", "jax")


def missing(engine):
    """None when ``engine`` can run here, else the line saying what to install."""
    if engine == "jax":
        return common.jax_missing()
    return None


# ---------------------------------------------------------------------------------------------
# the arithmetic floor

def flops_per_epoch(samples, sizes=SIZES):
    """Multiply-add FLOPs (2 per multiply-add) of one epoch's GEMMs, forward and backward.

    Per sample, for layers ``i -> o``: the forward ``x @ W`` is ``2 i o``; the backward forms
    every weight gradient ``x^T @ dz`` (``2 i o``) and every input gradient ``dz @ W^T``
    (``2 i o``) except the first layer's (the data needs none). Elementwise work (bias, ReLU,
    softmax, Adam) is left out: it is O(parameters + activations), not a GEMM.
    For 784-128-10 and 60000 samples: 2 * 60000 * (2 * 784 * 128 + 3 * 128 * 10) = 24.5 GFLOP.
    """
    layers = list(zip(sizes[:-1], sizes[1:]))
    per_sample = sum(2 * i * o for i, o in layers) * 2 + sum(2 * i * o for i, o in layers[1:])
    return samples * per_sample


def _best_time(fn, repeats, inner):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def gemm_rates(batch=64, sizes=SIZES, seed=0):
    """The machine's float32 GEMM rate (FLOP/s) through NumPy's BLAS under the current limits.

    Returns ``(peak, at_shapes)``: ``peak`` from a 1024 x 1024 x 1024 sgemm (the rate BLAS
    sustains on large products), ``at_shapes`` from the five GEMMs of one MLP step at
    ``batch`` (forward, weight gradients, the hidden layer's input gradient) run back to back.
    Each is the best of 3 timings (the fastest is the one the machine's other work disturbed
    least).
    """
    rng = np.random.default_rng(seed)
    f32 = np.float32
    a = rng.random((1024, 1024), dtype=f32)
    b = rng.random((1024, 1024), dtype=f32)
    out = np.empty((1024, 1024), f32)
    peak = 2 * 1024 ** 3 / _best_time(lambda: np.dot(a, b, out=out), 3, 2)
    i, h, o = sizes
    x = rng.random((batch, i), dtype=f32)
    w1, w2 = rng.random((i, h), dtype=f32), rng.random((h, o), dtype=f32)
    hid, dz = rng.random((batch, h), dtype=f32), rng.random((batch, o), dtype=f32)

    def step():
        np.dot(x, w1)
        np.dot(hid, w2)
        np.dot(dz, w2.T)
        np.dot(x.T, hid)
        np.dot(hid.T, dz)

    at_shapes = flops_per_epoch(batch, sizes) / _best_time(step, 3, 50)
    return peak, at_shapes


def arithmetic_floor(samples, batch=64):
    """The epoch's GEMM FLOPs at the best measured GEMM rate: no engine can beat it on this
    machine without doing less arithmetic. Returns a dict for the report."""
    peak, at_shapes = gemm_rates(batch)
    flops = flops_per_epoch(samples)
    rate = max(peak, at_shapes)
    return {"flops_per_epoch": flops, "gemm_gflops_peak": peak / 1e9,
            "gemm_gflops_at_mlp_shapes": at_shapes / 1e9, "floor_s": flops / rate,
            "floor_at_mlp_shapes_s": flops / at_shapes, "batch_size": batch}
