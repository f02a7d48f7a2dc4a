"""RNN and LSTM time steps on the device: one launch per time step each way, spread over the GPU.

Forward, a block owns one sample and ``REC_JT`` units: its ``REC_JT x REC_KS`` threads split
each unit's recurrent products ``h_{t-1} . w_hh[:, q H + j]`` over ``REC_KS`` interleaved
shares of the hidden index (neighbouring threads read neighbouring columns of ``w_hh``), the
shares meet in shared memory in a fixed order, and one thread per unit applies the cell.
Backward, a block owns one sample and ``REC_JB`` units, and ``REC_LANES`` threads per unit read
that unit's row of ``w_hh`` (contiguous) against ``dz_{t+1}``, reduced by a fixed tree. Sums are
float64 and the order is fixed, so the bits do not depend on timing; at the LSTM benchmark's
32 samples x 128 units a step is 128 blocks forward and 1024 backward (docs/gpu.md).
"""
from __future__ import annotations

import math

from numba import cuda, float64

from . import config
from .device import kernel, signatures
from .scalar import sigmoid_pair

_JT, _KS = config.REC_JT, config.REC_KS
_JB, _LANES = config.REC_JB, config.REC_LANES


def forward_launch(n_batch, hidden):
    """(grid, block) of a forward step."""
    return (min(config.MAX_GRID, n_batch * -(-hidden // _JT)), (_JT, _KS))


def backward_launch(n_batch, hidden):
    """(grid, block) of a backward step."""
    return (min(config.MAX_GRID, n_batch * -(-hidden // _JB)), (_LANES, _JB))


@cuda.jit(device=True)
def _strided_dot(a, a_base, b, b_base, b_stride, start, stop, step):
    """``sum a[a_base + m] b[b_base + m b_stride]`` over m = start, start + step, ... < stop,
    in float64 in that order: one thread's share of a recurrent product."""
    acc = 0.0
    m = start
    while m < stop:
        acc += float64(a[a_base + m]) * float64(b[b_base + m * b_stride])
        m += step
    return acc


@cuda.jit(device=True)
def _lane_sum(part, jy, lane, value):
    """The sum of ``value`` over the block's lanes of unit row ``jy``, by a fixed tree; every
    lane gets it. Called by every thread of the block (it holds barriers)."""
    part[jy, lane] = value
    cuda.syncthreads()
    step = _LANES // 2
    while step > 0:
        if lane < step:
            part[jy, lane] += part[jy, lane + step]
        cuda.syncthreads()
        step //= 2
    total = part[jy, 0]
    cuda.syncthreads()
    return total


def _rnn_step_body(xw, hs, w_hh, t, n_batch, hidden):
    # hs[t] = tanh(xw[t] + hs[t-1] @ w_hh), time-major (T, B, H) flat arrays
    part = cuda.shared.array((_KS, _JT), float64)
    jx = cuda.threadIdx.x
    ks = cuda.threadIdx.y
    tiles = (hidden + _JT - 1) // _JT
    n = n_batch * hidden
    blk = cuda.blockIdx.x
    while blk < n_batch * tiles:  # uniform per block: the barriers inside are safe
        r = blk // tiles
        j = (blk - r * tiles) * _JT + jx
        p = 0.0
        if t > 0 and j < hidden:
            p = _strided_dot(hs, (t - 1) * n + r * hidden, w_hh, j, hidden, ks, hidden, _KS)
        part[ks, jx] = p
        cuda.syncthreads()
        if ks == 0 and j < hidden:
            z = float64(xw[t * n + r * hidden + j])
            for s in range(_KS):
                z += part[s, jx]
            hs[t * n + r * hidden + j] = math.tanh(z)
        cuda.syncthreads()
        blk += cuda.gridDim.x


rnn_step = kernel(*signatures("void({t}[::1], {t}[::1], {t}[::1], int64, int64, int64)"))(
    _rnn_step_body)


def _rnn_step_back_body(dhs, hs, dz, w_hh, t, steps, n_batch, hidden):
    # dz[t] = (dhs[t] + dz[t+1] @ w_hh^T) * (1 - hs[t]^2)
    part = cuda.shared.array((_JB, _LANES), float64)
    lane = cuda.threadIdx.x
    jy = cuda.threadIdx.y
    tiles = (hidden + _JB - 1) // _JB
    n = n_batch * hidden
    blk = cuda.blockIdx.x
    while blk < n_batch * tiles:
        r = blk // tiles
        j = (blk - r * tiles) * _JB + jy
        p = 0.0
        if t < steps - 1 and j < hidden:
            p = _strided_dot(dz, (t + 1) * n + r * hidden, w_hh, j * hidden, 1, lane, hidden,
                              _LANES)
        total = _lane_sum(part, jy, lane, p)
        if lane == 0 and j < hidden:
            k = t * n + r * hidden + j
            y = float64(hs[k])
            dz[k] = (float64(dhs[k]) + total) * (1.0 - y * y)
        blk += cuda.gridDim.x


rnn_step_back = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64, int64)"))(
    _rnn_step_back_body)


def _lstm_step_body(xw, hs, w_hh, gates, cs, tcs, t, n_batch, hidden):
    # gates i, f, g, o of step t (H columns each of a (B, 4H) row, stored activated), the cell
    # cs[t] = f cs[t-1] + i g, tcs[t] = tanh(cs[t]), hs[t] = o tcs[t]; time-major flat arrays
    part = cuda.shared.array((_KS, 4, _JT), float64)
    jx = cuda.threadIdx.x
    ks = cuda.threadIdx.y
    tiles = (hidden + _JT - 1) // _JT
    n = n_batch * hidden
    width = 4 * hidden
    blk = cuda.blockIdx.x
    while blk < n_batch * tiles:  # uniform per block: the barriers inside are safe
        r = blk // tiles
        j = (blk - r * tiles) * _JT + jx
        prev = (t - 1) * n + r * hidden
        for q in range(4):
            p = 0.0
            if t > 0 and j < hidden:
                p = _strided_dot(hs, prev, w_hh, q * hidden + j, width, ks, hidden, _KS)
            part[ks, q, jx] = p
        cuda.syncthreads()
        if ks == 0 and j < hidden:
            k = r * hidden + j
            base = t * 4 * n + r * 4 * hidden + j
            zs = cuda.local.array(4, float64)
            for q in range(4):
                z = float64(xw[base + q * hidden])
                for s in range(_KS):
                    z += part[s, q, jx]
                zs[q] = z
            ig = sigmoid_pair(zs[0])[0]
            fg = sigmoid_pair(zs[1])[0]
            gg = math.tanh(zs[2])
            og = sigmoid_pair(zs[3])[0]
            gates[base] = ig
            gates[base + hidden] = fg
            gates[base + 2 * hidden] = gg
            gates[base + 3 * hidden] = og
            cp = float64(cs[(t - 1) * n + k]) if t > 0 else 0.0
            cs[t * n + k] = fg * cp + ig * gg
            tc = math.tanh(float64(cs[t * n + k]))
            tcs[t * n + k] = tc
            hs[t * n + k] = og * float64(tcs[t * n + k])
        cuda.syncthreads()
        blk += cuda.gridDim.x


lstm_step = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64)"))(
    _lstm_step_body)


def _lstm_step_back_body(dhs, gates, cs, tcs, dc, dz, w_hh, t, steps, n_batch, hidden):
    # dz[t] of the four gates from dh = dhs[t] + dz[t+1] @ w_hh^T; dc carries the cell
    # cotangent from step t+1 in and to step t-1 out (in place, zero before the last step)
    part = cuda.shared.array((_JB, _LANES), float64)
    lane = cuda.threadIdx.x
    jy = cuda.threadIdx.y
    tiles = (hidden + _JB - 1) // _JB
    n = n_batch * hidden
    width = 4 * hidden
    blk = cuda.blockIdx.x
    while blk < n_batch * tiles:
        r = blk // tiles
        j = (blk - r * tiles) * _JB + jy
        p = 0.0
        if t < steps - 1 and j < hidden:
            p = _strided_dot(dz, (t + 1) * 4 * n + r * width, w_hh, j * width, 1, lane,
                              width, _LANES)
        total = _lane_sum(part, jy, lane, p)
        if lane == 0 and j < hidden:
            k = r * hidden + j
            base = t * 4 * n + r * width + j
            g = float64(dhs[t * n + k]) + total
            ig = float64(gates[base])
            fg = float64(gates[base + hidden])
            gg = float64(gates[base + 2 * hidden])
            og = float64(gates[base + 3 * hidden])
            tc = float64(tcs[t * n + k])
            carried = float64(dc[k]) if t < steps - 1 else 0.0
            dcv = carried + g * og * (1.0 - tc * tc)
            cp = float64(cs[(t - 1) * n + k]) if t > 0 else 0.0
            dz[base] = dcv * gg * ig * (1.0 - ig)
            dz[base + hidden] = dcv * cp * fg * (1.0 - fg)
            dz[base + 2 * hidden] = dcv * ig * (1.0 - gg * gg)
            dz[base + 3 * hidden] = g * tc * og * (1.0 - og)
            dc[k] = dcv * fg
        blk += cuda.gridDim.x


lstm_step_back = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, "
    "int64, int64)"))(_lstm_step_back_body)
