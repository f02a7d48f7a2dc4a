"""Numba kernels of the compiled training path for attention models
(:mod:`fastlib.training.compiled_attention`).

The long story: docs/fastlib.md, section ``fastlib/kernels/transformer.py``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from fastlib.config import FASTMATH
from fastlib.kernels import dense as kd
from fastlib.kernels import optim as kopt
from fastlib.kernels import scalar
from fastlib.kernels.reduce import _block_sum
from fastlib.kernels.vecmath import fexp
from fastlib.training import fused_kernels as fk

_FM = set(FASTMATH)

# operation codes (column F_OP of a program row)
OP_DENSE, OP_LAYER_NORM, OP_RMS_NORM, OP_SWIGLU, OP_ATTENTION, OP_EMBEDDING, OP_ADD, \
    OP_COLUMNS = range(8)
# fields of a program row
(F_OP, F_IN, F_IN_W, F_OUT, F_OUT_W, F_AUX1, F_AUX2, F_AUX3, F_P0, F_P1, F_P2, F_P3, F_INT0,
 F_INT1, F_GRAD_A, F_GRAD_B) = range(16)
N_FIELDS = 16
# what the backward does with the cotangent of an input slot: write it, add it to what a
# later consumer (in forward order) wrote, or skip it (the model's input)
GRAD_WRITE, GRAD_ADD, GRAD_SKIP = range(3)
_LINEAR = 0


@njit(inline="always")
def _view(buf, off, rows, width):
    return buf[off:off + rows * width].reshape((rows, width))


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _input_grad(a, bt, gx, mode, tmp):
    """``gx = a @ bt`` (mode WRITE) or ``gx += a @ bt`` (ADD, through ``tmp``)."""
    if mode == GRAD_SKIP:
        return
    if mode == GRAD_WRITE:
        np.dot(a, bt, gx)
        return
    rows, cols = gx.shape
    t = tmp[:rows * cols].reshape((rows, cols))
    np.dot(a, bt, t)
    for i in range(rows):
        gr = gx[i]
        tr = t[i]
        for j in range(cols):
            gr[j] += tr[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _column_sums(g, out, acc):
    """``out[j] = sum_i g[i, j]`` through the float64 accumulator ``acc`` (as Dense's)."""
    rows, cols = g.shape
    for j in range(cols):
        acc[j] = 0.0
    for i in range(rows):
        gr = g[i]
        for j in range(cols):
            acc[j] += gr[j]
    for j in range(cols):
        out[j] = acc[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _add_bias(y, b):
    rows, cols = y.shape
    for i in range(rows):
        yr = y[i]
        for j in range(cols):
            yr[j] += b[j]


# ---------------------------------------------------------------------------------------------
# Dense

@njit(cache=True, error_model="numpy", fastmath=_FM)
def _dense_forward(x, w, b, pre, post, code, slope):
    np.dot(x, w, pre)
    rows, cols = pre.shape
    if code == _LINEAR:  # pre and post are one slot
        _add_bias(pre, b)
        return
    for i in range(rows):
        pr = pre[i]
        po = post[i]
        for j in range(cols):
            z = pr[j] + b[j]
            pr[j] = z
            po[j] = kd.activate(z, code, slope)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _dense_backward(x, w, pre, g, gpre, gw, gb, acc, gx, mode, tmp, code, slope):
    """``gpre = g f'(pre)`` (for linear ``gpre`` is ``g``), bias and weight gradients, and
    the input's cotangent."""
    if code != _LINEAR:
        rows, cols = g.shape
        for i in range(rows):
            gr = g[i]
            pr = pre[i]
            out = gpre[i]
            for j in range(cols):
                out[j] = gr[j] * kd.activate_derivative(pr[j], code, slope)
    _column_sums(gpre, gb, acc)
    np.dot(x.T, gpre, gw)
    _input_grad(gpre, w.T, gx, mode, tmp)


# ---------------------------------------------------------------------------------------------
# LayerNorm and RMSNorm: the arithmetic of fastlib.kernels.dense's layer kernels

@njit(cache=True, error_model="numpy", fastmath=_FM)
def _layer_norm_forward(x, weight, bias, eps, xhat, rstd, y):
    rows, cols = x.shape
    for i in range(rows):
        xr = x[i]
        mean = 0.0
        for j in range(cols):
            mean += xr[j]
        mean /= cols
        var = 0.0
        for j in range(cols):
            dev = xr[j] - mean
            var += dev * dev
        var /= cols
        r = 1.0 / np.sqrt(var + eps)
        rstd[i] = r
        hr = xhat[i]
        yr = y[i]
        for j in range(cols):
            xh = (xr[j] - mean) * r
            hr[j] = xh
            yr[j] = xh * weight[j] + bias[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _layer_norm_backward(dy, xhat, rstd, weight, dx, mode, dweight, dbias, acc):
    rows, cols = dy.shape
    for j in range(2 * cols):
        acc[j] = 0.0
    for i in range(rows):
        dr = dy[i]
        hr = xhat[i]
        mean_g = 0.0
        mean_gx = 0.0
        for j in range(cols):
            g = dr[j] * weight[j]
            mean_g += g
            mean_gx += g * hr[j]
            acc[j] += dr[j] * hr[j]
            acc[cols + j] += dr[j]
        if mode == GRAD_SKIP:
            continue
        mean_g /= cols
        mean_gx /= cols
        r = rstd[i]
        xr = dx[i]
        for j in range(cols):
            g = dr[j] * weight[j]
            v = r * (g - mean_g - hr[j] * mean_gx)
            if mode == GRAD_ADD:
                xr[j] += v
            else:
                xr[j] = v
    for j in range(cols):
        dweight[j] = acc[j]
        dbias[j] = acc[cols + j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _rms_norm_forward(x, weight, eps, rinv, y):
    rows, cols = x.shape
    for i in range(rows):
        xr = x[i]
        ms = 0.0
        for j in range(cols):
            ms += xr[j] * xr[j]
        r = 1.0 / np.sqrt(ms / cols + eps)
        rinv[i] = r
        yr = y[i]
        for j in range(cols):
            yr[j] = xr[j] * r * weight[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _rms_norm_backward(dy, x, rinv, weight, dx, mode, dweight, acc):
    rows, cols = dy.shape
    for j in range(cols):
        acc[j] = 0.0
    for i in range(rows):
        r = rinv[i]
        dr = dy[i]
        xr = x[i]
        mean_gx = 0.0
        for j in range(cols):
            mean_gx += dr[j] * weight[j] * xr[j]
            acc[j] += dr[j] * xr[j] * r
        if mode == GRAD_SKIP:
            continue
        mean_gx /= cols
        r3 = r * r * r
        out = dx[i]
        for j in range(cols):
            v = r * dr[j] * weight[j] - r3 * xr[j] * mean_gx
            if mode == GRAD_ADD:
                out[j] += v
            else:
                out[j] = v
    for j in range(cols):
        dweight[j] = acc[j]


# ---------------------------------------------------------------------------------------------
# SwiGLU: [w_gate | w_up] is one (d, 2h) block, so both projections are one product

@njit(cache=True, error_model="numpy", fastmath=_FM)
def _swiglu_forward(x, w_gu, w_down, au, hidden, y):
    np.dot(x, w_gu, au)
    rows, hid = hidden.shape
    for i in range(rows):
        ar = au[i]
        hr = hidden[i]
        for j in range(hid):
            hr[j] = scalar.silu_f(ar[j]) * ar[hid + j]
    np.dot(hidden, w_down, y)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _swiglu_backward(x, w_gu, w_down, au, hidden, g, dhidden, dau, gw_gu, gw_down, gx, mode,
                     tmp):
    np.dot(g, w_down.T, dhidden)
    np.dot(hidden.T, g, gw_down)
    rows, hid = hidden.shape
    for i in range(rows):
        ar = au[i]
        dr = dhidden[i]
        out = dau[i]
        for j in range(hid):
            a = ar[j]
            out[j] = dr[j] * ar[hid + j] * scalar.silu_df(a)
            out[hid + j] = dr[j] * scalar.silu_f(a)
    np.dot(x.T, dau, gw_gu)
    _input_grad(dau, w_gu.T, gx, mode, tmp)


# ---------------------------------------------------------------------------------------------
# attention: one (sample, head) block, the score / softmax / value chain fused

@njit(cache=True, error_model="numpy", fastmath=_FM)
def _gather_cols(src, r0, c0, out):
    """``out = src[r0:r0 + out.shape[0], c0:c0 + out.shape[1]]`` (contiguous, for BLAS)."""
    rows, width = out.shape
    for t in range(rows):
        s = src[r0 + t]
        o = out[t]
        for j in range(width):
            o[j] = s[c0 + j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _scatter_cols(block, r0, c0, dst):
    rows, width = block.shape
    for t in range(rows):
        s = block[t]
        o = dst[r0 + t]
        for j in range(width):
            o[c0 + j] = s[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _attention_block_forward(qkv, r0, c0, d, scale, causal, p, att, sc):
    """Block (rows r0.., head columns c0..): ``p = softmax(q k^T scale [causal])`` kept in
    ``p`` (T, T), ``att[rows, head] = p v``. Masked keys are left out of the softmax (weight
    exactly 0), as the generic kernel and reflib do."""
    steps = p.shape[0]
    dh = sc.shape[0] // (4 * steps)
    qh = sc[:steps * dh].reshape((steps, dh))
    kh = sc[steps * dh:2 * steps * dh].reshape((steps, dh))
    vh = sc[2 * steps * dh:3 * steps * dh].reshape((steps, dh))
    oh = sc[3 * steps * dh:4 * steps * dh].reshape((steps, dh))
    _gather_cols(qkv, r0, c0, qh)
    _gather_cols(qkv, r0, d + c0, kh)
    _gather_cols(qkv, r0, 2 * d + c0, vh)
    np.dot(qh, kh.T, p)
    for i in range(steps):
        last = i + 1 if causal else steps
        full = p[i]
        row = full[:last]
        for j in range(last):
            row[j] = row[j] * scale
        m = row[0]
        for j in range(1, last):
            m = max(m, row[j])
        for j in range(last):
            row[j] = fexp(row[j] - m)
        total = _block_sum(row, 0, last)     # float64
        inv = 1.0 / total
        for j in range(last):
            row[j] = row[j] * inv
        for j in range(last, steps):
            full[j] = 0.0
    np.dot(p, vh, oh)
    _scatter_cols(oh, r0, c0, att)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _attention_block_backward(qkv, r0, c0, d, scale, causal, p, gatt, dqkv, dp, sc):
    """Cotangents of the block's q, k, v into ``dqkv`` from ``gatt`` and the kept ``p``:
    ``dv = p^T do``, ``dP = do v^T``, ``dS = p (dP - sum_j p dP) scale``, ``dq = dS k``,
    ``dk = dS^T q``.

    NOTE: the row term ``sum_j p_ij dP_ij`` is taken from the block's own ``p`` and ``dP``
    in float64, not as ``sum(do * o)`` from the rounded output (equal in exact arithmetic):
    ``dP - sum`` cancels, and the output's rounding made the query and key gradients tens of
    times less accurate than the value gradients.
    """
    steps = p.shape[0]
    dh = sc.shape[0] // (4 * steps)
    qh = sc[:steps * dh].reshape((steps, dh))
    kh = sc[steps * dh:2 * steps * dh].reshape((steps, dh))
    vh = sc[2 * steps * dh:3 * steps * dh].reshape((steps, dh))
    doh = sc[3 * steps * dh:4 * steps * dh].reshape((steps, dh))
    _gather_cols(qkv, r0, c0, qh)
    _gather_cols(qkv, r0, d + c0, kh)
    _gather_cols(qkv, r0, 2 * d + c0, vh)
    _gather_cols(gatt, r0, c0, doh)
    np.dot(p.T, doh, vh)                      # vh now holds dv
    _scatter_cols(vh, r0, 2 * d + c0, dqkv)
    _gather_cols(qkv, r0, 2 * d + c0, vh)     # v again
    np.dot(doh, vh.T, dp)
    for i in range(steps):
        last = i + 1 if causal else steps
        pr = p[i]
        dr = dp[i]
        s = 0.0
        for j in range(last):
            s += np.float64(pr[j]) * np.float64(dr[j])
        for j in range(last):
            dr[j] = pr[j] * (dr[j] - s) * scale
        for j in range(last, steps):
            dr[j] = 0.0
    np.dot(dp, kh, doh)                       # dq
    _scatter_cols(doh, r0, c0, dqkv)
    np.dot(dp.T, qh, doh)                     # dk
    _scatter_cols(doh, r0, d + c0, dqkv)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _attention_forward(x, w_qkv, b_qkv, w_o, b_o, qkv, att, probs, y, samples, steps, heads,
                       scale, causal, sc):
    np.dot(x, w_qkv, qkv)
    _add_bias(qkv, b_qkv)
    d = att.shape[1]
    dh = d // heads
    for s in range(samples):
        for h in range(heads):
            o = ((s * heads + h) * steps) * steps
            p = probs[o:o + steps * steps].reshape((steps, steps))
            _attention_block_forward(qkv, s * steps, h * dh, d, scale, causal, p, att,
                                     sc[:4 * steps * dh])
    np.dot(att, w_o, y)
    _add_bias(y, b_o)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _attention_backward(x, w_qkv, w_o, qkv, att, probs, g, gatt, dqkv, gw_qkv, gb_qkv, gw_o,
                        gb_o, acc, gx, mode, tmp, samples, steps, heads, scale, causal, sc):
    np.dot(att.T, g, gw_o)
    _column_sums(g, gb_o, acc)
    np.dot(g, w_o.T, gatt)
    d = att.shape[1]
    dh = d // heads
    for s in range(samples):
        for h in range(heads):
            o = ((s * heads + h) * steps) * steps
            p = probs[o:o + steps * steps].reshape((steps, steps))
            dp = sc[4 * steps * dh:4 * steps * dh + steps * steps].reshape((steps, steps))
            _attention_block_backward(qkv, s * steps, h * dh, d, scale, causal, p, gatt, dqkv,
                                      dp, sc[:4 * steps * dh])
    np.dot(x.T, dqkv, gw_qkv)
    _column_sums(dqkv, gb_qkv, acc)
    _input_grad(dqkv, w_qkv.T, gx, mode, tmp)


# ---------------------------------------------------------------------------------------------
# the program, over the rows of one piece

@njit(cache=True, error_model="numpy", fastmath=_FM)
def _forward_piece(prog, fpar, samples, steps, w, act, tok, sc):
    rows = samples * steps
    for k in range(prog.shape[0]):
        op = prog[k, F_OP]
        win, wout = prog[k, F_IN_W], prog[k, F_OUT_W]
        y = _view(act, prog[k, F_OUT], rows, wout)
        if op == OP_EMBEDDING:
            table = _view(w, prog[k, F_P0], prog[k, F_INT0], wout)
            for i in range(rows):
                src = table[tok[i]]
                dst = y[i]
                for j in range(wout):
                    dst[j] = src[j]
            continue
        x = _view(act, prog[k, F_IN], rows, win)
        if op == OP_DENSE:
            _dense_forward(x, _view(w, prog[k, F_P0], win, wout), w[prog[k, F_P1]:][:wout],
                           _view(act, prog[k, F_AUX1], rows, wout), y, prog[k, F_INT0], fpar[k])
        elif op == OP_LAYER_NORM:
            _layer_norm_forward(x, w[prog[k, F_P0]:][:win], w[prog[k, F_P1]:][:win], fpar[k],
                                _view(act, prog[k, F_AUX1], rows, win),
                                act[prog[k, F_AUX2]:][:rows], y)
        elif op == OP_RMS_NORM:
            _rms_norm_forward(x, w[prog[k, F_P0]:][:win], fpar[k], act[prog[k, F_AUX1]:][:rows],
                              y)
        elif op == OP_SWIGLU:
            hid = prog[k, F_INT0]
            _swiglu_forward(x, _view(w, prog[k, F_P0], win, 2 * hid),
                            _view(w, prog[k, F_P1], hid, wout),
                            _view(act, prog[k, F_AUX1], rows, 2 * hid),
                            _view(act, prog[k, F_AUX2], rows, hid), y)
        elif op == OP_ATTENTION:
            heads = prog[k, F_INT0]
            _attention_forward(x, _view(w, prog[k, F_P0], win, 3 * win),
                               w[prog[k, F_P2]:][:3 * win], _view(w, prog[k, F_P1], win, win),
                               w[prog[k, F_P3]:][:win],
                               _view(act, prog[k, F_AUX1], rows, 3 * win),
                               _view(act, prog[k, F_AUX2], rows, win),
                               act[prog[k, F_AUX3]:][:samples * heads * steps * steps], y,
                               samples, steps, heads, act.dtype.type(fpar[k]),
                               prog[k, F_INT1] != 0, sc)
        elif op == OP_ADD:
            x2 = _view(act, prog[k, F_AUX1], rows, win)
            for i in range(rows):
                a, b, o = x[i], x2[i], y[i]
                for j in range(wout):
                    o[j] = a[j] + b[j]
        else:  # OP_COLUMNS: y[:, c0:c0 + win] = x
            c0 = prog[k, F_INT0]
            for i in range(rows):
                a, o = x[i], y[i]
                for j in range(win):
                    o[c0 + j] = a[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _pass_grad(g, gx, mode):
    """``gx (=|+=) g``: a cotangent handed on unchanged."""
    if mode == GRAD_SKIP:
        return
    rows, cols = gx.shape
    for i in range(rows):
        a, o = g[i], gx[i]
        if mode == GRAD_ADD:
            for j in range(cols):
                o[j] += a[j]
        else:
            for j in range(cols):
                o[j] = a[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _backward_piece(prog, fpar, samples, steps, w, act, gact, tok, gpart, acc, tmp, sc):
    """The program backward over one piece; parameter gradients into ``gpart`` (every entry
    written), cotangents into ``gact`` (the slots' layout, as ``act``)."""
    rows = samples * steps
    for k in range(prog.shape[0] - 1, -1, -1):
        op = prog[k, F_OP]
        win, wout = prog[k, F_IN_W], prog[k, F_OUT_W]
        mode = prog[k, F_GRAD_A]
        g = _view(gact, prog[k, F_OUT], rows, wout)
        if op == OP_EMBEDDING:
            num = prog[k, F_INT0]
            table = acc[:num * wout].reshape((num, wout))
            for r in range(num):
                tr = table[r]
                for j in range(wout):
                    tr[j] = 0.0
            for i in range(rows):   # NOTE: rows in order into float64, as the layer does
                tr = table[tok[i]]
                gr = g[i]
                for j in range(wout):
                    tr[j] += gr[j]
            out = gpart[prog[k, F_P0]:][:num * wout]
            flat = acc[:num * wout]
            for j in range(num * wout):
                out[j] = flat[j]
            continue
        x = _view(act, prog[k, F_IN], rows, win)
        gx = _view(gact, prog[k, F_IN], rows, win)
        if op == OP_DENSE:
            _dense_backward(x, _view(w, prog[k, F_P0], win, wout),
                            _view(act, prog[k, F_AUX1], rows, wout), g,
                            _view(gact, prog[k, F_AUX1], rows, wout),
                            _view(gpart, prog[k, F_P0], win, wout), gpart[prog[k, F_P1]:][:wout],
                            acc, gx, mode, tmp, prog[k, F_INT0], fpar[k])
        elif op == OP_LAYER_NORM:
            _layer_norm_backward(g, _view(act, prog[k, F_AUX1], rows, win),
                                 act[prog[k, F_AUX2]:][:rows], w[prog[k, F_P0]:][:win], gx, mode,
                                 gpart[prog[k, F_P0]:][:win], gpart[prog[k, F_P1]:][:win], acc)
        elif op == OP_RMS_NORM:
            _rms_norm_backward(g, x, act[prog[k, F_AUX1]:][:rows], w[prog[k, F_P0]:][:win], gx,
                               mode, gpart[prog[k, F_P0]:][:win], acc)
        elif op == OP_SWIGLU:
            hid = prog[k, F_INT0]
            _swiglu_backward(x, _view(w, prog[k, F_P0], win, 2 * hid),
                             _view(w, prog[k, F_P1], hid, wout),
                             _view(act, prog[k, F_AUX1], rows, 2 * hid),
                             _view(act, prog[k, F_AUX2], rows, hid), g,
                             _view(gact, prog[k, F_AUX2], rows, hid),
                             _view(gact, prog[k, F_AUX1], rows, 2 * hid),
                             _view(gpart, prog[k, F_P0], win, 2 * hid),
                             _view(gpart, prog[k, F_P1], hid, wout), gx, mode, tmp)
        elif op == OP_ATTENTION:
            heads = prog[k, F_INT0]
            _attention_backward(x, _view(w, prog[k, F_P0], win, 3 * win),
                                _view(w, prog[k, F_P1], win, win),
                                _view(act, prog[k, F_AUX1], rows, 3 * win),
                                _view(act, prog[k, F_AUX2], rows, win),
                                act[prog[k, F_AUX3]:][:samples * heads * steps * steps], g,
                                _view(gact, prog[k, F_AUX2], rows, win),
                                _view(gact, prog[k, F_AUX1], rows, 3 * win),
                                _view(gpart, prog[k, F_P0], win, 3 * win),
                                gpart[prog[k, F_P2]:][:3 * win],
                                _view(gpart, prog[k, F_P1], win, win),
                                gpart[prog[k, F_P3]:][:win], acc, gx, mode, tmp, samples, steps,
                                heads, act.dtype.type(fpar[k]), prog[k, F_INT1] != 0, sc)
        elif op == OP_ADD:
            _pass_grad(g, gx, mode)
            _pass_grad(g, _view(gact, prog[k, F_AUX1], rows, win), prog[k, F_GRAD_B])
        else:  # OP_COLUMNS
            c0 = prog[k, F_INT0]
            if mode != GRAD_SKIP:
                for i in range(rows):
                    a, o = g[i], gx[i]
                    for j in range(win):
                        if mode == GRAD_ADD:
                            o[j] += a[c0 + j]
                        else:
                            o[j] = a[c0 + j]


# ---------------------------------------------------------------------------------------------
# parallel regions

@njit(cache=True, error_model="numpy")
def _piece_bounds(nb, n_pieces, p):
    return (p * nb) // n_pieces, ((p + 1) * nb) // n_pieces


@njit(cache=True, error_model="numpy")
def _forward_one(p, n_pieces, nb, start, order, x, xi, use_tokens, steps, prog, fpar, w, act, tok,
                 sc, out_slot, out_w, out_all):
    s0, s1 = _piece_bounds(nb, n_pieces, p)
    samples = s1 - s0
    if samples == 0:
        return
    a = act[p]
    if use_tokens:
        tk = tok[p]
        for s in range(samples):
            r = order[start + s0 + s]
            for t in range(steps):
                tk[s * steps + t] = xi[r, t]
    else:
        width = x.shape[1]
        for s in range(samples):
            src = x[order[start + s0 + s]]
            dst = a[s * width:(s + 1) * width]
            for j in range(width):
                dst[j] = src[j]
    _forward_piece(prog, fpar, samples, steps, w, a, tok[p], sc[p])
    n = samples * steps * out_w
    src = a[out_slot:out_slot + n]
    dst = out_all[s0 * steps * out_w:s0 * steps * out_w + n]
    for j in range(n):
        dst[j] = src[j]


@njit(cache=True, parallel=True, error_model="numpy")
def _forward_region(threads, n_pieces, nb, start, order, x, xi, use_tokens, steps, prog, fpar, w,
                    act, tok, sc, out_slot, out_w, out_all):
    if threads == 1:
        for p in range(n_pieces):
            _forward_one(p, n_pieces, nb, start, order, x, xi, use_tokens, steps, prog, fpar, w,
                         act, tok, sc, out_slot, out_w, out_all)
        return
    for t in prange(threads):
        for p in range(t, n_pieces, threads):
            _forward_one(p, n_pieces, nb, start, order, x, xi, use_tokens, steps, prog, fpar, w,
                         act, tok, sc, out_slot, out_w, out_all)


@njit(cache=True, error_model="numpy")
def _backward_one(p, n_pieces, nb, steps, prog, fpar, w, act, gact, tok, part, acc, tmp, sc,
                  out_slot, out_w, dz_all):
    s0, s1 = _piece_bounds(nb, n_pieces, p)
    samples = s1 - s0
    if samples == 0:
        return
    n = samples * steps * out_w
    src = dz_all[s0 * steps * out_w:s0 * steps * out_w + n]
    dst = gact[p][out_slot:out_slot + n]
    for j in range(n):
        dst[j] = src[j]
    _backward_piece(prog, fpar, samples, steps, w, act[p], gact[p], tok[p], part[p], acc[p],
                    tmp[p], sc[p])


@njit(cache=True, parallel=True, error_model="numpy")
def _backward_region(threads, n_pieces, nb, steps, prog, fpar, w, act, gact, tok, part, acc, tmp,
                     sc, out_slot, out_w, dz_all):
    if threads == 1:
        for p in range(n_pieces):
            _backward_one(p, n_pieces, nb, steps, prog, fpar, w, act, gact, tok, part, acc, tmp,
                          sc, out_slot, out_w, dz_all)
        return
    for t in prange(threads):
        for p in range(t, n_pieces, threads):
            _backward_one(p, n_pieces, nb, steps, prog, fpar, w, act, gact, tok, part, acc, tmp,
                          sc, out_slot, out_w, dz_all)


@njit(cache=True, error_model="numpy")
def _chunk(n, chunks, c):
    return (c * n) // chunks, ((c + 1) * n) // chunks


@njit(cache=True, error_model="numpy")
def _reduce_one(c, chunks, n_pieces, part, g, sumsq):
    """Chunk c of the gradient: the pieces' partials added in piece order; its float64 sum
    of squares."""
    lo, hi = _chunk(g.shape[0], chunks, c)
    out = g[lo:hi]
    first = part[0][lo:hi]
    for i in range(hi - lo):
        out[i] = first[i]
    for p in range(1, n_pieces):
        src = part[p][lo:hi]
        for i in range(hi - lo):
            out[i] += src[i]
    sumsq[c] = kopt._sum_squares(out)


@njit(cache=True, parallel=True, error_model="numpy")
def _reduce_region(threads, chunks, n_pieces, part, g, sumsq):
    if threads == 1:
        for c in range(chunks):
            _reduce_one(c, chunks, n_pieces, part, g, sumsq)
        return
    for t in prange(threads):
        for c in range(t, chunks, threads):
            _reduce_one(c, chunks, n_pieces, part, g, sumsq)


@njit(cache=True, error_model="numpy")
def _update_one(c, chunks, kind, w, g, a, b, coeffs, clip_mode, clip, total):
    lo, hi = _chunk(w.shape[0], chunks, c)
    gp = g[lo:hi]
    fk._clip_flat(gp, clip_mode, clip, total)
    # empty state arrays (optimizers without them) stay empty when sliced
    kopt._update_impl(kind, w[lo:hi], gp, a[lo:hi], b[lo:hi], coeffs)


@njit(cache=True, parallel=True, error_model="numpy")
def _update_region(threads, chunks, kind, w, g, a, b, coeffs, clip_mode, clip, total):
    if threads == 1:
        old = kopt.enter_ftz()
        for c in range(chunks):
            _update_one(c, chunks, kind, w, g, a, b, coeffs, clip_mode, clip, total)
        kopt.leave_ftz(old)
        return
    for t in prange(threads):
        old = kopt.enter_ftz()  # per worker thread: the control word is thread-local
        for c in range(t, chunks, threads):
            _update_one(c, chunks, kind, w, g, a, b, coeffs, clip_mode, clip, total)
        kopt.leave_ftz(old)


# ---------------------------------------------------------------------------------------------
# the epoch

@njit(cache=True, error_model="numpy")
def pieces_for(nb, steps, min_rows, max_pieces):
    """Pieces a batch of ``nb`` samples is cut into: one below ``min_rows`` rows (a piece's
    work must pay for a thread hand-off), else ``max_pieces`` (at most one per sample). A
    function of the shape only, never of the threads available."""
    if nb * steps < min_rows:
        return 1
    return min(max_pieces, nb)


@njit(cache=True, error_model="numpy")
def epoch(x, xi, use_tokens, yi, yf, order, batch_size, steps, threads, min_rows, max_pieces,
          chunks, prog, fpar, out_slot, out_w, loss_code, kind, coeffs, clip_mode, clip, w, a, b,
          g, part, act, gact, tok, acc, tmp, sc, out_all, dz_all, sumsq):
    """Train one epoch; returns (loss_sum, correct, skipped, updates, diverged_batch, loss).

    NaN/Inf rules: a non-finite loss returns at once (the caller restores the weights); a
    non-finite gradient skips the update (``skipped``), as the generic path does.
    """
    n_samples = order.shape[0]
    loss_sum = 0.0
    correct_sum = 0.0
    skipped = 0
    updates = 0
    batch = 0
    for start in range(0, n_samples, batch_size):
        nb = min(batch_size, n_samples - start)
        n_pieces = pieces_for(nb, steps, min_rows, max_pieces)
        th = min(threads, n_pieces)
        _forward_region(th, n_pieces, nb, start, order, x, xi, use_tokens, steps, prog, fpar, w,
                        act, tok, sc, out_slot, out_w, out_all)
        width = steps * out_w
        z = out_all[:nb * width].reshape((nb, width))
        dz = dz_all[:nb * width].reshape((nb, width))
        loss, correct = fk._loss_and_grad(loss_code, z, yi, yf, order[start:start + nb], dz)
        if not math.isfinite(loss):
            return loss_sum, correct_sum, skipped, updates, batch, loss
        loss_sum += loss * nb
        correct_sum += correct
        _backward_region(th, n_pieces, nb, steps, prog, fpar, w, act, gact, tok, part, acc, tmp,
                         sc, out_slot, out_w, dz_all)
        _reduce_region(min(threads, chunks), chunks, n_pieces, part, g, sumsq)
        total = 0.0
        for c in range(chunks):
            total += sumsq[c]
        batch += 1
        if not (math.isfinite(total) or kopt._all_finite(g)):
            skipped += 1
            continue
        _update_region(min(threads, chunks), chunks, kind, w, g, a, b, coeffs[updates],
                       clip_mode, clip, total)
        updates += 1
    return loss_sum, correct_sum, skipped, updates, -1, 0.0
