"""RNN and LSTM cells over one piece of a batch, on caller-owned buffers (no allocation).

The long story: docs/fastlib.md, section ``fastlib/kernels/recurrent_pieces.py``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from fastlib.config import FASTMATH
from fastlib.kernels import scalar
from fastlib.kernels.vecmath import like

_FASTMATH = set(FASTMATH)

# NOTE: the most sequences a piece of the compiled recurrent schedule holds when the machine
# chooses the plan (fastlib.training.piece_plan), and the sub-piece of the attention
# program's recurrent rows. Eight rows suit OpenBLAS's small-matrix kernel for the per-step
# product (measured for the layers' kernels: 8 x 128 @ 128 x 512, one thread, 3.0-3.3 ms over
# 63 steps in pieces of 8, 4.0 ms as one 32-row product, 6.4-6.7 ms in pieces of 16). The
# piece plan, not the threads, fixes every summation order of the compiled paths.
PIECE = 8


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
def rnn_forward(hs, w_hh, z, steps, nb):
    """``hs[t] = tanh(hs[t] + hs[t-1] @ w_hh)`` in place; ``hs`` holds the projections.

    hs : (steps * nb, H) input projections with the bias added, overwritten by the states;
    z : (>= nb, H) scratch.
    """
    hidden = hs.shape[1]
    zp = z[:nb]
    for t in range(steps):
        if t > 0:
            np.dot(hs[(t - 1) * nb:t * nb], w_hh, zp)
        for b in range(nb):
            h = hs[t * nb + b]
            if t == 0:
                for j in range(hidden):
                    h[j] = scalar.tanh_f(h[j])
            else:
                zr = zp[b]
                for j in range(hidden):
                    h[j] = scalar.tanh_f(h[j] + zr[j])


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
def rnn_backward(gout, seq, hs, w_hh, dpre, carry, steps, nb):
    """Backward through time: ``dpre[t] = (dh_t + carry) * (1 - hs[t]^2)``.

    gout : the output cotangent, (steps * nb, H) when ``seq`` (every state is an output), else
    (nb, H) for the last state only; carry : (>= nb, H) scratch; dpre : (steps * nb, H) out.
    """
    hidden = hs.shape[1]
    cr_all = carry[:nb]
    for b in range(nb):
        cr = cr_all[b]
        for j in range(hidden):
            cr[j] = 0.0
    for t in range(steps - 1, -1, -1):
        for b in range(nb):
            r = t * nb + b
            h = hs[r]
            cr = cr_all[b]
            out = dpre[r]
            if seq or t == steps - 1:
                dh = gout[r] if seq else gout[b]
                for j in range(hidden):
                    out[j] = (dh[j] + cr[j]) * (like(h[j], 1.0) - h[j] * h[j])
            else:
                for j in range(hidden):
                    out[j] = cr[j] * (like(h[j], 1.0) - h[j] * h[j])
        if t > 0:
            np.dot(dpre[t * nb:(t + 1) * nb], w_hh.T, cr_all)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
def lstm_forward(gates, w_hh, cs, tcs, hs, z, steps, nb):
    """The LSTM cell over one piece, gate order i, f, g, o; ``h_{-1} = c_{-1} = 0``.

    gates : (steps * nb, 4H) input projections with the bias added, activated in place
    (sigmoid i, f, o; tanh g); cs, tcs, hs : (steps * nb, H) cell states, their tanh and the
    hidden states; z : (>= nb, 4H) scratch.
    """
    hidden = cs.shape[1]
    zp = z[:nb]
    for t in range(steps):
        if t > 0:
            np.dot(hs[(t - 1) * nb:t * nb], w_hh, zp)
        for b in range(nb):
            r = t * nb + b
            g = gates[r]
            if t > 0:
                zr = zp[b]
                ga, za = g[:2 * hidden], zr[:2 * hidden]
                for j in range(2 * hidden):
                    ga[j] = scalar.sigmoid_f(ga[j] + za[j])
                ga, za = g[2 * hidden:3 * hidden], zr[2 * hidden:3 * hidden]
                for j in range(hidden):
                    ga[j] = scalar.tanh_f(ga[j] + za[j])
                ga, za = g[3 * hidden:], zr[3 * hidden:]
                for j in range(hidden):
                    ga[j] = scalar.sigmoid_f(ga[j] + za[j])
            else:                                  # h_{-1} = 0: no recurrent term
                ga = g[:2 * hidden]
                for j in range(2 * hidden):
                    ga[j] = scalar.sigmoid_f(ga[j])
                ga = g[2 * hidden:3 * hidden]
                for j in range(hidden):
                    ga[j] = scalar.tanh_f(ga[j])
                ga = g[3 * hidden:]
                for j in range(hidden):
                    ga[j] = scalar.sigmoid_f(ga[j])
            gi, gf, gg, go = g[:hidden], g[hidden:2 * hidden], g[2 * hidden:3 * hidden], \
                g[3 * hidden:]
            c = cs[r]
            if t == 0:
                for j in range(hidden):
                    c[j] = gi[j] * gg[j]
            else:
                c_prev = cs[r - nb]
                for j in range(hidden):
                    c[j] = gf[j] * c_prev[j] + gi[j] * gg[j]
            tc = tcs[r]
            h = hs[r]
            for j in range(hidden):
                v = scalar.tanh_f(c[j])
                tc[j] = v
                h[j] = go[j] * v


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
def lstm_backward(gout, seq, gates, cs, tcs, w_hh, dz, dh_carry, dc_carry, steps, nb):
    """Backward through time of :func:`lstm_forward` for one piece.

    gout : (steps * nb, H) when ``seq``, else (nb, H) (the last state's cotangent only);
    dz : (steps * nb, 4H) out, the cotangents of the gate pre-activations; dh_carry,
    dc_carry : (>= nb, H) scratch.
    """
    hidden = cs.shape[1]
    dhc_all = dh_carry[:nb]
    dcc_all = dc_carry[:nb]
    for b in range(nb):
        dhc = dhc_all[b]
        dcc = dcc_all[b]
        for j in range(hidden):
            dhc[j] = 0.0
            dcc[j] = 0.0
    for t in range(steps - 1, -1, -1):
        for b in range(nb):
            r = t * nb + b
            g = gates[r]
            gi, gfr, gg, go = g[:hidden], g[hidden:2 * hidden], g[2 * hidden:3 * hidden], \
                g[3 * hidden:]
            one = like(gi[0], 1.0)
            d = dz[r]
            di, df, dg, do = d[:hidden], d[hidden:2 * hidden], d[2 * hidden:3 * hidden], \
                d[3 * hidden:]
            tc = tcs[r]
            dhc = dhc_all[b]
            dcc = dcc_all[b]
            has_out = seq or t == steps - 1
            dht = gout[r] if seq else gout[b]
            if t > 0:
                c_prev = cs[r - nb]
                for j in range(hidden):
                    gf = gfr[j]
                    dh = dht[j] + dhc[j] if has_out else dhc[j]
                    dc = dh * go[j] * (one - tc[j] * tc[j]) + dcc[j]
                    di[j] = dc * gg[j] * gi[j] * (one - gi[j])
                    df[j] = dc * c_prev[j] * gf * (one - gf)
                    dg[j] = dc * gi[j] * (one - gg[j] * gg[j])
                    do[j] = dh * tc[j] * go[j] * (one - go[j])
                    dcc[j] = dc * gf
            else:                                  # c_{-1} = 0: no forget-gate gradient
                for j in range(hidden):
                    gf = gfr[j]
                    dh = dht[j] + dhc[j] if has_out else dhc[j]
                    dc = dh * go[j] * (one - tc[j] * tc[j]) + dcc[j]
                    di[j] = dc * gg[j] * gi[j] * (one - gi[j])
                    df[j] = dc * 0.0 * gf * (one - gf)
                    dg[j] = dc * gi[j] * (one - gg[j] * gg[j])
                    do[j] = dh * tc[j] * go[j] * (one - go[j])
                    dcc[j] = dc * gf
        if t > 0:
            np.dot(dz[t * nb:(t + 1) * nb], w_hh.T, dhc_all)
