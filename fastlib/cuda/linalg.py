"""Matrix products on the device: one register-blocked GEMM, 2-D and batched, with pluggable
operand loads and epilogues, and ``matmul``'s forward and VJP.

A block computes a ``GEMM_BM x GEMM_BN`` block of C, each thread 4 x 4 sums in registers; A and
B come through shared memory along whichever axis is contiguous (coalesced, transposed or not),
in 128-bit loads where aligned, double-buffered (the next slice is read while this one is
multiplied). An output with too few blocks for the GPU has its inner axis split: each block stores its
chunk's float64 partial and the last block to finish a tile (an arrival count) adds them in
chunk order, so the bits do not depend on timing and the product stays one launch.
The long story: docs/gpu.md, "Kernels and their parallelism".
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, float64

from . import config, device, vector_load
from .device import device_function_here, kernel
from . import reduce as _reduce
from .vector_load import load_vector

_BM, _BN, _BK = config.GEMM_BM, config.GEMM_BN, config.GEMM_BK
_TX, _TY = config.GEMM_TX, config.GEMM_TY
_TM, _TN = _BM // _TY, _BN // _TX
_THREADS = _TX * _TY
_BM_PAD, _BN_PAD = _BM + 1, _BN + 1   # shared rows padded by one (a literal shape)
_NB_TYPES = {"float32": float32, "float64": float64}
last_to_arrive = device_function_here(_reduce.last_to_arrive, globals())

_SIG_GEMM = ("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], "
             "{t}[::1], float64[::1], int64[::1], int64, int64, int64, int64, int64, int64, "
             "int64, int64, int64, int64, float64, int64, int64, int64, int64)")


@cuda.jit(device=True)
def store_plain(c, out, bias, index, col, acc, param):
    """Plain GEMM epilogue: C = acc."""
    c[index] = acc


@cuda.jit(device=True)
def load_plain(value, aux, param):
    """Plain operand load: the operand's element as read."""
    return value


#: Operand loads are value functions ``load(x[i], aux[i], param)``; one with ``uses_aux`` False
#: (the default) is passed zeros for ``aux[i]``, which is then never read.
load_plain.uses_aux = False


if _BM != _BN:
    raise ImportError("fastlib.cuda.config: GEMM_BM and GEMM_BN must be equal (the A and B "
                      "tiles are staged by one function)")


@functools.lru_cache(maxsize=None)
def _staging(load, dtype_name):
    """(fetch, put): device functions staging one operand's ``GEMM_BK``-deep slice.

    ``fetch`` reads the elements ``load(x[e], aux[e], param)``, ``e = base + (outer0 + o) *
    s_outer + (p0 + kk) * s_inner``, of the tile's ``GEMM_BM`` outer indices (rows of A,
    columns of B) and ``GEMM_BK`` inner ones into the thread's registers, zero past
    ``n_outer`` or ``k1``; ``put`` stores them as ``tile[buf, kk, o]``. A thread takes groups
    of W neighbouring elements along the contiguous axis (the outer one when ``outer_fast``),
    neighbouring threads neighbouring groups, each group one 128-bit load when ``vec`` says
    the operand's addresses allow it (:func:`.vector_load.aligned`) and it lies inside.
    """
    width = vector_load.WIDTH[dtype_name]
    uses_aux = getattr(load, "uses_aux", False)
    groups = _BM * _BK // width
    per_thread = -(-groups // _THREADS)
    go, gi = _BM // width, _BK // width

    @cuda.jit(device=True)
    def fetch(regs, x, aux, base, s_outer, s_inner, outer0, n_outer, p0, k1, outer_fast, vec,
              param, tid):
        for r in range(per_thread):
            g = tid + r * _THREADS
            if g < groups:
                if outer_fast:
                    kk = g // go
                    o = (g - kk * go) * width
                    whole = outer0 + o + width <= n_outer and p0 + kk < k1
                else:
                    o = g // gi
                    kk = (g - o * gi) * width
                    whole = outer0 + o < n_outer and p0 + kk + width <= k1
                e = base + (outer0 + o) * s_outer + (p0 + kk) * s_inner
                if vec and whole:
                    xs = load_vector(x, e)
                    if uses_aux:
                        auxs = load_vector(aux, e)
                        for v in range(width):
                            regs[r * width + v] = load(xs[v], auxs[v], param)
                    else:
                        for v in range(width):
                            regs[r * width + v] = load(xs[v], 0.0, param)
                else:
                    for v in range(width):
                        oo = o + v if outer_fast else o
                        pp = p0 + kk if outer_fast else p0 + kk + v
                        if outer0 + oo < n_outer and pp < k1:
                            i = base + (outer0 + oo) * s_outer + pp * s_inner
                            regs[r * width + v] = load(x[i], aux[i] if uses_aux else 0.0,
                                                       param)
                        else:
                            regs[r * width + v] = 0.0

    @cuda.jit(device=True)
    def put(tile, buf, regs, outer_fast, tid):
        for r in range(per_thread):
            g = tid + r * _THREADS
            if g < groups:
                if outer_fast:
                    kk = g // go
                    o = (g - kk * go) * width
                    for v in range(width):
                        tile[buf, kk, o + v] = regs[r * width + v]
                else:
                    o = g // gi
                    kk = (g - o * gi) * width
                    for v in range(width):
                        tile[buf, kk + v, o] = regs[r * width + v]

    return fetch, put, per_thread * width


def _name(fn):
    """A device function's Python name (numba's dispatchers keep it on ``py_func``)."""
    return getattr(getattr(fn, "py_func", fn), "__name__", "epilogue")


@functools.lru_cache(maxsize=None)
def gemm_kernel(dtype_name, epilogue=store_plain, load_a=load_plain, load_b=load_plain):
    """The GEMM kernel for one dtype, epilogue and pair of operand loads.

    ``epilogue(c, out, bias, index, col, acc, param)`` stores the finished dot product ``acc``
    of element ``index`` (column ``col``): :func:`store_plain` for matmul, a bias +
    activation store for Dense (:mod:`.dense`). ``load_a(a[i], aux_a[i], param)`` (and
    ``load_b``) forms an operand's element ``i`` from the values read: plain, or Dense's
    ``g * f'(pre)`` formed on the fly (:mod:`.dense_grad`; ``uses_aux`` on the load says
    whether ``aux`` is read). With ``colsum`` the launch also writes ``colsum_out[j] =
    sum_r B[r, j]`` (float64 in order, rounded once): a Dense bias gradient beside its weight
    gradient. The shared tiles need a fixed element type, hence one kernel per dtype.
    """
    nbtype = _NB_TYPES[dtype_name]
    fetch_a, put_a, regs_n = _staging(load_a, dtype_name)
    fetch_b, put_b, _ = _staging(load_b, dtype_name)

    def gemm(a, aux_a, b, aux_b, c, out, bias, colsum_out, work, arrivals, batch, m, n, k,
             sa_z, sa_r, sa_c, sb_z, sb_r, sb_c, param, splits, colsum, vec_a, vec_b):
        # NOTE: every loop that holds a barrier is uniform per block (its bounds depend on
        # block indices and arguments only), so the barriers are safe
        tile_a = cuda.shared.array((2, _BK, _BM_PAD), nbtype)  # A^T slices: [buffer][k][m]
        tile_b = cuda.shared.array((2, _BK, _BN_PAD), nbtype)  # B slices: [buffer][k][n]
        last = cuda.shared.array(1, float64)
        acc = cuda.local.array((_TM, _TN), nbtype)
        col_acc = cuda.local.array(_TN, float64)
        a_reg = cuda.local.array(_TM, nbtype)
        b_reg = cuda.local.array(_TN, nbtype)
        next_a = cuda.local.array(regs_n, nbtype)   # the next slice, on its way to shared
        next_b = cuda.local.array(regs_n, nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * _TX + tx
        tiles_m = (m + _BM - 1) // _BM
        tiles_n = (n + _BN - 1) // _BN
        chunk = ((k + splits - 1) // splits + _BK - 1) // _BK * _BK
        a_m_fast = sa_r == 1 and sa_c != 1       # A's rows are contiguous: read along m
        b_n_fast = not (sb_r == 1 and sb_c != 1)  # B's rows are contiguous: read along n
        zs = cuda.blockIdx.z
        while zs < batch * splits:
            z = zs // splits
            s = zs - z * splits
            k0 = s * chunk
            k1 = min(k, k0 + chunk)
            slices = (k1 - k0 + _BK - 1) // _BK if k1 > k0 else 0
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
                    # double buffering: slice q + 1 is read from global memory into registers
                    # while slice q is multiplied from shared memory, then stored into the
                    # other buffer: one barrier per slice
                    if slices > 0:
                        fetch_a(next_a, a, aux_a, z * sa_z, sa_r, sa_c, r0, m, k0, k1, a_m_fast,
                                vec_a, param, tid)
                        fetch_b(next_b, b, aux_b, z * sb_z, sb_c, sb_r, c0, n, k0, k1, b_n_fast,
                                vec_b, param, tid)
                        put_a(tile_a, 0, next_a, a_m_fast, tid)
                        put_b(tile_b, 0, next_b, b_n_fast, tid)
                        cuda.syncthreads()
                    for q in range(slices):
                        buf = q % 2
                        more = q + 1 < slices
                        if more:
                            p1 = k0 + (q + 1) * _BK
                            fetch_a(next_a, a, aux_a, z * sa_z, sa_r, sa_c, r0, m, p1, k1,
                                    a_m_fast, vec_a, param, tid)
                            fetch_b(next_b, b, aux_b, z * sb_z, sb_c, sb_r, c0, n, p1, k1,
                                    b_n_fast, vec_b, param, tid)
                        for kk in range(_BK):
                            for i in range(_TM):
                                a_reg[i] = tile_a[buf, kk, ty + _TY * i]
                            for j in range(_TN):
                                b_reg[j] = tile_b[buf, kk, tx + _TX * j]
                            for i in range(_TM):
                                for j in range(_TN):
                                    acc[i, j] += a_reg[i] * b_reg[j]
                        if colsum and tr == 0 and ty == 0:
                            for kk in range(_BK):
                                for j in range(_TN):
                                    col_acc[j] += float64(tile_b[buf, kk, tx + _TX * j])
                        if more:
                            put_a(tile_a, 1 - buf, next_a, a_m_fast, tid)
                            put_b(tile_b, 1 - buf, next_b, b_n_fast, tid)
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
    aux_a = d_a if aux_a is None else aux_a
    aux_b = d_b if aux_b is None else aux_b
    sa_z, sa_r, sa_c = (int(s) for s in a_strides)
    sb_z, sb_r, sb_c = (int(s) for s in b_strides)
    a_m_fast = sa_r == 1 and sa_c != 1
    b_n_fast = not (sb_r == 1 and sb_c != 1)
    vec_a = vector_flag(d_a, aux_a, load_a, sa_z, sa_r, sa_c, a_m_fast, batch)
    vec_b = vector_flag(d_b, aux_b, load_b, sb_z, sb_c, sb_r, b_n_fast, batch)
    gemm_kernel(np.dtype(dtype).name, epilogue, load_a, load_b)[
        gemm_grid(m, n, batch, splits), GEMM_BLOCK](
        d_a, aux_a, d_b, aux_b, d_c, d_out, d_bias, d_c if d_colsum is None else d_colsum, work,
        arrivals, batch, m, n, k, sa_z, sa_r, sa_c, sb_z, sb_r, sb_c, float(param), splits,
        int(colsum), vec_a, vec_b)
    return d_c


def vector_flag(x, aux, load, s_z, s_outer, s_inner, outer_fast, batch):
    """1 when every group of an operand's staging lies on a 16-byte boundary (its contiguous
    axis has stride 1; the array, and ``aux`` where ``load`` reads it, aligned; the other
    strides multiples of the vector width), else 0: the 128-bit loads' precondition."""
    fast, other = (s_outer, s_inner) if outer_fast else (s_inner, s_outer)
    if fast != 1:
        return 0
    z = s_z if batch > 1 else 0
    arrays = (x, aux) if getattr(load, "uses_aux", False) else (x,)
    return int(all(vector_load.aligned(arr, 0, z, other) for arr in arrays))


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
