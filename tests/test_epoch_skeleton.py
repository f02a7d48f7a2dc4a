"""The epoch skeleton every compiled path ends its steps with (fastlib.kernels.skeleton).

Independent sources: NumPy's elementwise sums in the same piece order, ``np.clip``, the
global norm from ``np.linalg.norm``, and plain SGD ``w - lr * g`` written out by hand.
"""
from __future__ import annotations

import numpy as np
import pytest

from fastlib import optim
from fastlib.kernels import optim as kopt
from fastlib.kernels import skeleton as sk

N, PIECES = 10, 3
CUTS = np.array([0, 4, 7, 10], np.int64)   # three blocks of unequal size
LR = 0.5


def _step(parts, clip_mode=sk.CLIP_NONE, clip=0.0, threads=1):
    w = np.linspace(-1.0, 1.0, N)
    g = np.zeros(N)
    sumsq = np.zeros(CUTS.shape[0] - 1)
    sgd = optim.SGD(lr=LR)
    empty = np.zeros(0)
    applied = sk.end_step(threads, CUTS, PIECES, parts, g, sumsq, sgd.kind, w, empty, empty,
                          sgd.coefficients(1), clip_mode, clip, sk.model_precision(w), 1.0)
    return applied, w, g, sumsq


def _parts(seed=0):
    return np.random.default_rng(seed).standard_normal((PIECES, N))


def test_the_pieces_are_summed_in_order_and_sgd_applied():
    parts = _parts()
    applied, w, g, sumsq = _step(parts)
    total = parts[0] + parts[1] + parts[2]
    assert applied
    np.testing.assert_array_equal(g, total)
    np.testing.assert_array_equal(w, np.linspace(-1.0, 1.0, N) - LR * total)
    blocks = [np.sum(total[CUTS[k]:CUTS[k + 1]] ** 2) for k in range(3)]
    np.testing.assert_allclose(sumsq, blocks, rtol=1e-14)


def test_clipping_by_value_and_by_the_global_norm():
    parts = _parts(1)
    total = parts[0] + parts[1] + parts[2]
    _, w, _, _ = _step(parts, sk.CLIP_VALUE, 0.3)
    np.testing.assert_array_equal(w, np.linspace(-1.0, 1.0, N) - LR * np.clip(total, -0.3, 0.3))
    _, w, _, _ = _step(parts, sk.CLIP_NORM, 0.3)
    scaled = total * (0.3 / np.linalg.norm(total))
    np.testing.assert_allclose(w, np.linspace(-1.0, 1.0, N) - LR * scaled, rtol=1e-13)


def test_a_non_finite_gradient_skips_the_step_whole():
    parts = _parts(2)
    parts[1, 8] = np.nan
    applied, w, _, _ = _step(parts)
    assert not applied
    np.testing.assert_array_equal(w, np.linspace(-1.0, 1.0, N))


@pytest.mark.parametrize("clip_mode", [sk.CLIP_NONE, sk.CLIP_NORM])
def test_the_same_bits_on_one_thread_and_two(clip_mode):
    one = _step(_parts(3), clip_mode, 0.2, threads=1)
    two = _step(_parts(3), clip_mode, 0.2, threads=2)
    for a, b in zip(one[1:], two[1:]):
        np.testing.assert_array_equal(a, b)


def test_the_update_blocks_cover_the_vector_once():
    assert sk.block_cuts(2 * sk.BLOCK + 5).tolist() == [0, sk.BLOCK, 2 * sk.BLOCK,
                                                        2 * sk.BLOCK + 5]
    assert sk.block_cuts(5).tolist() == [0, 5]
