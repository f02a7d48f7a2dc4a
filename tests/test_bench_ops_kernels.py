"""The kernels the ops bench drove faster, on their parallel paths and across thread counts.

The performance work split copies, fills and reductions into chunks run in parallel on large
inputs, and cut the recurrent layers' batch into fixed pieces. Small test inputs never take
the parallel paths by default (``fastlib.config.PARALLEL_MIN_SIZE``), so these tests lower the
thresholds and fix the thread count, then check the results against NumPy exactly (copies) or
to rounding, and check that every result is the same bits for 1, 2 and 3 threads.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import fastlib
from fastlib import config
from fastlib.kernels import binary, reduce, structure


@pytest.fixture
def threads(monkeypatch):
    """Set the thread count and make every input large enough to run in parallel."""
    monkeypatch.setattr(config, "PARALLEL_MIN_SIZE", 8)
    monkeypatch.setattr(config, "PARALLEL_MIN_CHUNK", 4)

    def use(n):
        monkeypatch.setattr(config, "num_threads", lambda n=n: n)
    return use


@pytest.mark.parametrize("n", [1, 2, 3])
def test_structure_ops_on_their_parallel_paths_equal_numpy(threads, n):
    threads(n)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, 40, 5, 70)).astype(np.float32)
    for perm in itertools.permutations(range(4)):
        np.testing.assert_array_equal(structure.transpose_forward(x, perm),
                                      np.transpose(x, perm))
        y = np.ascontiguousarray(np.transpose(x, perm))
        np.testing.assert_array_equal(structure.transpose_vjp(x, perm, y), x)
    m = rng.standard_normal((300, 301))
    np.testing.assert_array_equal(structure.transpose_forward(m, (1, 0)), m.T)
    np.testing.assert_array_equal(structure.reshape_forward(x, (70, x.size // 70)),
                                  x.reshape(70, -1))
    for axis in range(4):
        other = list(x.shape)
        other[axis] = 3
        b = rng.standard_normal(other).astype(np.float32)
        c = structure.concat_forward(x, b, axis)
        np.testing.assert_array_equal(c, np.concatenate([x, b], axis))
        ga, gb = structure.concat_vjp(x, b, axis, c)
        np.testing.assert_array_equal(ga, x)
        np.testing.assert_array_equal(gb, b)
        for start, stop, step in ((0, None, 2), (1, -1, 3), (-4, None, 1), (5, 2, 1)):
            plan = structure.slice_plan(x.shape, axis, start, stop, step)
            index = [slice(None)] * 4
            index[axis] = slice(start, stop, step)
            want = x[tuple(index)]
            np.testing.assert_array_equal(structure.slice_forward(x, plan), want)
            g = rng.standard_normal(want.shape).astype(np.float32)
            scattered = np.zeros_like(x)
            scattered[tuple(index)] = g
            np.testing.assert_array_equal(structure.slice_vjp(x, plan, g), scattered)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_reduction_vjps_and_add_sub_vjps_on_their_parallel_paths(threads, n):
    threads(n)
    rng = np.random.default_rng(10 + n)
    x = rng.standard_normal((7, 30, 11)).astype(np.float32)
    for k in range(4):
        for axes in itertools.combinations(range(3), k):
            kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
            g = rng.standard_normal([d for i, d in enumerate(x.shape) if i not in axes])
            g = g.astype(np.float32)
            want = np.broadcast_to(g.reshape(kept), x.shape)
            np.testing.assert_array_equal(reduce.sum_vjp(x, axes, g), want)
            np.testing.assert_array_equal(reduce.mean_vjp(x, axes, g),
                                          want / np.float32(x.size // max(1, g.size)))
    for b_shape in [(7, 30, 11), (30, 11), (11,), (1, 30, 1), (7, 1, 11), ()]:
        b = rng.standard_normal(b_shape).astype(np.float32)
        g = rng.standard_normal(x.shape).astype(np.float32)
        for name, sign in (("add", 1), ("sub", -1)):
            for first, second in ((x, b), (b, x)):
                ga, gb = binary.binary_vjp(name, first, second, g)
                np.testing.assert_array_equal(ga, reduce.sum_to_shape(g, first.shape))
                np.testing.assert_array_equal(gb, sign * reduce.sum_to_shape(g, second.shape))
                assert ga.shape == first.shape and gb.shape == second.shape
                assert not np.shares_memory(ga, g) and not np.shares_memory(gb, g)


def test_sums_and_logsumexp_are_the_same_bits_for_any_thread_count(threads):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1300, 37)) * 10.0 ** rng.integers(-6, 6, (1300, 37)))
    row = rng.standard_normal(70_000).astype(np.float32)
    results = []
    for n in (1, 2, 3):
        threads(n)
        results.append([fastlib.forward("sum", [x], axis=0), fastlib.forward("sum", [x]),
                        fastlib.forward("mean", [x.T.copy()], axis=1),
                        fastlib.forward("logsumexp", [row]),
                        fastlib.vjp("logsumexp", [row], np.float32(1.5))[0],
                        fastlib.vjp("add", [x, x[0]], x)[1]])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
    # and the long logsumexp is right
    lse = fastlib.forward("logsumexp", [row])
    want = np.log(np.sum(np.exp(row.astype(np.float64) - row.max()))) + row.max()
    assert abs(float(lse) - want) <= 4 * np.spacing(np.float32(want))


def test_recurrent_and_attention_layers_are_the_same_bits_for_any_thread_count(threads):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((19, 7, 12)).astype(np.float32)   # 19 rows: pieces of 8, 8, 3
    dy = rng.standard_normal((19, 7, 12)).astype(np.float32)
    results = []
    for n in (1, 2, 3):
        threads(n)
        out = []
        for layer in (fastlib.LSTM(12, 12, return_sequences=True, seed=0),
                      fastlib.RNN(12, 12, return_sequences=True, seed=0),
                      fastlib.MultiHeadAttention(12, 3, seed=0),
                      fastlib.MultiHeadAttention(12, 3, causal=True, seed=0)):
            y = layer.forward(x)
            dx, grads = layer.backward(dy)
            out += [y.copy(), dx] + list(grads.values())
        results.append(out)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
