"""Structure ops: transpose, reshape, concat, slice, forward and VJP, through one strided copy.

Every one of them (and every VJP but slice's) is a copy between two strided index boxes of flat
buffers: ``dst[d_off + sum_k i_k * d_strides[k]] = src[s_off + sum_k i_k * s_strides[k]]`` for
all ``i`` in ``shape``. Transpose permutes the source strides, slice offsets and scales them,
concat writes each input into its region of the output, and the VJPs swap the roles. Outputs
are always new arrays (never views of an input).

The long story: docs/fastlib.md, section ``fastlib/kernels/structure.py``.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

import optable
from fastlib import config

_TILE_B = 32     # destination rows per tile (the source's contiguous direction)
_TILE_A = 256    # destination columns per tile (the destination's contiguous direction)
_BLOCK = 1 << 12  # elements per block of the slice VJP's zero-and-scatter pass (in L1)


# --- kernels ------------------------------------------------------------------------------

@njit(cache=True, nogil=True, inline="always")
def _copy(d, s, n):
    """``d[j] = s[j]`` for j < n: the one copy loop of the four stride patterns below."""
    for j in range(n):
        d[j] = s[j]


@njit(cache=True, nogil=True, inline="always")
def _copy_run(src, so, si, dst, do, di, n):
    """``dst[do + j di] = src[so + j si]`` for j < n (n >= 1), one loop per stride pattern.

    NOTE: slice views, not offset indexing: ``src[so + j * si]`` keeps Numba's negative-index
    wraparound test in the loop, which stops it vectorising (3x slower for step-2 slices).
    """
    # each branch hands _copy views of its own layout, so each call compiles its own loop
    if di == 1:
        if si == 1:
            _copy(dst[do:do + n], src[so:so + n], n)
        else:
            _copy(dst[do:do + n], src[so:so + (n - 1) * si + 1:si], n)
    elif si == 1:
        _copy(dst[do:do + (n - 1) * di + 1:di], src[so:so + n], n)
    else:
        _copy(dst[do:do + (n - 1) * di + 1:di], src[so:so + (n - 1) * si + 1:si], n)


@njit(cache=True, nogil=True)
def _runs_range(src, s_off, s_str, dst, d_off, d_str, shape, parts, t0, t1):
    """Copy the box row by row (rows = every index of the leading axes, runs along the last
    axis) for tasks t0..t1; task t is piece ``t % parts`` of row ``t // parts``."""
    nd = shape.size
    n = shape[nd - 1]
    si = s_str[nd - 1]
    di = d_str[nd - 1]
    if parts > 1:                     # few long rows: each task is a piece of one row
        for t in range(t0, t1):
            row = t // parts
            j0 = n * (t % parts) // parts
            j1 = n * (t % parts + 1) // parts
            so = s_off + j0 * si
            do = d_off + j0 * di
            rem = row
            for k in range(nd - 2, -1, -1):
                i = rem % shape[k]
                rem //= shape[k]
                so += i * s_str[k]
                do += i * d_str[k]
            if j1 > j0:
                _copy_run(src, so, si, dst, do, di, j1 - j0)
        return
    if t1 <= t0:
        return
    # whole rows t0..t1: unravel t0 once, then advance an odometer over the leading axes
    idx = np.zeros(max(nd - 1, 1), np.int64)
    so = s_off
    do = d_off
    rem = t0
    for k in range(nd - 2, -1, -1):
        i = rem % shape[k]
        rem //= shape[k]
        idx[k] = i
        so += i * s_str[k]
        do += i * d_str[k]
    for _ in range(t0, t1):
        _copy_run(src, so, si, dst, do, di, n)
        k = nd - 2
        while k >= 0:
            idx[k] += 1
            so += s_str[k]
            do += d_str[k]
            if idx[k] < shape[k]:
                break
            so -= s_str[k] * shape[k]
            do -= d_str[k] * shape[k]
            idx[k] = 0
            k -= 1


@njit(cache=True, parallel=True)
def _runs_par(src, s_off, s_str, dst, d_off, d_str, shape, parts, nchunks):
    rows = 1
    for k in range(shape.size - 1):
        rows *= shape[k]
    tasks = rows * parts
    for c in prange(nchunks):
        _runs_range(src, s_off, s_str, dst, d_off, d_str, shape, parts,
                    tasks * c // nchunks, tasks * (c + 1) // nchunks)


@njit(cache=True, nogil=True)
def _tiles_range(src, s_off, s_str, dst, d_off, d_str, shape, b, t0, t1):
    """Tiled copy: the last axis (a) is contiguous in dst, axis ``b`` is contiguous in src.

    Task t is a strip of ``_TILE_B`` indices of b (for one index of the other axes), copied
    ``_TILE_A`` columns at a time: runs of a along dst rows, reading src with stride sa.
    """
    nd = shape.size
    na = shape[nd - 1]
    nb = shape[b]
    sa = s_str[nd - 1]
    db = d_str[b]
    strips = (nb + _TILE_B - 1) // _TILE_B
    for t in range(t0, t1):
        outer = t // strips
        b0 = (t % strips) * _TILE_B
        b1 = min(b0 + _TILE_B, nb)
        so = s_off
        do = d_off
        rem = outer
        for k in range(nd - 2, -1, -1):
            if k == b:
                continue
            i = rem % shape[k]
            rem //= shape[k]
            so += i * s_str[k]
            do += i * d_str[k]
        for a0 in range(0, na, _TILE_A):
            a1 = min(a0 + _TILE_A, na)
            for ib in range(b0, b1):
                # src stride along b is 1
                _copy_run(src, so + ib + a0 * sa, sa, dst, do + ib * db + a0, 1, a1 - a0)


@njit(cache=True, parallel=True)
def _tiles_par(src, s_off, s_str, dst, d_off, d_str, shape, b, nchunks):
    outer = 1
    for k in range(shape.size - 1):
        if k != b:
            outer *= shape[k]
    tasks = outer * ((shape[b] + _TILE_B - 1) // _TILE_B)
    for c in prange(nchunks):
        _tiles_range(src, s_off, s_str, dst, d_off, d_str, shape, b,
                     tasks * c // nchunks, tasks * (c + 1) // nchunks)


@njit(cache=True, nogil=True)
def _slice_scatter_range(g, out, length, width, lo, st, count, rows_per_block, t0, t1):
    """The slice VJP over blocks t0..t1: ``out`` is (P, length, width) flat, ``g`` is
    (P, count, width) flat; out[p, lo + j st, :] = g[p, j, :], zeros elsewhere.

    Block t covers rows l0..l1 of one p: zeroed, then the kept rows overwritten (in cache).
    """
    blocks = (length + rows_per_block - 1) // rows_per_block
    for t in range(t0, t1):
        p = t // blocks
        l0 = (t % blocks) * rows_per_block
        l1 = min(l0 + rows_per_block, length)
        o = out[(p * length + l0) * width:(p * length + l1) * width]
        for i in range(o.size):
            o[i] = 0
        # first kept row at or after l0, and the end of the kept rows in this block
        j = 0 if l0 <= lo else (l0 - lo + st - 1) // st
        hi = min(l1, lo + (count - 1) * st + 1) if count > 0 else l0
        l = lo + j * st
        if l >= hi:
            continue
        gbase = p * count * width
        if width == 1:                # one strided run
            _copy_run(g, gbase + j, 1, o, l - l0, st, (hi - l + st - 1) // st)
            continue
        while l < hi:
            _copy_run(g, gbase + j * width, 1, o, (l - l0) * width, 1, width)
            j += 1
            l += st


@njit(cache=True, parallel=True)
def _slice_scatter_par(g, out, length, width, lo, st, count, rows_per_block, nchunks):
    p_dim = out.size // (length * width)
    tasks = p_dim * ((length + rows_per_block - 1) // rows_per_block)
    for c in prange(nchunks):
        _slice_scatter_range(g, out, length, width, lo, st, count, rows_per_block,
                             tasks * c // nchunks, tasks * (c + 1) // nchunks)


# --- planning -----------------------------------------------------------------------------

def _c_strides(shape):
    """Element strides of a C-contiguous array of ``shape``."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


def _simplify(s_strides, d_strides, shape):
    """The same box with size-1 axes dropped and axes adjacent in both buffers merged."""
    axes = [[n, s, d] for n, s, d in zip(shape, s_strides, d_strides) if n != 1]
    merged = []
    for n, s, d in axes:
        if merged:
            last = merged[-1]
            if last[1] == s * n and last[2] == d * n:
                last[0] *= n
                last[1], last[2] = s, d
                continue
        merged.append([n, s, d])
    if not merged:
        merged = [[1, 1, 1]]
    return [m[1] for m in merged], [m[2] for m in merged], [m[0] for m in merged]


@functools.lru_cache(maxsize=256)
def _box_plan(s_strides, d_strides, shape):
    """(size, tile axis or -1, source strides, destination strides, dims, tasks) of a box,
    simplified; cached, so that repeated copies of one shape skip the planning."""
    size = math.prod(shape)
    if size == 0:
        return 0, -1, None, None, None, 0
    s_str, d_str, dims = _simplify(s_strides, d_strides, shape)
    b = -1
    if d_str[-1] == 1 and s_str[-1] != 1 and len(dims) > 1:
        for k in range(len(dims) - 2, -1, -1):     # an axis contiguous in the source: tile
            if s_str[k] == 1:
                b = k
                break
    if b >= 0:
        tasks = size // dims[-1] // dims[b] * -(-dims[b] // _TILE_B)
    else:
        tasks = size // dims[-1]                   # rows
    return (size, b, np.array(s_str, np.int64), np.array(d_str, np.int64),
            np.array(dims, np.int64), tasks)


def _copy_box(src, s_off, s_strides, dst, d_off, d_strides, shape):
    """Copy the index box ``shape`` from ``src`` to ``dst`` (element offsets and strides)."""
    size, b, s_arr, d_arr, shp, tasks = _box_plan(tuple(s_strides), tuple(d_strides),
                                                  tuple(shape))
    if size == 0:
        return
    fs, fd = src.reshape(-1), dst.reshape(-1)
    nchunks = config.num_chunks(size)
    if b >= 0:
        nchunks = min(nchunks, tasks)
        if nchunks <= 1:
            _tiles_range(fs, s_off, s_arr, fd, d_off, d_arr, shp, b, 0, tasks)
        else:
            _tiles_par(fs, s_off, s_arr, fd, d_off, d_arr, shp, b, nchunks)
        return
    rows = tasks
    # few rows for the chunks: split each row into pieces (at least PARALLEL_MIN_CHUNK long)
    parts = max(1, min(nchunks, int(shp[-1]) // config.PARALLEL_MIN_CHUNK)) \
        if rows < nchunks else 1
    nchunks = min(nchunks, rows * parts)
    if nchunks <= 1:
        _runs_range(fs, s_off, s_arr, fd, d_off, d_arr, shp, parts, 0, rows * parts)
    else:
        _runs_par(fs, s_off, s_arr, fd, d_off, d_arr, shp, parts, nchunks)


# --- transpose -----------------------------------------------------------------------------

def _permuted_copy(x, perm):
    shape = tuple(x.shape[p] for p in perm)
    out = np.empty(shape, x.dtype)
    xs = _c_strides(x.shape)
    _copy_box(x, 0, [xs[p] for p in perm], out, 0, _c_strides(shape), shape)
    return out


def transpose_forward(x, perm):
    """``np.transpose(x, perm)`` as a new C-contiguous array."""
    return _permuted_copy(x, perm)


def transpose_vjp(x, perm, grad):
    """VJP of transpose: the cotangent transposed by the inverse permutation."""
    return _permuted_copy(grad, tuple(int(i) for i in np.argsort(perm)))


# --- reshape -------------------------------------------------------------------------------

def _flat_copy(x, shape):
    out = np.empty(shape, x.dtype)
    if x.size:
        _copy_box(x, 0, [1], out, 0, [1], (x.size,))
    return out


def reshape_forward(x, shape):
    """``x`` reshaped to the resolved ``shape`` (a copy)."""
    return _flat_copy(x, shape)


def reshape_vjp(x, shape, grad):
    """VJP of reshape: the cotangent reshaped back to ``x.shape`` (a copy)."""
    return _flat_copy(grad, x.shape)


# --- concat --------------------------------------------------------------------------------

def concat_forward(a, b, axis):
    """``np.concatenate([a, b], axis)`` (axis already normalised)."""
    shape = optable.output_shape("concat", [a.shape, b.shape], {"axis": axis})
    out = np.empty(shape, a.dtype)
    os_ = _c_strides(shape)
    _copy_box(a, 0, _c_strides(a.shape), out, 0, os_, a.shape)
    _copy_box(b, 0, _c_strides(b.shape), out, a.shape[axis] * os_[axis], os_, b.shape)
    return out


def concat_vjp(a, b, axis, grad):
    """VJP of concat: the two regions of the cotangent, as new arrays."""
    gs = _c_strides(grad.shape)
    ga = np.empty(a.shape, a.dtype)
    gb = np.empty(b.shape, a.dtype)
    _copy_box(grad, 0, gs, ga, 0, _c_strides(a.shape), a.shape)
    _copy_box(grad, a.shape[axis] * gs[axis], gs, gb, 0, _c_strides(b.shape), b.shape)
    return ga, gb


# --- slice ---------------------------------------------------------------------------------

def slice_plan(shape, axis, start, stop, step):
    """(axis, start, step, output shape) of ``x[..., start:stop:step, ...]`` (the op table's
    rule checks it; the params' types are the caller's to check)."""
    out = optable.output_shape("slice", [shape], {"axis": axis, "start": start, "stop": stop,
                                                  "step": step})
    ax, kept = optable.shapes.slice_range(shape, axis, start, stop, step)
    return ax, kept.start, kept.step, out


def _slice_strides(shape, ax, lo, st):
    xs = _c_strides(shape)
    strides = list(xs)
    strides[ax] = xs[ax] * st
    return lo * xs[ax], strides


def slice_forward(x, plan):
    """The slice described by ``plan`` (from ``slice_plan``) as a new array."""
    ax, lo, st, shape = plan
    out = np.empty(shape, x.dtype)
    off, strides = _slice_strides(x.shape, ax, lo, st)
    _copy_box(x, off, strides, out, 0, _c_strides(shape), shape)
    return out


def slice_vjp(x, plan, grad):
    """VJP of slice: zeros of x's shape with the cotangent scattered into the sliced region,
    written in one pass (``_slice_scatter_range``)."""
    ax, lo, st, shape = plan
    out = np.empty(x.shape, x.dtype)
    if out.size == 0:
        return out
    length = x.shape[ax]
    width = int(np.prod(x.shape[ax + 1:], dtype=np.int64))
    rows_per_block = max(1, _BLOCK // width)
    tasks = out.size // (length * width) * -(-length // rows_per_block)
    nchunks = min(config.num_chunks(out.size), tasks)
    g = np.ascontiguousarray(grad).reshape(-1)
    if nchunks <= 1:
        _slice_scatter_range(g, out.reshape(-1), length, width, lo, st, shape[ax],
                             rows_per_block, 0, tasks)
    else:
        _slice_scatter_par(g, out.reshape(-1), length, width, lo, st, shape[ax],
                           rows_per_block, nchunks)
    return out
