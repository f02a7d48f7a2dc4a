"""Reductions: sum, mean and logsumexp over any axes, and summing a cotangent back to a shape.

Every reduction is brought to one of two canonical layouts by a reshape (a view when the axes
are adjacent) or, for scattered axes, a transposed copy:

- rows   ``(P, R)``    reduce the last axis;
- middle ``(P, R, Q)`` reduce the middle axis, vectorised across the Q contiguous columns.

NOTE (summation order): sums accumulate in float64 for both dtypes, pairwise over blocks of
``_BLOCK`` elements: inside a block the compiler's vectorised partial sums (reassociation is
allowed there and only there), blocks combined as a binary tree. The error is at most about
``(_BLOCK + log2 n) * 2**-53 * sum|x|`` (~6e-14 relative to sum|x|): for float32 input that is
far below one float32 rounding, so the result is the exact sum rounded once, whatever n; for
float64 input it grows with log n, not with n as recursive summation's does. float64
accumulators make float32 results independent of n at the cost of converting each element.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from fastlib import config
from fastlib.kernels.vecmath import fexp

_FM = config.FASTMATH
# NOTE: reassociation is allowed inside one block sum only, so that the loop vectorises into
# partial sums (the error bound below holds for any order within a block).
_FM_BLOCK = config.FASTMATH | {"reassoc"}
_BLOCK = 512
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
        level = 0
        while top > 0 and levels[top - 1] == level:
            top -= 1
            s = stack[top] + s
            level += 1
        stack[top] = s
        levels[top] = level
        top += 1
    s = stack[top - 1]
    for k in range(top - 2, -1, -1):
        s = stack[k] + s
    return s


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
        level = 0
        while top > 0 and levels[top - 1] == level:
            top -= 1
            s = stack[top] + s
            level += 1
        stack[top] = s
        levels[top] = level
        top += 1
    s = stack[top - 1]
    for k in range(top - 2, -1, -1):
        s = stack[k] + s
    return s


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


@njit(cache=True, parallel=True, error_model="numpy")
def _lse_vjp_rows_par(x, lse, g, out, nchunks):
    p_rows = x.shape[0]
    for c in prange(nchunks):
        _lse_vjp_rows_range(x, lse, g, out, p_rows * c // nchunks, p_rows * (c + 1) // nchunks)


# --- middle: (P, R, Q) -> (P, Q) ------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _sum_middle_range(x, qparts, out, t0, t1):
    """out[p, q] = sum over r of x[p, r, q] for tasks t0..t1 (task = (p, column piece)),
    pairwise over blocks of _BLOCK rows, vectorised across the columns of the piece."""
    p_dim, r_dim, q_dim = x.shape
    nblocks = (r_dim + _BLOCK - 1) // _BLOCK
    depth = 2
    while (1 << (depth - 2)) < nblocks:
        depth += 1
    for task in range(t0, t1):
        p = task // qparts
        k = task % qparts
        q0 = q_dim * k // qparts
        q1 = q_dim * (k + 1) // qparts
        width = q1 - q0
        stack = np.empty((depth, width))
        levels = np.empty(depth, np.int64)
        blk = np.empty(width)
        top = 0
        # NOTE: explicit loops, not slice assignment: Numba's slice assignment drags in the
        # compilation of its shape-mismatch error path (seconds of compile time).
        for start in range(0, r_dim, _BLOCK):
            for q in range(width):
                blk[q] = 0.0
            for r in range(start, min(start + _BLOCK, r_dim)):
                row = x[p, r, q0:q1]
                for q in range(width):
                    blk[q] += row[q]
            level = 0
            while top > 0 and levels[top - 1] == level:
                top -= 1
                for q in range(width):
                    blk[q] = stack[top, q] + blk[q]
                level += 1
            for q in range(width):
                stack[top, q] = blk[q]
            levels[top] = level
            top += 1
        for q in range(width):
            s = stack[top - 1, q]
            for lvl in range(top - 2, -1, -1):
                s = stack[lvl, q] + s
            out[p, q0 + q] = s


@njit(cache=True, parallel=True, error_model="numpy")
def _sum_middle_par(x, qparts, out, nchunks):
    tasks = x.shape[0] * qparts
    for c in prange(nchunks):
        _sum_middle_range(x, qparts, out, tasks * c // nchunks, tasks * (c + 1) // nchunks)


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

def normalize_axes(axis, ndim, op="sum"):
    """``axis`` (None, int or tuple of ints) as a sorted tuple of distinct non-negative axes.

    Raises
    ------
    ValueError
        An axis out of range, repeated, or not an int.
    """
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise ValueError(f"{op}: axis must be None, an int or a tuple of ints, got {axis!r}")
        if not -ndim <= a < ndim:
            raise ValueError(f"{op}: axis {a} is out of range for an input with {ndim} "
                             f"dimension(s); use -{ndim} <= axis < {ndim}")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: axis {axis!r} repeats an axis")
    return tuple(sorted(out))


def _canonical(x, axes):
    """(kind, array, kept_shape): kind 'rows' (P, R) or 'middle' (P, R, Q) for the reduction."""
    shape = x.shape
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    r = int(np.prod([shape[a] for a in axes], dtype=np.int64)) if axes else 1
    if axes and axes == tuple(range(axes[0], axes[-1] + 1)):
        p = int(np.prod(shape[:axes[0]], dtype=np.int64))
        q = int(np.prod(shape[axes[-1] + 1:], dtype=np.int64))
        if q == 1:
            return "rows", x.reshape(p, r), kept
        return "middle", x.reshape(p, r, q), kept
    order = [i for i in range(x.ndim) if i not in axes] + list(axes)
    moved = np.ascontiguousarray(np.transpose(x, order))
    return "rows", moved.reshape(-1, r), kept


def _sum64(x, axes):
    """float64 sums of ``x`` over ``axes`` with the kept axes' shape."""
    kind, arr, kept = _canonical(x, axes)
    if arr.size == 0:
        return np.zeros(kept)
    nchunks = config.num_chunks(arr.size)
    if kind == "rows":
        p, r = arr.shape
        # few long rows: split each row into pieces so that every chunk has work
        # NOTE: the pieces depend on the shape only (config.SUM_ROW_PIECES), never on the
        # thread count, so results are bit-reproducible across machines and loads.
        parts = (max(1, min(config.SUM_ROW_PIECES, r // config.PARALLEL_MIN_CHUNK))
                 if p < config.SUM_ROW_PIECES else 1)
        partial = np.empty((p, parts))
        if nchunks == 1:
            _sum_rows_range(arr, parts, partial, 0, p * parts)
        else:
            _sum_rows_par(arr, parts, partial, min(nchunks, p * parts))
        return partial.sum(axis=1).reshape(kept)    # at most a few pieces per row
    p, _, q = arr.shape
    qparts = max(1, min(nchunks, q)) if p < nchunks else 1
    out = np.empty((p, q))
    if nchunks == 1:
        _sum_middle_range(arr, qparts, out, 0, p * qparts)
    else:
        _sum_middle_par(arr, qparts, out, min(nchunks, p * qparts))
    return out.reshape(kept)


def _with_keepdims(result, shape, axes, keepdims):
    if not keepdims:
        return result
    return result.reshape(tuple(1 if i in axes else d for i, d in enumerate(shape)))


def sum_forward(x, axes, keepdims=False):
    """Sum of ``x`` over ``axes`` (normalised tuple), in x's dtype (see the module NOTE)."""
    return _with_keepdims(_sum64(x, axes).astype(x.dtype), x.shape, axes, keepdims)


def mean_forward(x, axes, keepdims=False):
    """Mean of ``x`` over ``axes``: the float64 sum divided by the count, rounded once."""
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return _with_keepdims((_sum64(x, axes) / count).astype(x.dtype), x.shape, axes, keepdims)


def expand_to(g, shape, axes):
    """Broadcast a reduction's cotangent (kept axes only, or keepdims) back to ``shape``."""
    kept_shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return np.broadcast_to(g.reshape(kept_shape), shape).copy()   # C order, 0-d kept


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
    lse = np.empty(arr.shape[0])
    nchunks = min(config.num_chunks(arr.size), arr.shape[0])
    if nchunks <= 1:
        _lse_rows_range(arr, lse, 0, arr.shape[0])
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
    nchunks = min(config.num_chunks(arr.size), arr.shape[0])
    if nchunks <= 1:
        _lse_vjp_rows_range(arr, lse.astype(x.dtype), g, rows, 0, arr.shape[0])
    else:
        _lse_vjp_rows_par(arr, lse.astype(x.dtype), g, rows, nchunks)
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
