"""attention: causal MultiHeadAttention(64, 4 heads) + LayerNorm(64) + SwiGLU(64, 128, 64), mse.

The long story: docs/reports-bench.md, section ``reports/bench/models/attention.py``.
"""
from __future__ import annotations

import numpy as np

from reports.bench.models import common

DESCRIPTION = ("causal MultiHeadAttention(64, 4) + LayerNorm(64) + SwiGLU(64, 128, 64), mse, "
               "Adam lr=1e-3, float32, 64 positions")
LOSS = "mse"
BATCH_SIZES = "1,32,128"
SAMPLES = 1024
POSITIONS, D_MODEL, HEADS, HIDDEN = 64, 64, 4, 128
LN_EPS = 1e-5


def build(seed=0, dtype=np.float32):
    """The fastlib model (in ``dtype``)."""
    import fastlib

    return fastlib.Sequential([fastlib.MultiHeadAttention(D_MODEL, HEADS, causal=True),
                               fastlib.LayerNorm(D_MODEL),
                               fastlib.SwiGLU(D_MODEL, HIDDEN, D_MODEL)],
                              dtype=dtype, seed=seed)


def data(args):
    """``x (samples, 64, 64)`` and the causal running mean of x as the target."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples, POSITIONS, D_MODEL)).astype(np.float32)
    counts = np.arange(1, POSITIONS + 1, dtype=np.float64)[None, :, None]
    y = (np.cumsum(x, axis=1, dtype=np.float64) / counts).astype(np.float32)
    return x, y, f"generated sequences ({POSITIONS} positions x {D_MODEL}, seed 0)"


# ---------------------------------------------------------------------------------------------
# the layers, written once for PyTorch and once for JAX, on fastlib's parameter names

def stacked(params, prefix):
    """``params`` with ``prefix`` + ``w_q w_k w_v`` (and biases) stacked as ``w_qkv``, ``b_qkv``."""
    out = {k: v for k, v in params.items()
           if not (k.startswith(prefix) and k[len(prefix):] in
                   ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v"))}
    out[prefix + "w_qkv"] = np.concatenate([params[prefix + f"w_{n}"] for n in "qkv"], axis=1)
    out[prefix + "b_qkv"] = np.concatenate([params[prefix + f"b_{n}"] for n in "qkv"])
    return out


def torch_attention(p, prefix, x):
    import torch

    batch, steps, d = x.shape
    qkv = torch.addmm(p[prefix + "b_qkv"], x.reshape(-1, d), p[prefix + "w_qkv"])
    q, k, v = qkv.reshape(batch, steps, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
    att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    att = att.transpose(1, 2).reshape(-1, d)
    return torch.addmm(p[prefix + "b_o"], att, p[prefix + "w_o"]).reshape(batch, steps, d)


def torch_layer_norm(p, prefix, x):
    import torch

    return torch.nn.functional.layer_norm(x, (x.shape[-1],), p[prefix + "weight"],
                                          p[prefix + "bias"], LN_EPS)


def torch_swiglu(p, prefix, x):
    import torch

    gate = torch.nn.functional.silu(x @ p[prefix + "w_gate"])
    return (gate * (x @ p[prefix + "w_up"])) @ p[prefix + "w_down"]


def jax_attention(p, prefix, x):
    import jax
    import jax.numpy as jnp

    batch, steps, d = x.shape
    dh = d // HEADS
    qkv = (x @ p[prefix + "w_qkv"] + p[prefix + "b_qkv"]).reshape(batch, steps, 3, HEADS, dh)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(dh))
    mask = jnp.tril(jnp.ones((steps, steps), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    att = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, steps, d)
    return att @ p[prefix + "w_o"] + p[prefix + "b_o"]


def jax_layer_norm(p, prefix, x):
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LN_EPS) * p[prefix + "weight"] + p[prefix + "bias"]


def jax_swiglu(p, prefix, x):
    import jax

    gate = jax.nn.silu(x @ p[prefix + "w_gate"])
    return (gate * (x @ p[prefix + "w_up"])) @ p[prefix + "w_down"]


# ---------------------------------------------------------------------------------------------

def bench_fastlib(x, y, bs, max_steps, seed=0):
    return common.bench_fastlib(build, LOSS, x, y, bs, max_steps, seed)


def _torch_setup(seed):
    def setup(dev):
        p = common.torch_parameters(stacked(common.initial_parameters(build, seed), "0."), dev)

        def forward(xb):
            h = torch_attention(p, "0.", xb)
            return torch_swiglu(p, "2.", torch_layer_norm(p, "1.", h))

        return list(p.values()), forward
    return setup


_torch_mse = common.torch_loss("mse_loss")


def bench_torch(x, y, bs, max_steps, seed=0):
    return common.bench_torch(_torch_setup(seed), _torch_mse, x, y, bs, max_steps, seed)


def jax_forward(p, xb):
    h = jax_attention(p, "0.", xb)
    return jax_swiglu(p, "2.", jax_layer_norm(p, "1.", h))


def _jax_mse(out, yb):
    import jax.numpy as jnp

    return jnp.mean(jnp.square(out - yb))


def bench_jax(x, y, bs, max_steps, seed=0):
    return common.bench_jax("attention", jax_forward, _jax_mse,
                            stacked(common.initial_parameters(build, seed), "0."), x, y, bs,
                            max_steps, seed)


CPU_ENGINES = ("fastlib", "torch", "jax")
ENGINES = {"fastlib": bench_fastlib, "torch": bench_torch, "jax": bench_jax,
           **common.cuda_engines(build, LOSS, _torch_setup, _torch_mse)}


def missing(engine):
    """None when ``engine`` can run here, else the line saying what to install."""
    return common.jax_missing() if engine == "jax" else None
