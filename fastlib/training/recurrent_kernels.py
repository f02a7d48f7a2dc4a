"""Numba kernels of the program's recurrent schedule (:mod:`fastlib.training.recurrent_schedule`).

The long story: docs/fastlib.md, section ``fastlib/training/recurrent_kernels.py``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from fastlib.kernels import optim as kopt
from fastlib.kernels import recurrent_pieces as cells
from fastlib.training import fused_kernels as fk
from fastlib.training import skeleton as sk

# layer kinds
EMBEDDING, RNN, LSTM, DENSE = range(4)

# columns of the per-layer int64 table ``meta``
(KIND, DIN, DOUT, ACT, SEQ_IN, SEQ_OUT, W_OFF, W2_OFF, B_OFF, O_OUT, O_PRE, O_HS, O_C, O_TC,
 O_GOUT, O_DZ, N_META) = range(17)
# DIN: input width (an Embedding's table rows); SEQ_IN / SEQ_OUT: 1 when the layer's input /
# output has a time axis (its rows are steps * nb, else nb); W_OFF: Dense weight, recurrent
# w_ih, Embedding table; W2_OFF: w_hh; B_OFF: bias. O_OUT: the output; O_PRE: Dense
# pre-activations, LSTM gates, RNN states; O_HS: recurrent states (an RNN's are O_PRE, and
# with return_sequences they are the output); O_C, O_TC: LSTM cell states and their tanh;
# O_GOUT: the output's cotangent (a Dense layer's pre-activation cotangent, in place);
# O_DZ: a recurrent layer's pre-activation cotangents.

# offsets of the shared scratch in ``scratch``: layer 0's gathered input, the recurrence's
# product, the backward carries
S_IN, S_Z, S_DH, S_DC, N_SCRATCH = range(5)

# NOTE: parameter entries per block of the gradient sum and update. Fixed (a property of the
# results: the sums of squares add per block), large enough that a block costs far more than
# its share of a parallel region's start.
BLOCK = 1 << 14


@njit(inline="always")
def _view(row, off, rows, cols):
    return row[off:off + rows * cols].reshape((rows, cols))


# ---------------------------------------------------------------------------------------------
# one piece: forward, loss, backward

@njit(cache=True, error_model="numpy")
def _gather(x3, order, first, steps, nb, buf):
    """Layer 0's feature input of the piece whose first sample is ``order[first]``,
    time-major into ``buf``."""
    width = x3.shape[2]
    for b in range(nb):
        s = order[first + b]
        for t in range(steps):
            src = x3[s, t]
            dst = buf[t * nb + b]
            for k in range(width):
                dst[k] = src[k]


@njit(cache=True, error_model="numpy")
def _forward(meta, scratch, layer, steps, nb, first, order, idx, slope, w, row):
    """Layer ``layer`` of one piece, forward, from the previous layer's output in ``row``."""
    kind = meta[layer, KIND]
    din, dout = meta[layer, DIN], meta[layer, DOUT]
    rows_out = steps * nb if meta[layer, SEQ_OUT] else nb
    out = _view(row, meta[layer, O_OUT], rows_out, dout)
    ow, ob = meta[layer, W_OFF], meta[layer, B_OFF]
    if kind == EMBEDDING:
        table = w[ow:ow + din * dout].reshape((din, dout))
        for b in range(nb):
            s = order[first + b]
            for t in range(steps):
                src = table[idx[s, t]]
                dst = out[t * nb + b]
                for k in range(dout):
                    dst[k] = src[k]
        return
    rows_in = steps * nb if meta[layer, SEQ_IN] else nb
    inp = _view(row, scratch[S_IN] if layer == 0 else meta[layer - 1, O_OUT], rows_in, din)
    if kind == DENSE:
        pre = _view(row, meta[layer, O_PRE], rows_in, dout)
        np.dot(inp, w[ow:ow + din * dout].reshape((din, dout)), pre)
        bias = w[ob:ob + dout]
        code = meta[layer, ACT]
        for i in range(rows_in):
            p = pre[i]
            o = out[i]
            for j in range(dout):
                z = p[j] + bias[j]
                p[j] = z
                o[j] = fk._act(z, code, slope) if code != fk._LINEAR else z
        return
    hidden = dout
    width = hidden * (4 if kind == LSTM else 1)
    pre = _view(row, meta[layer, O_PRE], steps * nb, width)
    np.dot(inp, w[ow:ow + din * width].reshape((din, width)), pre)
    bias = w[ob:ob + width]
    for i in range(steps * nb):
        p = pre[i]
        for j in range(width):
            p[j] += bias[j]
    o2 = meta[layer, W2_OFF]
    w_hh = w[o2:o2 + hidden * width].reshape((hidden, width))
    z = _view(row, scratch[S_Z], nb, width)
    hs = _view(row, meta[layer, O_HS], steps * nb, hidden)
    if kind == RNN:
        cells.rnn_forward(pre, w_hh, z, steps, nb)
    else:
        cells.lstm_forward(pre, w_hh, _view(row, meta[layer, O_C], steps * nb, hidden),
                           _view(row, meta[layer, O_TC], steps * nb, hidden), hs, z, steps, nb)
    if not meta[layer, SEQ_OUT]:
        last = hs[(steps - 1) * nb:steps * nb]
        for b in range(nb):
            src = last[b]
            dst = out[b]
            for k in range(hidden):
                dst[k] = src[k]


@njit(cache=True, error_model="numpy")
def _backward(meta, scratch, layer, steps, nb, first, order, idx, slope, w, row, row64, grow):
    """Layer ``layer`` of one piece, backward: its partial parameter gradients into ``grow``
    and, above layer 0, the cotangent of its input (the previous layer's output)."""
    kind = meta[layer, KIND]
    din, dout = meta[layer, DIN], meta[layer, DOUT]
    rows_out = steps * nb if meta[layer, SEQ_OUT] else nb
    g = _view(row, meta[layer, O_GOUT], rows_out, dout)
    ow, ob = meta[layer, W_OFF], meta[layer, B_OFF]
    if kind == EMBEDDING:
        acc = _view(row64, 0, din, dout)
        for i in range(din):
            a = acc[i]
            for k in range(dout):
                a[k] = 0.0
        for b in range(nb):              # the generic path's order: sample, then step
            s = order[first + b]
            for t in range(steps):
                a = acc[idx[s, t]]
                src = g[t * nb + b]
                for k in range(dout):
                    a[k] += src[k]
        dst = grow[ow:ow + din * dout]
        flat = row64[:din * dout]
        for i in range(din * dout):
            dst[i] = flat[i]
        return
    rows_in = steps * nb if meta[layer, SEQ_IN] else nb
    inp = _view(row, scratch[S_IN] if layer == 0 else meta[layer - 1, O_OUT], rows_in, din)
    if kind == DENSE:
        # NOTE: the bias sums through the piece's float64 row (no allocation per call)
        fk._backward_epilogue(g, _view(row, meta[layer, O_PRE], rows_in, dout),
                              meta[layer, ACT], slope, row64)
        gbias = grow[ob:ob + dout]
        for j in range(dout):
            gbias[j] = row64[j]
        w_mat = w[ow:ow + din * dout].reshape((din, dout))
        fk._weight_gradient(inp, g, grow[ow:ow + din * dout].reshape((din, dout)))
        if layer > 0:
            np.dot(g, w_mat.T, _view(row, meta[layer - 1, O_GOUT], rows_in, din))
        return
    hidden = dout
    width = hidden * (4 if kind == LSTM else 1)
    dz = _view(row, meta[layer, O_DZ], steps * nb, width)
    hs = _view(row, meta[layer, O_HS], steps * nb, hidden)
    o2 = meta[layer, W2_OFF]
    w_hh = w[o2:o2 + hidden * width].reshape((hidden, width))
    seq = meta[layer, SEQ_OUT] == 1
    if kind == RNN:
        cells.rnn_backward(g, seq, hs, w_hh, dz, _view(row, scratch[S_DH], nb, hidden), steps,
                           nb)
    else:
        cells.lstm_backward(g, seq, _view(row, meta[layer, O_PRE], steps * nb, width),
                            _view(row, meta[layer, O_C], steps * nb, hidden),
                            _view(row, meta[layer, O_TC], steps * nb, hidden), w_hh, dz,
                            _view(row, scratch[S_DH], nb, hidden),
                            _view(row, scratch[S_DC], nb, hidden), steps, nb)
    fk._weight_gradient(inp, dz, grow[ow:ow + din * width].reshape((din, width)))
    dw_hh = grow[o2:o2 + hidden * width].reshape((hidden, width))
    if steps > 1:
        fk._weight_gradient(hs[:(steps - 1) * nb], dz[nb:], dw_hh)
    else:
        for i in range(hidden):
            for j in range(width):
                dw_hh[i, j] = 0.0
    fk.column_sums_into(dz, grow[ob:ob + width], row64)
    if layer > 0:
        w_ih = w[ow:ow + din * width].reshape((din, width))
        np.dot(dz, w_ih.T, _view(row, meta[layer - 1, O_GOUT], rows_in, din))


@njit(cache=True, error_model="numpy")
def _piece(p, nb_total, start, steps, piece, meta, scratch, slope, loss_code, x3, idx, yi, yf,
           order, w, gp, ws, ws64, rows_buf, n_mean, totals, corrects):
    """Forward, loss terms and backward of piece ``p`` of the batch at ``start``."""
    first = start + p * piece
    nb = min(piece, nb_total - p * piece)
    row, row64, grow = ws[p], ws64[p], gp[p]
    n_layers = meta.shape[0]
    if meta[0, KIND] != EMBEDDING:
        _gather(x3, order, first, steps, nb, _view(row, scratch[S_IN], steps * nb,
                                                   meta[0, DIN]))
    for layer in range(n_layers):
        _forward(meta, scratch, layer, steps, nb, first, order, idx, slope, w, row)
    last = n_layers - 1
    seq = meta[last, SEQ_OUT] == 1
    rows_out = steps * nb if seq else nb
    c = meta[last, DOUT]
    rows = rows_buf[p, :rows_out]
    for b in range(nb):
        s = order[first + b]
        if seq:   # the targets (N, T, C) viewed as (N * T, C)
            for t in range(steps):
                rows[t * nb + b] = s * steps + t
        else:
            rows[b] = s
    totals[p], corrects[p] = fk.loss_terms(loss_code, _view(row, meta[last, O_OUT], rows_out, c),
                                           yi, yf, rows, _view(row, meta[last, O_GOUT],
                                                               rows_out, c), n_mean)
    if not math.isfinite(totals[p]):
        return                          # the epoch stops at this batch; no gradient needed
    for layer in range(last, -1, -1):
        _backward(meta, scratch, layer, steps, nb, first, order, idx, slope, w, row, row64,
                  grow)


# ---------------------------------------------------------------------------------------------
# parallel regions

@njit(cache=True, parallel=True, error_model="numpy")
def _pieces_region(threads, n_pieces, nb_total, start, steps, piece, meta, scratch, slope,
                   loss_code, x3, idx, yi, yf, order, w, gp, ws, ws64, rows_buf, n_mean, totals,
                   corrects):
    """Every piece of one batch, ``threads`` at a time (threads take whole pieces)."""
    if threads == 1:
        old = kopt.enter_ftz()
        for p in range(n_pieces):
            _piece(p, nb_total, start, steps, piece, meta, scratch, slope, loss_code, x3, idx,
                   yi, yf, order, w, gp, ws, ws64, rows_buf, n_mean, totals, corrects)
        kopt.leave_ftz(old)
        return
    for t in prange(threads):
        old = kopt.enter_ftz()  # per worker thread: the control word is thread-local
        for p in range(t, n_pieces, threads):
            _piece(p, nb_total, start, steps, piece, meta, scratch, slope, loss_code, x3, idx,
                   yi, yf, order, w, gp, ws, ws64, rows_buf, n_mean, totals, corrects)
        kopt.leave_ftz(old)


# ---------------------------------------------------------------------------------------------
# the epoch

@njit(cache=True, error_model="numpy")
def epoch(x3, idx, yi, yf, order, batch_size, steps, piece, threads, meta, scratch, slope,
          loss_code, kind, coeffs, clip_mode, clip, w, a, b, g, gp, ws, ws64, rows_buf, blk):
    """Train one epoch; returns (loss_sum, correct, skipped, updates, diverged_batch, loss).

    ``x3`` (N, T, I) features or ``idx`` (N, T) token ids (the other empty), targets ``yi``
    (class indices) or ``yf`` (N rows, or N * T rows for a per-step output); ``order`` the
    sample order. Per step: the pieces' region (forward, loss, backward, partial gradients),
    the loss (pieces' terms added in piece order), the blocks' sums, the guard, and the
    blocks' clipping and update. NaN/Inf rules as the generic path: a non-finite loss returns
    at once (the caller restores weights); a non-finite gradient skips the update.
    ``correct`` counts rows of the final output (per-step rows for a sequence output).
    """
    old_fp = kopt.enter_ftz()
    n_samples = order.shape[0]
    n_layers = meta.shape[0]
    seq_out = meta[n_layers - 1, SEQ_OUT] == 1
    c_out = meta[n_layers - 1, DOUT]
    n_blocks = blk.shape[0] - 1
    max_pieces = gp.shape[0]
    totals = np.zeros(max_pieces, np.float64)
    corrects = np.zeros(max_pieces, np.float64)
    sumsq = np.zeros(n_blocks, np.float64)
    loss_sum = 0.0
    correct_sum = 0.0
    skipped = 0
    updates = 0
    batch = 0
    for start in range(0, n_samples, batch_size):
        nb = min(batch_size, n_samples - start)
        n_pieces = -(-nb // piece)
        n_mean = nb * steps if seq_out else nb
        kopt.leave_ftz(old_fp)
        _pieces_region(min(threads, n_pieces), n_pieces, nb, start, steps, piece, meta, scratch,
                       slope, loss_code, x3, idx, yi, yf, order, w, gp, ws, ws64, rows_buf,
                       n_mean, totals, corrects)
        kopt.enter_ftz()
        total_terms = 0.0
        correct = 0.0
        for p in range(n_pieces):
            total_terms += totals[p]
            correct += corrects[p]
        if loss_code == fk.CE or loss_code == fk.CCE:
            loss = total_terms / n_mean
        else:
            loss = total_terms / (n_mean * c_out)
        if not math.isfinite(loss):
            kopt.leave_ftz(old_fp)
            return loss_sum, correct_sum, skipped, updates, batch, loss
        loss_sum += loss * nb
        correct_sum += correct
        # -- the skeleton: sum the pieces' partials, guard, clip and update
        kopt.leave_ftz(old_fp)
        applied = sk.end_step(threads, blk, n_pieces, gp, g, sumsq, kind, w, a, b,
                              coeffs[updates:updates + 1], clip_mode, clip)
        kopt.enter_ftz()
        batch += 1
        if not applied:
            skipped += 1
            continue
        updates += 1
    kopt.leave_ftz(old_fp)
    return loss_sum, correct_sum, skipped, updates, -1, 0.0
