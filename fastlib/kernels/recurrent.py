"""Recurrences of the RNN and LSTM layers: the sequential part only, time-major.

The input projections of every step (``x_t @ w_ih + b``) and the weight gradients are single
large GEMMs done by the layer; these kernels run what must be sequential: the recurrence
``h_{t-1} @ w_hh`` (``np.dot`` inside Numba, i.e. BLAS) fused with the cell's elementwise work,
forward and backward through time. Arrays are C-contiguous, time-major ``(T, B, ...)``, all of
one float dtype; the layers allocate them and are the only callers.

The long story: docs/fastlib.md, section ``fastlib/kernels/recurrent.py``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from fastlib.config import FASTMATH
from fastlib.kernels import scalar
from fastlib.kernels.vecmath import like

_FASTMATH = set(FASTMATH)  # numba takes a set (config holds a frozenset)
_PIECE = 8                 # batch rows per independent piece


# --- RNN ---------------------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
def _rnn_forward_range(xw, w_hh, hs, p0, p1):
    """``hs[t] = tanh(xw[t] + hs[t-1] @ w_hh)`` with ``h_{-1} = 0`` for pieces p0..p1."""
    steps, batch, hidden = xw.shape
    z = np.empty((min(_PIECE, batch), hidden), dtype=xw.dtype)
    for piece in range(p0, p1):
        b0 = piece * _PIECE
        b1 = min(b0 + _PIECE, batch)
        zp = z[:b1 - b0]
        for t in range(steps):
            if t > 0:
                np.dot(hs[t - 1, b0:b1], w_hh, zp)
            for b in range(b0, b1):
                x = xw[t, b]
                h = hs[t, b]
                if t == 0:
                    for j in range(hidden):
                        h[j] = scalar.tanh_f(x[j])
                else:
                    zr = zp[b - b0]
                    for j in range(hidden):
                        h[j] = scalar.tanh_f(x[j] + zr[j])


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
def _rnn_backward_range(dhs, hs, w_hh_t, dpre, p0, p1):
    """``dpre[t] = (dhs[t] + dh_next) * (1 - hs[t]^2)`` backward through time, pieces p0..p1."""
    steps, batch, hidden = hs.shape
    carry_all = np.zeros((min(_PIECE, batch), hidden), dtype=hs.dtype)
    for piece in range(p0, p1):
        b0 = piece * _PIECE
        b1 = min(b0 + _PIECE, batch)
        carry = carry_all[:b1 - b0]                       # dL/dh_t arriving from step t + 1
        for b in range(b1 - b0):
            cr = carry[b]
            for j in range(hidden):
                cr[j] = 0.0
        for t in range(steps - 1, -1, -1):
            for b in range(b0, b1):
                h = hs[t, b]
                dh = dhs[t, b]
                cr = carry[b - b0]
                out = dpre[t, b]
                for j in range(hidden):
                    out[j] = (dh[j] + cr[j]) * (like(h[j], 1.0) - h[j] * h[j])
            if t > 0:
                np.dot(dpre[t, b0:b1], w_hh_t, carry)


# --- LSTM --------------------------------------------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
def _lstm_forward_range(xw, w_hh, gates, cs, tcs, hs, p0, p1):
    """The LSTM cell over the sequence for batch pieces p0..p1 (see ``lstm_forward``)."""
    steps, batch, four_h = xw.shape
    hidden = four_h // 4
    z = np.zeros((min(_PIECE, batch), four_h), dtype=xw.dtype)
    for piece in range(p0, p1):
        b0 = piece * _PIECE
        b1 = min(b0 + _PIECE, batch)
        zp = z[:b1 - b0]
        for t in range(steps):
            if t > 0:
                np.dot(hs[t - 1, b0:b1], w_hh, zp)
            for b in range(b0, b1):
                x = xw[t, b]
                zr = zp[b - b0]
                g = gates[t, b]
                # i and f: sigmoid over the first 2H columns; g: tanh; o: sigmoid
                if t == 0:                                 # h_{-1} = 0: no recurrent term
                    for j in range(four_h):
                        zr[j] = 0.0
                xa, za, ga = x[:2 * hidden], zr[:2 * hidden], g[:2 * hidden]
                for j in range(2 * hidden):
                    ga[j] = scalar.sigmoid_f(xa[j] + za[j])
                xa, za, ga = x[2 * hidden:3 * hidden], zr[2 * hidden:3 * hidden], \
                    g[2 * hidden:3 * hidden]
                for j in range(hidden):
                    ga[j] = scalar.tanh_f(xa[j] + za[j])
                xa, za, ga = x[3 * hidden:], zr[3 * hidden:], g[3 * hidden:]
                for j in range(hidden):
                    ga[j] = scalar.sigmoid_f(xa[j] + za[j])
                gi, gf, gg, go = g[:hidden], g[hidden:2 * hidden], g[2 * hidden:3 * hidden], \
                    g[3 * hidden:]
                c = cs[t, b]
                if t == 0:
                    for j in range(hidden):
                        c[j] = gi[j] * gg[j]
                else:
                    c_prev = cs[t - 1, b]
                    for j in range(hidden):
                        c[j] = gf[j] * c_prev[j] + gi[j] * gg[j]
                tc = tcs[t, b]
                h = hs[t, b]
                for j in range(hidden):
                    v = scalar.tanh_f(c[j])
                    tc[j] = v
                    h[j] = go[j] * v


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
def _lstm_backward_range(dhs, gates, cs, tcs, w_hh_t, dz, p0, p1):
    """Backward through time of the LSTM cell for batch pieces p0..p1."""
    steps, batch, hidden = cs.shape
    dh_all = np.empty((min(_PIECE, batch), hidden), dtype=cs.dtype)
    dc_all = np.empty((min(_PIECE, batch), hidden), dtype=cs.dtype)
    zero_row = np.zeros(hidden, dtype=cs.dtype)            # c_{-1}
    for piece in range(p0, p1):
        b0 = piece * _PIECE
        b1 = min(b0 + _PIECE, batch)
        dh_carry = dh_all[:b1 - b0]      # dL/dh_t and dL/dc_t arriving from step t + 1
        dc_carry = dc_all[:b1 - b0]
        for b in range(b1 - b0):
            dhc = dh_carry[b]
            dcc = dc_carry[b]
            for j in range(hidden):
                dhc[j] = 0.0
                dcc[j] = 0.0
        for t in range(steps - 1, -1, -1):
            for row in range(b0, b1):
                b = row - b0
                g = gates[t, row]
                gi, gfr, gg, go = g[:hidden], g[hidden:2 * hidden], g[2 * hidden:3 * hidden], \
                    g[3 * hidden:]
                one = like(gi[0], 1.0)
                d = dz[t, row]
                di, df, dg, do = d[:hidden], d[hidden:2 * hidden], d[2 * hidden:3 * hidden], \
                    d[3 * hidden:]
                tc = tcs[t, row]
                dht = dhs[t, row]
                dhc = dh_carry[b]
                c_prev = cs[t - 1, row] if t > 0 else zero_row
                for j in range(hidden):
                    gf = gfr[j]
                    dh = dht[j] + dhc[j]
                    dc = dh * go[j] * (one - tc[j] * tc[j]) + dc_carry[b, j]
                    di[j] = dc * gg[j] * gi[j] * (one - gi[j])
                    df[j] = dc * c_prev[j] * gf * (one - gf)
                    dg[j] = dc * gi[j] * (one - gg[j] * gg[j])
                    do[j] = dh * tc[j] * go[j] * (one - go[j])
                    dc_carry[b, j] = dc * gf
            if t > 0:
                np.dot(dz[t, b0:b1], w_hh_t, dh_carry)


# --- launchers ---------------------------------------------------------------------------

def _pieces(batch):
    return -(-batch // _PIECE)


def rnn_forward(xw, w_hh, hs):
    """``hs[t] = tanh(xw[t] + hs[t-1] @ w_hh)`` with ``h_{-1} = 0`` (no product at t = 0).

    xw : (T, B, H) input projections with the bias added; hs : (T, B, H) output.
    """
    _rnn_forward_range(xw, w_hh, hs, 0, _pieces(xw.shape[1]))


def rnn_backward(dhs, hs, w_hh_t, dpre):
    """Backward through time: ``dpre[t] = (dhs[t] + dh_next) * (1 - hs[t]^2)``.

    dhs : (T, B, H) cotangents of the outputs; w_hh_t : (H, H) = w_hh transposed (contiguous);
    dpre : (T, B, H) output, the cotangents of the pre-activations (from which the layer forms
    every weight gradient with one GEMM each).
    """
    _rnn_backward_range(dhs, hs, w_hh_t, dpre, 0, _pieces(hs.shape[1]))


def lstm_forward(xw, w_hh, gates, cs, tcs, hs):
    """The LSTM cell over the sequence, gate order i, f, g, o; ``h_{-1} = c_{-1} = 0``.

    xw : (T, B, 4H) input projections with the bias added. Outputs, all saved for the backward:
    gates (T, B, 4H) activated gates (sigmoid i, f, o; tanh g), cs (T, B, H) cell states,
    tcs (T, B, H) tanh of the cell states, hs (T, B, H) hidden states.
    """
    _lstm_forward_range(xw, w_hh, gates, cs, tcs, hs, 0, _pieces(xw.shape[1]))


def lstm_backward(dhs, gates, cs, tcs, w_hh_t, dz):
    """Backward through time of ``lstm_forward``.

    dhs : (T, B, H) cotangents of the hidden states; w_hh_t : (4H, H) = w_hh transposed;
    dz : (T, B, 4H) output, the cotangents of the gate pre-activations.
    """
    _lstm_backward_range(dhs, gates, cs, tcs, w_hh_t, dz, 0, _pieces(gates.shape[1]))
