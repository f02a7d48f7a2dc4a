"""The MLP schedule's epoch (:mod:`fastlib.training.mlp_schedule`): a chain of Dense rows on
``(N, d)`` data, each layer pair cut into pieces of columns (the even layer's outputs) and rows
(the odd layer's inputs), each piece's parameters one contiguous block on one thread.

Each piece runs Dense's epilogues (:mod:`fastlib.kernels.dense`); the loss is the compiled
epochs' one (:mod:`fastlib.kernels.batch_loss`) and the step ends in the epoch skeleton
(:mod:`fastlib.kernels.skeleton`), each piece's update applied to its own block at the start
of the next step's first region. In mixed precision (:data:`Precision`) the forward and
backward read the masters rounded to the 16-bit format, every layer's output and input
cotangent is rounded to it, and the gradient is rounded, unscaled and guarded by the loss
scale, as the per-batch mixed path (``fastlib.training.mixed_precision``) does. Why this epoch
is kept beside the interpreter: docs/architecture.md, "Why the MLP schedule survives".
"""
from __future__ import annotations

import collections
import math

import numpy as np
from numba import njit, prange

import optable
from fastlib.kernels import half
from fastlib.kernels import optim as kopt
from fastlib.kernels import skeleton as sk
from fastlib.kernels.batch_loss import batch_mean, loss_terms
from fastlib.kernels.blas import dot_into
from fastlib.kernels.dense import backward_epilogue, fast_activate, weight_gradient
from fastlib.kernels.interpreter import EpochState, EpochUpdate
from fastlib.kernels.native_call import call_compiled

_LINEAR = optable.activation_codes()["linear"]

#: The column plan: per layer its width ``dims`` (the input's first), activation ``codes``,
#: column cuts ``cols``, per layer and piece the weight and bias offsets ``w_off``, ``b_off``;
#: the pieces' parameter blocks ``blk``; per layer the offsets of its activations ``act_off``
#: and of its pieces' partial products ``part_off``; the leaky ``slope`` (model dtype), the
#: batch size, ``threads`` and the loss code (``optable.losses.LOSS_CODES``).
ColumnPlan = collections.namedtuple(
    "ColumnPlan", "dims codes cols w_off b_off blk act_off part_off slope batch_size threads "
                  "loss_code")
#: The epoch's flat buffers (laid out by ``mlp_schedule.run``): the gathered batches ``a_in``
#: (this one and the next), per layer ``pre``, ``post`` and ``gout`` (COL layers piece by
#: piece, ROW layers whole), the pieces' partials ``part`` (ROW layers' products, COL layers'
#: input cotangents), a lone last COL layer's joined ``logits``, the loss gradient ``dz`` and
#: float64 bias sums ``acc64`` (pieces + 1, widest layer); the sums of squares ``sumsq``.
ColumnBuffers = collections.namedtuple(
    "ColumnBuffers", "a_in post pre gout part logits dz acc64 sumsq")
#: The run's precision (the skeleton's: every compiled epoch reads the same record).
Precision = sk.Precision


@njit(cache=True, error_model="numpy")
def _gather(x, order, start, r0, r1, a_in, fmt):
    """Rows ``r0:r1`` of the batch at ``start``: ``a_in[i] = x[order[start + i]]`` (flat
    ``a_in``, rows of ``x.shape[1]``), rounded to the 16-bit format ``fmt`` unless it is -1
    (a mixed run's inputs are rounded batch by batch: no rounded copy of the data set)."""
    width = x.shape[1]
    for i in range(r0, r1):
        r = order[start + i]
        for k in range(width):
            a_in[i * width + k] = x[r, k]
    half.round_in_place(fmt, a_in[r0 * width:r1 * width])


# ---------------------------------------------------------------------------------------------
# one piece of one pair

@njit(cache=True, error_model="numpy")
def _pair_input(plan, layer, nb, a_in, post):
    """The full input of COL layer ``layer``: the batch, or the previous ROW layer's output."""
    din = plan.dims[layer]
    if layer == 0:
        return a_in[:nb * din].reshape((nb, din))
    o = plan.act_off[layer - 1]
    return post[o:o + nb * din].reshape((nb, din))


# NOTE: the pieces' forward and backward are inlined into ``_piece_work`` (their one call
# site) at Numba's IR level, and ``_pair_region`` calls ``_piece_work`` by address: levels of
# linking and re-optimising fewer per dtype (the interpreter's NOTE on compile time)
@njit(cache=True, error_model="numpy", inline="always")
def _forward_piece(plan, layer, p, nb, w, a_in, bufs, fmt):
    """Piece ``p`` of the pair starting at COL layer ``layer``: its columns' pre-activation and
    output (Dense's epilogue; rounded to the format ``fmt`` unless it is -1), then, with a ROW
    layer above, its partial product ``z_p``."""
    n_layers = plan.codes.shape[0]
    din = plan.dims[layer]
    c0 = plan.cols[layer, p]
    width = plan.cols[layer, p + 1] - c0
    if width == 0:
        return  # the reductions skip empty pieces
    a_prev = _pair_input(plan, layer, nb, a_in, bufs.post)
    op = plan.act_off[layer] + plan.batch_size * c0
    pre_p = bufs.pre[op:op + nb * width].reshape((nb, width))
    post_p = bufs.post[op:op + nb * width].reshape((nb, width))
    ow = plan.w_off[layer, p]
    dot_into(a_prev, w[ow:ow + din * width].reshape((din, width)), pre_p)
    bias = w[plan.b_off[layer, p]:plan.b_off[layer, p] + width]
    code = plan.codes[layer]
    for i in range(nb):
        for j in range(width):
            z = pre_p[i, j] + bias[j]
            pre_p[i, j] = z
            post_p[i, j] = fast_activate(z, code, plan.slope) if code != _LINEAR else z
    half.round_in_place(fmt, bufs.post[op:op + nb * width])   # the layer's output, stored
    if layer + 1 < n_layers:
        d2 = plan.dims[layer + 2]
        ow2 = plan.w_off[layer + 1, p]
        oq = plan.part_off[layer + 1] + p * plan.batch_size * d2
        dot_into(post_p, w[ow2:ow2 + width * d2].reshape((width, d2)),
               bufs.part[oq:oq + nb * d2].reshape((nb, d2)))


@njit(cache=True, error_model="numpy", inline="always")
def _backward_piece(plan, layer, p, nb, w, g, a_in, bufs, fmt):
    """Piece ``p`` of the pair starting at COL layer ``layer``, backward: with a ROW layer
    above (whose full cotangent is ready), its rows' weight gradient and this piece's
    cotangent ``dz @ W1[p, :]^T``, else the loss gradient's columns; then Dense's backward of
    the COL piece and, above the first layer, its partial input cotangent ``gout @ W0_p^T``.
    In a 16-bit format ``fmt`` the piece's cotangent is rounded (the ROW layer's input
    cotangent; the loss cotangent was scaled and rounded before the backward began)."""
    n_layers = plan.codes.shape[0]
    din = plan.dims[layer]
    c0 = plan.cols[layer, p]
    width = plan.cols[layer, p + 1] - c0
    if width == 0:
        return
    bs = plan.batch_size
    op = plan.act_off[layer] + bs * c0
    gp = bufs.gout[op:op + nb * width].reshape((nb, width))
    if layer + 1 < n_layers:
        d2 = plan.dims[layer + 2]
        o2 = plan.act_off[layer + 1]
        g2 = bufs.gout[o2:o2 + nb * d2].reshape((nb, d2))
        ow2 = plan.w_off[layer + 1, p]
        weight_gradient(bufs.post[op:op + nb * width].reshape((nb, width)), g2,
                        g[ow2:ow2 + width * d2].reshape((width, d2)))
        dot_into(g2, w[ow2:ow2 + width * d2].reshape((width, d2)).T, gp)
        half.round_in_place(fmt, bufs.gout[op:op + nb * width])
    else:
        dz = bufs.dz[:nb * plan.dims[n_layers]].reshape((nb, plan.dims[n_layers]))
        for i in range(nb):
            for j in range(width):
                gp[i, j] = dz[i, c0 + j]
    backward_epilogue(gp, bufs.pre[op:op + nb * width].reshape((nb, width)), gp, gp,
                      bufs.acc64[p], plan.codes[layer], plan.slope)
    gbias = g[plan.b_off[layer, p]:plan.b_off[layer, p] + width]
    for j in range(width):
        gbias[j] = bufs.acc64[p, j]
    ow = plan.w_off[layer, p]
    weight_gradient(_pair_input(plan, layer, nb, a_in, bufs.post), gp,
                    g[ow:ow + din * width].reshape((din, width)))
    if layer > 0:
        oq = plan.part_off[layer] + p * bs * din
        dot_into(gp, w[ow:ow + din * width].reshape((din, width)).T,
               bufs.part[oq:oq + nb * din].reshape((nb, din)))


# ---------------------------------------------------------------------------------------------
# the serial joins between pairs

@njit(cache=True, error_model="numpy")
def _sum_pieces(dst, part, base, bs, cuts, n_pieces):
    """``dst = sum over non-empty pieces q (in order) of part[base + q * bs * width]``."""
    nb, width = dst.shape
    first = True
    for q in range(n_pieces):
        if cuts[q + 1] == cuts[q]:
            continue  # an empty piece wrote nothing
        o = base + q * bs * width
        src = part[o:o + nb * width].reshape((nb, width))
        if first:
            for i in range(nb):
                for j in range(width):
                    dst[i, j] = src[i, j]
            first = False
        else:
            for i in range(nb):
                for j in range(width):
                    dst[i, j] += src[i, j]


@njit(cache=True, error_model="numpy")
def _join_forward(plan, layer, nb, n_pieces, w, bufs, fmt):
    """ROW layer ``layer``: ``pre = sum of the pieces' z_p + b``, ``post = f(pre)`` (rounded to
    the format ``fmt`` unless it is -1)."""
    dout = plan.dims[layer + 1]
    o = plan.act_off[layer]
    pre_f = bufs.pre[o:o + nb * dout].reshape((nb, dout))
    post_f = bufs.post[o:o + nb * dout].reshape((nb, dout))
    _sum_pieces(pre_f, bufs.part, plan.part_off[layer], plan.batch_size, plan.cols[layer - 1],
                n_pieces)
    code = plan.codes[layer]
    for q in range(n_pieces):
        c0, c1 = plan.cols[layer, q], plan.cols[layer, q + 1]
        bias = w[plan.b_off[layer, q]:plan.b_off[layer, q] + c1 - c0]
        for i in range(nb):
            for j in range(c0, c1):
                z = pre_f[i, j] + bias[j - c0]
                pre_f[i, j] = z
                post_f[i, j] = fast_activate(z, code, plan.slope) if code != _LINEAR else z
    half.round_in_place(fmt, bufs.post[o:o + nb * dout])


@njit(cache=True, error_model="numpy")
def _join_backward(plan, layer, nb, n_pieces, g, bufs, fmt):
    """ROW layer ``layer``: its full cotangent (the loss gradient, or the sum of the next COL
    layer's partials, rounded to the format ``fmt`` unless it is -1), times ``f'(pre)``, and
    its bias gradient into the pieces' blocks."""
    n_layers = plan.codes.shape[0]
    dout = plan.dims[layer + 1]
    o = plan.act_off[layer]
    gf = bufs.gout[o:o + nb * dout].reshape((nb, dout))
    if layer == n_layers - 1:
        dz = bufs.dz[:nb * dout].reshape((nb, dout))
        for i in range(nb):
            for j in range(dout):
                gf[i, j] = dz[i, j]
    else:
        _sum_pieces(gf, bufs.part, plan.part_off[layer + 1], plan.batch_size,
                    plan.cols[layer + 1], n_pieces)
        half.round_in_place(fmt, bufs.gout[o:o + nb * dout])
    acc64 = bufs.acc64[n_pieces]
    backward_epilogue(gf, bufs.pre[o:o + nb * dout].reshape((nb, dout)), gf, gf, acc64,
                      plan.codes[layer], plan.slope)
    for q in range(n_pieces):
        c0, c1 = plan.cols[layer, q], plan.cols[layer, q + 1]
        for j in range(c0, c1):
            g[plan.b_off[layer, q] + j - c0] = acc64[j]


# ---------------------------------------------------------------------------------------------
# parallel regions: one per pair and direction

@njit(cache=True, error_model="numpy")
def _piece_work(plan, layer, forward, update, p, nb, a_in, state, bufs, upd, c, total, prec,
                unscale):
    """Piece ``p`` of the pair at ``layer``: forward (after the previous step's pending update
    of its block with coefficient row ``c``, when ``update``; ``layer = -1``: the update
    alone), or backward (at the first pair, its block's float64 sum of squares too). In a
    16-bit format (``prec``) the block's finished gradient is rounded to it and multiplied by
    ``unscale`` (the loss scale's float32 reciprocal) before its sum of squares, and its
    updated masters are rounded into ``prec.w16``, which the forward and backward read."""
    lo, hi = plan.blk[p], plan.blk[p + 1]
    if not forward:
        _backward_piece(plan, layer, p, nb, prec.w16, state.g, a_in, bufs, prec.code)
        if layer == 0:
            if prec.scaled:     # rounded and unscaled in one pass
                half.round_scale_in_place(prec.code, state.g[lo:hi], unscale)
            else:
                half.round_in_place(prec.code, state.g[lo:hi])
            bufs.sumsq[p] = kopt._sum_squares(state.g[lo:hi])
        return
    if update:
        sk.update_block(lo, hi, upd.kind, state.w, state.g, state.a, state.b, c, upd.clip_mode,
                        upd.clip, total, prec.code, prec.w16)
    if layer >= 0:
        _forward_piece(plan, layer, p, nb, prec.w16, a_in, bufs, prec.code)


@njit(cache=True, parallel=True, error_model="numpy")
def _pair_region(threads, layer, forward, update, nb, n_pieces, a_in, plan, state, bufs, upd, c,
                 total, gather, prec, unscale, work):
    """Every piece of the pair at ``layer`` (:func:`_piece_work`, called through its entry
    ``work``: not linked in, see ``fastlib.kernels.native_call``), ``threads`` at a time;
    backward at the first pair, each thread also gathers its share of the next batch's rows
    (``gather``: ``(x, order, next_start, next_nb, a_next)``; ``a_next`` is the other buffer,
    this step's batch is still being read)."""
    x, order, next_start, next_nb, a_next = gather
    next_batch = not forward and layer == 0
    if threads == 1:
        old = kopt.enter_ftz()
        for p in range(n_pieces):
            call_compiled(work, (plan, layer, forward, update, p, nb, a_in, state, bufs, upd, c,
                                 total, prec, unscale))
        if next_batch:
            _gather(x, order, next_start, np.int64(0), next_nb, a_next, prec.code)
        kopt.leave_ftz(old)
        return
    # NOTE: a parallel loop takes arrays and scalars only (no tuples of arrays): the named
    # tuples are taken apart here and each thread puts them together again
    (dims, codes, cols, w_off, b_off, blk, act_off, part_off, slope, batch_size, plan_threads,
     loss_code) = plan
    w, a, b, g = state
    buf_a_in, post, pre, gout, part, logits, dz, acc64, sumsq = bufs
    kind, coeffs, clip_mode, clip = upd
    fmt, w16, scale, clean, skips, scaled, growth, backoff, interval, dynamic = prec
    for t in prange(threads):
        old = kopt.enter_ftz()  # per worker thread: the control word is thread-local
        mplan = ColumnPlan(dims, codes, cols, w_off, b_off, blk, act_off, part_off, slope,
                           batch_size, plan_threads, loss_code)
        mstate = EpochState(w, a, b, g)
        mbufs = ColumnBuffers(buf_a_in, post, pre, gout, part, logits, dz, acc64, sumsq)
        mupd = EpochUpdate(kind, coeffs, clip_mode, clip)
        mprec = Precision(fmt, w16, scale, clean, skips, scaled, growth, backoff, interval,
                          dynamic)
        for p in range(t, n_pieces, threads):
            call_compiled(work, (mplan, layer, forward, update, p, nb, a_in, mstate, mbufs, mupd,
                                 c, total, mprec, unscale))
        if next_batch:
            _gather(x, order, next_start, (t * next_nb) // threads,
                    ((t + 1) * next_nb) // threads, a_next, fmt)
        kopt.leave_ftz(old)


# ---------------------------------------------------------------------------------------------
# the epoch

@njit(cache=True, error_model="numpy")
def epoch(plan, data, state, bufs, update, prec, work):
    """Train one epoch; returns (loss_sum, correct, skipped, updates, diverged_batch, loss).

    ``data`` is an ``interpreter.EpochData`` (``features`` (N, d), the targets, ``order``),
    ``state`` an ``interpreter.EpochState`` (``g`` the gradient, each piece's block written
    by its piece), ``update`` an ``interpreter.EpochUpdate``. Per step: gather the batch; per
    pair, one forward region and the serial join of the ROW layer's pieces; the loss (serial);
    per pair from the top, the serial join of the ROW layer's cotangent and one backward
    region; the guard (and a loss scale's update, ``skeleton.scale_after_step``). The update is
    applied at the start of the next step's first forward region (or after the loop); ``prec``
    is the run's :data:`Precision`, ``work`` the entry of :func:`_piece_work`
    (:func:`piece_work_entry`). NaN/Inf rules: a non-finite loss returns at once (the caller
    restores weights); a non-finite gradient skips the update (``skipped``), as the generic
    path does.
    """
    # NOTE: flush-to-zero (see fastlib.kernels.optim) for the serial parts of the epoch, and
    # inside every region for each thread. The regions are launched with the caller's control
    # word restored: a worker thread that a launch creates inherits the launching thread's
    # MXCSR, and a pool started under FTZ/DAZ kept it for every later parallel kernel of the
    # process (a parallel float32 log then read subnormal inputs as 0 and returned -inf).
    old_fp = kopt.enter_ftz()
    x, order = data.features, data.order
    n_samples = x.shape[0]
    n_layers = plan.codes.shape[0]
    n_pieces = plan.blk.shape[0] - 1
    last = n_layers - 1
    bs = plan.batch_size
    c_out = plan.dims[n_layers]
    threads = plan.threads
    loss_sum = 0.0
    correct_sum = 0.0
    skipped = 0
    updates = 0
    batch = 0
    pending = False
    total = 0.0
    # NOTE: two batch buffers: the backward pass gathers the next batch in parallel while
    # this batch's buffer is still in use (a serial gather was ~8% of a batch-64 MNIST epoch)
    in_size = bs * plan.dims[0]
    # NOTE: the regions' flags and constants are passed as typed values (np.bool_, np.int64),
    # not literals: Numba compiles a callee once per distinct literal argument, and the three
    # calls below once cost three compiles of the largest kernel, and of each callee, per dtype
    yes, no, zero = np.bool_(True), np.bool_(False), np.int64(0)
    _gather(x, order, zero, zero, min(bs, n_samples), bufs.a_in[:in_size], prec.code)
    no_gather = (x, order, zero, zero, bufs.a_in)
    for start in range(0, n_samples, bs):
        nb = min(bs, n_samples - start)
        step_in = bufs.a_in[(batch % 2) * in_size:(batch % 2 + 1) * in_size]
        next_in = bufs.a_in[(1 - batch % 2) * in_size:(2 - batch % 2) * in_size]
        next_nb = max(0, min(bs, n_samples - start - bs))
        # the gradient's unscale factor: the reciprocal in float64, rounded once to the dtype
        # (as torch.amp.GradScaler.unscale_ takes it)
        unscale = state.g.dtype.type(1.0 / prec.scale[0])
        for layer in range(0, n_layers, 2):
            # the pending update of the previous step uses its coefficient row, updates - 1
            kopt.leave_ftz(old_fp)
            _pair_region(threads, layer, yes, pending and layer == 0, nb, n_pieces, step_in,
                         plan, state, bufs, update, update.coeffs[max(updates - 1, 0):][:1], total,
                         no_gather, prec, unscale, work)
            kopt.enter_ftz()
            if layer + 1 < n_layers:
                _join_forward(plan, layer + 1, nb, n_pieces, prec.w16, bufs, prec.code)
        pending = False
        ol = plan.act_off[last]
        if last % 2 == 1:  # a ROW layer's output is already whole
            logits = bufs.post[ol:ol + nb * c_out].reshape((nb, c_out))
        else:  # a lone COL layer: its pieces side by side
            logits = bufs.logits[:nb * c_out].reshape((nb, c_out))
            for q in range(n_pieces):
                c0, c1 = plan.cols[last, q], plan.cols[last, q + 1]
                src = bufs.post[ol + bs * c0:ol + bs * c0 + nb * (c1 - c0)].reshape(
                    (nb, c1 - c0))
                for i in range(nb):
                    for j in range(c0, c1):
                        logits[i, j] = src[i, j - c0]
        dz = bufs.dz[:nb * c_out].reshape((nb, c_out))
        terms, correct = loss_terms(plan.loss_code, logits, data.classes, data.values,
                                    order[start:start + nb], dz, nb)
        loss = batch_mean(plan.loss_code, terms, nb, c_out)
        if not math.isfinite(loss):
            kopt.leave_ftz(old_fp)
            return loss_sum, correct_sum, skipped, updates, batch, loss
        loss_sum += loss * nb
        correct_sum += correct
        sk.loss_cotangent_in_format(prec, bufs.dz[:nb * c_out])
        for layer in range(last - last % 2, -1, -2):
            if layer + 1 < n_layers:
                _join_backward(plan, layer + 1, nb, n_pieces, state.g, bufs, prec.code)
            kopt.leave_ftz(old_fp)
            _pair_region(threads, layer, no, no, nb, n_pieces, step_in, plan, state, bufs,
                         update, update.coeffs[0:1], total,
                         (x, order, start + bs, next_nb, next_in), prec, unscale, work)
            kopt.enter_ftz()
        # -- the skeleton's guard: the pieces' sums are added in piece order (each piece owns
        # one block of the parameters); the update is applied at the next forward region
        total, apply = sk.guard(bufs.sumsq, state.g)
        if prec.scaled:
            scale, clean, skips = sk.scale_after_step(prec.scale[0], prec.clean[0],
                                                      prec.skips[0], not apply, prec.growth,
                                                      prec.backoff, prec.interval, prec.dynamic)
            prec.scale[0], prec.clean[0], prec.skips[0] = scale, clean, skips
        batch += 1
        if not apply:
            skipped += 1
            continue
        pending = True
        updates += 1
    kopt.leave_ftz(old_fp)
    if pending:
        _pair_region(threads, np.int64(-1), yes, yes, zero, n_pieces, bufs.a_in, plan, state,
                     bufs, update, update.coeffs[updates - 1:updates], total, no_gather, prec,
                     state.g.dtype.type(1.0), work)
    return loss_sum, correct_sum, skipped, updates, -1, 0.0


def piece_work_entry(plan, state, bufs, update, prec):
    """The native entry of :func:`_piece_work` for these arguments' types (``epoch``'s last
    argument): compiled once, on its own, and called by address from the pairs' regions."""
    from fastlib.compile_once import native_entry

    zero, no = np.int64(0), np.bool_(False)
    return native_entry(_piece_work, plan, zero, no, no, zero, zero, bufs.a_in, state, bufs,
                        update, update.coeffs[0:1], 0.0, prec, state.g.dtype.type(1.0))
