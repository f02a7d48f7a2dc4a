"""RNN and LSTM through time on the device: one persistent kernel per layer and direction.

The forward kernel runs every time step in one launch: a block owns tiles of (units x samples),
each thread one share of a recurrent product ``h_{t-1} . w_hh[:, col]`` summed in the model's
dtype in a fixed order, the shares and then the cell finished in shared memory; one grid-wide
barrier per step (a cooperative launch). A block's ``w_hh`` columns stay in shared memory
across steps where they fit, else come from L2. Backward is the same with ``dz_{t+1}`` and the
rows of ``w_hh``. Where a cooperative launch is impossible (:class:`Recurrence` says why), the
same kernel runs one launch per step, with the same bits. The story: docs/gpu.md.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np
from numba import cuda, float32, float64

from . import config, device
from .device import kernel
from .scalar import sigmoid_pair

_THREADS = config.REC_THREADS
_WCAP = config.REC_WEIGHT_CACHE
_NB_TYPES = {"float32": float32, "float64": float64}

_SIG_FORWARD = ("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, "
                "int64, int64, int64, int64, int64, int64, int64)")
_SIG_BACKWARD = ("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], "
                 "{t}[::1], int64, int64, int64, int64, int64, int64, int64, int64, int64, int64)")


class Recurrence:
    """How a run's recurrent layers step through time, and why.

    ``mode`` is ``"persistent"`` (one cooperative launch per layer and direction, a grid-wide
    barrier per step) or ``"per-step"`` (the same kernel launched once per time step);
    ``reason`` says why not persistent (None when persistent). ``used`` is True once a
    persistent kernel was launched (a CUDA graph recording that fails then retries per step).
    """

    def __init__(self):
        self.reason = support()
        self.mode = "persistent" if self.reason is None else "per-step"
        self.used = False

    def fall_back(self, reason):
        """Launch per step from now on, for ``reason``."""
        self.mode, self.reason = "per-step", reason


def support():
    """None where this process can launch the persistent kernels, else the reason it cannot."""
    if os.environ.get("FASTLIB_CUDA_PERSISTENT", "1") == "0":
        return "FASTLIB_CUDA_PERSISTENT=0 in the environment"
    if config.SIMULATOR:
        return None  # the simulator runs a cooperative grid of one block
    try:
        if not cuda.get_current_device().COOPERATIVE_LAUNCH:
            return "this GPU does not support cooperative launches"
    except Exception as exc:
        return f"the GPU's cooperative-launch attribute is unreadable ({type(exc).__name__}: {exc})"
    return None


def _units(gates, backward):
    """Units per tile: a forward tile holds REC_COLUMNS gate columns (an LSTM unit's four
    gates together, so the cell finishes in the block), a backward tile REC_BACK_UNITS units."""
    return config.REC_BACK_UNITS if backward else max(1, config.REC_COLUMNS // gates)


def plan(n_batch, hidden, gates, backward):
    """(units, shares, unit tiles, sample tiles) of a direction's tiles.

    A tile is ``units`` units of ``lanes = REC_THREADS // (columns * shares)`` samples, each
    product split into ``shares`` contiguous chunks of its inner axis: the fewest shares that
    give the GPU its fill of tiles without idle lanes, each chunk at least REC_MIN_SHARE long.
    """
    units = _units(gates, backward)
    cols = units if backward else gates * units
    inner = gates * hidden if backward else hidden
    n_ut = -(-hidden // units)
    shares = 1
    while True:
        lanes = _THREADS // (cols * shares)
        tiles = n_ut * -(-n_batch // lanes)
        wider = 2 * shares * cols <= _THREADS and inner // (2 * shares) >= config.REC_MIN_SHARE
        if not wider or (tiles >= device.fill_target() and lanes <= n_batch):
            break
        shares *= 2
    return units, shares, n_ut, -(-n_batch // (_THREADS // (cols * shares)))


@functools.lru_cache(maxsize=None)
def forward_kernel(dtype_name, lstm, persistent):
    """The forward kernel of one dtype and cell; ``persistent`` runs steps ``t0..t1-1`` with a
    grid-wide barrier between them (a cooperative launch), else one step per launch."""
    nbtype = _NB_TYPES[dtype_name]
    gates = 4 if lstm else 1

    def body(xw, w_hh, hs, gate_out, cs, tcs, t0, t1, n_batch, hidden, units, shares, n_ut,
             n_st, cache):
        # xw (T, B, gates*H) projections with the bias; hs, cs, tcs (T, B, H); time-major, flat
        wc = cuda.shared.array(_WCAP, nbtype)        # the block's w_hh columns, [k][column]
        part = cuda.shared.array(_THREADS, nbtype)   # each thread's share of its product
        zbuf = cuda.shared.array(_THREADS, nbtype)   # each (sample, column)'s finished product
        tid = cuda.threadIdx.x
        cols = gates * units
        lanes = _THREADS // (cols * shares)
        c = tid % cols
        p = (tid // cols) % shares
        lane = tid // (cols * shares)
        q = c // units
        chunk = (hidden + shares - 1) // shares
        k0 = p * chunk
        k1 = min(hidden, k0 + chunk)
        width = gates * hidden
        n = n_batch * hidden
        n_tiles = n_ut * n_st
        if cache:  # every tile of this block has the unit tile blockIdx % n_ut
            j0 = (cuda.blockIdx.x % n_ut) * units
            for e in range(tid, hidden * cols, _THREADS):
                cc = e % cols
                qq = cc // units
                jj = j0 + cc - qq * units
                wc[e] = w_hh[(e // cols) * width + qq * hidden + jj] if jj < hidden else 0.0
            cuda.syncthreads()
        for t in range(t0, t1):
            tile = cuda.blockIdx.x
            while tile < n_tiles:  # uniform per block: the barriers inside are safe
                st = tile // n_ut
                ut = tile - st * n_ut
                j = ut * units + c - q * units
                s = st * lanes + lane
                acc = nbtype(0.0)
                if t > 0 and lane < lanes and j < hidden and s < n_batch:
                    hb = (t - 1) * n + s * hidden
                    if cache:
                        for k in range(k0, k1):
                            acc += hs[hb + k] * wc[k * cols + c]
                    else:
                        col = q * hidden + j
                        for k in range(k0, k1):
                            acc += hs[hb + k] * w_hh[k * width + col]
                part[tid] = acc
                cuda.syncthreads()
                if p == 0 and lane < lanes:
                    z = part[tid]
                    for r in range(1, shares):
                        z += part[tid + r * cols]
                    zbuf[lane * cols + c] = z
                cuda.syncthreads()
                for e in range(tid, lanes * units, _THREADS):  # the cells: (sample, unit)
                    ll = e // units
                    jj = ut * units + e - ll * units
                    ss = st * lanes + ll
                    if jj < hidden and ss < n_batch:
                        k = ss * hidden + jj
                        zrow = ll * cols + e - ll * units
                        if lstm:
                            base = t * gates * n + ss * width + jj
                            zi = float64(xw[base]) + float64(zbuf[zrow])
                            zf = float64(xw[base + hidden]) + float64(zbuf[zrow + units])
                            zg = float64(xw[base + 2 * hidden]) + float64(zbuf[zrow + 2 * units])
                            zo = float64(xw[base + 3 * hidden]) + float64(zbuf[zrow + 3 * units])
                            ig = sigmoid_pair(zi)[0]
                            fg = sigmoid_pair(zf)[0]
                            gg = math.tanh(zg)
                            og = sigmoid_pair(zo)[0]
                            gate_out[base] = ig
                            gate_out[base + hidden] = fg
                            gate_out[base + 2 * hidden] = gg
                            gate_out[base + 3 * hidden] = og
                            cp = float64(cs[(t - 1) * n + k]) if t > 0 else 0.0
                            cs[t * n + k] = fg * cp + ig * gg
                            tc = math.tanh(float64(cs[t * n + k]))
                            tcs[t * n + k] = tc
                            hs[t * n + k] = og * float64(tcs[t * n + k])
                        else:
                            hs[t * n + k] = math.tanh(float64(xw[t * n + k])
                                                      + float64(zbuf[zrow]))
                cuda.syncthreads()
                tile += cuda.gridDim.x
            if persistent and t + 1 < t1:
                cuda.cg.this_grid().sync()   # step t's states, everywhere, before step t + 1

    name = (f"{'lstm' if lstm else 'rnn'}_forward[{dtype_name},"
            f"{'persistent' if persistent else 'step'}]")
    lazy = kernel(_SIG_FORWARD.format(t=dtype_name), name=name)(body)
    lazy.cooperative = persistent
    return lazy


@functools.lru_cache(maxsize=None)
def backward_kernel(dtype_name, lstm, persistent):
    """The backward kernel of one dtype and cell, steps ``t1-1`` down to ``t0``."""
    nbtype = _NB_TYPES[dtype_name]
    gates = 4 if lstm else 1

    def body(dhs, hs, gate_in, cs, tcs, dc, dz, w_hh, t0, t1, steps, n_batch, hidden, units,
             shares, n_ut, n_st, cache):
        # dz (T, B, gates*H) the pre-activations' cotangents; dc (B, H) the cell cotangent
        # carried from step t + 1 to step t (LSTM); dhs (T, B, H) the states' own cotangents
        wc = cuda.shared.array(_WCAP, nbtype)        # the block's w_hh rows, padded by one
        part = cuda.shared.array(_THREADS, nbtype)
        tid = cuda.threadIdx.x
        lanes = _THREADS // (units * shares)
        u = tid % units
        p = (tid // units) % shares
        lane = tid // (units * shares)
        width = gates * hidden
        chunk = (width + shares - 1) // shares
        m0 = p * chunk
        m1 = min(width, m0 + chunk)
        n = n_batch * hidden
        n_tiles = n_ut * n_st
        if cache:
            j0 = (cuda.blockIdx.x % n_ut) * units
            for e in range(tid, units * width, _THREADS):
                uu = e // width
                m = e - uu * width
                wc[uu * (width + 1) + m] = w_hh[(j0 + uu) * width + m] if j0 + uu < hidden \
                    else 0.0
            cuda.syncthreads()
        for tt in range(t1 - t0):
            t = t1 - 1 - tt
            tile = cuda.blockIdx.x
            while tile < n_tiles:
                st = tile // n_ut
                ut = tile - st * n_ut
                j = ut * units + u
                s = st * lanes + lane
                live = lane < lanes and j < hidden and s < n_batch
                acc = nbtype(0.0)
                if t < steps - 1 and live:
                    db = (t + 1) * gates * n + s * width
                    if cache:
                        wb = u * (width + 1)
                        for m in range(m0, m1):
                            acc += dz[db + m] * wc[wb + m]
                    else:
                        for m in range(m0, m1):
                            acc += dz[db + m] * w_hh[j * width + m]
                part[tid] = acc
                cuda.syncthreads()
                if p == 0 and live:
                    total = part[tid]
                    for r in range(1, shares):
                        total += part[tid + r * units]
                    k = s * hidden + j
                    g = float64(dhs[t * n + k]) + float64(total)
                    if lstm:
                        base = t * gates * n + s * width + j
                        ig = float64(gate_in[base])
                        fg = float64(gate_in[base + hidden])
                        gg = float64(gate_in[base + 2 * hidden])
                        og = float64(gate_in[base + 3 * hidden])
                        tc = float64(tcs[t * n + k])
                        carried = float64(dc[k]) if t < steps - 1 else 0.0
                        dcv = carried + g * og * (1.0 - tc * tc)
                        cp = float64(cs[(t - 1) * n + k]) if t > 0 else 0.0
                        dz[base] = dcv * gg * ig * (1.0 - ig)
                        dz[base + hidden] = dcv * cp * fg * (1.0 - fg)
                        dz[base + 2 * hidden] = dcv * ig * (1.0 - gg * gg)
                        dz[base + 3 * hidden] = g * tc * og * (1.0 - og)
                        dc[k] = dcv * fg
                    else:
                        y = float64(hs[t * n + k])
                        dz[t * n + k] = g * (1.0 - y * y)
                cuda.syncthreads()
                tile += cuda.gridDim.x
            if persistent and t > t0:
                cuda.cg.this_grid().sync()

    name = (f"{'lstm' if lstm else 'rnn'}_backward[{dtype_name},"
            f"{'persistent' if persistent else 'step'}]")
    lazy = kernel(_SIG_BACKWARD.format(t=dtype_name), name=name)(body)
    lazy.cooperative = persistent
    return lazy


def geometry(n_batch, hidden, gates, backward, most):
    """(grid, units, shares, unit tiles, sample tiles, cache) of a persistent launch that may
    have ``most`` co-resident blocks: a grid that is a multiple of the unit tiles where it
    cannot hold every tile (so each block's tiles share one unit tile), and ``cache`` 1 when
    that tile's weights fit the shared-memory cache."""
    units, shares, n_ut, n_st = plan(n_batch, hidden, gates, backward)
    n_tiles = n_ut * n_st
    grid = n_tiles if n_tiles <= most else (most // n_ut * n_ut or most)
    need = units * (gates * hidden + 1) if backward else hidden * gates * units
    cache = int((n_tiles <= grid or grid % n_ut == 0) and need <= _WCAP)
    return grid, units, shares, n_ut, n_st, cache


def _launch(make, args, n_batch, hidden, gates, backward, steps, recurrence, sizes):
    """Run ``steps`` steps of one direction: one cooperative launch, or one launch per step."""
    if recurrence.mode == "persistent":
        kern = make(True)
        most = kern.cooperative_blocks(kern.key(args), _THREADS)
        if most >= 1:
            grid, *shape = geometry(n_batch, hidden, gates, backward, most)
            recurrence.used = True
            kern[grid, _THREADS](*args, 0, steps, *sizes, *shape)
            return
        recurrence.fall_back(f"a persistent recurrent kernel does not fit on one "
                             f"multiprocessor ({most} co-resident blocks)")
    kern = make(False)
    shape = plan(n_batch, hidden, gates, backward)
    grid = max(1, min(config.MAX_GRID, shape[2] * shape[3]))
    order = range(steps - 1, -1, -1) if backward else range(steps)
    for t in order:  # the weights come from L2: a per-step block would load them every step
        kern[grid, _THREADS](*args, t, t + 1, *sizes, *shape, 0)


def forward(lstm, xw, w_hh, hs, gate_out, cs, tcs, steps, n_batch, hidden, recurrence):
    """The states of every step (and, for an LSTM, its gates, cells and their tanh).

    ``xw`` (steps, n_batch, gates * hidden) holds the input projections with the bias, ``hs``
    (steps, n_batch, hidden) receives the states; time-major flat device arrays. One launch,
    or ``steps`` in per-step mode (``recurrence``).
    """
    name = np.dtype(xw.dtype).name
    gates = 4 if lstm else 1
    _launch(lambda persistent: forward_kernel(name, lstm, persistent),
            (xw, w_hh, hs, gate_out, cs, tcs), n_batch, hidden, gates, False, steps,
            recurrence, (n_batch, hidden))


def backward(lstm, dhs, hs, gate_in, cs, tcs, dc, dz, w_hh, steps, n_batch, hidden, recurrence):
    """The pre-activations' cotangents ``dz`` of every step, from the states' ``dhs``.

    ``dc`` (n_batch, hidden) is the LSTM's carried cell cotangent (scratch, written before it
    is read). One launch, or ``steps`` in per-step mode.
    """
    name = np.dtype(dhs.dtype).name
    gates = 4 if lstm else 1
    _launch(lambda persistent: backward_kernel(name, lstm, persistent),
            (dhs, hs, gate_in, cs, tcs, dc, dz, w_hh), n_batch, hidden, gates, True, steps,
            recurrence, (steps, n_batch, hidden))
