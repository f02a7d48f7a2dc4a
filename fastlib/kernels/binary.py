"""Binary ops with NumPy broadcasting: add, sub, mul, div, maximum (forward and VJP).

Broadcasting is reduced to a 2-D problem: the output is viewed as (M, K) after merging
adjacent axes, and each operand is addressed as ``base[row * row_stride + col * col_stride]``
with strides of 0 along broadcast axes. Shape pairs that do not merge into two axes (such as
``(n, 1, n)`` against ``(1, n, 1)``) are materialised with ``np.broadcast_to`` first. The VJP
computes each operand's contribution at the output's shape and sums it back to the operand's
shape with the pairwise reduction of ``fastlib.kernels.reduce``.

NOTE (kink): ``maximum`` sends the whole cotangent to ``a`` where ``a >= b`` (ties go to the
first argument) and to ``b`` elsewhere; a NaN in ``a`` counts as "a wins", so NaN propagates
forward and backward as in ``np.maximum``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

import optable
from fastlib import config
from fastlib.compile_once import read_only
from fastlib.kernels.reduce import copy_and_sum_to_shape, scaled_copies, sum_to_shape
from fastlib.kernels.reduce import sum_to_shape_rounded_once
from fastlib.kernels.vecmath import dd_div, dd_mul, like, two_prod

_FM = config.FASTMATH

# op name -> code: the op table's stable codes (compiled into the kernels as constants)
BINARY_OPS = optable.names(category="binary")
CODES = optable.codes(BINARY_OPS)
_ADD, _SUB, _MUL, _DIV, _MAX = (CODES[n] for n in ("add", "sub", "mul", "div", "maximum"))
# NOTE: a code the kernels do not know raises (never a fallback to another op); the launchers
# check the name first, so this is the message of a direct kernel call with a bad code.
_UNKNOWN = "unknown binary op code (not a code of optable's binary ops):"
# NOTE (a promise the conformance suite holds fastlib to): in these dtypes every VJP of a binary
# op is the exact value rounded once, up to float64 rounding: products and quotients are formed
# in float64 (exact products of float32 numbers) and summed back over broadcast axes there
# (``binary_vjp``, ``reduce.sum_to_shape``), then rounded to the dtype. float64 makes no such
# float64 sums back over broadcast axes are compensated and each term is formed exactly (a
# double-double product or quotient), so a summed float64 VJP is also the exact value rounded
# once up to n eps^2 of its terms (``_vjp_terms_dd``, ``reduce.sum_to_shape_rounded_once``);
# a float64 VJP that is not summed rounds its formula as written (div's b: three roundings).
ROUNDED_ONCE_VJP_DTYPES = ("float32",)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _first_wins(x, y):
    """maximum's gradient routing, written once for every VJP path."""
    return x >= y or x != x     # NOTE: ties (and NaN in a) go to the first argument


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _binop(op, x, y):
    if op == _ADD:
        return x + y
    if op == _SUB:
        return x - y
    if op == _MUL:
        return x * y
    if op == _DIV:
        return x / y
    if op == _MAX:
        return x if (x >= y or x != x) else y
    return like(x, math.nan)    # never reached: the task kernels raise on an unknown code first


@njit(cache=True, nogil=True, error_model="numpy")
def _require_code(op, vjp):
    """Raise ``ValueError`` naming ``op`` unless it is a binary op code of the op table
    (``vjp``: one of the codes ``_vjp_tasks`` computes, mul, div and maximum). Called once per
    task range, outside the element loops, which then stay plain maps."""
    if op == _MUL or op == _DIV or op == _MAX:
        return
    if not vjp and (op == _ADD or op == _SUB):
        return
    raise ValueError(_UNKNOWN, op)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _forward_span(op, a, oa, ca, b, ob, cb, out):
    """out[j] = op(a[oa + j ca], b[ob + j cb]); one loop per stride pattern (ca, cb in {0, 1})
    over slice views (offset indexing would keep Numba's negative-index wraparound in the
    loop and stop it vectorising); the op test is loop-invariant and hoisted."""
    k = out.size
    if ca == 1 and cb == 1:
        av = a[oa:oa + k]
        bv = b[ob:ob + k]
        for j in range(k):
            out[j] = _binop(op, av[j], bv[j])
    elif ca == 0 and cb == 1:
        x = a[oa]
        bv = b[ob:ob + k]
        for j in range(k):
            out[j] = _binop(op, x, bv[j])
    elif ca == 1 and cb == 0:
        av = a[oa:oa + k]
        y = b[ob]
        for j in range(k):
            out[j] = _binop(op, av[j], y)
    else:
        v = _binop(op, a[oa], b[ob])
        for j in range(k):
            out[j] = v


@njit(inline="always")
def _task(t, parts, k):
    """(row, first column, end column) of task ``t``: row ``t // parts``, piece ``t % parts``
    of its ``k`` columns."""
    return t // parts, k * (t % parts) // parts, k * (t % parts + 1) // parts


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _forward_tasks(op, a, sa, b, sb, out, parts, t0, t1):
    """out = op(a, b) for tasks t0..t1 of the (M, K) output; sa/sb = (row, col) strides.

    Task t covers row t // parts, columns of piece t % parts (parts > 1 splits long rows).
    """
    _require_code(op, False)
    for t in range(t0, t1):
        r, j0, j1 = _task(t, parts, out.shape[1])
        _forward_span(op, a, r * sa[0] + j0 * sa[1], sa[1], b, r * sb[0] + j0 * sb[1], sb[1],
                      out[r, j0:j1])


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _vjp_pair(op, x, y, g):
    """(g * d op/dx, g * d op/dy) in float64 (exact products for float32 operands)."""
    xv = np.float64(x)
    yv = np.float64(y)
    gv = np.float64(g)
    if op == _MUL:
        return gv * yv, gv * xv
    if op == _DIV:
        q = gv / yv
        return q, -q * (xv / yv)
    if op == _MAX:
        win = _first_wins(x, y)
        return (gv, 0.0) if win else (0.0, gv)
    return math.nan, math.nan       # never reached: ``_vjp_tasks`` raises on the code first


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _vjp_span(op, a, oa, ca, b, ob, cb, g, ga, gb):
    """Contributions of one span of the output (see ``_forward_span``)."""
    k = g.size
    if ca == 1 and cb == 1:
        av = a[oa:oa + k]
        bv = b[ob:ob + k]
        for j in range(k):
            ga[j], gb[j] = _vjp_pair(op, av[j], bv[j], g[j])
    elif ca == 0 and cb == 1:
        x = a[oa]
        bv = b[ob:ob + k]
        for j in range(k):
            ga[j], gb[j] = _vjp_pair(op, x, bv[j], g[j])
    elif ca == 1 and cb == 0:
        av = a[oa:oa + k]
        y = b[ob]
        for j in range(k):
            ga[j], gb[j] = _vjp_pair(op, av[j], y, g[j])
    else:
        x = a[oa]
        y = b[ob]
        for j in range(k):
            ga[j], gb[j] = _vjp_pair(op, x, y, g[j])


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _vjp_tasks(op, a, sa, b, sb, g, ga, gb, parts, t0, t1):
    """Contributions at the output's shape: ga = g * d op/da, gb = g * d op/db (mul, div, max),
    for tasks as in ``_forward_tasks``. Products and quotients are formed in float64."""
    _require_code(op, True)
    for t in range(t0, t1):
        r, j0, j1 = _task(t, parts, g.shape[1])
        _vjp_span(op, a, r * sa[0] + j0 * sa[1], sa[1], b, r * sb[0] + j0 * sb[1], sb[1],
                  g[r, j0:j1], ga[r, j0:j1], gb[r, j0:j1])


@njit(cache=True, parallel=True, error_model="numpy")
def _forward(op, a, sa, b, sb, out, parts, nchunks):
    tasks = out.shape[0] * parts
    for c in prange(nchunks):
        _forward_tasks(op, a, sa, b, sb, out, parts, tasks * c // nchunks,
                       tasks * (c + 1) // nchunks)


@njit(cache=True, parallel=True, error_model="numpy")
def _vjp(op, a, sa, b, sb, g, ga, gb, parts, nchunks):
    tasks = g.shape[0] * parts
    for c in prange(nchunks):
        _vjp_tasks(op, a, sa, b, sb, g, ga, gb, parts, tasks * c // nchunks,
                   tasks * (c + 1) // nchunks)


def _split(m, size):
    """(column pieces per row, prange chunks): split rows when there are fewer than chunks."""
    nchunks = config.num_chunks(size)
    parts = nchunks if m < nchunks else 1
    return parts, nchunks


def _stride_plan(a_shape, b_shape, shape):
    """(M, K, a's (row, col) strides, b's) of an (M, K) view of the output, or None when the
    axes do not merge into two; cached per shape triple (the plan is pure shape arithmetic)."""
    nd = len(shape)
    dims = list(shape)
    strides = []
    for x_shape in (a_shape, b_shape):
        padded = (1,) * (nd - len(x_shape)) + x_shape
        st = [0] * nd
        step = 1
        for i in range(nd - 1, -1, -1):
            st[i] = 0 if padded[i] == 1 else step
            step *= padded[i]
        strides.append(st)
    # merge adjacent axes that are contiguous for both operands (size-1 axes merge freely)
    merged = []          # list of [size, stride_a, stride_b]
    for i in range(nd):
        size, s_a, s_b = dims[i], strides[0][i], strides[1][i]
        if size == 1:
            continue
        if merged:
            last = merged[-1]
            if last[1] == s_a * size and last[2] == s_b * size:
                merged[-1] = [last[0] * size, s_a, s_b]
                continue
        merged.append([size, s_a, s_b])
    if not merged:
        merged = [[1, 0, 0]]
    if len(merged) == 1:
        merged.insert(0, [1, 0, 0])
    if len(merged) > 2:
        return None
    (m, ra, rb), (k, ca, cb) = merged
    return m, k, np.array([ra, ca], np.int64), np.array([rb, cb], np.int64)


def _plan(a, b, shape):
    """Operands as flat arrays with (row, col) strides over an (M, K) view of the output."""
    plan = _stride_plan(a.shape, b.shape, tuple(shape))
    if plan is None:
        return None
    m, k, sa, sb = plan
    return m, k, a.reshape(-1), sa, b.reshape(-1), sb


def _planned(a, b, shape):
    plan = _plan(a, b, shape)
    if plan is None:
        a = np.ascontiguousarray(np.broadcast_to(a, shape))
        b = np.ascontiguousarray(np.broadcast_to(b, shape))
        plan = _plan(a, b, shape)
    m, k, fa, sa, fb, sb = plan
    return m, k, read_only(fa), sa, read_only(fb), sb


def binary_forward(name, a, b):
    """``name(a, b)`` with NumPy broadcasting, for C-contiguous arrays of one float dtype.

    Parameters
    ----------
    name : str
        One of ``BINARY_OPS``.
    a, b : ndarray
        Operands (validated by ``fastlib.ops``; shapes must broadcast).

    Returns
    -------
    ndarray
        The broadcast result, a new C-contiguous array.
    """
    code = optable.code_of(name, "binary", "binary_forward")
    shape = optable.output_shape(name, [a.shape, b.shape], {})
    out = np.empty(shape, a.dtype)
    if out.size == 0:
        return out
    m, k, fa, sa, fb, sb = _planned(a, b, shape)
    parts, nchunks = _split(m, out.size)
    if nchunks == 1:    # no parallel region: no thread hand-off for small arrays
        _forward_tasks(code, fa, sa, fb, sb, out.reshape(m, k), 1, 0, m)
    else:
        _forward(code, fa, sa, fb, sb, out.reshape(m, k), parts, nchunks)
    return out


def _add_sub_vjp(name, a_shape, b_shape, shape, grad):
    """(g, g) for add, (g, -g) for sub, each summed back to its operand's shape.

    NOTE: the outputs are written in one pass over the cotangent: both copies from one read
    when neither operand was broadcast, and the copy for one operand with the other's sum (a
    bias) when the other was broadcast over leading axes (``reduce.copy_and_sum_to_shape``).
    """
    sb = -1.0 if name == "sub" else 1.0
    if a_shape == shape and b_shape == shape:
        return scaled_copies(grad, 1.0, sb)
    if a_shape == shape:
        ga, gb = copy_and_sum_to_shape(grad, b_shape)
        return ga, (-gb if name == "sub" else gb)
    if b_shape == shape:
        gb, ga = copy_and_sum_to_shape(grad, a_shape, sb)
        return ga, gb
    gb = sum_to_shape(grad, b_shape)             # both broadcast: two sums, new arrays
    return sum_to_shape(grad, a_shape), (-gb if name == "sub" else gb)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _finite_pair(pair, plain):
    """``pair`` when its sum is finite, else (``plain``, 0): an exact pair overflows or meets
    inf or 0 * inf in its error term where the plain formula gives IEEE's inf or NaN."""
    h, lo = pair
    if abs(h) < np.inf and abs(lo) < np.inf:
        return h, lo
    return plain, 0.0


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _vjp_terms_dd(op, a, b, g, ga, la, gb, lb):
    """Each operand's VJP term at the output's shape as an exact pair hi + lo (float64
    arrays of one shape, ``a`` and ``b`` already broadcast to it): mul by ``two_prod``, div
    by double-double quotients, maximum and the others as the cotangent itself."""
    for i in range(g.size):
        x = a[i]
        y = b[i]
        gv = g[i]
        if op == _MUL:
            ga[i], la[i] = _finite_pair(two_prod(gv, y), gv * y)
            gb[i], lb[i] = _finite_pair(two_prod(gv, x), gv * x)
        elif op == _DIV:
            qh, ql = dd_div(gv, 0.0, y, 0.0)
            ga[i], la[i] = _finite_pair((qh, ql), gv / y)
            rh, rl = dd_div(x, 0.0, y, 0.0)
            ph, pl = dd_mul(qh, ql, rh, rl)
            gb[i], lb[i] = _finite_pair((-ph, -pl), -(gv / y) * (x / y))
        elif op == _MAX:
            win = _first_wins(x, y)
            ga[i], la[i] = (gv, 0.0) if win else (0.0, 0.0)
            gb[i], lb[i] = (0.0, 0.0) if win else (gv, 0.0)
        else:
            raise ValueError(_UNKNOWN, op)


def _summed_vjp64(name, a, b, grad, shape):
    """float64 VJPs summed back over broadcast axes: exact terms, compensated sums, each
    rounded once (module NOTE)."""
    if name in ("add", "sub"):
        ga = sum_to_shape_rounded_once(grad, a.shape)
        gb = sum_to_shape_rounded_once(grad, b.shape)
        return ga, (-gb if name == "sub" else gb)
    full = [read_only(np.ascontiguousarray(np.broadcast_to(v, shape), np.float64).reshape(-1))
            for v in (a, b, grad)]
    ga, la, gb, lb = (np.empty(full[2].size) for _ in range(4))
    _vjp_terms_dd(CODES[name], *full, ga, la, gb, lb)
    return (sum_to_shape_rounded_once(ga.reshape(shape), a.shape, la.reshape(shape)),
            sum_to_shape_rounded_once(gb.reshape(shape), b.shape, lb.reshape(shape)))


def binary_vjp(name, a, b, grad):
    """(grad_a, grad_b): each operand's cotangent, summed back to the operand's shape."""
    code = optable.code_of(name, "binary", "binary_vjp")
    shape = optable.output_shape(name, [a.shape, b.shape], {})
    if a.dtype == np.float64 and (shape != a.shape or shape != b.shape):
        return _summed_vjp64(name, a, b, grad, shape)
    if name in ("add", "sub"):
        return _add_sub_vjp(name, a.shape, b.shape, shape, grad)
    # NOTE: when a contribution is summed back over broadcast axes, the contributions are
    # formed in float64: a product of two float32 numbers is exact there, so the float32
    # result is the exact sum rounded once, however much the terms cancel.
    reduced = shape != a.shape or shape != b.shape
    work = np.float64 if reduced else a.dtype
    ga = np.empty(shape, work)
    gb = np.empty(shape, work)
    if ga.size:
        m, k, fa, sa, fb, sb = _planned(a, b, shape)
        parts, nchunks = _split(m, ga.size)
        views = (read_only(grad.reshape(m, k)), ga.reshape(m, k), gb.reshape(m, k))
        if nchunks == 1:
            _vjp_tasks(code, fa, sa, fb, sb, *views, 1, 0, m)
        else:
            _vjp(code, fa, sa, fb, sb, *views, parts, nchunks)
    return (sum_to_shape(ga, a.shape).astype(a.dtype, copy=False),
            sum_to_shape(gb, b.shape).astype(a.dtype, copy=False))


# every binary op of the table has its forward branch, and every product its VJP branch
optable.require_branches(_binop, "op", CODES, "fastlib.kernels.binary")
optable.require_branches(_vjp_pair, "op", {n: CODES[n] for n in ("mul", "div", "maximum")},
                         "fastlib.kernels.binary")
