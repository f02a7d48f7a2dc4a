"""Matrix products on the device: one register-blocked GEMM, 2-D and batched, with pluggable
operand loads and epilogues, and ``matmul``'s forward and VJP.

A block computes a ``GEMM_BM x GEMM_BN`` block of C, each thread 4 x 4 sums in registers; A and
B come through shared memory along whichever axis is contiguous (coalesced, transposed or not).
An output with too few blocks for the GPU has its inner axis split: each block stores its
chunk's float64 partial and the last block to finish a tile (an arrival count) adds them in
chunk order, so the bits do not depend on timing and the product stays one launch.
The long story: docs/gpu.md, "Kernels and their parallelism".
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, float64

from . import config, device
from .device import device_function_here, kernel
from . import reduce as _reduce

_BM, _BN, _BK = config.GEMM_BM, config.GEMM_BN, config.GEMM_BK
_TX, _TY = config.GEMM_TX, config.GEMM_TY
_TM, _TN = _BM // _TY, _BN // _TX
_THREADS = _TX * _TY
_BM_PAD, _BN_PAD = _BM + 1, _BN + 1   # shared rows padded by one (a literal shape)
_NB_TYPES = {"float32": float32, "float64": float64}
last_to_arrive = device_function_here(_reduce.last_to_arrive, globals())

_SIG_GEMM = ("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], "
             "{t}[::1], float64[::1], int64[::1], int64, int64, int64, int64, int64, int64, "
             "int64, int64, int64, int64, float64, int64, int64)")


@cuda.jit(device=True)
def store_plain(c, out, bias, index, col, acc, param):
    """Plain GEMM epilogue: C = acc."""
    c[index] = acc


@cuda.jit(device=True)
def load_plain(x, aux, i, param):
    """Plain operand load: ``x[i]``."""
    return x[i]


if _BM != _BN:
    raise ImportError("fastlib.cuda.config: GEMM_BM and GEMM_BN must be equal (the A and B "
                      "tiles are staged by one function)")


@functools.lru_cache(maxsize=None)
def _stager(load):
    """Device function staging one operand's ``GEMM_BK``-deep slice into a shared tile.

    ``tile[kk, o] = load(x, aux, base + (outer0 + o) * s_outer + (p0 + kk) * s_inner)`` for
    the tile's ``GEMM_BM`` outer indices (rows of A, columns of B) and ``GEMM_BK`` inner ones,
    zero past ``n_outer`` or ``k1``; each thread loads (BM * BK) / THREADS elements, and
    neighbouring threads neighbouring addresses: along the outer axis when ``outer_fast``
    (it is the contiguous one), else along the inner axis.
    """
    @cuda.jit(device=True)
    def stage(tile, x, aux, base, s_outer, s_inner, outer0, n_outer, p0, k1, outer_fast, param,
              tid):
        for e in range(tid, _BM * _BK, _THREADS):
            if outer_fast:
                o = e % _BM
                kk = e // _BM
            else:
                kk = e % _BK
                o = e // _BK
            outer = outer0 + o
            p = p0 + kk
            if outer < n_outer and p < k1:
                tile[kk, o] = load(x, aux, base + outer * s_outer + p * s_inner, param)
            else:
                tile[kk, o] = 0.0
    return stage


def _name(fn):
    """A device function's Python name (numba's dispatchers keep it on ``py_func``)."""
    return getattr(getattr(fn, "py_func", fn), "__name__", "epilogue")


@functools.lru_cache(maxsize=None)
def gemm_kernel(dtype_name, epilogue=store_plain, load_a=load_plain, load_b=load_plain):
    """The GEMM kernel for one dtype, epilogue and pair of operand loads.

    ``epilogue(c, out, bias, index, col, acc, param)`` stores the finished dot product ``acc``
    of element ``index`` (column ``col``): :func:`store_plain` for matmul, a bias +
    activation store for Dense (:mod:`.dense`). ``load_a(a, aux_a, i, param)`` (and
    ``load_b``) reads an operand's element ``i``: plain, or Dense's ``g * f'(pre)`` formed on
    the fly (:mod:`.dense_grad`). With ``colsum`` the launch also writes ``colsum_out[j] =
    sum_r B[r, j]`` (float64 in order, rounded once): a Dense bias gradient beside its weight
    gradient. The shared tiles need a fixed element type, hence one kernel per dtype.
    """
    nbtype = _NB_TYPES[dtype_name]
    stage_a, stage_b = _stager(load_a), _stager(load_b)

    def gemm(a, aux_a, b, aux_b, c, out, bias, colsum_out, work, arrivals, batch, m, n, k,
             sa_z, sa_r, sa_c, sb_z, sb_r, sb_c, param, splits, colsum):
        # NOTE: every loop that holds a barrier is uniform per block (its bounds depend on
        # block indices and arguments only), so the barriers are safe
        tile_a = cuda.shared.array((_BK, _BM_PAD), nbtype)     # A^T slice: [k][m]
        tile_b = cuda.shared.array((_BK, _BN_PAD), nbtype)     # B slice: [k][n]
        last = cuda.shared.array(1, float64)
        acc = cuda.local.array((_TM, _TN), nbtype)
        col_acc = cuda.local.array(_TN, float64)
        a_reg = cuda.local.array(_TM, nbtype)
        b_reg = cuda.local.array(_TN, nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * _TX + tx
        tiles_m = (m + _BM - 1) // _BM
        tiles_n = (n + _BN - 1) // _BN
        chunk = ((k + splits - 1) // splits + _BK - 1) // _BK * _BK
        a_m_fast = sa_r == 1 and sa_c != 1       # A's rows are contiguous: read along m
        b_k_fast = sb_r == 1 and sb_c != 1       # B's columns are contiguous: read along k
        zs = cuda.blockIdx.z
        while zs < batch * splits:
            z = zs // splits
            s = zs - z * splits
            k0 = s * chunk
            k1 = min(k, k0 + chunk)
            tr = cuda.blockIdx.y
            while tr < tiles_m:
                tc = cuda.blockIdx.x
                while tc < tiles_n:
                    r0 = tr * _BM
                    c0 = tc * _BN
                    for i in range(_TM):
                        for j in range(_TN):
                            acc[i, j] = 0.0
                    for j in range(_TN):
                        col_acc[j] = 0.0
                    for p0 in range(k0, k1, _BK):
                        # A^T and B staged (rows of A and columns of B as the tiles' columns)
                        stage_a(tile_a, a, aux_a, z * sa_z, sa_r, sa_c, r0, m, p0, k1,
                                a_m_fast, param, tid)
                        stage_b(tile_b, b, aux_b, z * sb_z, sb_c, sb_r, c0, n, p0, k1,
                                not b_k_fast, param, tid)
                        cuda.syncthreads()
                        for kk in range(_BK):
                            for i in range(_TM):
                                a_reg[i] = tile_a[kk, ty + _TY * i]
                            for j in range(_TN):
                                b_reg[j] = tile_b[kk, tx + _TX * j]
                            for i in range(_TM):
                                for j in range(_TN):
                                    acc[i, j] += a_reg[i] * b_reg[j]
                        if colsum and tr == 0 and ty == 0:
                            for kk in range(_BK):
                                for j in range(_TN):
                                    col_acc[j] += float64(tile_b[kk, tx + _TX * j])
                        cuda.syncthreads()
                    finish = True
                    if splits > 1:
                        # this chunk's partials; the last block of the tile adds them below
                        base = (z * splits + s) * m * n
                        for i in range(_TM):
                            row = r0 + ty + _TY * i
                            for j in range(_TN):
                                col = c0 + tx + _TX * j
                                if row < m and col < n:
                                    work[base + row * n + col] = float64(acc[i, j])
                        if colsum and tr == 0 and ty == 0:
                            cbase = batch * splits * m * n + s * n
                            for j in range(_TN):
                                col = c0 + tx + _TX * j
                                if col < n:
                                    work[cbase + col] = col_acc[j]
                        finish = last_to_arrive(arrivals, (z * tiles_m + tr) * tiles_n + tc,
                                                splits, last)
                        if finish:
                            for i in range(_TM):
                                row = r0 + ty + _TY * i
                                for j in range(_TN):
                                    col = c0 + tx + _TX * j
                                    if row < m and col < n:
                                        total = 0.0
                                        for q in range(splits):
                                            total += work[(z * splits + q) * m * n
                                                          + row * n + col]
                                        acc[i, j] = total   # the dtype's value, rounded once
                            if colsum and tr == 0 and ty == 0:
                                cbase = batch * splits * m * n
                                for j in range(_TN):
                                    col = c0 + tx + _TX * j
                                    if col < n:
                                        total = 0.0
                                        for q in range(splits):
                                            total += work[cbase + q * n + col]
                                        col_acc[j] = total
                    if finish:  # one epilogue for both paths (it is inlined 16 times)
                        for i in range(_TM):
                            row = r0 + ty + _TY * i
                            for j in range(_TN):
                                col = c0 + tx + _TX * j
                                if row < m and col < n:
                                    epilogue(c, out, bias, (z * m + row) * n + col, col,
                                             acc[i, j], param)
                        if colsum and tr == 0 and ty == 0:
                            for j in range(_TN):
                                col = c0 + tx + _TX * j
                                if col < n:
                                    colsum_out[col] = col_acc[j]
                    if splits > 1:
                        cuda.syncthreads()  # `last` is read by every thread before its reuse
                    tc += cuda.gridDim.x
                tr += cuda.gridDim.y
            zs += cuda.gridDim.z

    name = f"gemm[{dtype_name},{_name(epilogue)},{_name(load_a)},{_name(load_b)}]"
    return kernel(_SIG_GEMM.format(t=dtype_name), name=name)(gemm)


def split_count(m, n, k, batch):
    """How many chunks the inner axis is cut into: enough blocks to fill the GPU, each chunk
    at least ``MIN_SPLIT_SLICES`` slices deep (1: no split)."""
    tiles = -(-m // _BM) * -(-n // _BN) * batch
    target = device.fill_target()
    if tiles >= target:
        return 1
    deepest = max(1, k // (_BK * config.MIN_SPLIT_SLICES))
    return int(max(1, min(-(-target // tiles), deepest)))


def gemm_grid(m, n, batch, splits):
    """(x, y, z) blocks of a GEMM launch (grid-stride past ``config.MAX_GRID``)."""
    return (max(1, min(config.MAX_GRID, -(-n // _BN))),
            max(1, min(config.MAX_GRID, -(-m // _BM))),
            max(1, min(config.MAX_GRID, batch * splits)))


GEMM_BLOCK = (_TX, _TY)


def gemm_device(d_a, a_strides, d_b, b_strides, batch, m, n, k, dtype, epilogue=store_plain,
                d_out=None, d_bias=None, param=0.0, d_c=None, load_a=load_plain,
                load_b=load_plain, aux_a=None, aux_b=None, d_colsum=None):
    """``C[z] = A[z] @ B[z]`` for z < batch; a flat C-contiguous (batch, m, n) device array
    (``d_c`` when given, e.g. a view of a training run's flat gradient buffer; else a new one).

    ``a_strides`` / ``b_strides`` are (batch, row, column) element strides of the operands.
    With an ``epilogue`` other than :func:`store_plain`, ``d_out`` and ``d_bias`` are passed
    to it (Dense: C holds the pre-activation, ``d_out`` the activation). ``load_a`` /
    ``load_b`` read the operands (with ``aux_a`` / ``aux_b``); ``d_colsum`` (float dtype,
    length n) receives B's column sums (batch 1). One launch, nothing allocated in a steady
    training step (the split's partials come from the step's arena).
    """
    if d_c is None:
        d_c = device.empty(batch * m * n, dtype)
    d_out = d_c if d_out is None else d_out
    d_bias = d_c if d_bias is None else d_bias
    splits = split_count(m, n, k, batch)
    colsum = d_colsum is not None
    if splits > 1:
        work = device.empty(batch * splits * m * n + (splits * n if colsum else 0), np.float64)
        arrivals = device.arrival_counters(batch * -(-m // _BM) * -(-n // _BN))
    else:
        work, arrivals = _EMPTY_WORK(), device.arrival_counters(1)
    gemm_kernel(np.dtype(dtype).name, epilogue, load_a, load_b)[
        gemm_grid(m, n, batch, splits), GEMM_BLOCK](
        d_a, d_a if aux_a is None else aux_a, d_b, d_b if aux_b is None else aux_b, d_c, d_out,
        d_bias, d_c if d_colsum is None else d_colsum, work, arrivals, batch, m, n, k,
        *[int(s) for s in a_strides], *[int(s) for s in b_strides], float(param), splits,
        int(colsum))
    return d_c


_NO_WORK = []


def _EMPTY_WORK():
    """A length-0 float64 device array (the unsplit launch's unused partials), made once."""
    if not _NO_WORK:
        _NO_WORK.append(device._allocate(0, np.float64))
    return _NO_WORK[0]


def _layout(a_shape, b_shape):
    """(batch, m, k, n, b_shared) of ``a @ b`` for validated shapes."""
    m, k = a_shape[-2:]
    n = b_shape[-1]
    batch = int(np.prod(a_shape[:-2], dtype=np.int64))
    return batch, m, k, n, len(b_shape) == 2


def matmul_forward(a, b):
    """``a @ b``: 2-D, batched with equal batch shapes, or batched ``a`` with a shared 2-D ``b``."""
    batch, m, k, n, shared = _layout(a.shape, b.shape)
    d_c = gemm_device(device.put(a), (m * k, k, 1), device.put(b),
                      (0 if shared else k * n, n, 1), batch, m, n, k, a.dtype)
    return device.get(d_c, a.shape[:-1] + (n,))


def matmul_vjp(a, b, grad):
    """(grad @ b^T, a^T @ grad), the second summed over the batch when ``b`` is shared."""
    batch, m, k, n, shared = _layout(a.shape, b.shape)
    d_a, d_b, d_g = device.put(a), device.put(b), device.put(grad)
    # grad of a: G (m, n) @ B^T (n, k); B^T is B read with row stride 1 and column stride n.
    d_ga = gemm_device(d_g, (m * n, n, 1), d_b, (0 if shared else k * n, 1, n),
                       batch, m, k, n, a.dtype)
    if shared:
        # sum_z A_z^T G_z = A_all^T G_all: A_all (batch*m, k) read transposed, one product.
        d_gb = gemm_device(d_a, (0, 1, k), d_g, (0, n, 1), 1, k, n, batch * m, a.dtype)
    else:
        d_gb = gemm_device(d_a, (m * k, 1, k), d_g, (m * n, n, 1), batch, k, n, m, a.dtype)
    return device.get(d_ga, a.shape), device.get(d_gb, b.shape)
