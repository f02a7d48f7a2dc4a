"""transformer: a small pre-norm decoder block on a character-level next-character task.

The long story: docs/reports-bench.md, section ``reports/bench/models/transformer.py``.
"""
from __future__ import annotations

import numpy as np

from reports.bench.models import attention as _att
from reports.bench.models import common

DESCRIPTION = ("decoder block: Embedding(29, 64) + [LayerNorm + causal MultiHeadAttention(64, 4)]"
               " + [LayerNorm + SwiGLU(64, 128, 64)] (residual) + LayerNorm + Dense(64, 29), "
               "next-char binary_cross_entropy_with_logits, Adam lr=1e-3, float32, 64 chars")
LOSS = "binary_cross_entropy_with_logits"
BATCH_SIZES = "1,32,128"
SAMPLES = 1024
ALPHABET = " .,abcdefghijklmnopqrstuvwxyz"
CONTEXT, D_MODEL, HEADS, HIDDEN = 64, 64, 4, 128
VOCAB = len(ALPHABET)

_WORDS = {
    "det": ["the", "a", "every", "one", "no", "this"],
    "adj": ["small", "quick", "old", "green", "quiet", "bright", "heavy", "round"],
    "noun": ["fox", "river", "engine", "garden", "tensor", "window", "number", "lantern",
             "kernel", "bridge"],
    "verb": ["sees", "moves", "holds", "finds", "follows", "counts", "lifts", "keeps"],
    "prep": ["near", "under", "over", "beside", "behind"],
}


def generated_text(chars, seed=0):
    """``chars`` characters of deterministic English-like text over :data:`ALPHABET`.

    Sentences ``det [adj] noun verb det [adj] noun [prep det noun][, and ...].``, each choice
    drawn by ``numpy.random.default_rng(seed)``: regular enough that a small model learns
    spelling and word order, varied enough that it cannot memorise the text.
    """
    rng = np.random.default_rng(seed)
    pick = lambda kind: _WORDS[kind][rng.integers(len(_WORDS[kind]))]  # noqa: E731

    def phrase():
        words = [pick("det")] + ([pick("adj")] if rng.random() < 0.5 else []) + [pick("noun")]
        return " ".join(words)

    parts, length = [], 0
    while length < chars:
        clause = f"{phrase()} {pick('verb')} {phrase()}"
        if rng.random() < 0.4:
            clause += f" {pick('prep')} {pick('det')} {pick('noun')}"
        if rng.random() < 0.3:
            clause += f", and {phrase()} {pick('verb')} {phrase()}"
        sentence = clause + ". "
        parts.append(sentence)
        length += len(sentence)
    return "".join(parts)[:chars]


def build(seed=0, dtype=np.float32):
    """The fastlib model (in ``dtype``), shortcut weights set to the identity."""
    import fastlib as fl

    model = fl.Sequential([
        fl.Embedding(VOCAB, D_MODEL),
        fl.Parallel([fl.Dense(D_MODEL, D_MODEL),
                     fl.Sequential([fl.LayerNorm(D_MODEL),
                                    fl.MultiHeadAttention(D_MODEL, HEADS, causal=True)])],
                    combine="add"),
        fl.Parallel([fl.Dense(D_MODEL, D_MODEL),
                     fl.Sequential([fl.LayerNorm(D_MODEL), fl.SwiGLU(D_MODEL, HIDDEN, D_MODEL)])],
                    combine="add"),
        fl.LayerNorm(D_MODEL),
        fl.Dense(D_MODEL, VOCAB),
    ], dtype=dtype, seed=seed)
    params = model.parameters()
    for shortcut in ("1.0.weight", "2.0.weight"):
        params[shortcut][...] = np.eye(D_MODEL, dtype=params[shortcut].dtype)
    return model


def data(args):
    """``x (samples, 64)`` character ids, ``y (samples, 64, 29)`` one-hot next characters."""
    text = generated_text(args.samples * CONTEXT + 1)
    ids = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    lookup = np.zeros(256, dtype=np.int64)
    lookup[np.frombuffer(ALPHABET.encode("ascii"), dtype=np.uint8)] = np.arange(VOCAB)
    ids = lookup[ids]
    starts = np.arange(args.samples) * CONTEXT
    window = starts[:, None] + np.arange(CONTEXT)[None, :]
    x = ids[window]
    y = np.eye(VOCAB, dtype=np.float32)[ids[window + 1]]
    return x, y, f"generated text ({len(text)} characters, seed 0)"


def bench_fastlib(x, y, bs, max_steps, seed=0):
    return common.bench_fastlib(build, LOSS, x, y, bs, max_steps,
                                seed)


def _params(seed):
    return _att.stacked(common.initial_parameters(build, seed), "1.1.1.")


def _torch_setup(seed):
    def setup(dev):
        import torch

        p = common.torch_parameters(_params(seed), dev)

        def forward(idx):
            h = p["0.weight"][idx]
            a = _att.torch_attention(p, "1.1.1.", _att.torch_layer_norm(p, "1.1.0.", h))
            h = h @ p["1.0.weight"] + p["1.0.bias"] + a
            f = _att.torch_swiglu(p, "2.1.1.", _att.torch_layer_norm(p, "2.1.0.", h))
            h = h @ p["2.0.weight"] + p["2.0.bias"] + f
            h = _att.torch_layer_norm(p, "3.", h)
            return torch.matmul(h, p["4.weight"]) + p["4.bias"]

        return list(p.values()), forward
    return setup


_torch_loss = common.torch_loss(LOSS)


def bench_torch(x, y, bs, max_steps, seed=0):
    return common.bench_torch(_torch_setup(seed), _torch_loss, x, y, bs, max_steps, seed)


def jax_forward(p, idx):
    h = p["0.weight"][idx]
    a = _att.jax_attention(p, "1.1.1.", _att.jax_layer_norm(p, "1.1.0.", h))
    h = h @ p["1.0.weight"] + p["1.0.bias"] + a
    f = _att.jax_swiglu(p, "2.1.1.", _att.jax_layer_norm(p, "2.1.0.", h))
    h = h @ p["2.0.weight"] + p["2.0.bias"] + f
    return _att.jax_layer_norm(p, "3.", h) @ p["4.weight"] + p["4.bias"]


def _jax_loss(z, yb):
    import jax.numpy as jnp

    # log(1 + exp(-|z|)) + max(z, 0) - z y: the stable form every library uses
    return jnp.mean(jnp.maximum(z, 0) - z * yb + jnp.log1p(jnp.exp(-jnp.abs(z))))


def bench_jax(x, y, bs, max_steps, seed=0):
    return common.bench_jax("transformer", jax_forward, _jax_loss, _params(seed),
                            x.astype(np.int32), y, bs, max_steps, seed)


CPU_ENGINES = ("fastlib", "torch", "jax")
ENGINES = {"fastlib": bench_fastlib, "torch": bench_torch, "jax": bench_jax,
           **common.cuda_engines(build, LOSS, _torch_setup,
                                 _torch_loss)}


def missing(engine):
    """None when ``engine`` can run here, else the line saying what to install."""
    return common.jax_missing() if engine == "jax" else None
