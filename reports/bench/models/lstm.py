"""lstm: LSTM(32 -> 128) + Dense(128 -> 10), cross_entropy, Adam lr 1e-3, float32.

The long story: docs/reports-bench.md, section ``reports/bench/models/lstm.py``.
"""
from __future__ import annotations

import numpy as np

from reports.bench.models import common

DESCRIPTION = ("LSTM(32 -> 128, last state) + Dense(128 -> 10), cross_entropy, Adam lr=1e-3, "
               "float32, 64 steps")
LOSS = "cross_entropy"
BATCH_SIZES = "1,32,128"
SAMPLES = 1024
STEPS, FEATURES, HIDDEN, CLASSES = 64, 32, 128, 10


def build(seed=0, dtype=np.float32):
    """The fastlib model (in ``dtype``)."""
    import fastlib

    return fastlib.Sequential([fastlib.LSTM(FEATURES, HIDDEN), fastlib.Dense(HIDDEN, CLASSES)],
                              dtype=dtype, seed=seed)


def data(args):
    """``x (samples, 64, 32)`` float32, ``y (samples, 1)`` class indices."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples, STEPS, FEATURES)).astype(np.float32)
    y = np.argmax(x[:, :, :CLASSES].sum(axis=1), axis=1).reshape(-1, 1)
    return x, y, f"generated sequences ({STEPS} steps x {FEATURES} features, seed 0)"


def bench_fastlib(x, y, bs, max_steps, seed=0):
    return common.bench_fastlib(build, LOSS, x, y, bs, max_steps, seed)


def _torch_setup(seed):
    def setup(dev):
        import torch

        p = common.initial_parameters(build, seed)
        lstm = torch.nn.LSTM(FEATURES, HIDDEN, batch_first=True).to(dev)
        with torch.no_grad():
            lstm.weight_ih_l0.copy_(torch.from_numpy(p["0.w_ih"].T.copy()))
            lstm.weight_hh_l0.copy_(torch.from_numpy(p["0.w_hh"].T.copy()))
            lstm.bias_ih_l0.copy_(torch.from_numpy(p["0.b"]))
            lstm.bias_hh_l0.zero_()
        lstm.bias_hh_l0.requires_grad_(False)
        dense = common.torch_parameters({k: p[k] for k in ("1.weight", "1.bias")}, dev)
        w, b = dense["1.weight"], dense["1.bias"]

        def forward(xb):
            out, _ = lstm(xb)
            return torch.addmm(b, out[:, -1], w)

        params = [lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, w, b]
        return params, forward
    return setup


_torch_loss = common.torch_loss(LOSS)


def bench_torch(x, y, bs, max_steps, seed=0):
    return common.bench_torch(_torch_setup(seed), _torch_loss, x, common.class_indices(y), bs,
                              max_steps, seed)


def jax_forward(p, xb):
    import jax
    import jax.numpy as jnp

    batch = xb.shape[0]
    xw = jnp.einsum("bti,ig->tbg", xb, p["0.w_ih"]) + p["0.b"]

    def step(carry, z_in):
        h, c = carry
        z = z_in + h @ p["0.w_hh"]
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), None

    zeros = jnp.zeros((batch, HIDDEN), xb.dtype)
    (h, _), _ = jax.lax.scan(step, (zeros, zeros), xw)
    return h @ p["1.weight"] + p["1.bias"]


def bench_jax(x, y, bs, max_steps, seed=0):
    from reports.bench.models.mlp import jax_cross_entropy

    return common.bench_jax("lstm", jax_forward, jax_cross_entropy,
                            common.initial_parameters(build, seed), x,
                            common.class_indices(y).astype(np.int32), bs, max_steps, seed)


CPU_ENGINES = ("fastlib", "torch", "jax")
ENGINES = {"fastlib": bench_fastlib, "torch": bench_torch, "jax": bench_jax,
           **common.cuda_engines(build, LOSS, _torch_setup, _torch_loss,
                                 common.class_indices)}


def missing(engine):
    """None when ``engine`` can run here, else the line saying what to install."""
    return common.jax_missing() if engine == "jax" else None
