"""Mixed precision in the interpreter: every compiled model trains in bfloat16 and float16.

Independent source: the per-batch mixed path (``fused=False``: the layers' own forward and
backward, each unit's output, input cotangent and parameter gradient rounded through NumPy;
``tests/test_mixed_precision.py`` watches its rounding points and holds a Dense MLP in the
general schedule to it bit for bit). Sequence models lay their rows out time-major and cut
batches into pieces, so their float32 sums run in another order, and a sum on the other side
of a 16-bit rounding moves one value by one 16-bit unit. They train with SGD, whose step the
two paths take alike (Adam's is computed in another order: an ulp of a master can flip the
master's 16-bit rounding, and Adam's normalised step makes that 1% of a step) and are held to
be far nearer the per-batch run than the nearest wrong run, the one that rounds nothing
(float32 throughout): a rounding point missed or added moves a run that far.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention,
                            Parallel, RMSNorm, Sequential, SwiGLU)


def _run(model, x, y, loss, **kw):
    return fastlib.train(model, x, y, kw.pop("epochs", 3), kw.pop("batch_size", 8),
                         kw.pop("lr", 1e-2), loss, optimizer=kw.pop("optimizer", "Adam"),
                         seed=0, verbose=False, divergence=False, **kw)


def _tokens_lstm_attention():
    return Sequential([Embedding(9, 6), LSTM(6, 6, True), MultiHeadAttention(6, 2, True),
                       LayerNorm(6), Dense(6, 3)], dtype=np.float32, seed=3)


def _residual_swiglu():
    """A Dense unit; a unit that is a Parallel (add) of a Dense and a nested Sequential, whose
    input (the first unit's output) two rows read; a recurrent unit with every state; a Dense
    head: units of several rows, a join, an input cotangent summed from two readers."""
    return Sequential([Dense(6, 6, "tanh"),
                       Parallel([Dense(6, 6, "tanh"), Sequential([RMSNorm(6), SwiGLU(6, 8, 6)])],
                                "add"), RNN(6, 6, True), Dense(6, 6)],
                      dtype=np.float32, seed=3)


def _concat_top():
    """Not a Sequential: the whole model is the one unit (only its output rounded)."""
    return Parallel([Sequential([LSTM(6, 4), Dense(4, 2, "tanh")]), LSTM(6, 3)], "concat",
                    dtype=np.float32, seed=5)


def _sequence_data(kind, n=30, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "tokens":
        return (rng.integers(0, 9, (n, steps)),
                rng.standard_normal((n, steps, 3)).astype(np.float32), "mse")
    x = rng.standard_normal((n, steps, 6)).astype(np.float32)
    if kind == "sequence":
        return x, rng.standard_normal((n, steps, 6)).astype(np.float32), "mse"
    return x, rng.standard_normal((n, 5)).astype(np.float32), "mse"


def _distance(model, reference):
    """The largest difference of any parameter, over that parameter's largest magnitude."""
    return max(float(np.max(np.abs(model.parameters()[k] - v))) / float(np.max(np.abs(v)))
               for k, v in reference.parameters().items())


@pytest.mark.parametrize("fmt, loss_scale", [
    ("bfloat16", None), ("float16", {"init_scale": 2.0 ** 18, "growth_interval": 3})])
@pytest.mark.parametrize("make, kind, pieces", [
    (_tokens_lstm_attention, "tokens", None), (_residual_swiglu, "sequence", None),
    (_residual_swiglu, "sequence", 3), (_concat_top, "last", None)],
    ids=["tokens-lstm-attention", "residual-swiglu", "residual-swiglu-3-pieces",
         "concat-top"])
def test_sequence_models_train_compiled_in_16_bits_as_the_per_batch_path_does(
        fmt, loss_scale, make, kind, pieces):
    x, y, loss = _sequence_data(kind)
    per_batch, compiled, plain = make(), make(), make()
    kw = dict(dtype=fmt, loss_scale=loss_scale, optimizer="SGD", lr=0.1)
    rb = _run(per_batch, x, y, loss, fused=False, **kw)
    ra = _run(compiled, x, y, loss, **kw, **({} if pieces is None else {"pieces": pieces}))
    _run(plain, x, y, loss, optimizer="SGD", lr=0.1)    # float32 throughout: nothing rounded
    assert (ra.path, ra.schedule, ra.precision) == ("program", "general", fmt)
    assert rb.path == "generic"
    assert (ra.skipped_steps, ra.loss_scale, ra.loss_scale_skips) == \
        (rb.skipped_steps, rb.loss_scale, rb.loss_scale_skips)
    assert ra.loss_history == pytest.approx(rb.loss_history, rel=2.0 ** -8)
    nearest_wrong = _distance(plain, per_batch)
    assert nearest_wrong > 1e-3, "the case must tell a rounded run from an unrounded one"
    assert _distance(compiled, per_batch) <= nearest_wrong / 16


def test_a_program_says_where_its_units_end():
    # units: Dense (row 0), Parallel (rows 1-4: Dense, RMSNorm, SwiGLU, Add), RNN (row 5),
    # Dense (row 6)
    from fastlib.kernels import instructions as ins
    from fastlib.training.program import Program

    prog = Program(_residual_swiglu(), np.dtype(np.float32), 5, 4, 6, False, True)
    rows, rounds = prog.tables.rows, prog.rounds
    assert [int(r["op"]) for r in rows] == [ins.DENSE, ins.DENSE, ins.RMS_NORM, ins.SWIGLU,
                                            ins.ADD, ins.RNN, ins.DENSE]
    y = [int(r["y"]) for r in rows]
    # forward: the last row writing each unit's output; backward: the first row reading a
    # unit's input (rows 1 and 2 read the Parallel's: row 1, whose backward comes last; the
    # first unit's input is the model's, whose cotangent is not computed)
    assert [int(s) for s in rounds[:, 0]] == [y[0], -1, -1, -1, y[4], y[5], y[6]]
    assert [int(s) for s in rounds[:, 1]] == [-1, y[0], -1, -1, -1, y[4], y[5]]


def test_a_resumed_run_continues_the_loss_scale_bit_for_bit(tmp_path):
    x, y, loss = _sequence_data("tokens", n=16)
    kw = dict(dtype="float16", batch_size=4,
              loss_scale={"init_scale": 2.0 ** 20, "growth_interval": 3})
    whole = _tokens_lstm_attention()
    full = _run(whole, x, y, loss, epochs=4, **kw)
    ck = str(tmp_path / "run.ckpt")
    _run(_tokens_lstm_attention(), x, y, loss, epochs=2, checkpoint=ck, **kw)
    resumed_model = _tokens_lstm_attention()
    resumed = _run(resumed_model, x, y, loss, epochs=4, resume=ck, **kw)
    assert (full.path, full.schedule, resumed.schedule) == ("program", "general", "general")
    assert full.loss_scale_skips > 0, "the scale must have moved both ways"
    assert (resumed.loss_scale, resumed.loss_scale_skips) == \
        (full.loss_scale, full.loss_scale_skips)
    assert resumed.loss_history == full.loss_history
    for k, v in whole.parameters().items():
        assert np.array_equal(v, resumed_model.parameters()[k]), k
