"""Recurrent programs under the general schedule (fastlib.kernels.interpreter): RNN, LSTM,
Embedding and Dense chains, pieces of sequences per thread, blocks per update.

Independent sources: the generic per-batch path (``fused=False``: the layers' own forward and
backward, ``Optimizer.update``, ``clip_gradients``; itself held to reflib by the conformance
``train`` rows and test_fastlib_train.py), reflib's exact-tape training step, and the result
of the same run on one thread and on two (equal bit for bit by design: pieces and blocks, not
threads, fix every summation order).
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib import config
from fastlib.kernels.recurrent import PIECE
from fastlib.kernels.skeleton import BLOCK

# float64: the two paths differ by summation order only (BLAS's products, the pieces'
# partial gradients added in piece order), ~1e-16 relative per operation; a few epochs on
# these small models keep parameters within ~1e-13, so 1e-10 leaves margin while a wrong
# term (a dropped step, a missing piece, a wrong coefficient) is 1e-3 or larger.
PATH_RTOL = 1e-10
# float32: the same differences at float32's eps (6e-8), grown over a few dozen steps of
# recurrences 4-6 long; 2e-4 is ~3000 eps, a dropped term is far larger.
PATH_RTOL32 = 2e-4


def close(a, b, rtol):
    for k in b:
        scale = max(np.max(np.abs(b[k])), 1e-300)
        assert np.max(np.abs(a[k] - b[k])) <= rtol * scale, k


def lstm_last(dtype, i=4, h=5, c=3):
    return fastlib.Sequential([fastlib.LSTM(i, h), fastlib.Dense(h, c)], dtype=dtype, seed=1)


def rnn_seq(dtype, i=4, h=5, c=3):
    return fastlib.Sequential([fastlib.RNN(i, h, True), fastlib.Dense(h, c, "tanh")],
                              dtype=dtype, seed=1)


def lstm_probs(dtype, i=4, h=5, c=3):
    return fastlib.Sequential([fastlib.LSTM(i, h), fastlib.Dense(h, c, "sigmoid")], dtype=dtype,
                              seed=1)


def stacked(dtype, i=4, h=5, c=3):
    """Dense on every step, LSTM over the sequence, RNN to the last state, nested Sequential."""
    return fastlib.Sequential([fastlib.Dense(i, 3, "sigmoid"), fastlib.LSTM(3, h, True),
                               fastlib.Sequential([fastlib.RNN(h, 4), fastlib.Dense(4, c)])],
                              dtype=dtype, seed=1)


def tokens(dtype, vocab=7, c=3):
    return fastlib.Sequential([fastlib.Embedding(vocab, 4), fastlib.LSTM(4, 5, True),
                               fastlib.LSTM(5, 3), fastlib.Dense(3, c)], dtype=dtype, seed=1)


def data(n=23, steps=5, width=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, steps, width)), rng.integers(0, 3, size=(n, 1))


def targets(loss, y, shape, rng):
    if loss == "cross_entropy":
        return y
    if loss == "categorical_cross_entropy":
        return fastlib.onehot(y, shape[-1], dtype=np.float64)
    if loss == "mse":
        return rng.standard_normal(shape)
    return (rng.random(shape) > 0.5).astype(np.float64)


def both_paths(build, x, t, loss, dtype=np.float64, epochs=3, bs=5, **kw):
    out = []
    for fused in (True, False):
        m = build(dtype)
        r = fastlib.train(m, x, t, epochs, bs, 0.02, loss, x, t, seed=2, fused=fused,
                          verbose=False, **kw)
        assert r.fused == fused
        assert r.schedule == ("general" if fused else None)
        out.append((r, m.parameters()))
    return out


# (model, loss, optimizer, batch size, clip, clip mode): every layer kind and composition,
# every loss the path takes (per-step outputs with mse and bce), every optimizer, both clipping
# modes, and batch sizes on each side of a piece (PIECE - 1, PIECE, PIECE + 1, two pieces and
# a row, a whole epoch of 23 with a partial last piece), and 1
CASES = [
    (lstm_last, "cross_entropy", "adam", PIECE, 0.0, "value"),
    (lstm_last, "categorical_cross_entropy", "sgd", PIECE + 1, 0.0, "value"),
    (lstm_last, "binary_cross_entropy_with_logits", "momentum", PIECE - 1, 0.05, "value"),
    (lstm_last, "mse", "adamw", 2 * PIECE + 1, 0.3, "norm"),
    (lstm_last, "cross_entropy", "nag", 1, 0.0, "value"),
    (rnn_seq, "mse", "rmsprop", 5, 0.0, "value"),
    (rnn_seq, "binary_cross_entropy_with_logits", "adagrad", 23, 0.1, "norm"),
    (lstm_probs, "binary_cross_entropy", "adam", PIECE + 1, 0.0, "value"),
    (stacked, "cross_entropy", "adam", 2 * PIECE + 1, 0.05, "value"),
    (stacked, "mse", "sgd", 1, 0.0, "value"),
]


@pytest.mark.parametrize("build, loss, opt_name, bs, clip, mode", CASES,
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_compiled_path_equals_the_generic_path(build, loss, opt_name, bs, clip, mode):
    x, y = data()
    rng = np.random.default_rng(3)
    out_shape = build(np.float64).infer_shape(x.shape)
    t = targets(loss, y, out_shape, rng)
    (r1, p1), (r0, p0) = both_paths(build, x, t, loss, bs=bs, optimizer=opt_name,
                                    gradient_clip=clip, clip_mode=mode)
    close(p1, p0, PATH_RTOL)
    np.testing.assert_allclose(r1.loss_history, r0.loss_history, rtol=1e-12)
    np.testing.assert_allclose(r1.val_loss_history, r0.val_loss_history, rtol=1e-12)
    if loss == "mse":
        assert r1.accuracy_history == r0.accuracy_history == [None] * 3
    else:  # per-row fractions summed in another order by each path
        np.testing.assert_allclose(r1.accuracy_history, r0.accuracy_history, rtol=1e-12)


def test_tokens_through_an_embedding_equal_the_generic_path():
    rng = np.random.default_rng(4)
    x = rng.integers(0, 7, size=(19, 6))   # repeated tokens: the table's rows sum
    t = (rng.random((19, 3)) > 0.5).astype(np.float64)
    (r1, p1), (r0, p0) = both_paths(tokens, x, t, "binary_cross_entropy_with_logits",
                                    bs=PIECE + 3, optimizer="rmsprop", gradient_clip=0.3,
                                    clip_mode="norm")
    close(p1, p0, PATH_RTOL)
    np.testing.assert_allclose(r1.loss_history, r0.loss_history, rtol=1e-12)


def test_one_time_step_equals_the_generic_path():
    x, y = data(steps=1)
    (r1, p1), (r0, p0) = both_paths(stacked, x, y, "cross_entropy", bs=PIECE + 1,
                                    optimizer="adam")
    close(p1, p0, PATH_RTOL)


@pytest.mark.parametrize("build", [lstm_last, rnn_seq])
def test_float32_runs_in_float32_and_equals_the_generic_path(build):
    x, y = data(n=40, steps=6)
    x = x.astype(np.float32)
    t = y if build is lstm_last else np.random.default_rng(5).standard_normal(
        (40, 6, 3)).astype(np.float32)
    loss = "cross_entropy" if build is lstm_last else "mse"
    (r1, p1), (r0, p0) = both_paths(build, x, t, loss, dtype=np.float32, bs=PIECE + 5,
                                    optimizer="adam")
    assert all(v.dtype == np.float32 for v in p1.values())
    close(p1, p0, PATH_RTOL32)
    np.testing.assert_allclose(r1.loss_history, r0.loss_history, rtol=PATH_RTOL32)


def test_equals_reflib_training_steps():
    """LSTM + Dense, no shuffling, two epochs against reflib's exact-tape training step."""
    import reflib.models
    from reflib.train import train_step

    x, y = data(n=2 * PIECE + 3)
    bs = PIECE + 2
    m = lstm_last(np.float64)
    start = {k: v.copy() for k, v in m.parameters().items()}
    r = fastlib.train(m, x, y, 2, bs, 0.05, "cross_entropy", optimizer="Adam", shuffle=False,
                      verbose=False)
    assert r.fused
    ref = reflib.models.from_config(m.get_config())
    ref.load_parameters(start)
    state = None
    for _ in range(2):
        for s in range(0, len(x), bs):
            _, _, new, state = train_step(ref, x[s:s + bs], y[s:s + bs], "cross_entropy",
                                          "adam", state, lr=0.05)
            ref.load_parameters(new)
    close(m.parameters(), ref.parameters(), PATH_RTOL)


@pytest.mark.parametrize("bs", [1, 2 * PIECE + 1])
def test_the_result_does_not_depend_on_the_thread_count(monkeypatch, bs):
    x, y = data(n=41)
    runs = []
    for threads in (1, 2):
        monkeypatch.setattr(config, "THREADS", threads)
        m = stacked(np.float32)
        r = fastlib.train(m, x.astype(np.float32), y, 2, bs, 0.05, "cross_entropy",
                          optimizer="Adam", seed=4, verbose=False)
        assert r.fused
        runs.append((m.parameters(), r.loss_history))
    for k, v in runs[0][0].items():
        assert np.array_equal(v, runs[1][0][k]), k
    assert runs[0][1] == runs[1][1]


def test_a_parameter_vector_past_one_block_equals_the_generic_path():
    """LSTM(2, 63) + Dense: 16760 parameters, past one update block of 16384."""
    h = 63
    n_params = 4 * h * (2 + h + 1) + (h + 1) * 2
    assert n_params > BLOCK
    x, y = data(n=PIECE + 3, steps=2, width=2)
    build = lambda dtype: fastlib.Sequential([fastlib.LSTM(2, h), fastlib.Dense(h, 2)],
                                             dtype=dtype, seed=1)
    (r1, p1), (r0, p0) = both_paths(build, x, y % 2, "cross_entropy", epochs=2, bs=PIECE,
                                    optimizer="adam", gradient_clip=0.05, clip_mode="norm")
    close(p1, p0, PATH_RTOL)


def test_the_path_declines_what_it_does_not_run():
    x, y = data()
    d = np.float64

    def fused(model, xx=x, yy=y, loss="cross_entropy", **kw):
        return fastlib.train(model, xx, yy, 1, 4, 0.05, loss, verbose=False, **kw).fused

    assert fused(lstm_last(d))
    assert not fused(lstm_last(d), fused=False)
    # every elementwise activation of the op table is compiled (softmax is not); a Parallel
    # container or a norm layer moves the model to the program's general schedule
    # (tests/test_compiled_mixed.py follows which schedule runs)
    assert fused(fastlib.Sequential([fastlib.LSTM(4, 5), fastlib.Dense(5, 3, "gelu")],
                                    dtype=d))
    assert not fused(fastlib.Sequential([fastlib.LSTM(4, 5), fastlib.Dense(5, 3, "softmax")],
                                        dtype=d), loss="mse", yy=np.eye(3)[y[:, 0]])
    par = fastlib.Sequential([fastlib.LSTM(4, 5), fastlib.Parallel(
        [fastlib.Dense(5, 3), fastlib.Dense(5, 3)], combine="add")], dtype=d)
    assert fused(par)
    ln = fastlib.Sequential([fastlib.LSTM(4, 5), fastlib.LayerNorm(5), fastlib.Dense(5, 3)],
                            dtype=d)
    assert fused(ln)
    # binary_cross_entropy on probabilities is one of the compiled losses too
    probs = fastlib.Sequential([fastlib.LSTM(4, 5), fastlib.Dense(5, 1, "sigmoid")], dtype=d)
    assert fused(probs, yy=(y > 0).astype(d), loss="binary_cross_entropy")


def test_token_ids_out_of_range_are_refused_with_the_layers_message():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 7, size=(9, 4))
    x[3, 2] = 7
    with pytest.raises(ValueError, match=r"index 7 out of range \[0, 7\)"):
        fastlib.train(tokens(np.float64), x, rng.integers(0, 2, (9, 3)).astype(float), 1, 4,
                      0.05, "binary_cross_entropy_with_logits", verbose=False)


def test_a_nonfinite_loss_stops_and_restores_as_the_generic_path_does():
    x, _ = data()
    t = np.random.default_rng(6).standard_normal((len(x), 3))
    results = []
    for fused in (True, False):
        m = lstm_last(np.float64)
        with pytest.warns(RuntimeWarning, match="non-finite loss"):
            r = fastlib.train(m, x, t, 4, 4, 1e30, "mse", optimizer="SGD", fused=fused,
                              verbose=False, divergence=False)
        results.append((r, m.parameters()))
    (r1, p1), (r0, p0) = results
    assert r1.diverged and r0.diverged
    assert r1.restored_epoch == r0.restored_epoch
    assert r1.loss_history == pytest.approx(r0.loss_history, rel=1e-12)
    close(p1, p0, PATH_RTOL)
