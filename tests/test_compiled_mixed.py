"""Recurrent layers inside the compiled attention program: RNN and LSTM (every state or the
last) mixed with attention, norms, SwiGLU and Dense, and inside ``Parallel`` (add, concat).

Independent source: the generic per-batch path (``fused=False``: the layers' own forward and
backward, ``Optimizer.update``, ``clip_gradients``; itself held to reflib by the conformance
``train`` rows). Both compute the same formulas in different summation orders, so they agree
to rounding: float64 within a few hundred ulps of each layer's scale after two epochs. The
same run on one thread and on two is equal bit for bit (the pieces depend on the batch's
shape only). The referee holds these models in the conformance ``train`` rows.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib import config
from fastlib.kernels.instructions import ELEMENTWISE_ACTIVATIONS
from fastlib.kernels.recurrent import PIECE
from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention,
                            Parallel, RMSNorm, Sequential, SwiGLU)
from fastlib.training import schedules
# the attention path's comparison: each parameter against its layer's scale (tests/ is on the
# path as pytest runs this file)
from test_compiled_attention import NORMALISING, _close

# Both dtypes: the paths differ only in summation order (BLAS's products, the pieces'
# partials, the sub-pieces' w_hh terms), ~eps per operation; over two epochs of five-step
# recurrences feeding attention they stayed within 7 eps of each layer's scale (measured over
# these cases, float32 and float64 alike). 256 eps (the attention path's bound) leaves room
# for Adam-type optimizers, which divide such differences by their own running size; a wrong
# term (a dropped carry, a missing sub-piece) is 1e-3 of the scale or more.
ULPS64 = ULPS32 = 256


def _lstm_attention(dtype, causal=True, cell=LSTM):
    """Embedding -> LSTM (every state) -> attention -> LayerNorm -> Dense."""
    return Sequential([Embedding(7, 4), cell(4, 4, True), MultiHeadAttention(4, 2, causal),
                       LayerNorm(4), Dense(4, 2)], dtype=dtype, seed=3)


def _residual(dtype, causal=False, cell=LSTM):
    """A residual block: Parallel([recurrent, Dense], add), RMSNorm, Dense."""
    return Sequential([Parallel([cell(3, 4, True), Dense(3, 4, "tanh")], "add"), RMSNorm(4),
                       Dense(4, 2)], dtype=dtype, seed=4)


def _concat_last(dtype, causal=True, cell=RNN):
    """Attention, then Parallel([recurrent last state, LSTM last state], concat), SwiGLU."""
    return Sequential([Dense(3, 4), MultiHeadAttention(4, 2, causal),
                       Parallel([cell(4, 3), LSTM(4, 2)], "concat"), SwiGLU(5, 3, 2)],
                      dtype=dtype, seed=5)


def _last_state(dtype, causal=False, cell=RNN):
    """A recurrent layer's last state into LayerNorm and a Dense head (no time axis after)."""
    return Sequential([cell(3, 5), LayerNorm(5), Dense(5, 2, "gelu")], dtype=dtype, seed=6)


def _top_parallel(dtype, causal=False, cell=LSTM):
    """A Parallel as the whole model: a recurrent branch beside a Dense one, added."""
    return Parallel([cell(3, 2, True), Dense(3, 2, "tanh")], "add", dtype=dtype, seed=8)


MODELS = {"lstm_attention": (_lstm_attention, "tokens", True),
          "top_parallel": (_top_parallel, "features", True),
          "residual": (_residual, "features", True),
          "concat_last": (_concat_last, "features", False),
          "last_state": (_last_state, "features", False)}


def _data(kind, seq_out, loss, dtype, n=11, steps=5, classes=2):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 7, (n, steps)) if kind == "tokens" else \
        rng.uniform(-1, 1, (n, steps, 3)).astype(dtype)
    shape = (n, steps, classes) if seq_out else (n, classes)
    if loss == "cross_entropy":
        return x, rng.integers(0, classes, (n, 1))
    if loss == "categorical_cross_entropy":
        return x, np.eye(classes, dtype=dtype)[rng.integers(0, classes, n)]
    if loss == "binary_cross_entropy_with_logits":
        return x, (rng.uniform(0, 1, shape) > 0.5).astype(dtype)
    return x, rng.uniform(-1, 1, shape).astype(dtype)


class _Spy:
    """Counts the epochs each registered schedule of the program ran (the registry's own
    entries)."""

    def __init__(self, monkeypatch):
        self.ran = []
        entries = schedules.schedules()
        monkeypatch.setattr(schedules, "_SCHEDULES", list(entries))   # restored after the test
        for s in entries:
            schedules.register_schedule(s.name, s.plan_from_program, self._wrap(s.name, s.run))

    def _wrap(self, name, run):
        def spy(ctx, plan, x, y, order):
            self.ran.append(name)
            return run(ctx, plan, x, y, order)
        return spy


def _train(model, x, y, fused, loss, optimizer, clip, mode, bs=4):
    return fastlib.train(model, x, y, 2, bs, 0.02, loss, optimizer=optimizer,
                         gradient_clip=clip, clip_mode=mode, seed=1, fused=fused, verbose=False)


CASES = [  # model, causal, recurrent cell, loss, optimizer, clip, clip mode
    ("lstm_attention", True, LSTM, "mse", "Adam", 0.0, "value"),
    ("lstm_attention", False, RNN, "binary_cross_entropy_with_logits", "SGD", 0.05, "norm"),
    ("residual", False, LSTM, "mse", "RMSprop", 0.01, "value"),
    ("residual", False, RNN, "binary_cross_entropy_with_logits", "NAG", 0.0, "value"),
    ("concat_last", True, RNN, "cross_entropy", "AdamW", 0.02, "norm"),
    ("concat_last", False, LSTM, "categorical_cross_entropy", "Momentum", 0.01, "value"),
    ("last_state", False, LSTM, "binary_cross_entropy_with_logits", "Adagrad", 0.0, "value"),
    ("last_state", False, RNN, "mse", "Adam", 0.05, "norm"),
    ("top_parallel", False, LSTM, "mse", "Adam", 0.02, "norm"),
]


@pytest.mark.parametrize("dtype,ulps", [(np.float64, ULPS64), (np.float32, ULPS32)])
@pytest.mark.parametrize("name,causal,cell,loss,optimizer,clip,mode", CASES)
def test_mixed_models_compile_and_agree_with_the_generic_path(monkeypatch, dtype, ulps, name,
                                                              causal, cell, loss, optimizer,
                                                              clip, mode):
    build, kind, seq_out = MODELS[name]
    x, y = _data(kind, seq_out, loss, dtype)
    spy = _Spy(monkeypatch)
    runs = []
    for fused in (True, False):
        model = build(dtype, causal, cell)
        p0 = {k: v.copy() for k, v in model.parameters().items()}
        r = _train(model, x, y, fused, loss, optimizer, clip, mode)
        assert r.fused == fused
        runs.append((r, model.parameters()))
    assert spy.ran == ["general", "general"]     # both epochs in the program's interpreter
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(runs[0][0].loss_history, runs[1][0].loss_history,
                               rtol=ulps * eps)
    if loss != "mse":
        np.testing.assert_allclose(runs[0][0].accuracy_history, runs[1][0].accuracy_history,
                                   atol=1e-12)
    _close(dtype, runs[0][1], runs[1][1], p0, ulps, ("b_k",) if optimizer in NORMALISING else ())


def test_recurrent_chains_and_mixed_programs_share_the_general_schedule(monkeypatch):
    """An Embedding -> LSTM -> Dense chain and the same chain with a norm after the LSTM both
    run under the one interpreter."""
    x, y = _data("tokens", False, "cross_entropy", np.float64)
    spy = _Spy(monkeypatch)
    chain = Sequential([Embedding(7, 3), LSTM(3, 4), Dense(4, 2)], dtype=np.float64, seed=1)
    _train(chain, x, y, True, "cross_entropy", "Adam", 0.0, "value")
    normed = Sequential([Embedding(7, 3), LSTM(3, 4), LayerNorm(4), Dense(4, 2)],
                        dtype=np.float64, seed=1)
    _train(normed, x, y, True, "cross_entropy", "Adam", 0.0, "value")
    assert spy.ran == ["general"] * 4


# sequences of 4 in one piece of more than recurrent.PIECE sequences: the program's cells run
# the whole piece as one group, the layers' in groups of PIECE; the last batch is partial
STEPS = 4
BATCHES = [PIECE + 3, 2 * PIECE + 2]


@pytest.mark.parametrize("bs", BATCHES)
def test_pieces_past_a_cell_group_same_bits_on_one_thread_and_two(monkeypatch, bs):
    """Equal bits on one thread and two, and agreement with the generic path, where a piece
    holds more sequences than the layers' cell groups."""
    monkeypatch.setattr(config, "PIECES", 1 if bs < 2 * PIECE else 2)
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (bs + 3, STEPS, 3)).astype(np.float32)
    y = rng.uniform(-1, 1, (bs + 3, STEPS, 2)).astype(np.float32)
    got = []
    for threads in (1, 2):
        monkeypatch.setattr(config, "THREADS", threads)
        model = _residual(np.float32)
        p0 = {k: v.copy() for k, v in model.parameters().items()}
        r = _train(model, x, y, True, "mse", "Adam", 0.0, "value", bs=bs)
        assert r.fused and -(-bs // r.piece_plan["pieces"]) > PIECE
        got.append((r.loss_history, model.parameters()))
    assert got[0][0] == got[1][0]
    for k, v in got[0][1].items():
        np.testing.assert_array_equal(v, got[1][1][k])
    generic = _residual(np.float32)
    _train(generic, x, y, False, "mse", "Adam", 0.0, "value", bs=bs)
    _close(np.float32, got[0][1], generic.parameters(), p0, ULPS32, ("b_k",))


def test_shapes_the_generic_path_refuses_are_not_compiled():
    """A recurrent layer on (N, d) data and a Parallel joining a last state with every state
    are left to the generic path, which names the problem."""
    rng = np.random.default_rng(1)
    model = Sequential([LayerNorm(3), LSTM(3, 2), Dense(2, 2)], dtype=np.float64)
    with pytest.raises(ValueError):
        _train(model, rng.uniform(-1, 1, (5, 3)), rng.uniform(-1, 1, (5, 2)), True, "mse",
               "SGD", 0.0, "value")
    model = Sequential([Parallel([LSTM(3, 2), LSTM(3, 2, True)], "add"), Dense(2, 2)],
                       dtype=np.float64)
    with pytest.raises(ValueError):
        _train(model, rng.uniform(-1, 1, (5, 4, 3)), rng.uniform(-1, 1, (5, 2)), True, "mse",
               "SGD", 0.0, "value")


def test_fused_activations_are_the_tables_elementwise_activations():
    """The compiled paths' activations are every op-table activation whose op is unary, and a
    gelu MLP (outside the old hand-written list) trains fused, as the generic path does."""
    import optable

    unary = {a.name for a in optable.ACTIVATIONS.values()
             if optable.OPS[a.op].category == "unary"}
    assert set(ELEMENTWISE_ACTIVATIONS) == unary and "softmax" not in unary
    rng = np.random.default_rng(2)
    x, y = rng.uniform(-1, 1, (9, 3)), rng.uniform(-1, 1, (9, 2))
    runs = []
    for fused in (True, False):
        model = Sequential([Dense(3, 4, "gelu"), Dense(4, 2, "softplus")], dtype=np.float64,
                           seed=2)
        p0 = {k: v.copy() for k, v in model.parameters().items()}
        r = _train(model, x, y, fused, "mse", "Adam", 0.0, "value")
        assert r.fused == fused
        runs.append(model.parameters())
    _close(np.float64, runs[0], runs[1], p0, ULPS64)
