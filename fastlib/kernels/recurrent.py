"""Recurrences of the RNN and LSTM layers: the sequential part only, time-major.

The input projections of every step (``x_t @ w_ih + b``) and the weight gradients are single
large GEMMs done by the layer; these kernels run what must be sequential: the recurrence
``h_{t-1} @ w_hh`` (``np.dot`` inside Numba, i.e. BLAS) fused with the cell's elementwise work,
forward and backward through time. Arrays are C-contiguous, time-major ``(T, B, ...)``, all of
one float dtype; the layers allocate them and are the only callers.

NOTE: the derivatives of the cell's sigmoid and tanh gates are taken from their saved outputs
(sigma' = sigma (1 - sigma), tanh' = 1 - tanh^2): the same values as ``scalar.sigmoid_df`` /
``scalar.tanh_df`` of the pre-activations, without recomputing an exponential per gate.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from fastlib.config import FASTMATH
from fastlib.kernels import scalar
from fastlib.kernels.vecmath import like

_FASTMATH = set(FASTMATH)  # numba takes a set (config holds a frozenset)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def rnn_forward(xw, w_hh, hs):
    """``hs[t] = tanh(xw[t] + hs[t-1] @ w_hh)`` with ``h_{-1} = 0`` (no product at t = 0).

    xw : (T, B, H) input projections with the bias added; hs : (T, B, H) output.
    """
    steps, batch, hidden = xw.shape
    z = np.empty((batch, hidden), dtype=xw.dtype)
    for t in range(steps):
        if t == 0:
            for b in range(batch):
                for j in range(hidden):
                    hs[0, b, j] = scalar.tanh_f(xw[0, b, j])
        else:
            np.dot(hs[t - 1], w_hh, z)
            for b in range(batch):
                for j in range(hidden):
                    hs[t, b, j] = scalar.tanh_f(xw[t, b, j] + z[b, j])


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def rnn_backward(dhs, hs, w_hh_t, dpre):
    """Backward through time: ``dpre[t] = (dhs[t] + dh_next) * (1 - hs[t]^2)``.

    dhs : (T, B, H) cotangents of the outputs; w_hh_t : (H, H) = w_hh transposed (contiguous);
    dpre : (T, B, H) output, the cotangents of the pre-activations (from which the layer forms
    every weight gradient with one GEMM each).
    """
    steps, batch, hidden = hs.shape
    carry = np.zeros((batch, hidden), dtype=hs.dtype)  # dL/dh_t arriving from step t + 1
    for t in range(steps - 1, -1, -1):
        for b in range(batch):
            for j in range(hidden):
                h = hs[t, b, j]
                dpre[t, b, j] = (dhs[t, b, j] + carry[b, j]) * (like(h, 1.0) - h * h)
        if t > 0:
            np.dot(dpre[t], w_hh_t, carry)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def lstm_forward(xw, w_hh, gates, cs, tcs, hs):
    """The LSTM cell over the sequence, gate order i, f, g, o; ``h_{-1} = c_{-1} = 0``.

    xw : (T, B, 4H) input projections with the bias added. Outputs, all saved for the backward:
    gates (T, B, 4H) activated gates (sigmoid i, f, o; tanh g), cs (T, B, H) cell states,
    tcs (T, B, H) tanh of the cell states, hs (T, B, H) hidden states.

    NOTE: each step is three short loops over few arrays (gates, cell, output) rather than one
    loop touching seven: LLVM vectorises these (twice as fast as the single loop here).
    """
    steps, batch, four_h = xw.shape
    hidden = four_h // 4
    z = np.zeros((batch, four_h), dtype=xw.dtype)
    for t in range(steps):
        if t > 0:
            np.dot(hs[t - 1], w_hh, z)
        g = gates[t]
        x = xw[t]
        for b in range(batch):
            for j in range(hidden):
                g[b, j] = scalar.sigmoid_f(x[b, j] + z[b, j])
            for j in range(hidden, 2 * hidden):
                g[b, j] = scalar.sigmoid_f(x[b, j] + z[b, j])
            for j in range(2 * hidden, 3 * hidden):
                g[b, j] = scalar.tanh_f(x[b, j] + z[b, j])
            for j in range(3 * hidden, four_h):
                g[b, j] = scalar.sigmoid_f(x[b, j] + z[b, j])
        c = cs[t]
        if t == 0:
            for b in range(batch):
                for j in range(hidden):
                    c[b, j] = g[b, j] * g[b, 2 * hidden + j]
        else:
            c_prev = cs[t - 1]
            for b in range(batch):
                for j in range(hidden):
                    c[b, j] = g[b, hidden + j] * c_prev[b, j] + g[b, j] * g[b, 2 * hidden + j]
        tc = tcs[t]
        h = hs[t]
        for b in range(batch):
            for j in range(hidden):
                v = scalar.tanh_f(c[b, j])
                tc[b, j] = v
                h[b, j] = g[b, 3 * hidden + j] * v


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def lstm_backward(dhs, gates, cs, tcs, w_hh_t, dz):
    """Backward through time of ``lstm_forward``.

    dhs : (T, B, H) cotangents of the hidden states; w_hh_t : (4H, H) = w_hh transposed;
    dz : (T, B, 4H) output, the cotangents of the gate pre-activations.
    """
    steps, batch, hidden = cs.shape
    dh_carry = np.zeros((batch, hidden), dtype=cs.dtype)
    dc_carry = np.zeros((batch, hidden), dtype=cs.dtype)
    for t in range(steps - 1, -1, -1):
        for b in range(batch):
            for j in range(hidden):
                gi = gates[t, b, j]
                gf = gates[t, b, hidden + j]
                gg = gates[t, b, 2 * hidden + j]
                go = gates[t, b, 3 * hidden + j]
                tc = tcs[t, b, j]
                dh = dhs[t, b, j] + dh_carry[b, j]
                dc = dh * go * (like(tc, 1.0) - tc * tc) + dc_carry[b, j]
                one = like(tc, 1.0)
                c_prev = cs[t - 1, b, j] if t > 0 else like(tc, 0.0)
                dz[t, b, j] = dc * gg * gi * (one - gi)
                dz[t, b, hidden + j] = dc * c_prev * gf * (one - gf)
                dz[t, b, 2 * hidden + j] = dc * gi * (one - gg * gg)
                dz[t, b, 3 * hidden + j] = dh * tc * go * (one - go)
                dc_carry[b, j] = dc * gf
        if t > 0:
            np.dot(dz[t], w_hh_t, dh_carry)
