"""The compiled training path for attention models against the generic per-batch path.

The generic path (``fused=False``) runs the layers' own NumPy / kernel code batch by batch; the
compiled path compiles the model into one program per epoch. Both compute the same formulas,
so they must agree to rounding: float64 to a few hundred ulps of each parameter's scale after
two epochs, float32 to a few hundred float32 ulps. The referee (reflib at 30 digits) holds the
compiled path in the conformance ``train`` rows; here the two paths are held to each other, on
one thread and two, across the kernels' piece boundary.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib import config
from fastlib.layers import (Dense, Embedding, LayerNorm, MultiHeadAttention, Parallel, RMSNorm,
                            Sequential, SwiGLU)
from fastlib.training import general_schedule as gs


def _issue_block(dtype, causal, d=4, heads=2):
    return Sequential([MultiHeadAttention(d, heads, causal), LayerNorm(d), SwiGLU(d, 2 * d, d)],
                      dtype=dtype, seed=3)


def _token_model(dtype, d=4):
    # embedding, a residual-style add of an attention branch and a Dense, norms, SwiGLU, and
    # a concat head: every operation of the compiled program
    return Sequential([Embedding(7, d),
                       Parallel([Sequential([MultiHeadAttention(d, 2, True), RMSNorm(d)]),
                                 Dense(d, d, "tanh")], "add"),
                       LayerNorm(d), SwiGLU(d, 3, d),
                       Parallel([Dense(d, 2), Dense(d, 1, "silu")]), Dense(3, 2)],
                      dtype=dtype, seed=5)


def _data(kind, dtype, n=11, steps=5, d=4, out=4):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 7, (n, steps)) if kind == "tokens" else \
        rng.uniform(-1, 1, (n, steps, d)).astype(dtype)
    y = rng.uniform(-1, 1, (n, steps, out)).astype(dtype)
    return x, y


def _train(model, x, y, fused, loss="mse", optimizer="Adam", clip=0.0, mode="value", bs=4):
    return fastlib.train(model, x, y, 2, bs, 0.02, loss, optimizer=optimizer,
                         gradient_clip=clip, clip_mode=mode, seed=1, fused=fused, verbose=False)


# optimizers that divide a gradient by its own running size: on a gradient that is 0 in exact
# arithmetic (attention's key bias) they turn each path's rounding into steps of the rate's size
# and sign, so that tensor is compared only where the update is proportional to the gradient
NORMALISING = ("Adam", "AdamW", "Adagrad", "RMSprop")


def _close(dtype, p_fast, p_gen, p0, ulps, skip=()):
    """Every parameter within ``ulps`` of its dtype's eps times its layer's scale (the
    largest distance a parameter of the layer travelled plus the largest parameter): the two
    paths round in different orders. Per layer, not per tensor: attention's key bias has an
    exactly zero gradient (softmax ignores a shift per row), so what it gets is rounding,
    which Adam divides by its own size into steps of the rate's size."""
    eps = float(np.finfo(dtype).eps)
    layer = {}
    for k in p_gen:
        name = k.rsplit(".", 1)[0]
        size = float(np.max(np.abs(p_gen[k] - p0[k]))) + float(np.max(np.abs(p0[k])))
        layer[name] = max(layer.get(name, 0.0), size)
    for k in p_gen:
        if k.rsplit(".", 1)[-1] in skip:
            continue
        scale = layer[k.rsplit(".", 1)[0]]
        err = float(np.max(np.abs(p_fast[k].astype(np.float64) - p_gen[k])))
        assert err <= ulps * eps * max(scale, 1e-300), (k, err, scale)


CASES = [  # (model kind, causal, loss, optimizer, clip, clip mode)
    ("block", True, "mse", "Adam", 0.0, "value"),
    ("block", False, "binary_cross_entropy_with_logits", "SGD", 0.05, "norm"),
    ("block", True, "mse", "AdamW", 0.01, "value"),
    ("tokens", True, "mse", "NAG", 0.0, "value"),
    ("tokens", True, "binary_cross_entropy_with_logits", "RMSprop", 0.02, "norm"),
]


@pytest.mark.parametrize("dtype,ulps", [(np.float64, 256), (np.float32, 256)])
@pytest.mark.parametrize("kind,causal,loss,optimizer,clip,mode", CASES)
def test_compiled_epochs_agree_with_the_generic_path(dtype, ulps, kind, causal, loss, optimizer,
                                                     clip, mode):
    out = 2 if kind == "tokens" else 4
    x, y = _data(kind, dtype, out=out)
    if loss.startswith("binary"):
        y = (y > 0).astype(dtype)
    results, params = [], []
    for fused in (True, False):
        model = _token_model(dtype) if kind == "tokens" else _issue_block(dtype, causal)
        p0 = {k: v.copy() for k, v in model.parameters().items()}
        r = _train(model, x, y, fused, loss, optimizer, clip, mode)
        assert r.fused == fused          # fused=False turns the compiled path off
        assert (r.path, r.schedule) == (("program", "general") if fused else ("generic", None))
        results.append(r)
        params.append(model.parameters())
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(results[0].loss_history, results[1].loss_history,
                               rtol=ulps * eps)
    _close(dtype, params[0], params[1], p0, ulps, ("b_k",) if optimizer in NORMALISING else ())


def test_a_two_dimensional_model_with_a_norm_trains_with_cross_entropy():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (9, 5))
    y = rng.integers(0, 3, (9, 1))
    runs = []
    for fused in (True, False):
        model = Sequential([Dense(5, 6, "gelu"), LayerNorm(6), Dense(6, 3)], dtype=np.float64,
                           seed=2)
        p0 = {k: v.copy() for k, v in model.parameters().items()}
        r = _train(model, x, y, fused, "cross_entropy", "Momentum", bs=4)
        assert r.fused == fused
        runs.append((r, model.parameters()))
    assert runs[0][0].accuracy_history == runs[1][0].accuracy_history
    _close(np.float64, runs[0][1], runs[1][1], p0, 256)


@pytest.mark.parametrize("bs", [gs.MIN_PIECE_ROWS // 8 - 1, gs.MIN_PIECE_ROWS // 8])
def test_the_same_bits_on_one_thread_and_two(monkeypatch, bs):
    """Sequences of 8 positions: batches of MIN_PIECE_ROWS / 8 samples are cut into pieces,
    one sample fewer are not (and the partial last batch crosses back)."""
    x, y = _data("block", np.float32, n=2 * bs + 3, steps=8)
    got = []
    for threads in (1, 2):
        monkeypatch.setattr(config, "THREADS", threads)
        model = _issue_block(np.float32, True)
        r = _train(model, x, y, True, bs=bs)
        assert r.fused
        got.append((r.loss_history, model.parameters()))
    assert got[0][0] == got[1][0]
    for k, v in got[0][1].items():
        np.testing.assert_array_equal(v, got[1][1][k])


def test_which_models_the_path_takes():
    x, y = _data("block", np.float64)
    # a softmax Dense is not compiled; a Dense-only model on positions is, by the general
    # schedule (its loss reads the output per position, as the generic loop does)
    model = Sequential([MultiHeadAttention(4, 2), Dense(4, 4, "softmax")], dtype=np.float64)
    assert not _train(model, x, np.abs(y) / 4, True).fused
    model = Sequential([Dense(4, 4, "gelu"), Dense(4, 4)], dtype=np.float64)
    assert _train(model, x, y, True).schedule == "general"


def test_a_non_finite_loss_stops_the_run_and_restores_the_weights():
    x, y = _data("block", np.float64)
    x[6, 0, 0] = 1e300   # the third batch's forward overflows
    model = _issue_block(np.float64, True)
    p0 = {k: v.copy() for k, v in model.parameters().items()}
    with pytest.warns(RuntimeWarning):
        r = _train(model, x, y, True)
    assert r.diverged and r.divergence_rule == "non_finite_loss" and r.restored_epoch == 0
    for k, v in model.parameters().items():
        np.testing.assert_array_equal(v, p0[k])
