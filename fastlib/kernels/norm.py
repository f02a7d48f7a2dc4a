"""Row normalisations: softmax, log_softmax (any axis), layer_norm and rms_norm (last axis).

Each kernel is a serial function over a range of rows (P, D) with a ``prange`` driver over
chunks of rows; below the parallel threshold the launcher calls the row function directly
(no parallel region).
softmax and log_softmax go through the log-sum-exp of each row, shifted by the row maximum, so
they are finite for any finite input. Row statistics (sums of exps, means, variances, the dot
products of the VJPs) accumulate in float64 with the pairwise sum of
``fastlib.kernels.reduce`` (see its NOTE); layer_norm and rms_norm also form their outputs in
float64 and round once.

The long story: docs/fastlib.md, section ``fastlib/kernels/norm.py``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from fastlib import config
from fastlib.kernels.reduce import _pairwise_sum, _row_max, _row_sumexp
from fastlib.kernels.vecmath import (_exp64, dd_add, dd_add_d, dd_div, dd_exp, dd_mul, dd_mul_d,
                                     dd_sqrt, fexp, like, two_prod, two_sum)

_FM = config.FASTMATH


@njit(cache=True, nogil=True)
def _chunk(n, c, nchunks):
    """(start, stop) of chunk c of nchunks over range(n)."""
    return n * c // nchunks, n * (c + 1) // nchunks


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _softmax_rows(x, g, out, eps, r0, r1):
    d = x.shape[1]
    for row in range(r0, r1):
        v = x[row]
        o = out[row]
        m = _row_max(v)
        for j in range(d):
            o[j] = fexp(v[j] - m)
        s = like(v[0], _pairwise_sum(o, 0, d))
        for j in range(d):
            o[j] = o[j] / s


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _log_softmax_rows(x, g, out, eps, r0, r1):
    d = x.shape[1]
    for row in range(r0, r1):
        v = x[row]
        o = out[row]
        m = _row_max(v)
        ls = like(v[0], math.log(_row_sumexp(v, m)))
        for j in range(d):
            o[j] = (v[j] - m) - ls


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _softmax_rows_vjp(x, g, out, eps, r0, r1):
    """gx = y * (g - sum(g * y)), y = softmax(x) per row."""
    d = x.shape[1]
    prod = np.empty(d)
    for row in range(r0, r1):
        v = x[row]
        o = out[row]
        gr = g[row]
        m = _row_max(v)
        for j in range(d):
            o[j] = fexp(v[j] - m)
        s = like(v[0], _pairwise_sum(o, 0, d))
        for j in range(d):
            o[j] = o[j] / s
            prod[j] = np.float64(gr[j]) * np.float64(o[j])
        dot = like(v[0], _pairwise_sum(prod, 0, d))
        for j in range(d):
            o[j] = o[j] * (gr[j] - dot)


def _lsm_grad(xj, m, ls, gj, gsum):
    """g_j - exp((x_j - max) - ls) * gsum, ls = log sum exp(x - max) and gsum in float64.

    float64: libm exp, the shift and ls rounded as they are. float32: all in float64 (the
    vectorisable ``_exp64``, relative error < 1e-14) and rounded once.
    """
    return gj - math.exp((xj - m) - ls) * gsum


@njit(cache=True, error_model="numpy", fastmath=_FM, inline="always")
def _lsm_grad32(xj, m, ls, gj, gsum):
    t = (np.float64(xj) - np.float64(m)) - ls
    y = np.float32(np.float64(gj) - _exp64(t) * gsum)    # t < -700: exp(-700) ~ 0 here
    return y if t == t else np.float32(t)


@njit(cache=True, error_model="numpy", fastmath=_FM, inline="always")
def _lsm_grad64(xj, m, ls, gj, gsum):
    return gj - math.exp((xj - m) - ls) * gsum


@overload(_lsm_grad, inline="always")
def _lsm_grad_overload(xj, m, ls, gj, gsum):
    if xj == types.float32:
        return lambda xj, m, ls, gj, gsum: _lsm_grad32(xj, m, ls, gj, gsum)
    if xj == types.float64:
        return lambda xj, m, ls, gj, gsum: _lsm_grad64(xj, m, ls, gj, gsum)
    return None


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _log_softmax_rows_vjp(x, g, out, eps, r0, r1):
    """gx = g - softmax(x) * sum(g) per row, softmax = exp((x - max) - log(sum exp(x - max))).

    NOTE: shifting by the max first keeps x - max exact-ish and small; ``x - lse`` with the
    log-sum-exp rounded to the dtype would carry lse's rounding error, |lse| u, into the exponent
    (9e3 ULPs at logits of 1e4).
    """
    d = x.shape[1]
    for row in range(r0, r1):
        v = x[row]
        o = out[row]
        gr = g[row]
        m = _row_max(v)
        ls = math.log(_row_sumexp(v, m))
        gsum = _pairwise_sum(gr, 0, d)
        for j in range(d):
            o[j] = _lsm_grad(v[j], m, ls, gr[j], gsum)


# --- float64 VJPs in double-double (module NOTE) -------------------------------------------

@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _exp_row_dd(v, eh, el):
    """eh + el = exp(v - max v) in dd (v - max exact as a pair); returns their dd sum S."""
    m = _row_max(v)
    sh = 0.0
    sl = 0.0
    for j in range(v.size):
        th, tl = two_sum(v[j], -m)
        a, b = dd_exp(th, tl)
        eh[j] = a
        el[j] = b
        sh, sl = dd_add(sh, sl, a, b)
    return sh, sl


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _softmax_rows_vjp64(x, g, out, eps, r0, r1):
    """float64 gx_i = e_i (g_i S - T) / S^2 in dd, rounded once (module NOTE)."""
    d = x.shape[1]
    eh = np.empty(d)
    el = np.empty(d)
    for row in range(r0, r1):
        v = x[row]
        gr = g[row]
        sh, sl = _exp_row_dd(v, eh, el)
        th = 0.0
        tl = 0.0
        for j in range(d):
            ph, pl = dd_mul_d(eh[j], el[j], gr[j])
            th, tl = dd_add(th, tl, ph, pl)
        ih, il = dd_div(1.0, 0.0, sh, sl)
        i2h, i2l = dd_mul(ih, il, ih, il)
        for i in range(d):
            wh, wl = dd_mul_d(sh, sl, gr[i])
            wh, wl = dd_add(wh, wl, -th, -tl)
            ph, pl = dd_mul(eh[i], el[i], wh, wl)
            out[row, i] = dd_mul(ph, pl, i2h, i2l)[0]


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _log_softmax_rows_vjp64(x, g, out, eps, r0, r1):
    """float64 gx_i = g_i - (e_i / S) sum(g) in dd, rounded once (module NOTE)."""
    d = x.shape[1]
    eh = np.empty(d)
    el = np.empty(d)
    for row in range(r0, r1):
        v = x[row]
        gr = g[row]
        sh, sl = _exp_row_dd(v, eh, el)
        gh = 0.0
        gl = 0.0
        for j in range(d):
            gh, gl = dd_add_d(gh, gl, gr[j])
        ih, il = dd_div(1.0, 0.0, sh, sl)
        ch, cl = dd_mul(ih, il, gh, gl)            # sum(g) / S
        for i in range(d):
            ph, pl = dd_mul(eh[i], el[i], ch, cl)
            out[row, i] = dd_add_d(-ph, -pl, gr[i])[0]


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _projection_vjp_row_dd(ch, cl, hh, hl, d, eps, pq, pp, o):
    """o_i = r (h_i (Q_-i + d eps) - c_i P_-i) / Q, r = 1 / sqrt(Q / d), all in dd (module NOTE).

    c and h are dd rows (ch + cl, hh + hl); pq and pp are (d, 2) scratch arrays for the dd
    prefix sums of c^2 and h c. The VJP of rms_norm (c = x, h = g) and of layer_norm (c, h
    the centred row and cotangent).
    """
    qh = 0.0
    ql = 0.0
    ph = 0.0
    pl = 0.0
    for k in range(d):
        pq[k, 0] = qh
        pq[k, 1] = ql
        pp[k, 0] = ph
        pp[k, 1] = pl
        ah, al = dd_mul(ch[k], cl[k], ch[k], cl[k])
        qh, ql = dd_add(qh, ql, ah, al)
        ah, al = dd_mul(hh[k], hl[k], ch[k], cl[k])
        ph, pl = dd_add(ph, pl, ah, al)
    eh, el = two_prod(np.float64(d), eps)               # d eps, exact
    tqh, tql = dd_add(qh, ql, eh, el)                   # Q
    vh, vl = dd_div(tqh, tql, np.float64(d), 0.0)
    sh, sl = dd_sqrt(vh, vl)
    rh, rl = dd_div(1.0, 0.0, sh, sl)                   # r
    iqh, iql = dd_div(1.0, 0.0, tqh, tql)               # 1 / Q
    # suffix sums, walking back
    sqh = 0.0
    sql = 0.0
    sph = 0.0
    spl = 0.0
    for i in range(d - 1, -1, -1):
        ah, al = dd_add(pq[i, 0], pq[i, 1], sqh, sql)   # Q_-i
        ah, al = dd_add(ah, al, eh, el)
        ah, al = dd_mul(hh[i], hl[i], ah, al)
        bh, bl = dd_add(pp[i, 0], pp[i, 1], sph, spl)   # P_-i
        bh, bl = dd_mul(ch[i], cl[i], bh, bl)
        nh, nl = dd_add(ah, al, -bh, -bl)
        nh, nl = dd_mul(nh, nl, iqh, iql)
        o[i] = dd_mul(nh, nl, rh, rl)[0]
        ah, al = dd_mul(ch[i], cl[i], ch[i], cl[i])
        sqh, sql = dd_add(sqh, sql, ah, al)
        ah, al = dd_mul(hh[i], hl[i], ch[i], cl[i])
        sph, spl = dd_add(sph, spl, ah, al)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _layer_norm_rows_vjp64(x, g, out, eps, r0, r1):
    """float64 layer_norm VJP in dd: c = x - mean(x), h = g - mean(g), then the projection."""
    d = x.shape[1]
    ch = np.empty(d)
    cl = np.empty(d)
    hh = np.empty(d)
    hl = np.empty(d)
    pq = np.empty((d, 2))
    pp = np.empty((d, 2))
    for row in range(r0, r1):
        v = x[row]
        gr = g[row]
        sxh = 0.0
        sxl = 0.0
        sgh = 0.0
        sgl = 0.0
        for j in range(d):
            sxh, sxl = dd_add_d(sxh, sxl, v[j])
            sgh, sgl = dd_add_d(sgh, sgl, gr[j])
        muh, mul = dd_div(sxh, sxl, np.float64(d), 0.0)
        gmh, gml = dd_div(sgh, sgl, np.float64(d), 0.0)
        for j in range(d):
            ch[j], cl[j] = dd_add_d(-muh, -mul, v[j])
            hh[j], hl[j] = dd_add_d(-gmh, -gml, gr[j])
        _projection_vjp_row_dd(ch, cl, hh, hl, d, eps, pq, pp, out[row])


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _rms_norm_rows_vjp64(x, g, out, eps, r0, r1):
    """float64 rms_norm VJP in dd: the projection with c = x, h = g."""
    d = x.shape[1]
    zero = np.zeros(d)
    pq = np.empty((d, 2))
    pp = np.empty((d, 2))
    for row in range(r0, r1):
        _projection_vjp_row_dd(x[row], zero, g[row], zero, d, eps, pq, pp, out[row])


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _layer_norm_rows(x, g, out, eps, r0, r1):
    """y = (x - mean) / sqrt(var + eps), var biased; statistics and y in float64."""
    d = x.shape[1]
    dev = np.empty(d)
    for row in range(r0, r1):
        v = x[row]
        mu = _pairwise_sum(v, 0, d) / d
        for j in range(d):
            t = np.float64(v[j]) - mu
            dev[j] = t * t
        r = 1.0 / math.sqrt(_pairwise_sum(dev, 0, d) / d + eps)
        for j in range(d):
            out[row, j] = (np.float64(v[j]) - mu) * r


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _layer_norm_rows_vjp(x, g, out, eps, r0, r1):
    """gx = r (g - mean(g) - y mean(g y)), y the normalised row, r = 1 / sqrt(var + eps)."""
    d = x.shape[1]
    y = np.empty(d)
    tmp = np.empty(d)
    for row in range(r0, r1):
        v = x[row]
        gr = g[row]
        mu = _pairwise_sum(v, 0, d) / d
        for j in range(d):
            t = np.float64(v[j]) - mu
            tmp[j] = t * t
        r = 1.0 / math.sqrt(_pairwise_sum(tmp, 0, d) / d + eps)
        for j in range(d):
            y[j] = (np.float64(v[j]) - mu) * r
            tmp[j] = np.float64(gr[j]) * y[j]
        gy = _pairwise_sum(tmp, 0, d) / d
        gm = _pairwise_sum(gr, 0, d) / d
        for j in range(d):
            out[row, j] = r * (np.float64(gr[j]) - gm - y[j] * gy)


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _rms_norm_rows(x, g, out, eps, r0, r1):
    """y = x / sqrt(mean(x^2) + eps) in float64."""
    d = x.shape[1]
    sq = np.empty(d)
    for row in range(r0, r1):
        v = x[row]
        for j in range(d):
            t = np.float64(v[j])
            sq[j] = t * t
        r = 1.0 / math.sqrt(_pairwise_sum(sq, 0, d) / d + eps)
        for j in range(d):
            out[row, j] = np.float64(v[j]) * r


@njit(cache=True, nogil=True, fastmath=_FM, error_model="numpy")
def _rms_norm_rows_vjp(x, g, out, eps, r0, r1):
    """gx = r (g - y mean(g y)), y = x r, r = 1 / sqrt(mean(x^2) + eps)."""
    d = x.shape[1]
    tmp = np.empty(d)
    for row in range(r0, r1):
        v = x[row]
        gr = g[row]
        for j in range(d):
            t = np.float64(v[j])
            tmp[j] = t * t
        r = 1.0 / math.sqrt(_pairwise_sum(tmp, 0, d) / d + eps)
        for j in range(d):
            tmp[j] = np.float64(gr[j]) * np.float64(v[j]) * r
        gy = _pairwise_sum(tmp, 0, d) / d
        for j in range(d):
            out[row, j] = r * (np.float64(gr[j]) - np.float64(v[j]) * r * gy)


# One ``prange`` driver per row kernel (a driver that dispatched on an op code would make
# LLVM optimise all eight kernels in one function: seconds of compile time for every dtype).

@njit(cache=True, parallel=True, error_model="numpy")
def _softmax_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _softmax_rows(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _log_softmax_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _log_softmax_rows(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _softmax_vjp_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _softmax_rows_vjp(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _log_softmax_vjp_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _log_softmax_rows_vjp(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _layer_norm_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _layer_norm_rows(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _layer_norm_vjp_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _layer_norm_rows_vjp(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _rms_norm_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _rms_norm_rows(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _rms_norm_vjp_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _rms_norm_rows_vjp(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _softmax_vjp64_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _softmax_rows_vjp64(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _log_softmax_vjp64_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _log_softmax_rows_vjp64(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _layer_norm_vjp64_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _layer_norm_rows_vjp64(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


@njit(cache=True, parallel=True, error_model="numpy")
def _rms_norm_vjp64_par(x, g, out, eps, nchunks):
    for c in prange(nchunks):
        _rms_norm_rows_vjp64(x, g, out, eps, *_chunk(x.shape[0], c, nchunks))


# op -> (serial row kernel, parallel driver)
_SOFTMAX = (_softmax_rows, _softmax_par)
_LOG_SOFTMAX = (_log_softmax_rows, _log_softmax_par)
_SOFTMAX_VJP = (_softmax_rows_vjp, _softmax_vjp_par)
_LOG_SOFTMAX_VJP = (_log_softmax_rows_vjp, _log_softmax_vjp_par)
_LAYER_NORM = (_layer_norm_rows, _layer_norm_par)
_LAYER_NORM_VJP = (_layer_norm_rows_vjp, _layer_norm_vjp_par)
_RMS_NORM = (_rms_norm_rows, _rms_norm_par)
_RMS_NORM_VJP = (_rms_norm_rows_vjp, _rms_norm_vjp_par)
# the float64 specialisations of the VJPs (double-double; module NOTE)
_FLOAT64_VJP = {
    _SOFTMAX_VJP: (_softmax_rows_vjp64, _softmax_vjp64_par),
    _LOG_SOFTMAX_VJP: (_log_softmax_rows_vjp64, _log_softmax_vjp64_par),
    _LAYER_NORM_VJP: (_layer_norm_rows_vjp64, _layer_norm_vjp64_par),
    _RMS_NORM_VJP: (_rms_norm_rows_vjp64, _rms_norm_vjp64_par),
}


# --- launchers ----------------------------------------------------------------------------

def _rows(x):
    return x.reshape(-1, x.shape[-1])


def _run(op, x, g=None, eps=0.0):
    """Run row kernel ``op`` over x's last axis (serial below the parallel threshold)."""
    out = np.empty_like(x)
    if x.size == 0:
        return out
    rx = _rows(x)
    rg = rx if g is None else _rows(g)
    nchunks = min(config.num_chunks(x.size), rx.shape[0])
    if x.dtype == np.float64:
        op = _FLOAT64_VJP.get(op, op)
    serial, parallel = op
    if nchunks <= 1:
        serial(rx, rg, _rows(out), float(eps), 0, rx.shape[0])
    else:
        parallel(rx, rg, _rows(out), float(eps), nchunks)
    return out


def _along_last(op, axis, x, g=None):
    """Run ``op`` along ``axis`` by moving it last (a copy) when it is not already."""
    ax = axis % x.ndim
    if ax == x.ndim - 1:
        return _run(op, x, g)
    moved = np.ascontiguousarray(np.moveaxis(x, ax, -1))
    gm = None if g is None else np.ascontiguousarray(np.moveaxis(g, ax, -1))
    return np.ascontiguousarray(np.moveaxis(_run(op, moved, gm), -1, ax))


def softmax_forward(x, axis=-1):
    """softmax along ``axis`` (normalised int), via the shifted log-sum-exp."""
    return _along_last(_SOFTMAX, axis, x)


def log_softmax_forward(x, axis=-1):
    """log_softmax along ``axis``: (x - max) - log(sum(exp(x - max)))."""
    return _along_last(_LOG_SOFTMAX, axis, x)


def softmax_vjp(x, axis, grad):
    """VJP of softmax: y * (g - sum(g * y)) along ``axis``."""
    return _along_last(_SOFTMAX_VJP, axis, x, grad)


def log_softmax_vjp(x, axis, grad):
    """VJP of log_softmax: g - softmax(x) * sum(g) along ``axis``."""
    return _along_last(_LOG_SOFTMAX_VJP, axis, x, grad)


def layer_norm_forward(x, eps):
    """(x - mean) / sqrt(var + eps) over the last axis (biased variance, no affine)."""
    return _run(_LAYER_NORM, x, eps=eps)


def layer_norm_vjp(x, eps, grad):
    """VJP of layer_norm: r (g - mean(g) - y mean(g y)) per row."""
    return _run(_LAYER_NORM_VJP, x, grad, eps)


def rms_norm_forward(x, eps):
    """x / sqrt(mean(x^2) + eps) over the last axis (no affine)."""
    return _run(_RMS_NORM, x, eps=eps)


def rms_norm_vjp(x, eps, grad):
    """VJP of rms_norm: r (g - y mean(g y)) per row."""
    return _run(_RMS_NORM_VJP, x, grad, eps)
