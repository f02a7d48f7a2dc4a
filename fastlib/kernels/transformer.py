"""Numba kernels of the compiled program's interpreter: the general schedule
(:mod:`fastlib.training.general_schedule`) runs a program's rows (:mod:`fastlib.training.program`).

The long story: docs/fastlib.md, section ``fastlib/kernels/transformer.py``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from fastlib.config import FASTMATH
from fastlib.kernels import dense as kd
from fastlib.kernels import recurrent_pieces as cells
from fastlib.kernels import scalar
from fastlib.kernels.reduce import _block_sum
from fastlib.kernels.vecmath import fexp
from fastlib.training import fused_kernels as fk
from fastlib.training import skeleton as sk

_FM = set(FASTMATH)

# operation codes (column F_OP of a program row)
OP_DENSE, OP_LAYER_NORM, OP_RMS_NORM, OP_SWIGLU, OP_ATTENTION, OP_EMBEDDING, OP_ADD, \
    OP_COLUMNS, OP_RNN, OP_LSTM = range(10)
# fields of a program row. F_ROWS: rows per sample of the row's input (the sequence's steps,
# or 1 for a slot without a time axis, such as a recurrent layer's last state)
(F_OP, F_IN, F_IN_W, F_OUT, F_OUT_W, F_AUX1, F_AUX2, F_AUX3, F_P0, F_P1, F_P2, F_P3, F_INT0,
 F_INT1, F_GRAD_A, F_GRAD_B, F_ROWS, F_AUX4, F_AUX5) = range(19)
N_FIELDS = 19
# what the backward does with the cotangent of an input slot: write it, add it to what a
# later consumer (in forward order) wrote, or skip it (the model's input)
GRAD_WRITE, GRAD_ADD, GRAD_SKIP = range(3)
_LINEAR = fk._LINEAR   # the op table's code of "linear"


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


# ---------------------------------------------------------------------------------------------
# Dense

@njit(cache=True, error_model="numpy", fastmath=_FM)
def _dense_forward(x, w, b, pre, post, code, slope):
    np.dot(x, w, pre)
    if code == _LINEAR:  # pre and post are one slot
        kd.add_bias(pre, b)
    else:
        kd.bias_activation(pre, b, post, code, slope)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _dense_backward(x, w, pre, g, gw, gb, acc, gx, mode, tmp, code, slope):
    """``g *= f'(pre)`` in place (the output's cotangent has no other reader), bias and
    weight gradients, and the input's cotangent: the other compiled paths' Dense epilogue."""
    fk._backward_epilogue(g, pre, code, slope, acc)
    for j in range(gb.shape[0]):
        gb[j] = acc[j]
    np.dot(x.T, g, gw)
    _input_grad(g, w.T, gx, mode, tmp)


# ---------------------------------------------------------------------------------------------
# LayerNorm and RMSNorm: the forward is fastlib.kernels.dense's; the backward is its
# arithmetic without allocating and with the input cotangent written, added or skipped

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
def _head_block(qkv, r0, c0, d, steps, sc):
    """The block's q, k, v gathered (contiguous, for BLAS) into the scratch ``sc`` of four
    (T, dh) arrays, and the fourth array (the output, or the output's cotangent)."""
    dh = sc.shape[0] // (4 * steps)
    qh = sc[:steps * dh].reshape((steps, dh))
    kh = sc[steps * dh:2 * steps * dh].reshape((steps, dh))
    vh = sc[2 * steps * dh:3 * steps * dh].reshape((steps, dh))
    _gather_cols(qkv, r0, c0, qh)
    _gather_cols(qkv, r0, d + c0, kh)
    _gather_cols(qkv, r0, 2 * d + c0, vh)
    return qh, kh, vh, sc[3 * steps * dh:4 * steps * dh].reshape((steps, dh))


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _attention_block_forward(qkv, r0, c0, d, scale, causal, p, att, sc):
    """Block (rows r0.., head columns c0..): ``p = softmax(q k^T scale [causal])`` kept in
    ``p`` (T, T), ``att[rows, head] = p v``. Masked keys are left out of the softmax (weight
    exactly 0), as the generic kernel and reflib do."""
    steps = p.shape[0]
    qh, kh, vh, oh = _head_block(qkv, r0, c0, d, steps, sc)
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
    qh, kh, vh, doh = _head_block(qkv, r0, c0, d, steps, sc)
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
    kd.add_bias(qkv, b_qkv)
    d = att.shape[1]
    dh = d // heads
    for s in range(samples):
        for h in range(heads):
            o = ((s * heads + h) * steps) * steps
            p = probs[o:o + steps * steps].reshape((steps, steps))
            _attention_block_forward(qkv, s * steps, h * dh, d, scale, causal, p, att,
                                     sc[:4 * steps * dh])
    np.dot(att, w_o, y)
    kd.add_bias(y, b_o)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _attention_backward(x, w_qkv, w_o, qkv, att, probs, g, gatt, dqkv, gw_qkv, gb_qkv, gw_o,
                        gb_o, acc, gx, mode, tmp, samples, steps, heads, scale, causal, sc):
    np.dot(att.T, g, gw_o)
    fk.column_sums_into(g, gb_o, acc)
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
    fk.column_sums_into(dqkv, gb_qkv, acc)
    _input_grad(dqkv, w_qkv.T, gx, mode, tmp)


# ---------------------------------------------------------------------------------------------
# RNN and LSTM: the recurrence of fastlib.kernels.recurrent_pieces over sub-pieces of at most
# cells.PIECE samples (its measured best product shape), each laid out time-major (row
# t * n + b); the input projections, weight gradients and input cotangent are products over
# the piece's sample-major rows (s * steps + t), as every other operation's

@njit(cache=True, error_model="numpy")
def _time_major_row(s, t, samples, steps):
    """Row of sample ``s``, step ``t`` in the time-major sub-piece layout of a piece."""
    q0 = (s // cells.PIECE) * cells.PIECE
    return q0 * steps + t * min(cells.PIECE, samples - q0) + (s - q0)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _reorder(a, b, samples, steps, to_time_major):
    """``b = a`` with the rows moved from sample-major to time-major, or back."""
    width = a.shape[1]
    for s in range(samples):
        for t in range(steps):
            tm = _time_major_row(s, t, samples, steps)
            src = a[s * steps + t] if to_time_major else a[tm]
            dst = b[tm] if to_time_major else b[s * steps + t]
            for j in range(width):
                dst[j] = src[j]


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _recurrent_forward(x, w_ih, w_hh, bias, work, gates, hs, cs, tcs, y, samples, steps, lstm,
                       seq, sc):
    """``gates = x @ w_ih + b`` (time-major), the recurrence, and the output ``y``: every
    state (sample-major) or each sample's last. An RNN's ``hs`` is its ``gates`` (in place)."""
    np.dot(x, w_ih, work)
    kd.add_bias(work, bias)
    _reorder(work, gates, samples, steps, True)
    width, hidden = gates.shape[1], hs.shape[1]
    z = sc[:cells.PIECE * width].reshape((cells.PIECE, width))
    for q0 in range(0, samples, cells.PIECE):
        n = min(cells.PIECE, samples - q0)
        r0, r1 = q0 * steps, (q0 + n) * steps
        if lstm:
            cells.lstm_forward(gates[r0:r1], w_hh, cs[r0:r1], tcs[r0:r1], hs[r0:r1], z, steps, n)
        else:
            cells.rnn_forward(gates[r0:r1], w_hh, z, steps, n)
        if not seq:
            for b in range(n):
                src, dst = hs[r1 - n + b], y[q0 + b]
                for j in range(hidden):
                    dst[j] = src[j]
    if seq:
        _reorder(hs, y, samples, steps, False)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _recurrent_backward(x, w_ih, w_hh, gates, hs, cs, tcs, g, g_tm, dz_tm, dz, gw_ih, gw_hh, gb,
                        acc, gx, mode, tmp, samples, steps, lstm, seq, sc):
    """Backward through time per sub-piece into ``dz_tm``; ``w_hh``'s gradient summed over
    the sub-pieces in order; then, sample-major, ``w_ih``'s and the bias's gradients and the
    input's cotangent."""
    width, hidden = gates.shape[1], hs.shape[1]
    if seq:
        _reorder(g, g_tm, samples, steps, True)
    dh = sc[:cells.PIECE * hidden].reshape((cells.PIECE, hidden))
    dc = sc[cells.PIECE * hidden:2 * cells.PIECE * hidden].reshape((cells.PIECE, hidden))
    part = tmp[:hidden * width].reshape((hidden, width))
    for q0 in range(0, samples, cells.PIECE):
        n = min(cells.PIECE, samples - q0)
        r0, r1 = q0 * steps, (q0 + n) * steps
        gq = g_tm[r0:r1] if seq else g[q0:q0 + n]
        if lstm:
            cells.lstm_backward(gq, seq, gates[r0:r1], cs[r0:r1], tcs[r0:r1], w_hh, dz_tm[r0:r1],
                                dh, dc, steps, n)
        else:
            cells.rnn_backward(gq, seq, hs[r0:r1], w_hh, dz_tm[r0:r1], dh, steps, n)
        # w_hh pairs the state of step t - 1 with the cotangent of step t
        if q0 == 0:
            if steps > 1:
                np.dot(hs[r0:r1 - n].T, dz_tm[r0 + n:r1], gw_hh)
            else:
                gw_hh[:] = 0.0
        elif steps > 1:
            np.dot(hs[r0:r1 - n].T, dz_tm[r0 + n:r1], part)
            for i in range(hidden):
                gr, pr = gw_hh[i], part[i]
                for j in range(width):
                    gr[j] += pr[j]
    _reorder(dz_tm, dz, samples, steps, False)
    np.dot(x.T, dz, gw_ih)
    fk.column_sums_into(dz, gb, acc)
    _input_grad(dz, w_ih.T, gx, mode, tmp)


# ---------------------------------------------------------------------------------------------
# the program, over the rows of one piece

@njit(inline="always")
def _recurrent_views(prog, k, samples, steps, w, act):
    """Row ``k`` (an RNN or LSTM): whether it is an LSTM, whether it returns every state, its
    input, ``w_ih``, ``w_hh``, and its slots: AUX1 the gates (time-major; an RNN's states), AUX2
    the states, AUX3 / AUX4 an LSTM's cells and their tanh (in the cotangents, AUX3 holds the
    output's, time-major), AUX5 sample-major work (the projections forward, the gates'
    cotangent backward)."""
    lstm = prog[k, F_OP] == OP_LSTM
    din, hidden = prog[k, F_IN_W], prog[k, F_OUT_W]
    width = 4 * hidden if lstm else hidden
    rows = samples * steps
    return (lstm, prog[k, F_INT1] != 0, _view(act, prog[k, F_IN], rows, din),
            _view(w, prog[k, F_P0], din, width), _view(w, prog[k, F_P1], hidden, width),
            _view(act, prog[k, F_AUX1], rows, width), _view(act, prog[k, F_AUX2], rows, hidden),
            _view(act, prog[k, F_AUX3], rows, hidden), _view(act, prog[k, F_AUX4], rows, hidden))


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _recurrent_op_forward(prog, k, samples, steps, w, act, sc):
    lstm, seq, x, w_ih, w_hh, gates, hs, cs, tcs = _recurrent_views(prog, k, samples, steps, w,
                                                                    act)
    width, hidden = gates.shape[1], hs.shape[1]
    _recurrent_forward(x, w_ih, w_hh, w[prog[k, F_P2]:][:width],
                       _view(act, prog[k, F_AUX5], samples * steps, width), gates, hs, cs, tcs,
                       _view(act, prog[k, F_OUT], samples * (steps if seq else 1), hidden),
                       samples, steps, lstm, seq, sc)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _recurrent_op_backward(prog, k, samples, steps, w, act, gact, gpart, acc, tmp, sc):
    lstm, seq, x, w_ih, w_hh, gates, hs, cs, tcs = _recurrent_views(prog, k, samples, steps, w,
                                                                    act)
    rows, width, hidden = samples * steps, gates.shape[1], hs.shape[1]
    _recurrent_backward(x, w_ih, w_hh, gates, hs, cs, tcs,
                        _view(gact, prog[k, F_OUT], samples * (steps if seq else 1), hidden),
                        _view(gact, prog[k, F_AUX3], rows, hidden),
                        _view(gact, prog[k, F_AUX1], rows, width),
                        _view(gact, prog[k, F_AUX5], rows, width),
                        _view(gpart, prog[k, F_P0], x.shape[1], width),
                        _view(gpart, prog[k, F_P1], hidden, width),
                        gpart[prog[k, F_P2]:][:width], acc,
                        _view(gact, prog[k, F_IN], rows, x.shape[1]), prog[k, F_GRAD_A], tmp,
                        samples, steps, lstm, seq, sc)


@njit(cache=True, error_model="numpy", fastmath=_FM)
def _forward_piece(prog, fpar, samples, steps, w, act, tok, sc):
    for k in range(prog.shape[0]):
        op = prog[k, F_OP]
        win, wout = prog[k, F_IN_W], prog[k, F_OUT_W]
        rows = samples * prog[k, F_ROWS]
        if op == OP_RNN or op == OP_LSTM:
            _recurrent_op_forward(prog, k, samples, steps, w, act, sc)
            continue
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
            kd.layer_norm_forward(x, w[prog[k, F_P0]:][:win], w[prog[k, F_P1]:][:win], fpar[k],
                                _view(act, prog[k, F_AUX1], rows, win),
                                act[prog[k, F_AUX2]:][:rows], y)
        elif op == OP_RMS_NORM:
            kd.rms_norm_forward(x, w[prog[k, F_P0]:][:win], fpar[k], act[prog[k, F_AUX1]:][:rows],
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
        elif op == OP_COLUMNS:  # y[:, c0:c0 + win] = x
            c0 = prog[k, F_INT0]
            for i in range(rows):
                a, o = x[i], y[i]
                for j in range(win):
                    o[c0 + j] = a[j]
        else:
            # never reached by a program that passed instructions.check_program
            raise ValueError("compiled program: unknown op code in a forward row")


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
    for k in range(prog.shape[0] - 1, -1, -1):
        op = prog[k, F_OP]
        win, wout = prog[k, F_IN_W], prog[k, F_OUT_W]
        mode = prog[k, F_GRAD_A]
        rows = samples * prog[k, F_ROWS]
        if op == OP_RNN or op == OP_LSTM:
            _recurrent_op_backward(prog, k, samples, steps, w, act, gact, gpart, acc, tmp, sc)
            continue
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
        elif op == OP_COLUMNS:
            c0 = prog[k, F_INT0]
            if mode != GRAD_SKIP:
                for i in range(rows):
                    a, o = g[i], gx[i]
                    for j in range(win):
                        if mode == GRAD_ADD:
                            o[j] += a[c0 + j]
                        else:
                            o[j] = a[c0 + j]
        else:
            raise ValueError("compiled program: unknown op code in a backward row")


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
    n = samples * out_w
    src = a[out_slot:out_slot + n]
    dst = out_all[s0 * out_w:s0 * out_w + n]
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
    n = samples * out_w
    src = dz_all[s0 * out_w:s0 * out_w + n]
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


# ---------------------------------------------------------------------------------------------
# the epoch

@njit(cache=True, error_model="numpy")
def epoch(x, xi, use_tokens, yi, yf, order, batch_size, steps, threads, pieces, cuts, prog,
          fpar, out_slot, out_w, loss_code, kind, coeffs, clip_mode, clip, w, a, b, g, part,
          act, gact, tok, acc, tmp, sc, out_all, dz_all, sumsq):
    """Train one epoch; returns (loss_sum, correct, skipped, updates, diverged_batch, loss).

    ``out_w`` is the model output's width per sample (its positions times its features, or
    its features alone when the output has no time axis). Every batch is cut into ``pieces``
    pieces of samples (fewer when it has fewer samples), run ``threads`` at a time. NaN/Inf
    rules: a non-finite loss returns at once (the caller restores the weights); a non-finite
    gradient skips the update (``skipped``), as the generic path does.
    """
    n_samples = order.shape[0]
    loss_sum = 0.0
    correct_sum = 0.0
    skipped = 0
    updates = 0
    batch = 0
    for start in range(0, n_samples, batch_size):
        nb = min(batch_size, n_samples - start)
        n_pieces = min(pieces, nb)
        th = min(threads, n_pieces)
        _forward_region(th, n_pieces, nb, start, order, x, xi, use_tokens, steps, prog, fpar, w,
                        act, tok, sc, out_slot, out_w, out_all)
        z = out_all[:nb * out_w].reshape((nb, out_w))
        dz = dz_all[:nb * out_w].reshape((nb, out_w))
        loss, correct = fk._loss_and_grad(loss_code, z, yi, yf, order[start:start + nb], dz)
        if not math.isfinite(loss):
            return loss_sum, correct_sum, skipped, updates, batch, loss
        loss_sum += loss * nb
        correct_sum += correct
        _backward_region(th, n_pieces, nb, steps, prog, fpar, w, act, gact, tok, part, acc, tmp,
                         sc, out_slot, out_w, dz_all)
        # the skeleton: sum the pieces' partials, guard, clip and update
        applied = sk.end_step(threads, cuts, n_pieces, part, g, sumsq, kind, w, a, b,
                              coeffs[updates:updates + 1], clip_mode, clip)
        batch += 1
        if not applied:
            skipped += 1
            continue
        updates += 1
    return loss_sum, correct_sum, skipped, updates, -1, 0.0
