"""The small kernels of device training that the op kernels do not already provide.

Batches gathered from the resident data through the epoch's shuffled index, Embedding's lookup
and its backward, elementwise helpers, per-column sums in float64 (split over rows), the five
losses with per-block partial sums, and the guarded optimizer step (finiteness, both clipping
modes, the update, all decided on the device in two launches over the run's flat gradient
buffer, so a step needs no readback before its update).

Every kernel works on flat C-contiguous arrays with grid-stride loops, like the rest of
:mod:`fastlib.cuda`, so the simulator's tiny blocks and grids run the same code paths as a GPU.
"""
from __future__ import annotations

import math

from numba import cuda, float32, float64, int64

import optable
from fastlib.kernels.skeleton import scale_after_step as _scale_rule

from . import config
from .device import device_function_here, kernel, signatures
from .optim import coefficient_signatures, update_at
from .norm import LAYER_NORM, row_moments
from . import reduce as _reduce
from .scalar import sigmoid_pair

_RB = config.REDUCE_BLOCK
last_to_arrive = device_function_here(_reduce.last_to_arrive, globals())
# this module's own copy: numba's simulator swaps a device function's module for the length of
# each call, and block threads leaving the shared copy restored the real numba.cuda under
# threads still entering it (the lowered LayerNorm backward failed so)
block_sum = device_function_here(_reduce.block_sum_body, globals())

#: Loss codes of :data:`loss_rows`: the op table's codes of the five losses.
LOSS_CODES = optable.loss_codes()
MSE, CE, CCE, BCE, BCE_LOGITS = (LOSS_CODES[n] for n in (
    "mse", "cross_entropy", "categorical_cross_entropy", "binary_cross_entropy",
    "binary_cross_entropy_with_logits"))

#: Slots of the guard vector written by :data:`guard_update` (after the loss partials).
APPLY, SCALE, NORM, GRAD_FINITE = range(4)
GUARD_SIZE = 4

#: Slots of a run's int64 step state on the device (read by the kernels, so a recorded step --
#: a CUDA graph -- replays for every batch with the same arguments): the batch's first position
#: in the epoch's order, the step's row of the epoch's numbers, the applied steps this epoch
#: (the row of the coefficient table), the halt flag a non-finite loss sets, and the count of
#: blocks that finished the update (the last one advances the others).
CURSOR, ROW, T, HALT, DONE = range(5)
STATE_SIZE = 5


# ---------------------------------------------------------------------------------------------
# data movement

def _gather_rows_body(src, order, state, out, count, width):
    # out[r, j] = src[order[start + r], j]: the batch, gathered on the device; start is the
    # cursor in the run's step state (device memory, so a recorded step replays per batch)
    start = state[CURSOR]
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < count * width:
        r = i // width
        out[i] = src[order[start + r] * width + (i - r * width)]
        i += step


gather_rows = kernel(
    *signatures("void({t}[::1], int64[::1], int64[::1], {t}[::1], int64, int64)"),
    "void(int64[::1], int64[::1], int64[::1], int64[::1], int64, int64)")(_gather_rows_body)


def _embedding_forward_body(w, idx, out, n, dim):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n * dim:
        r = i // dim
        out[i] = w[idx[r] * dim + (i - r * dim)]
        i += step


embedding_forward = kernel(*signatures("void({t}[::1], int64[::1], {t}[::1], int64, int64)"))(
    _embedding_forward_body)


def _embedding_backward_body(idx, g, dw, work, arrivals, n, num, dim, splits):
    # dw[v, j] = sum over rows r with idx[r] == v of g[r, j], without atomics: block (x, s)
    # takes columns x * blockDim.x + tid of rows chunk s, adds them in row order into its own
    # float64 table work[s] (num x dim), and the last block of the column block (an arrival
    # count) adds the splits' tables in split order and rounds once: the bits do not depend
    # on which block finishes when
    tid = cuda.threadIdx.x
    last = cuda.shared.array(1, float64)
    chunk = (n + splits - 1) // splits
    cb = cuda.blockIdx.x
    while cb * cuda.blockDim.x < dim:  # uniform per block: the barriers inside are safe
        j = cb * cuda.blockDim.x + tid
        s = cuda.blockIdx.y
        while s < splits:
            base = s * num * dim
            if j < dim:
                for v in range(num):
                    work[base + v * dim + j] = 0.0
                for r in range(s * chunk, min(n, (s + 1) * chunk)):
                    work[base + idx[r] * dim + j] += float64(g[r * dim + j])
            if last_to_arrive(arrivals, cb, splits, last) and j < dim:
                for v in range(num):
                    total = 0.0
                    for q in range(splits):
                        total += work[q * num * dim + v * dim + j]
                    dw[v * dim + j] = total
            cuda.syncthreads()
            s += cuda.gridDim.y
        cb += cuda.gridDim.x


embedding_backward = kernel(
    *signatures("void(int64[::1], {t}[::1], {t}[::1], float64[::1], int64[::1], int64, int64, "
                "int64, int64)"))(_embedding_backward_body)


# ---------------------------------------------------------------------------------------------
# elementwise helpers

def _add_into_body(a, b):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < a.shape[0]:
        a[i] = a[i] + b[i]
        i += step


add_into = kernel(*signatures("void({t}[::1], {t}[::1])"))(_add_into_body)


def _copy_body(src, dst):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.shape[0]:
        dst[i] = src[i]
        i += step


copy = kernel(*signatures("void({t}[::1], {t}[::1])"))(_copy_body)


def _add_pair_body(a, b, out):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = a[i] + b[i]
        i += step


#: ``out = a + b``: the program's Add join (summed left to right, as the CPU does).
add_pair = kernel(*signatures("void({t}[::1], {t}[::1], {t}[::1])"))(_add_pair_body)


def _put_columns_body(x, y, rows, d_in, d_out, col0):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < rows * d_in:
        r = i // d_in
        y[r * d_out + col0 + i - r * d_in] = x[i]
        i += step


#: ``y[:, col0:col0 + d_in] = x``: the program's Columns join, (rows, d_in) into (rows, d_out).
put_columns = kernel(*signatures("void({t}[::1], {t}[::1], int64, int64, int64, int64)"))(
    _put_columns_body)


def _take_columns_body(g, out, rows, d_in, d_out, col0, add):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < rows * d_in:
        r = i // d_in
        v = g[r * d_out + col0 + i - r * d_in]
        out[i] = out[i] + v if add else v
        i += step


#: ``out (=|+=) g[:, col0:col0 + d_in]``: the Columns join's backward, written or added into
#: the input's cotangent (``add``) in one pass.
take_columns = kernel(*signatures(
    "void({t}[::1], {t}[::1], int64, int64, int64, int64, int64)"))(_take_columns_body)


def _affine_rows_body(x, w, b, out, n, d, with_bias):
    # out[r, j] = x[r, j] * w[j] (+ b[j])
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n * d:
        j = i % d
        v = x[i] * w[j]
        if with_bias:
            v = v + b[j]
        out[i] = v
        i += step


affine_rows = kernel(*signatures("void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, "
                                 "int64)"))(_affine_rows_body)


#: Modes of :data:`column_sums`: ``out[j] = sum_r a[r, j]``; ``sum_r a[r, j] b[r, j]``; both
#: (the product into ``out``, the plain sum into ``out2``: a norm layer's weight and bias).
SUM_A, SUM_AB, SUM_AB_AND_A = range(3)


def _column_sums_body(a, b, out, out2, work, arrivals, rows, d, mode, splits):
    # Column sums split over the long axis (rows) into `splits` chunks: thread j of block
    # (x, s) adds column j of chunk s in float64 in row order (neighbouring threads read
    # neighbouring columns), stores the partial, and the last block of the column block (an
    # arrival count) adds the chunks' partials in chunk order and rounds once: the bits do not
    # depend on which block finishes when
    tid = cuda.threadIdx.x
    last = cuda.shared.array(1, float64)
    chunk = (rows + splits - 1) // splits
    cb = cuda.blockIdx.x
    while cb * cuda.blockDim.x < d:  # uniform per block: the barriers inside are safe
        j = cb * cuda.blockDim.x + tid
        s = cuda.blockIdx.y
        while s < splits:
            acc = 0.0
            acc2 = 0.0
            if j < d:
                for r in range(s * chunk, min(rows, (s + 1) * chunk)):
                    v = float64(a[r * d + j])
                    if mode == SUM_A:
                        acc += v
                    else:
                        acc += v * float64(b[r * d + j])
                        acc2 += v
            if splits == 1:
                if j < d:
                    out[j] = acc
                    if mode == SUM_AB_AND_A:
                        out2[j] = acc2
            else:
                if j < d:
                    work[(2 * s) * d + j] = acc
                    work[(2 * s + 1) * d + j] = acc2
                if last_to_arrive(arrivals, cb, splits, last) and j < d:
                    total = 0.0
                    total2 = 0.0
                    for q in range(splits):
                        total += work[(2 * q) * d + j]
                        total2 += work[(2 * q + 1) * d + j]
                    out[j] = total
                    if mode == SUM_AB_AND_A:
                        out2[j] = total2
                cuda.syncthreads()
            s += cuda.gridDim.y
        cb += cuda.gridDim.x


column_sums = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], float64[::1], int64[::1], int64, int64, "
    "int64, int64)"))(_column_sums_body)


def _norm_affine_body(x, w, b, xhat, y, rows, n, mode, eps, with_bias):
    # layer_norm / rms_norm of each row (one block per row, as .norm's row kernel) and the
    # affine map in the same pass: xhat is kept for backward, y = xhat * w (+ b) in the dtype
    shared = cuda.shared.array(_RB, float64)
    tid = cuda.threadIdx.x
    row = cuda.blockIdx.x
    while row < rows:  # uniform per block: the barriers in row_moments are safe
        base = row * n
        center, scale = row_moments(shared, x, base, n, 1, mode, eps)
        j = tid
        while j < n:
            xhat[base + j] = (float64(x[base + j]) - center) * scale
            v = xhat[base + j] * w[j]
            if with_bias:
                v = v + b[j]
            y[base + j] = v
            j += cuda.blockDim.x
        row += cuda.gridDim.x


norm_affine = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64, float64, "
    "int64)"))(_norm_affine_body)


def _norm_affine_vjp_body(x, g, w, out, rows, n, mode, eps):
    # the row VJP of .norm (layer_norm / rms_norm) of the cotangent g * w, the affine map's
    # input cotangent formed on the fly (in the dtype, where the unfused path stored it)
    shared = cuda.shared.array(_RB, float64)
    tid = cuda.threadIdx.x
    row = cuda.blockIdx.x
    while row < rows:
        base = row * n
        center, scale = row_moments(shared, x, base, n, 1, mode, eps)
        acc_g = 0.0
        acc_gx = 0.0
        j = tid
        while j < n:
            gv = float64(g[base + j] * w[j])
            acc_g += gv
            acc_gx += gv * (float64(x[base + j]) - center)
            j += cuda.blockDim.x
        mean_g = block_sum(shared, acc_g) / n
        mean_gx = block_sum(shared, acc_gx) / n
        j = tid
        while j < n:
            gv = float64(g[base + j] * w[j])
            dv = float64(x[base + j]) - center
            if mode == LAYER_NORM:
                out[base + j] = scale * (gv - mean_g - dv * scale * scale * mean_gx)
            else:
                out[base + j] = scale * gv - dv * scale * scale * scale * mean_gx
            j += cuda.blockDim.x
        row += cuda.gridDim.x


norm_affine_vjp = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], {t}[::1], int64, int64, int64, float64)"))(
    _norm_affine_vjp_body)


# ---------------------------------------------------------------------------------------------
# losses: gradient of the mean loss, and per-block partial sums of the terms and of the hits

def _loss_rows_body(pred, target, order, state, grad, stats, stats_width, rows, width, mode,
                    inv_n, eps):
    # Block b writes partial[b] (sum of its rows' loss terms) and partial[nblocks + b] (correct
    # predictions: rows for the two categorical losses, elements for the binary ones), in the
    # step's row of ``stats``. Targets are read through the epoch's order at the cursor (no
    # gathered copy of the batch's targets).
    shared = cuda.shared.array(_RB, float64)
    partial = stats[state[ROW] * stats_width:]
    start = state[CURSOR]
    tid = cuda.threadIdx.x
    nblocks = cuda.gridDim.x
    loss_acc = 0.0
    hits = 0.0
    r = cuda.blockIdx.x * cuda.blockDim.x + tid
    while r < rows:
        base = r * width
        tbase = order[start + r] * width      # the target's row in the resident data
        if mode == CE or mode == CCE:
            m = -math.inf
            best = 0
            for j in range(width):
                v = float64(pred[base + j])
                if v > m:
                    m = v
                    best = j
            s = 0.0
            for j in range(width):
                s += math.exp(float64(pred[base + j]) - m)
            lse = m + math.log(s)
            if mode == CE:
                cls = int(target[order[start + r]])
                loss_acc += lse - float64(pred[base + cls])
                for j in range(width):
                    p = math.exp(float64(pred[base + j]) - m) / s
                    if j == cls:
                        p -= 1.0
                    grad[base + j] = p * inv_n
                if best == cls:
                    hits += 1.0
            else:
                tsum = 0.0
                tbest = 0
                tm = -math.inf
                for j in range(width):
                    t = float64(target[tbase + j])
                    tsum += t
                    loss_acc -= t * (float64(pred[base + j]) - lse)
                    if t > tm:
                        tm = t
                        tbest = j
                for j in range(width):
                    p = math.exp(float64(pred[base + j]) - m) / s
                    grad[base + j] = (p * tsum - float64(target[tbase + j])) * inv_n
                if best == tbest:
                    hits += 1.0
        else:
            for j in range(width):
                x = float64(pred[base + j])
                t = float64(target[tbase + j])
                if mode == MSE:
                    loss_acc += (x - t) * (x - t)
                    grad[base + j] = 2.0 * (x - t) * inv_n
                elif mode == BCE:
                    # a saturated probability against a disagreeing target is moved inside
                    # (0, 1) by the dtype's eps, as fastlib.losses does on the CPU
                    if (x <= 0.0 and t > 0.0) or (x >= 1.0 and t < 1.0):
                        x = min(max(x, eps), 1.0 - eps)
                    term = 0.0
                    if t != 0.0:
                        term -= t * math.log(x)
                    if t != 1.0:
                        term -= (1.0 - t) * math.log1p(-x)
                    loss_acc += term
                    grad[base + j] = (x - t) / (x * (1.0 - x)) * inv_n
                    if (x > 0.5) == (t > 0.5):
                        hits += 1.0
                else:
                    e = math.exp(-abs(x))
                    loss_acc += max(x, 0.0) - x * t + math.log1p(e)
                    grad[base + j] = (sigmoid_pair(x)[0] - t) * inv_n
                    if (x > 0.0) == (t > 0.5):
                        hits += 1.0
        r += cuda.gridDim.x * cuda.blockDim.x
    total = block_sum(shared, loss_acc)
    correct = block_sum(shared, hits)
    if tid == 0:
        partial[cuda.blockIdx.x] = total
        partial[nblocks + cuda.blockIdx.x] = correct


loss_rows = kernel(
    *signatures("void({t}[::1], {t}[::1], int64[::1], int64[::1], {t}[::1], float64[::1], "
                "int64, int64, int64, int64, float64, float64)"),
    *signatures("void({t}[::1], int64[::1], int64[::1], int64[::1], {t}[::1], float64[::1], "
                "int64, int64, int64, int64, float64, float64)"))(_loss_rows_body)


# ---------------------------------------------------------------------------------------------
# the guarded step: finiteness and norm, clipping, update -- decided on the device, two launches
# over the run's one flat gradient buffer

def _guard_partials_body(g, partials):
    # Block b writes partials[2b] = the sum of squares of the elements its threads visit and
    # partials[2b + 1] = how many of them are not finite (a NaN's square is NaN, so the two are
    # kept apart); block tree sums, so the grid is small and fixed (config.GUARD_BLOCKS).
    shared = cuda.shared.array(_RB, float64)
    acc = 0.0
    bad = 0.0
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < g.shape[0]:
        v = float64(g[i])
        if v != v or v == math.inf or v == -math.inf:
            bad += 1.0
        else:
            acc += v * v
        i += stride
    total = block_sum(shared, acc)
    count = block_sum(shared, bad)
    if cuda.threadIdx.x == 0:
        partials[2 * cuda.blockIdx.x] = total
        partials[2 * cuda.blockIdx.x + 1] = count


guard_partials = kernel(*signatures("void({t}[::1], float64[::1])"))(_guard_partials_body)


def _guard_update_body(kind, w, g, a, b, table, state, stats, stats_width, n_loss,
                       partials, clip, norm_mode, inv_n, limit, count):
    # Every block first decides the guard from the same numbers in the same order (so every
    # block decides alike): the loss partials of this step's row and the gradient partials.
    # The loss counts as finite when its mean fits the dtype (|mean| < limit, the dtype's
    # largest number: the CPU rounds the float64 mean to the dtype). A non-finite loss sets the
    # halt flag, and no later step of the epoch applies (training stops there, as on the CPU).
    # Then clip (value: clamp; norm: the scale) into g, as the CPU clips in place, and take the
    # optimizer step with the coefficients of row T of the epoch's table. The last block to
    # finish advances the step state (cursor, row, T) for the next step.
    guard = cuda.shared.array(GUARD_SIZE, float64)
    tid = cuda.threadIdx.x
    at = state[ROW] * stats_width
    if tid == 0:
        total = 0.0
        bad = 0.0
        for k in range(partials.shape[0] // 2):
            total += partials[2 * k]
            bad += partials[2 * k + 1]
        loss = 0.0
        for q in range(n_loss):
            loss += stats[at + q]
        mean = loss * inv_n
        loss_ok = mean == mean and abs(mean) < limit
        grad_ok = bad == 0.0
        norm = math.sqrt(total) if grad_ok else math.nan
        s = 1.0
        if norm_mode and grad_ok and clip > 0.0 and norm > clip:
            s = clip / norm
        apply = 1.0 if (loss_ok and grad_ok and state[HALT] == 0) else 0.0
        guard[APPLY] = apply
        guard[SCALE] = s
        guard[NORM] = norm
        guard[GRAD_FINITE] = 1.0 if grad_ok else 0.0
        if cuda.blockIdx.x == 0:
            out = at + 2 * n_loss
            for q in range(GUARD_SIZE):
                stats[out + q] = guard[q]
    cuda.syncthreads()
    if guard[APPLY] != 0.0:
        s = guard[SCALE]
        c = table[state[T]]
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < w.shape[0]:
            if clip > 0.0:
                if norm_mode:
                    if s != 1.0:
                        g[i] = g[i] * s
                else:
                    g[i] = min(max(g[i], -clip), clip)
            update_at(kind, i, w, g, a, b, c)
            i += step
    # the last block out advances the state (every block has read it by then)
    cuda.threadfence()
    cuda.syncthreads()
    if tid == 0:
        done = cuda.atomic.add(state, DONE, 1)
        if done == cuda.gridDim.x - 1:
            if guard[APPLY] != 0.0:
                state[T] += 1
            else:
                # the halt flag is written here, after every block has read it
                total = 0.0
                for q in range(n_loss):
                    total += stats[at + q]
                mean = total * inv_n
                if not (mean == mean and abs(mean) < limit):
                    state[HALT] = 1
            state[CURSOR] += count
            state[ROW] += 1
            state[DONE] = 0


guarded_update = kernel(*coefficient_signatures(
    "void(int64, {t}[::1], {t}[::1], {t}[::1], {t}[::1], {c}, int64[::1], "
    "float64[::1], int64, int64, float64[::1], float64, int64, float64, float64, int64)"))(
    _guard_update_body)


# ---------------------------------------------------------------------------------------------
# mixed precision: the loss scale, on the device (so a recorded step replays with the scale of
# its turn, and a step needs no readback to decide it)

#: Entries of a run's loss-scale state on the device: the scale, the clean steps in a row, the
#: skips; the loss-scale kernel copies them into the step's row of numbers after the guard's.
LOSS_SCALE, SCALE_CLEAN, SCALE_SKIPS = range(3)
SCALE_STATE_SIZE = 3

scale_after_step = device_function_here(_scale_rule.py_func, globals())


def _scale_values_body(a, scale, inverse):
    # a *= the scale (the loss cotangent, before the backward), or a *= its reciprocal computed
    # in float64 and rounded once to float32 (the gradients, as torch.amp.GradScaler.unscale_)
    s = scale[LOSS_SCALE]
    f = float32(1.0 / s) if inverse else float32(s)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < a.shape[0]:
        a[i] = a[i] * f
        i += step


scale_values = kernel("void(float32[::1], float64[::1], int64)")(_scale_values_body)


def _loss_scale_step_body(scale, stats, state, stats_width, n_loss, growth, backoff, interval,
                          dynamic):
    # One thread, after the guarded update, from the guard's own decision in the step's row
    # (the state's row has moved on by one): a step that did not halt training (a finite loss,
    # no earlier halt) moves the scale by the rule every path shares
    # (``skeleton.scale_after_step``): a non-finite gradient -> back off and count a skip,
    # else one more clean step. A non-finite loss stops training there, the scale as it was.
    if cuda.grid(1) != 0:
        return
    at = (state[ROW] - 1) * stats_width
    if state[HALT] == 0:
        found_inf = stats[at + 2 * n_loss + GRAD_FINITE] == 0.0
        s, clean, skips = scale_after_step(scale[LOSS_SCALE], int64(scale[SCALE_CLEAN]),
                                           int64(scale[SCALE_SKIPS]), found_inf, growth,
                                           backoff, interval, dynamic)
        scale[LOSS_SCALE] = s
        scale[SCALE_CLEAN] = clean
        scale[SCALE_SKIPS] = skips
    out = at + 2 * n_loss + GUARD_SIZE
    for q in range(SCALE_STATE_SIZE):
        stats[out + q] = scale[q]


loss_scale_step = kernel("void(float64[::1], float64[::1], int64[::1], int64, int64, float64, "
                         "float64, int64, int64)")(
    _loss_scale_step_body)
