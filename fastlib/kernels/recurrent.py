"""RNN (tanh) and LSTM (gates i, f, g, o) over sequences, forward and backward: the layers and
the compiled program's rows call these same kernels; ``h_{-1} = c_{-1} = 0``.

The input projections of every step (``x @ w_ih + b``) and the weight gradients are single
GEMMs over all rows; the cells run what must be sequential, the recurrence ``h_{t-1} @ w_hh``
(BLAS) fused with the cell's elementwise work, on groups of sequences laid out time-major
(row ``t * n + b``, ``instructions.row_index``). A row layout that is not the cells' (the
layers' ``(batch, seq)`` rows) is copied into cell groups of :data:`PIECE` sequences and back.
The long story: docs/fastlib.md, section ``fastlib/kernels/recurrent.py``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from fastlib.config import FASTMATH
from fastlib.kernels import scalar
from fastlib.kernels.blas import dot_into
from fastlib.kernels.dense import add_bias, column_sums_into, input_grad, weight_gradient
from fastlib.kernels.instructions import row_index
from fastlib.kernels.vecmath import like

_FASTMATH = set(FASTMATH)

# NOTE: the sequences of one cell group when the rows' layout is not already the cells' (the
# layers), and the most sequences a piece of a compiled program with a recurrent row holds
# when the machine chooses the plan (fastlib.training.piece_plan). A property of the per-step
# product's shape on one thread, not of the core count (with more cores than batch / PIECE
# the plan takes one piece per core, smaller): through NumPy's OpenBLAS (fastlib.kernels.blas)
# R x 128 @ 128 x 512 costs 2.97 / 2.18 / 1.86 us a row at 8 / 16 / 32 rows (its transpose
# for the cotangents 3.36 / 2.20 / 1.81); sixteen takes most of that gain while a batch of 32
# still splits into two pieces. Checked on the LSTM benchmark's epoch (two cores): 0.35 s in
# pieces of 16 against 0.39 s in pieces of 8 at batch 32. With SciPy's OpenBLAS, which lacks
# the small-matrix kernels, 8 was best. The piece plan, not the threads, fixes every
# summation order of the compiled paths.
PIECE = 16


# -- the cells: one group of nb sequences, time-major (row t * nb + b), caller-owned buffers ----

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
            dot_into(hs[(t - 1) * nb:t * nb], w_hh, zp)
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
            dot_into(dpre[t * nb:(t + 1) * nb], w_hh.T, cr_all)


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
            dot_into(hs[(t - 1) * nb:t * nb], w_hh, zp)
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
            dot_into(dz[t * nb:(t + 1) * nb], w_hh.T, dhc_all)


# -- a layer's (or a program row's) forward and backward -------------------------------------

@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def _relayout(a, b, samples, steps, g_from, g_to):
    """``b = a`` with the rows moved from the layout of groups ``g_from`` to ``g_to``."""
    width = a.shape[1]
    for s in range(samples):
        for t in range(steps):
            src = a[row_index(s, t, samples, steps, g_from)]
            dst = b[row_index(s, t, samples, steps, g_to)]
            for j in range(width):
                dst[j] = src[j]


@njit(inline="always")
def _cells(samples, group):
    """The sequences of a cell group: the rows' own groups when they are time-major
    (``group > 1``), else :data:`PIECE`."""
    return group if group > 1 else min(PIECE, samples)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def recurrent_forward(x, w_ih, w_hh, bias, gates, hs, cs, tcs, y, work, samples, steps, lstm,
                      every_state, group, sc):
    """The layer over ``samples`` sequences of ``steps`` rows of ``x`` (layout ``group``):
    ``gates = x @ w_ih + b`` then the recurrence, in cell layout, into ``gates`` (activated in
    place), ``hs`` (states; an RNN's are its ``gates``), an LSTM's ``cs`` and ``tcs`` (cells and
    their tanh); ``y`` every state (layout ``group``) or each sequence's last. ``work`` (rows x
    gates) holds the projections when ``group`` is not the cells' layout; ``sc`` holds a cell
    group's product (cells x gates)."""
    cells = _cells(samples, group)
    width, hidden = gates.shape[1], hs.shape[1]
    if cells == group:
        dot_into(x, w_ih, gates)
        add_bias(gates, bias)
    else:
        dot_into(x, w_ih, work)
        add_bias(work, bias)
        _relayout(work, gates, samples, steps, group, cells)
    z = sc[:cells * width].reshape((cells, width))
    for q0 in range(0, samples, cells):
        n = min(cells, samples - q0)
        r0, r1 = q0 * steps, (q0 + n) * steps
        if lstm:
            lstm_forward(gates[r0:r1], w_hh, cs[r0:r1], tcs[r0:r1], hs[r0:r1], z, steps, n)
        else:
            rnn_forward(gates[r0:r1], w_hh, z, steps, n)
        if not every_state:
            for b in range(n):
                src, dst = hs[r1 - n + b], y[q0 + b]
                for j in range(hidden):
                    dst[j] = src[j]
    if every_state:
        _relayout(hs, y, samples, steps, cells, group)


@njit(cache=True, error_model="numpy", fastmath=_FASTMATH)
def recurrent_backward(x, w_ih, w_hh, gates, hs, cs, tcs, g, g_cells, dz, dz_cells, gw_ih, gw_hh,
                       gb, acc, gx, mode, tmp, samples, steps, lstm, every_state, group, sc):
    """Backward through time of :func:`recurrent_forward` from the output's cotangent ``g``:
    the gates' cotangents into ``dz`` (layout ``group``), the weight gradients (``w_hh``'s
    summed over the cell groups in order), the bias gradient through the float64 ``acc`` and
    the input's cotangent by ``mode``. When ``group`` is not the cells' layout, ``g_cells``
    (every state's cotangent) and ``dz_cells`` hold the cell layout's copies (else they may
    be anything); ``tmp`` holds one hidden x gates product; ``sc`` two cells x hidden
    carries."""
    cells = _cells(samples, group)
    width, hidden = gates.shape[1], hs.shape[1]
    native = cells == group
    gc = g if native or not every_state else g_cells
    dzc = dz if native else dz_cells
    if every_state and not native:
        _relayout(g, g_cells, samples, steps, group, cells)
    dh = sc[:cells * hidden].reshape((cells, hidden))
    dc = sc[cells * hidden:2 * cells * hidden].reshape((cells, hidden))
    part = tmp[:hidden * width].reshape((hidden, width))
    for q0 in range(0, samples, cells):
        n = min(cells, samples - q0)
        r0, r1 = q0 * steps, (q0 + n) * steps
        gq = gc[r0:r1] if every_state else gc[q0:q0 + n]
        if lstm:
            lstm_backward(gq, every_state, gates[r0:r1], cs[r0:r1], tcs[r0:r1], w_hh, dzc[r0:r1],
                          dh, dc, steps, n)
        else:
            rnn_backward(gq, every_state, hs[r0:r1], w_hh, dzc[r0:r1], dh, steps, n)
        # w_hh pairs the state of step t - 1 with the cotangent of step t
        if q0 == 0:
            if steps > 1:
                weight_gradient(hs[r0:r1 - n], dzc[r0 + n:r1], gw_hh)
            else:
                gw_hh[:] = 0.0
        elif steps > 1:
            weight_gradient(hs[r0:r1 - n], dzc[r0 + n:r1], part)
            for i in range(hidden):
                gr, pr = gw_hh[i], part[i]
                for j in range(width):
                    gr[j] += pr[j]
    if not native:
        _relayout(dz_cells, dz, samples, steps, cells, group)
    weight_gradient(x, dz, gw_ih)
    column_sums_into(dz, gb, acc)
    input_grad(dz, w_ih.T, gx, mode, tmp)
