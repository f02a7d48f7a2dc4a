"""The fused MLP epoch cut into pieces (fastlib.kernels.dense_columns): column/row pieces per
layer pair, each piece's parameters in one contiguous block, pieces run on their own threads.

Independent sources: the generic per-batch path (``fused=False``, itself tested against reflib
in test_fastlib_train.py) and reflib's training step directly; the result of one piece layout
run on one thread and on two (equal bit for bit by design: pieces, not threads, fix every
summation order); the original arrays for the flat layout's round trip.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastlib
from fastlib import config
from fastlib.layers.activations import ACTIVATIONS
from fastlib.training import mlp_schedule

# float64 runs of two paths differ only by summation order (see test_fastlib_train.PATH_RTOL)
PATH_RTOL = 1e-10


@pytest.fixture
def split(monkeypatch):
    """Cut every model into two pieces, however small (the machine's choice keeps tiny models
    whole)."""
    monkeypatch.setattr(config, "PIECES", 2)
    return monkeypatch


def make(dims, activation="relu", dtype=np.float64, seed=0):
    layers = [fastlib.Dense(dims[i], dims[i + 1], activation if i < len(dims) - 2 else "linear")
              for i in range(len(dims) - 1)]
    return fastlib.Sequential(layers, dtype=dtype, seed=seed)


def data(n=23, d_in=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d_in)), rng.integers(0, classes, size=(n, 1))


def targets_for(loss, y, classes):
    rng = np.random.default_rng(1)
    if loss == "cross_entropy":
        return y
    if loss == "categorical_cross_entropy":
        return fastlib.onehot(y, classes, dtype=np.float64)
    if loss == "mse":
        return rng.standard_normal((len(y), classes))
    return (rng.random((len(y), classes)) > 0.5).astype(np.float64)


def close(a, b, rtol=PATH_RTOL):
    for k in b:
        scale = max(np.max(np.abs(b[k])), 1e-300)
        assert np.max(np.abs(a[k] - b[k])) <= rtol * scale, k


# (dims, activation, loss, optimizer, batch size, clip, clip mode): one to four layers (a lone
# last COL layer when odd), layers narrower than the number of pieces (empty pieces), batch 1
# (outer products), the last incomplete batch (23 samples), every loss, clipping both ways
CASES = [
    ((5, 3), "relu", "cross_entropy", "adam", 4, 0.0, "value"),
    ((5, 6, 3), "relu", "cross_entropy", "adam", 4, 0.0, "value"),
    ((5, 6, 3), "tanh", "categorical_cross_entropy", "rmsprop", 5, 0.0, "value"),
    ((5, 6, 3), "sigmoid", "mse", "momentum", 1, 0.05, "value"),
    ((5, 6, 3), "leaky_relu", "binary_cross_entropy_with_logits", "nag", 3, 0.0, "value"),
    ((5, 9, 8, 3), "relu", "cross_entropy", "adamw", 4, 0.3, "norm"),
    ((5, 7, 1, 3), "relu", "mse", "adagrad", 1, 0.0, "value"),
    ((5, 1, 4, 6, 3), "tanh", "cross_entropy", "sgd", 23, 0.0, "value"),
    ((5, 4, 4, 4, 1), "relu", "binary_cross_entropy_with_logits", "adam", 6, 0.2, "norm"),
]


@pytest.mark.parametrize("dims, act, loss, opt_name, bs, clip, mode", CASES)
def test_pieces_equal_the_generic_path(split, dims, act, loss, opt_name, bs, clip, mode):
    x, y = data()
    t = targets_for(loss, y, dims[-1])
    results, params = [], []
    for fused in (True, False):
        m = make(dims, act)
        r = fastlib.train(m, x, t, 3, bs, 0.02, loss, x, t, optimizer=opt_name,
                          gradient_clip=clip, clip_mode=mode, seed=2, fused=fused, verbose=False)
        assert r.fused == fused
        results.append(r)
        params.append(m.parameters())
    close(params[0], params[1])
    np.testing.assert_allclose(results[0].loss_history, results[1].loss_history, rtol=1e-12)
    if loss == "mse":  # no accuracy
        assert results[0].accuracy_history == results[1].accuracy_history
    else:  # bce's accuracy is a mean of per-row fractions, summed in another order by each path
        np.testing.assert_allclose(results[0].accuracy_history, results[1].accuracy_history,
                                   rtol=1e-12)


def test_pieces_equal_reflib_steps(split):
    """A three-layer model, no shuffling, against reflib's exact-tape training step."""
    import reflib.models
    from reflib.train import train_step

    x, y = data()
    m = make((5, 6, 4, 3))
    start = {k: v.copy() for k, v in m.parameters().items()}
    r = fastlib.train(m, x, y, 2, 4, 0.05, "cross_entropy", optimizer="Adam", shuffle=False,
                      verbose=False)
    assert r.fused
    ref = reflib.models.from_config(m.get_config())
    ref.load_parameters(start)
    state = None
    for _ in range(2):
        for s in range(0, len(x), 4):
            _, _, new, state = train_step(ref, x[s:s + 4], y[s:s + 4], "cross_entropy", "adam",
                                          state, lr=0.05)
            ref.load_parameters(new)
    close(m.parameters(), ref.parameters())


@pytest.mark.parametrize("bs", [1, 4])
def test_the_result_does_not_depend_on_the_thread_count(split, bs):
    x, y = data()
    runs = []
    for threads in (1, 2):
        split.setattr(config, "THREADS", threads)
        m = make((5, 9, 8, 3))
        r = fastlib.train(m, x, y, 3, bs, 0.05, "cross_entropy", optimizer="Adam", seed=4,
                          verbose=False)
        runs.append((m.parameters(), r.loss_history))
    for k, v in runs[0][0].items():
        assert np.array_equal(v, runs[1][0][k]), k
    assert runs[0][1] == runs[1][1]


@pytest.mark.parametrize("dims", [(5, 3), (5, 6, 3), (5, 9, 1, 3), (7, 2, 5, 4, 3)])
def test_the_flat_layout_round_trips_every_parameter(dims):
    m = make(dims)
    arrays = m.parameters()
    layers = list(m.layers)
    dims = [layers[0].in_features] + [d.out_features for d in layers]
    codes = [ACTIVATIONS[d.activation] for d in layers]
    names = [(f"{i}.weight", f"{i}.bias") for i in range(len(layers))]
    for pieces in (1, 2, 3):
        plan = mlp_schedule._Plan(dims, codes, names, np.dtype(np.float64), 0, pieces)
        flat = plan.flatten(arrays)
        assert flat.size == plan.size == sum(v.size for v in arrays.values())
        # every parameter appears exactly once
        assert np.array_equal(np.sort(flat), np.sort(np.concatenate(
            [v.ravel() for v in arrays.values()])))
        back = {k: np.zeros_like(v) for k, v in arrays.items()}
        plan.unflatten(flat, back)
        for k in arrays:
            assert np.array_equal(back[k], arrays[k]), (pieces, k)


def test_pieces_are_chosen_by_model_size_and_cores_not_by_load(monkeypatch):
    mnist = 784 * 128 + 128 + 128 * 10 + 10          # 101,770 parameters
    digits = 64 * 128 + 128 + 128 * 10 + 10          # 9,610 parameters
    for threads in (1, 2):
        monkeypatch.setattr(config, "THREADS", threads)
        # one piece per usable core, each of at least MIN_PIECE_PARAMS (16,384) parameters:
        # 101,770 // 16,384 = 6
        assert [mlp_schedule.machine_pieces(mnist, c) for c in (1, 2, 4, 16)] == [1, 2, 4, 6]
        # below SPLIT_MIN_PARAMS (32,768) one piece whatever the cores
        assert [mlp_schedule.machine_pieces(digits, c) for c in (1, 2, 16)] == [1, 1, 1]
    # a run records the machine's choice, and it is the choice for this process's cores
    m = make((784, 128, 10), dtype=np.float32)
    rng = np.random.default_rng(0)
    r = fastlib.train(m, rng.standard_normal((8, 784)).astype(np.float32),
                      rng.integers(0, 10, (8, 1)), 1, 4, 0.01, "cross_entropy", verbose=False)
    assert (r.path, r.schedule) == ("program", "mlp")
    assert r.piece_plan == {"pieces": mlp_schedule.machine_pieces(mnist, config.usable_cores()),
                            "source": "machine"}


@pytest.mark.parametrize("bs", [1, 2])
def test_a_nonfinite_gradient_in_one_piece_skips_the_whole_step(split, bs):
    """The overflow sits in the second layer's weight gradient (one piece's block); no piece
    may apply its update, so nothing changes."""
    m = fastlib.Sequential([fastlib.Dense(1, 2), fastlib.Dense(2, 2)], dtype=np.float32)
    p = m.parameters()
    p["0.weight"][...] = 1e31
    p["1.weight"][...] = 1e-31
    p["0.bias"][...] = p["1.bias"][...] = 0.0
    x = np.ones((2, 1), np.float32)
    y = np.full((2, 2), -1e8, np.float32)
    before = {k: v.copy() for k, v in p.items()}
    with pytest.warns(RuntimeWarning, match="skipped"):
        r = fastlib.train(m, x, y, 1, bs, 0.1, "mse", optimizer="Adam", verbose=False,
                          divergence=False)
    assert r.fused and r.skipped_steps == -(-2 // bs)
    for k, v in m.parameters().items():
        assert np.array_equal(v, before[k]), k


def test_resume_in_pieces_is_bit_for_bit(split, tmp_path):
    x, y = data()
    kw = dict(optimizer="Adam", seed=5, verbose=False)
    full = make((5, 9, 8, 3))
    fastlib.train(full, x, y, 4, 3, 0.01, "cross_entropy", **kw)
    part = make((5, 9, 8, 3))
    ck = tmp_path / "ck.npz"
    fastlib.train(part, x, y, 2, 3, 0.01, "cross_entropy", checkpoint=ck, **kw)
    resumed = make((5, 9, 8, 3), seed=9)
    fastlib.train(resumed, x, y, 4, 3, 0.01, "cross_entropy", resume=ck, **kw)
    for k, v in full.parameters().items():
        assert np.array_equal(resumed.parameters()[k], v), k


def test_the_epoch_leaves_no_flush_to_zero_in_the_worker_threads():
    """A fresh process whose first parallel region is a fused epoch in pieces: the worker
    threads that region creates must not keep the epoch's flush-to-zero / denormals-are-zero
    mode, or every later parallel kernel reads subnormals as 0 (log(1.4e-45) = -inf)."""
    script = textwrap.dedent("""
        import numpy as np, fastlib
        from fastlib import config
        config.PIECES, config.THREADS = 2, 2
        rng = np.random.default_rng(0)
        m = fastlib.Sequential([fastlib.Dense(5, 6, "relu"), fastlib.Dense(6, 3)], seed=0)
        fastlib.train(m, rng.standard_normal((8, 5)), rng.integers(0, 3, (8, 1)), 1, 4, 0.1,
                      "cross_entropy", verbose=False)
        # a parallel elementwise kernel (400005 elements: several chunks) on a subnormal
        tiny = np.full(400005, np.float32(1.4e-45))
        out = np.asarray(fastlib.forward("log", [tiny]))
        print(int(np.sum(~np.isfinite(out))))
    """)
    env = {**os.environ, "VERIGRAD_ADAPTIVE_THREADS": "0"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=pathlib.Path(__file__).parents[1], timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] == "0", run.stdout
