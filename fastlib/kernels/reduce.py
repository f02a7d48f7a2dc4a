"""Reductions: sum, mean and logsumexp over any axes, and summing a cotangent back to a shape.

Every reduction is brought to one of two canonical layouts by a reshape (a view when the axes
are adjacent) or, for scattered axes, a transposed copy:

- rows   ``(P, R)``    reduce the last axis;
- middle ``(P, R, Q)`` reduce the middle axis, vectorised across the Q contiguous columns.

The long story: docs/fastlib.md, section ``fastlib/kernels/reduce.py``.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from fastlib import config
from fastlib.kernels.vecmath import dd_add, dd_div, dd_exp, dd_mul, fexp, two_sum

_FM = config.FASTMATH
# NOTE: reassociation is allowed inside one block sum only, so that the loop vectorises into
# partial sums (the error bound below holds for any order within a block).
_FM_BLOCK = config.FASTMATH | {"reassoc"}
_BLOCK = 512
# NOTE (a promise the conformance suite holds fastlib to): in these dtypes ``sum`` and ``mean``
# return the exact result rounded once, up to the float64 accumulation error (module NOTE).
ROUNDED_ONCE_FORWARD_DTYPES = ("float32",)
_STACK = 64          # pairwise levels: enough for 2**64 blocks


# --- scalar pairwise sums ------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=_FM_BLOCK, error_model="numpy")
def _block_sum(v, lo, hi):
    """float64 sum of v[lo:hi] (one block): a plain loop the compiler vectorises.

    NOTE: the loop runs over a slice view from index 0; indexing ``v[lo + i]`` would keep
    Numba's negative-index wraparound test in the loop and stop it vectorising.
    """
    w = v[lo:hi]
    s = 0.0
    for i in range(w.size):
        s += w[i]
    return s


# The binary tree over block sums, kept as a stack of (partial sum, level): a new block sum
# merges with every top entry of its level, as the recursive pairwise sum would pair them.

@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _tree_push(stack, levels, top, s):
    """Push block sum ``s`` (level 0), merging equal levels; return the new stack height."""
    level = 0
    while top > 0 and levels[top - 1] == level:
        top -= 1
        s = stack[top] + s
        level += 1
    stack[top] = s
    levels[top] = level
    return top + 1


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _tree_total(stack, top):
    """The tree's total: the stack's partial sums added from the top down."""
    s = stack[top - 1]
    for k in range(top - 2, -1, -1):
        s = stack[k] + s
    return s


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _pairwise_sum(v, lo, hi):
    """Pairwise float64 sum of v[lo:hi] (blocks of _BLOCK combined as a binary tree)."""
    if hi - lo <= _BLOCK:
        return _block_sum(v, lo, hi)
    stack = np.empty(_STACK)
    levels = np.empty(_STACK, np.int64)
    top = 0
    for start in range(lo, hi, _BLOCK):
        s = _block_sum(v, start, min(start + _BLOCK, hi))
        top = _tree_push(stack, levels, top, s)
    return _tree_total(stack, top)


# --- rows: (P, R) -> (P,) -----------------------------------------------------------------
# Each kernel is a serial function over a range of tasks (rows, or row pieces) plus a
# ``prange`` driver over chunks of that range; launchers call the serial function directly
# when there is one chunk, so small inputs never enter a parallel region.

@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _sum_rows_range(x, parts, partial, t0, t1):
    """partial[row, k] = pairwise sum of piece k of row ``row``, for tasks t0..t1."""
    r = x.shape[1]
    for task in range(t0, t1):
        row = task // parts
        k = task % parts
        partial[row, k] = _pairwise_sum(x[row], r * k // parts, r * (k + 1) // parts)


@njit(cache=True, parallel=True, error_model="numpy")
def _sum_rows_par(x, parts, partial, nchunks):
    tasks = x.shape[0] * parts
    for c in prange(nchunks):
        _sum_rows_range(x, parts, partial, tasks * c // nchunks, tasks * (c + 1) // nchunks)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _row_max(v):
    """max of a non-empty row of finite values (callers validate finiteness): sixteen
    running maxima, so that the loop vectorises."""
    n = v.size
    m = v[0]
    k = n // 16 * 16
    if k:
        acc = np.empty(16, v.dtype)
        for j in range(16):
            acc[j] = v[j]
        for i in range(16, k, 16):
            for j in range(16):
                w = v[i + j]
                acc[j] = w if w > acc[j] else acc[j]
        for j in range(16):
            m = acc[j] if acc[j] > m else m
    for i in range(k, n):
        m = v[i] if v[i] > m else m
    return m


@njit(inline="always", error_model="numpy")
def dd_shifted_exp(v, m, eh, el):
    """exp(v - m) of a row in double-double into ``eh``, ``el``; returns their dd sum."""
    sh = 0.0
    sl = 0.0
    for i in range(v.shape[0]):
        th, tl = two_sum(v[i], -m)
        a, b = dd_exp(th, tl)
        eh[i] = a
        el[i] = b
        sh, sl = dd_add(sh, sl, a, b)
    return sh, sl


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _row_sumexp(v, shift):
    """float64 sum of exp(v - shift) over a row (exp in v's dtype, pairwise accumulation)."""
    n = v.size
    buf = np.empty(min(n, _BLOCK), v.dtype)
    stack = np.empty(_STACK)
    levels = np.empty(_STACK, np.int64)
    top = 0
    for start in range(0, n, _BLOCK):
        w = v[start:min(start + _BLOCK, n)]
        for i in range(w.size):
            buf[i] = fexp(w[i] - shift)
        s = _block_sum(buf, 0, w.size)
        top = _tree_push(stack, levels, top, s)
    return _tree_total(stack, top)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _lse_rows_range(x, out, r0, r1):
    """out[row] = float64 log-sum-exp of row ``row`` of x, shifted by its max (no overflow)."""
    for row in range(r0, r1):
        v = x[row]
        m = _row_max(v)
        out[row] = np.float64(m) + math.log(_row_sumexp(v, m))


@njit(cache=True, parallel=True, error_model="numpy")
def _lse_rows_par(x, out, nchunks):
    p_rows = x.shape[0]
    for c in prange(nchunks):
        _lse_rows_range(x, out, p_rows * c // nchunks, p_rows * (c + 1) // nchunks)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _lse_vjp_rows_range(x, lse, g, out, r0, r1):
    """out[p, r] = g[p] * exp(x[p, r] - lse[p]) (the softmax of each row times its cotangent)."""
    r = x.shape[1]
    for row in range(r0, r1):
        shift = lse[row]
        gr = g[row]
        for i in range(r):
            out[row, i] = gr * fexp(x[row, i] - shift)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _lse_vjp_rows_range64(x, g, out, r0, r1):
    """float64 out[p, r] = g[p] e_r / S, e = exp(x[p] - max), S = sum e, in double-double
    (``fastlib.kernels.vecmath``), rounded once.

    NOTE: exp(x - lse) with lse rounded to float64 carries lse's rounding error, u |lse|, into
    every entry (7 ULPs at lse ~ 16); e / S has no such term.
    """
    r = x.shape[1]
    eh = np.empty(r)
    el = np.empty(r)
    for row in range(r0, r1):
        v = x[row]
        sh, sl = dd_shifted_exp(v, _row_max(v), eh, el)
        ch, cl = dd_div(g[row], 0.0, sh, sl)
        for i in range(r):
            out[row, i] = dd_mul(eh[i], el[i], ch, cl)[0]


@njit(cache=True, parallel=True, error_model="numpy")
def _lse_vjp_rows_par64(x, g, out, nchunks):
    p_rows = x.shape[0]
    for c in prange(nchunks):
        _lse_vjp_rows_range64(x, g, out, p_rows * c // nchunks, p_rows * (c + 1) // nchunks)


@njit(cache=True, parallel=True, error_model="numpy")
def _lse_vjp_rows_par(x, lse, g, out, nchunks):
    p_rows = x.shape[0]
    for c in prange(nchunks):
        _lse_vjp_rows_range(x, lse, g, out, p_rows * c // nchunks, p_rows * (c + 1) // nchunks)


# --- middle: (P, R, Q) -> (P, Q) ------------------------------------------------------------
# Two phases. Blocks: the float64 sum of each block of _BLOCK rows, per column, rows added in
# order four at a time (tasks = (p, block, column piece), so a short wide input still splits
# across threads).
# Combine: the blocks of each column added as a binary tree. Neither phase's order depends on
# how the tasks are split, so the sums are the same bits for any thread count.

@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _middle_blocks_range(x, qparts, blocks, dst, scale, t0, t1):
    """blocks[p, b, q] = sum of x[p, r, q] over the rows r of block b (in order), for tasks
    t0..t1 (task = (p, block, column piece)). When ``dst`` is not empty it also receives
    ``scale * x`` over the same entries (the copy an add / sub VJP needs, in the same pass).

    NOTE: explicit loops, not slice assignment: Numba's slice assignment drags in the
    compilation of its shape-mismatch error path (seconds of compile time).
    """
    p_dim, r_dim, q_dim = x.shape
    nblocks = blocks.shape[1]
    copy = dst.size > 0
    for task in range(t0, t1):
        p = task // (nblocks * qparts)
        rest = task % (nblocks * qparts)
        b = rest // qparts
        k = rest % qparts
        q0 = q_dim * k // qparts
        q1 = q_dim * (k + 1) // qparts
        width = q1 - q0
        blk = np.empty(width)
        for q in range(width):
            blk[q] = 0.0
        r = b * _BLOCK
        r_end = min(r + _BLOCK, r_dim)
        # NOTE: four rows per pass, added in pairs before they reach the accumulator: a
        # quarter of the accumulator's trips through L1 (1000x1000 float32, one thread:
        # 0.24 ms against 0.28 ms row by row, NumPy's float32 sum(0) 0.29 ms)
        while r + 4 <= r_end:
            a0 = x[p, r, q0:q1]
            a1 = x[p, r + 1, q0:q1]
            a2 = x[p, r + 2, q0:q1]
            a3 = x[p, r + 3, q0:q1]
            if copy:
                # NOTE: the copy in loops of its own (the sums then read the rows from L1),
                # not fused into the sum loop: 0.52 ms against 0.82 ms on 1000x1000 float32
                for i in range(4):
                    row = x[p, r + i, q0:q1]
                    out = dst[p, r + i, q0:q1]
                    for q in range(width):
                        out[q] = scale * row[q]
            for q in range(width):
                blk[q] += ((np.float64(a0[q]) + np.float64(a1[q]))
                           + (np.float64(a2[q]) + np.float64(a3[q])))
            r += 4
        while r < r_end:
            row = x[p, r, q0:q1]
            if copy:
                out = dst[p, r, q0:q1]
                for q in range(width):
                    out[q] = scale * row[q]
            for q in range(width):
                blk[q] += row[q]
            r += 1
        dest = blocks[p, b, q0:q1]
        for q in range(width):
            dest[q] = blk[q]


@njit(cache=True, parallel=True, error_model="numpy")
def _middle_blocks_par(x, qparts, blocks, dst, scale, nchunks):
    tasks = x.shape[0] * blocks.shape[1] * qparts
    for c in prange(nchunks):
        _middle_blocks_range(x, qparts, blocks, dst, scale, tasks * c // nchunks,
                             tasks * (c + 1) // nchunks)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _middle_combine(blocks, out):
    """out[p, q] = the block sums blocks[p, :, q] added as a binary tree (pairwise)."""
    p_dim, nblocks, q_dim = blocks.shape
    depth = 2
    while (1 << (depth - 2)) < nblocks:
        depth += 1
    stack = np.empty((depth, q_dim))
    levels = np.empty(depth, np.int64)
    acc = np.empty(q_dim)
    for p in range(p_dim):
        top = 0
        for b in range(nblocks):
            src = blocks[p, b]
            for q in range(q_dim):
                acc[q] = src[q]
            level = 0
            while top > 0 and levels[top - 1] == level:
                top -= 1
                for q in range(q_dim):
                    acc[q] = stack[top, q] + acc[q]
                level += 1
            for q in range(q_dim):
                stack[top, q] = acc[q]
            levels[top] = level
            top += 1
        for q in range(q_dim):
            s = stack[top - 1, q]
            for lvl in range(top - 2, -1, -1):
                s = stack[lvl, q] + s
            out[p, q] = s


def _sum_middle(arr, dst=None, scale=1.0, serial=False):
    """float64 sums of ``arr`` (P, R, Q) over R, shape (P, Q); ``dst`` (P, R, Q), if given,
    receives ``scale * arr`` in the same pass."""
    p, r, q = arr.shape
    nblocks = -(-r // _BLOCK)
    nchunks = 1 if serial else config.num_chunks(arr.size)
    qparts = max(1, min(nchunks, q)) if p * nblocks < nchunks else 1
    blocks = np.empty((p, nblocks, q))
    if dst is None:
        dst = np.empty((0, 0, 0), arr.dtype)
    tasks = p * nblocks * qparts
    nchunks = min(nchunks, tasks)
    if nchunks <= 1:
        _middle_blocks_range(arr, qparts, blocks, dst, arr.dtype.type(scale), 0, tasks)
    else:
        _middle_blocks_par(arr, qparts, blocks, dst, arr.dtype.type(scale), nchunks)
    if nblocks == 1:
        return blocks.reshape(p, q)
    out = np.empty((p, q))
    _middle_combine(blocks, out)
    return out


# --- long rows of logsumexp: pieces ----------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _lse_pieces_range(x, parts, pmax, psum, t0, t1):
    """For tasks t0..t1 (task = (row, piece)): pmax = the piece's max, psum = float64 sum of
    exp(x - pmax) over the piece (pairwise). Combined by ``_lse_combine``."""
    r = x.shape[1]
    for task in range(t0, t1):
        row = task // parts
        k = task % parts
        v = x[row, r * k // parts:r * (k + 1) // parts]
        m = _row_max(v)
        pmax[row, k] = m
        psum[row, k] = _row_sumexp(v, m)


@njit(cache=True, parallel=True, error_model="numpy")
def _lse_pieces_par(x, parts, pmax, psum, nchunks):
    tasks = x.shape[0] * parts
    for c in prange(nchunks):
        _lse_pieces_range(x, parts, pmax, psum, tasks * c // nchunks, tasks * (c + 1) // nchunks)


@njit(cache=True, nogil=True, error_model="numpy")
def _lse_combine(pmax, psum, out):
    """out[row] = M + log(sum_k psum[row, k] exp(pmax[row, k] - M)), M the row max; in order."""
    for row in range(pmax.shape[0]):
        m = pmax[row, 0]
        for k in range(1, pmax.shape[1]):
            m = max(m, pmax[row, k])
        m64 = np.float64(m)
        s = 0.0
        for k in range(pmax.shape[1]):
            s += psum[row, k] * math.exp(np.float64(pmax[row, k]) - m64)
        out[row] = m64 + math.log(s)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _lse_vjp_pieces_range(x, lse, g, parts, out, t0, t1):
    """out = g[row] * exp(x - lse[row]) over tasks (row, piece) t0..t1."""
    r = x.shape[1]
    for task in range(t0, t1):
        row = task // parts
        k = task % parts
        j0 = r * k // parts
        j1 = r * (k + 1) // parts
        v = x[row, j0:j1]
        o = out[row, j0:j1]
        shift = lse[row]
        gr = g[row]
        for i in range(j1 - j0):
            o[i] = gr * fexp(v[i] - shift)


@njit(cache=True, parallel=True, error_model="numpy")
def _lse_vjp_pieces_par(x, lse, g, parts, out, nchunks):
    tasks = x.shape[0] * parts
    for c in prange(nchunks):
        _lse_vjp_pieces_range(x, lse, g, parts, out, tasks * c // nchunks,
                              tasks * (c + 1) // nchunks)


# --- broadcasting a cotangent back: (M, K) views ----------------------------------------------

@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _expand_range(g, rs, cs, out, parts, t0, t1):
    """out[i, j] = g[i rs + j cs] (cs 0 or 1) for tasks t0..t1 (task = (row, piece))."""
    k = out.shape[1]
    for t in range(t0, t1):
        i = t // parts
        j0 = k * (t % parts) // parts
        j1 = k * (t % parts + 1) // parts
        o = out[i, j0:j1]
        if cs == 0:
            v = g[i * rs]
            for j in range(j1 - j0):
                o[j] = v
        else:
            s = g[i * rs + j0:i * rs + j1]
            for j in range(j1 - j0):
                o[j] = s[j]


@njit(cache=True, parallel=True, error_model="numpy")
def _expand_par(g, rs, cs, out, parts, nchunks):
    tasks = out.shape[0] * parts
    for c in prange(nchunks):
        _expand_range(g, rs, cs, out, parts, tasks * c // nchunks, tasks * (c + 1) // nchunks)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _scaled_copies_range(g, sa, sb, ga, gb, t0, t1):
    """ga = sa * g and gb = sb * g (flat, elements t0..t1): one read of g for two outputs."""
    s = g[t0:t1]
    a = ga[t0:t1]
    b = gb[t0:t1]
    for i in range(t1 - t0):
        v = s[i]
        a[i] = sa * v
        b[i] = sb * v


@njit(cache=True, parallel=True, error_model="numpy")
def _scaled_copies_par(g, sa, sb, ga, gb, nchunks):
    n = g.size
    for c in prange(nchunks):
        _scaled_copies_range(g, sa, sb, ga, gb, n * c // nchunks, n * (c + 1) // nchunks)


# --- validation scans ---------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _count_outside(v, lo, hi):
    """How many entries of the flat array v are not in [lo, hi] (NaN counts; a vectorised
    count, no early exit, so that the common all-valid case runs at memory speed)."""
    bad = 0
    for i in range(v.size):
        x = v[i]
        bad += 0 if (x >= lo and x <= hi) else 1
    return bad


def first_outside(x, lo, hi):
    """Flat index of the first entry of ``x`` outside [lo, hi] (NaN is outside), or -1.

    With ``lo = -max, hi = max`` of the dtype this finds the first non-finite entry.
    """
    flat = x.reshape(-1)
    if flat.size == 0 or _count_outside(flat, lo, hi) == 0:   # bounds as float64: exact
        return -1
    ok = (flat >= lo) & (flat <= hi)
    return int(np.argmin(ok))


# --- launchers ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def _layout(shape, axes):
    """(kind, view shape or axis order, kept shape) of ``_canonical``, cached per (shape, axes)."""
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    r = math.prod(shape[a] for a in axes)
    if axes and axes == tuple(range(axes[0], axes[-1] + 1)):
        p = math.prod(shape[:axes[0]])
        q = math.prod(shape[axes[-1] + 1:])
        if q == 1:
            return "rows", (p, r), kept
        return "middle", (p, r, q), kept
    order = tuple(i for i in range(len(shape)) if i not in axes) + tuple(axes)
    return "moved", order, kept


def _canonical(x, axes):
    """(kind, array, kept_shape): kind 'rows' (P, R) or 'middle' (P, R, Q) for the reduction."""
    kind, how, kept = _layout(x.shape, tuple(axes))
    if kind != "moved":
        return kind, x.reshape(how), kept
    moved = np.ascontiguousarray(np.transpose(x, how))
    return "rows", moved.reshape(-1, math.prod(x.shape[a] for a in axes)), kept


def _row_parts(p, r):
    """Pieces per row for P rows of length R: several only for few long rows.

    NOTE: the pieces depend on the shape only (config.SUM_ROW_PIECES), never on the thread
    count, so results are bit-reproducible across machines and loads.
    """
    return (max(1, min(config.SUM_ROW_PIECES, r // config.PARALLEL_MIN_CHUNK))
            if p < config.SUM_ROW_PIECES else 1)


def _sum64(x, axes, serial=False):
    """float64 sums of ``x`` over ``axes`` with the kept axes' shape (``serial``: on the
    calling thread only)."""
    kind, arr, kept = _canonical(x, axes)
    if arr.size == 0:
        return np.zeros(kept)
    if kind == "middle":
        return _sum_middle(arr, serial=serial).reshape(kept)
    nchunks = 1 if serial else config.num_chunks(arr.size)
    p, r = arr.shape
    # few long rows: split each row into pieces so that every chunk has work
    parts = _row_parts(p, r)
    partial = np.empty((p, parts))
    nchunks = min(nchunks, p * parts)
    if nchunks <= 1:
        _sum_rows_range(arr, parts, partial, 0, p * parts)
    else:
        _sum_rows_par(arr, parts, partial, nchunks)
    if parts == 1:
        return partial.reshape(kept)
    return partial.sum(axis=1).reshape(kept)    # at most a few pieces per row


def _with_keepdims(result, shape, axes, keepdims):
    if not keepdims:
        return result
    return result.reshape(tuple(1 if i in axes else d for i, d in enumerate(shape)))


def sum_forward(x, axes, keepdims=False, *, serial=False):
    """Sum of ``x`` over ``axes`` (normalised tuple), in x's dtype (see the module NOTE).

    ``serial=True`` keeps the work on the calling thread (the same bits either way): the
    layers use it for their bias gradients, which sit between NumPy GEMMs. NOTE: a parallel
    region right after a NumPy GEMM waits for NumPy's OpenBLAS workers, which keep spinning
    on the other core after the call: a 0.14 ms two-thread column sum of 2048 x 384 float32
    took 3.8-4.8 ms on average there (0.3 ms on one thread).
    """
    return _with_keepdims(_sum64(x, axes, serial).astype(x.dtype), x.shape, axes, keepdims)


def mean_forward(x, axes, keepdims=False):
    """Mean of ``x`` over ``axes``: the float64 sum divided by the count, rounded once."""
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return _with_keepdims((_sum64(x, axes) / count).astype(x.dtype), x.shape, axes, keepdims)


@functools.lru_cache(maxsize=256)
def _broadcast_plan(kept_shape, shape):
    """(M, K, row stride, column stride) of the C-ordered ``shape`` viewed as (M, K), with a
    ``kept_shape`` array (1 on broadcast axes) read at ``g[i * rs + j * cs]``; None when the
    axes do not merge into two (then NumPy broadcasts)."""
    strides = [0] * len(shape)
    step = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = 0 if kept_shape[i] == 1 else step
        step *= kept_shape[i]
    merged = []                                   # [size, stride]
    for n, st in zip(shape, strides):
        if n == 1:
            continue
        if merged and merged[-1][1] == st * n:
            merged[-1] = [merged[-1][0] * n, st]
            continue
        merged.append([n, st])
    while len(merged) < 2:
        merged.insert(0, [1, 0])
    if len(merged) > 2 or merged[1][1] not in (0, 1):
        return None
    (m, rs), (k, cs) = merged
    return m, k, rs, cs


def expand_to(g, shape, axes):
    """Broadcast a reduction's cotangent (kept axes only, or keepdims) back to ``shape``: one
    parallel write pass into a fresh array (a fill where every axis was reduced)."""
    kept_shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    g = np.ascontiguousarray(g).reshape(kept_shape)
    out = np.empty(shape, g.dtype)
    plan = _broadcast_plan(kept_shape, tuple(shape)) if out.size else None
    if plan is None:
        out[...] = g    # empty, or axes that do not merge into two: NumPy broadcasts
        return out
    m, k, rs, cs = plan
    nchunks = config.num_chunks(out.size)
    parts = max(1, min(nchunks, k // config.PARALLEL_MIN_CHUNK)) if m < nchunks else 1
    nchunks = min(nchunks, m * parts)
    flat, out2 = g.reshape(-1), out.reshape(m, k)
    if nchunks <= 1:
        _expand_range(flat, rs, cs, out2, parts, 0, m * parts)
    else:
        _expand_par(flat, rs, cs, out2, parts, nchunks)
    return out


def sum_vjp(x, axes, grad):
    """VJP of sum: the cotangent broadcast back over the reduced axes."""
    return expand_to(grad, x.shape, axes)


def mean_vjp(x, axes, grad):
    """VJP of mean: the cotangent divided by the count, broadcast back."""
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return expand_to(grad / x.dtype.type(count), x.shape, axes)


def _lse_rows(x, axes):
    """(rows (P, R), float64 lse (P,), kept shape, (p, q) of a middle layout or None)."""
    kind, arr, kept = _canonical(x, axes)
    pq = None
    if kind == "middle":
        # NOTE: move the reduced block last (one copy) so that the row kernel applies.
        p, r, q = arr.shape
        arr = np.ascontiguousarray(arr.transpose(0, 2, 1)).reshape(p * q, r)
        pq = (p, q)
    p, r = arr.shape
    lse = np.empty(p)
    parts = _row_parts(p, r)
    nchunks = min(config.num_chunks(arr.size), p * parts)
    if parts > 1:
        # few long rows: each piece's max and sum of exp relative to it, combined per row
        pmax = np.empty((p, parts), arr.dtype)
        psum = np.empty((p, parts))
        if nchunks <= 1:
            _lse_pieces_range(arr, parts, pmax, psum, 0, p * parts)
        else:
            _lse_pieces_par(arr, parts, pmax, psum, nchunks)
        _lse_combine(pmax, psum, lse)
    elif nchunks <= 1:
        _lse_rows_range(arr, lse, 0, p)
    else:
        _lse_rows_par(arr, lse, nchunks)
    return arr, lse, kept, pq


def logsumexp_forward(x, axes, keepdims=False):
    """log(sum(exp(x))) over ``axes``, shifted by the maximum: finite for finite x."""
    _, lse, kept, _ = _lse_rows(x, axes)
    return _with_keepdims(lse.astype(x.dtype).reshape(kept), x.shape, axes, keepdims)


def logsumexp_vjp(x, axes, grad):
    """VJP of logsumexp: grad * softmax(x) over the reduced axes."""
    arr, lse, kept, pq = _lse_rows(x, axes)
    g = grad.astype(x.dtype, copy=False).reshape(-1)
    rows = np.empty_like(arr)
    p, r = arr.shape
    parts = _row_parts(p, r)
    nchunks = min(config.num_chunks(arr.size), p * parts)
    if x.dtype == np.float64:       # double-double, rounded once (the kernel's NOTE)
        if min(nchunks, p) <= 1:
            _lse_vjp_rows_range64(arr, g, rows, 0, p)
        else:
            _lse_vjp_rows_par64(arr, g, rows, min(nchunks, p))
    elif nchunks <= 1:
        _lse_vjp_rows_range(arr, lse.astype(x.dtype), g, rows, 0, p)
    elif parts == 1:
        _lse_vjp_rows_par(arr, lse.astype(x.dtype), g, rows, nchunks)
    else:
        _lse_vjp_pieces_par(arr, lse.astype(x.dtype), g, parts, rows, nchunks)
    if pq is not None:
        p, q = pq
        return np.ascontiguousarray(rows.reshape(p, q, -1).transpose(0, 2, 1)).reshape(x.shape)
    if len(axes) == x.ndim or axes == tuple(range(x.ndim - len(axes), x.ndim)):
        return rows.reshape(x.shape)
    order = [i for i in range(x.ndim) if i not in axes] + list(axes)
    moved_shape = tuple(x.shape[i] for i in order)
    return np.ascontiguousarray(np.transpose(rows.reshape(moved_shape), np.argsort(order)))


def sum_to_shape(g, shape):
    """Sum a broadcast cotangent ``g`` back to ``shape`` (NumPy broadcasting rules reversed).

    Leading axes that broadcasting added are summed away; axes where ``shape`` has 1 and ``g``
    does not are summed with keepdims. Pairwise float64 accumulation (module NOTE).
    """
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                     if d == 1 and g.shape[lead + i] != 1)
    return _sum64(np.ascontiguousarray(g), axes).astype(g.dtype).reshape(shape)


def _contiguous(g):
    """``g`` as a C-contiguous array, 0-d kept 0-d (``np.ascontiguousarray`` makes it 1-d)."""
    return g if g.flags.c_contiguous else np.ascontiguousarray(g).reshape(g.shape)


def _reduction_axes(g_shape, shape):
    lead = len(g_shape) - len(shape)
    return tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and g_shape[lead + i] != 1)


def scaled_copies(g, sa, sb):
    """(sa * g, sb * g) as two new arrays from one read of ``g`` (sa, sb exact: +-1)."""
    g = _contiguous(g)
    ga = np.empty_like(g)
    gb = np.empty_like(g)
    n = g.size
    nchunks = config.num_chunks(n)
    flat = g.reshape(-1)
    t = g.dtype.type
    if nchunks <= 1:
        _scaled_copies_range(flat, t(sa), t(sb), ga.reshape(-1), gb.reshape(-1), 0, n)
    else:
        _scaled_copies_par(flat, t(sa), t(sb), ga.reshape(-1), gb.reshape(-1), nchunks)
    return ga, gb


def copy_and_sum_to_shape(g, shape, scale=1.0):
    """(``scale * g`` as a new array, ``g`` summed back to ``shape``), in one pass over g when
    the summed axes are leading ones (a bias broadcast over rows); else a copy and a sum.

    The sum is the same bits as ``sum_to_shape(g, shape)``.
    """
    g = _contiguous(g)
    shape = tuple(shape)
    axes = _reduction_axes(g.shape, shape)
    kind, arr, _ = _canonical(g, axes)
    if kind == "middle" and arr.size and g.shape != shape:
        dst = np.empty(g.shape, g.dtype)
        total = _sum_middle(arr, dst.reshape(arr.shape), scale)
        return dst, total.astype(g.dtype).reshape(shape)
    copy = g.copy() if scale == 1 else np.multiply(g, g.dtype.type(scale))
    return copy, sum_to_shape(g, shape)


# --- sums back to a shape, rounded once (float64) --------------------------------------------
#
# NOTE: a float64 pairwise sum errs by up to ~log2(n) eps sum|terms| (and by the block's linear
# growth inside a block), so a well-conditioned sum of a few thousand cotangents (a bias
# broadcast over a long batch) came out 7-9 ulp off. These kernels carry the sum as an
# unevaluated pair s + c (Knuth's TwoSum for s, the errors gathered in c) and round once at the
# end: the result is the exact sum rounded once up to n eps^2 sum|terms|, for terms given as
# hi + lo pairs (a product or quotient formed exactly by the caller). Serial and float64-only:
# float64 is the accuracy-first dtype; float32 sums accumulate in float64, which is already
# "rounded once" for them.

@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _dd_sum_rows(hi, lo, use_lo, out):
    """out[p] = sum_r hi[p, r] (+ lo[p, r] when ``use_lo``), compensated, rounded once."""
    rows, r_dim = hi.shape
    for p in range(rows):
        h = hi[p]
        s = 0.0
        c = 0.0
        for r in range(r_dim):
            s, e = two_sum(s, h[r])
            c += e
        if use_lo:
            w = lo[p]
            for r in range(r_dim):
                c += w[r]
        out[p] = s + c


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _dd_sum_middle(hi, lo, use_lo, out):
    """out[p, q] = sum_r hi[p, r, q] (+ lo), compensated column by column, rounded once."""
    p_dim, r_dim, q_dim = hi.shape
    s = np.empty(q_dim)
    c = np.empty(q_dim)
    for p in range(p_dim):
        for q in range(q_dim):
            s[q] = 0.0
            c[q] = 0.0
        for r in range(r_dim):
            h = hi[p, r]
            for q in range(q_dim):
                t, e = two_sum(s[q], h[q])
                s[q] = t
                c[q] += e
            if use_lo:
                w = lo[p, r]
                for q in range(q_dim):
                    c[q] += w[q]
        for q in range(q_dim):
            out[p, q] = s[q] + c[q]


def sum_to_shape_rounded_once(hi, shape, lo=None):
    """Sum float64 terms ``hi`` (+ ``lo``, same shape) back to ``shape``, rounded once.

    Parameters
    ----------
    hi : numpy.ndarray
        float64 terms at the broadcast shape (a cotangent, or each term's rounded value).
    shape : tuple of int
        The operand's shape (NumPy broadcasting reversed, as :func:`sum_to_shape`).
    lo : numpy.ndarray, optional
        Each term's rounding error (``hi + lo`` the exact term), or None when ``hi`` is exact.

    Returns
    -------
    numpy.ndarray
        A new float64 array of ``shape``: the exact sum rounded once (up to n eps^2 of the sum
        of |terms|).
    """
    shape = tuple(shape)
    hi = _contiguous(np.asarray(hi, np.float64))
    if hi.shape == shape:       # nothing to sum: a new array (never the caller's cotangent)
        return hi.copy() if lo is None else hi + lo
    axes = _reduction_axes(hi.shape, shape)
    kind, arr, kept = _canonical(hi, axes)
    use_lo = lo is not None
    low = (_canonical(_contiguous(np.asarray(lo, np.float64)), axes)[1] if use_lo
           else np.zeros((0,) * arr.ndim))
    if arr.size == 0:
        return np.zeros(shape)
    if kind == "middle":
        out = np.empty((arr.shape[0], arr.shape[2]))
        _dd_sum_middle(arr, low, use_lo, out)
    else:
        out = np.empty(arr.shape[0])
        _dd_sum_rows(arr, low, use_lo, out)
    return out.reshape(shape)
