"""The fixed decomposition of a batch for data-parallel training (no MPI needed).

Expected values are derived by hand from the definitions: blocks are near-equal; the ranks'
runs of blocks partition them; when K divides the number of blocks, the ranks' shards are the
balanced split of the batch; the subtrees a rank owns cover its run; and the tree sum over the
nodes of any K is the same expression, hence the same bits.
"""
from __future__ import annotations

import numpy as np
import pytest

from fastlib.training.distributed import (DataParallel, batch_blocks, block_bounds,
                                          check_ranks, rank_blocks, resolve, tree_nodes,
                                          tree_sum)


@pytest.mark.parametrize("n,m", [(64, 8), (45, 8), (5, 5), (7, 3), (1, 1)])
def test_blocks_are_near_equal_and_cover_the_batch(n, m):
    b = block_bounds(n, m)
    assert b[0][0] == 0 and b[-1][1] == n
    assert all(b[j][1] == b[j + 1][0] for j in range(m - 1))
    sizes = [hi - lo for lo, hi in b]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@pytest.mark.parametrize("n", [64, 45, 13, 8])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_when_k_divides_the_blocks_shards_differ_by_at_most_one_sample(n, k):
    m = min(8, n)
    assert m % k == 0  # 8 blocks (every n here is at least 8): each K here divides them
    bounds = block_bounds(n, m)
    sizes = []
    for r in range(k):
        a, b = rank_blocks(m, k, r)
        sizes.append(sum(hi - lo for lo, hi in bounds[a:b]))
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    # the shards are exactly the balanced split floor((r+1) n / K) - floor(r n / K)
    assert sizes == [((r + 1) * n) // k - (r * n) // k for r in range(k)]


@pytest.mark.parametrize("blocks,k", [(8, 1), (8, 2), (8, 4), (8, 8), (12, 3), (12, 6),
                                      (24, 24)])
@pytest.mark.parametrize("samples,batch", [(45, 8), (100, 32), (61, 12), (7, 64), (1000, 7)])
def test_every_batch_of_an_epoch_splits_within_one_sample(blocks, k, samples, batch):
    """Each batch of an epoch, the last partial one included, split the way train_one_batch
    splits it: the ranks' shards tile the batch and their sizes differ by at most one."""
    check_ranks(blocks, k)  # an accepted configuration
    for start in range(0, samples, batch):
        n = min(batch, samples - start)
        m = batch_blocks(n, blocks)
        bounds = block_bounds(n, m)
        sizes = [sum(hi - lo for lo, hi in bounds[slice(*rank_blocks(m, k, r))])
                 for r in range(k)]
        assert sum(sizes) == n, (start, sizes)
        assert max(sizes) - min(sizes) <= 1, (n, m, sizes)


@pytest.mark.parametrize("blocks,k,fit", [(8, 3, 9), (8, 5, 10), (8, 16, 16), (12, 5, 15)])
def test_ranks_that_do_not_divide_the_blocks_are_refused_with_the_fix(blocks, k, fit):
    # e.g. 8 blocks of a batch of 64 on 3 ranks: 3 + 3 + 2 blocks = 24, 24, 16 samples
    with pytest.raises(ValueError, match=rf"{k} MPI ranks do not divide the {blocks} blocks.*"
                                         rf"DataParallel\(blocks={fit}\)"):
        check_ranks(blocks, k)


@pytest.mark.parametrize("m,k", [(8, 1), (8, 2), (8, 3), (8, 5), (13, 4), (16, 16), (4, 6)])
def test_each_rank_owns_subtrees_that_tile_its_run(m, k):
    runs = [rank_blocks(m, k, r) for r in range(k)]
    assert runs[0][0] == 0 and runs[-1][1] == m
    for a, b in runs:
        nodes = tree_nodes(0, m, a, b)
        covered = [j for lo, hi in nodes for j in range(lo, hi)]
        assert covered == list(range(a, b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_tree_sum_is_the_same_bits_for_every_k(dtype):
    rng = np.random.default_rng(0)
    m = 8
    leaves = {(j, j + 1): (rng.standard_normal(50) * 10.0 ** rng.integers(-6, 6, 50)
                           ).astype(dtype) for j in range(m)}
    # by hand: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
    L = [leaves[(j, j + 1)] for j in range(m)]
    want = ((L[0] + L[1]) + (L[2] + L[3])) + ((L[4] + L[5]) + (L[6] + L[7]))
    for k in (1, 2, 3, 5, 8):
        values = {}
        for r in range(k):
            for node in tree_nodes(0, m, *rank_blocks(m, k, r)):
                values[node] = tree_sum(leaves, *node)
        assert np.array_equal(tree_sum(values, 0, m), want), k
    # and the order matters: a left-to-right sum differs somewhere (what the tree prevents)
    seq = L[0].copy()
    for x in L[1:]:
        seq = seq + x
    assert not np.array_equal(seq, want)


def test_options_are_checked():
    assert resolve(False) is None and resolve(True) == DataParallel()
    with pytest.raises(ValueError, match="blocks"):
        DataParallel(blocks=0)
    with pytest.raises(ValueError, match="timeout"):
        DataParallel(timeout=-1)
    with pytest.raises(TypeError, match="DataParallel"):
        resolve("yes")
