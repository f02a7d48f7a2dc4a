"""Numba kernels of the program's MLP schedule (:mod:`fastlib.training.mlp_schedule`).

The long story: docs/fastlib.md, section ``fastlib/training/fused_kernels.py``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

import optable
from fastlib.kernels import dense as kd
from fastlib.kernels import optim as kopt
from fastlib.kernels import scalar
from fastlib.layers.activations import ACTIVATIONS
from fastlib.training import skeleton as sk

# loss codes of the kernel: the op table's, for the losses it runs
LOSS_CODES = {n: c for n, c in optable.loss_codes().items() if n != "binary_cross_entropy"}
CE, CCE, MSE, BCE_LOGITS = (LOSS_CODES[n] for n in (
    "cross_entropy", "categorical_cross_entropy", "mse", "binary_cross_entropy_with_logits"))

# Activations the compiled paths apply elementwise: the op table's activations whose op is
# unary (softmax normalises a whole row and trains through the generic path). The kernels
# call Dense's own activation functions, which switch on the table's codes.
FUSED_ACTIVATIONS = tuple(a.name for a in optable.ACTIVATIONS.values()
                          if optable.OPS[a.op].category == "unary")
FUSED_CODES = frozenset(ACTIVATIONS[a] for a in FUSED_ACTIVATIONS)
_LINEAR = ACTIVATIONS["linear"]


# ---------------------------------------------------------------------------------------------
# per-element pieces shared with the generic path's math

@njit(cache=True, error_model="numpy")
def _loss_and_grad(code, z, yi, yf, rows, dz):
    """Mean loss of the logits ``z`` (rows x C) and its gradient into ``dz``; correct count."""
    n, c = z.shape
    total, correct = loss_terms(code, z, yi, yf, rows, dz, n)
    if code == CE or code == CCE:
        return total / n, correct
    return total / (n * c), correct


@njit(cache=True, error_model="numpy")
def loss_terms(code, z, yi, yf, rows, dz, n_mean):
    """The float64 sum of the loss terms of the logits ``z`` (rows x C) and the correct count;
    the gradient of the mean over ``n_mean`` rows into ``dz``.

    ``n_mean`` is the row count the loss averages over, which may exceed ``z``'s rows when a
    batch is cut into pieces (the recurrent path): dividing the pieces' summed terms by it
    gives the batch's mean. ``rows[i]`` is the row of ``yi`` / ``yf`` that holds row i's target.
    """
    c = z.shape[1]
    n = z.shape[0]
    total = 0.0
    correct = 0.0
    one = z.dtype.type(1)
    if code == CE or code == CCE:
        inv_n = one / z.dtype.type(n_mean)
        for i in range(n):
            m = z[i, 0]
            arg = 0
            for j in range(1, c):
                if z[i, j] > m:
                    m = z[i, j]
                    arg = j
            s = z.dtype.type(0)
            for j in range(c):
                s += math.exp(z[i, j] - m)
            lse = m + math.log(s)
            if code == CE:
                k = yi[rows[i]]
                total += np.float64(lse - z[i, k])
                for j in range(c):
                    dz[i, j] = math.exp(z[i, j] - lse) * inv_n
                dz[i, k] -= inv_n
                if arg == k:
                    correct += 1.0
            else:
                r = rows[i]
                t_sum = z.dtype.type(0)
                t_arg = 0
                for j in range(c):
                    t = yf[r, j]
                    t_sum += t
                    total -= np.float64(t * (z[i, j] - lse))
                    if t > yf[r, t_arg]:
                        t_arg = j
                for j in range(c):
                    dz[i, j] = (math.exp(z[i, j] - lse) * t_sum - yf[r, j]) * inv_n
                if arg == t_arg:
                    correct += 1.0
        return total, correct
    inv_m = one / z.dtype.type(n_mean * c)
    for i in range(n):
        r = rows[i]
        hits = 0
        for j in range(c):
            t = yf[r, j]
            x = z[i, j]
            if code == MSE:
                d = x - t
                total += np.float64(d * d)
                dz[i, j] = 2 * d * inv_m
            else:
                # NOTE: max(z, 0) - z t + log(1 + exp(-|z|)): finite for any finite z
                total += np.float64(max(x, 0) - x * t + math.log1p(math.exp(-abs(x))))
                sig = one / (one + math.exp(-x)) if x >= 0 else math.exp(x) / (one + math.exp(x))
                dz[i, j] = (sig - t) * inv_m
                if (x > 0) == (t > 0.5):
                    hits += 1
        if code == BCE_LOGITS:
            correct += hits / c
    return total, correct


_RELU = ACTIVATIONS["relu"]


# NOTE: Dense's epilogue functions, so the compiled paths and the layer apply one formula per
# activation code. relu, the common case, is inlined; every other code is a call, so the hot
# loops stay small (inlining every activation's body there cost ~10% of an MLP epoch).
@njit(inline="always", error_model="numpy")
def _act(z, code, slope):
    if code == _RELU:
        return scalar.relu_f(z)
    return _act_other(z, code, slope)


@njit(inline="always", error_model="numpy")
def _act_derivative(z, code, slope):
    if code == _RELU:
        return scalar.relu_df(z)
    return _act_derivative_other(z, code, slope)


@njit(cache=True, error_model="numpy")
def _act_other(z, code, slope):
    return kd.activate(z, code, slope)


@njit(cache=True, error_model="numpy")
def _act_derivative_other(z, code, slope):
    return kd.activate_derivative(z, code, slope)


@njit(cache=True, error_model="numpy")
def _backward_epilogue(gout, pre, code, slope, acc):
    """``gout *= f'(pre)`` in place and its column sums into the caller's float64 ``acc``
    (the bias gradient, as Dense's backward: float64 sums, rows in order)."""
    rows, cols = gout.shape
    for j in range(cols):
        acc[j] = 0.0
    for i in range(rows):
        for j in range(cols):
            v = gout[i, j]
            if code != _LINEAR:
                v = v * _act_derivative(pre[i, j], code, slope)
                gout[i, j] = v
            acc[j] += v


@njit(cache=True, error_model="numpy")
def column_sums_into(g, out, acc):
    """``out[j] = sum_i g[i, j]`` through the caller's float64 accumulator ``acc``, rows in
    order (Dense's float64 bias-gradient sums, without allocating): the linear epilogue."""
    _backward_epilogue(g, g, _LINEAR, 0.0, acc)
    for j in range(g.shape[1]):
        out[j] = acc[j]


@njit(cache=True, error_model="numpy")
def _outer(u, v, out):
    """``out = u^T v`` for one row each: the batch-1 weight gradient ``x^T @ delta``.

    NOTE: each element is the single product u[i] * v[j], exactly what a matrix product with
    an inner dimension of 1 computes, so the values equal the BLAS path's; a plain loop is
    several times faster than a GEMM call at this shape.
    """
    m, n = u.shape[0], v.shape[0]
    for i in range(m):
        ui = u[i]
        for j in range(n):
            out[i, j] = ui * v[j]


@njit(cache=True, error_model="numpy")
def _weight_gradient(a, d, out):
    """``out = a^T d``: BLAS, or the outer product at one row."""
    if a.shape[0] > 1:
        np.dot(a.T, d, out)
    else:
        _outer(a[0], d[0], out)


@njit(cache=True, error_model="numpy")
def _gather(x, order, start, r0, r1, a_in):
    """Rows ``r0:r1`` of the batch at ``start``: ``a_in[i] = x[order[start + i]]`` (flat
    ``a_in``, rows of ``x.shape[1]``)."""
    width = x.shape[1]
    for i in range(r0, r1):
        r = order[start + i]
        for k in range(width):
            a_in[i * width + k] = x[r, k]


# ---------------------------------------------------------------------------------------------
# one piece of one pair

@njit(cache=True, error_model="numpy")
def _pair_input(layer, nb, dims, act_off, a_in, post):
    """The full input of COL layer ``layer``: the batch, or the previous ROW layer's output."""
    din = dims[layer]
    if layer == 0:
        return a_in[:nb * din].reshape((nb, din))
    o = act_off[layer - 1]
    return post[o:o + nb * din].reshape((nb, din))


@njit(cache=True, error_model="numpy")
def _forward_piece(layer, p, nb, bs, dims, cols, w_off, b_off, act_off, part_off, codes, slope,
                   w, a_in, post, pre, part):
    """Piece ``p`` of the pair starting at COL layer ``layer``: its columns' pre-activation and
    output (Dense's epilogue), then, with a ROW layer above, its partial product ``z_p``."""
    n_layers = codes.shape[0]
    din = dims[layer]
    c0 = cols[layer, p]
    width = cols[layer, p + 1] - c0
    if width == 0:
        return  # the reductions skip empty pieces
    a_prev = _pair_input(layer, nb, dims, act_off, a_in, post)
    op = act_off[layer] + bs * c0
    pre_p = pre[op:op + nb * width].reshape((nb, width))
    post_p = post[op:op + nb * width].reshape((nb, width))
    ow = w_off[layer, p]
    np.dot(a_prev, w[ow:ow + din * width].reshape((din, width)), pre_p)
    bias = w[b_off[layer, p]:b_off[layer, p] + width]
    code = codes[layer]
    for i in range(nb):
        for j in range(width):
            z = pre_p[i, j] + bias[j]
            pre_p[i, j] = z
            post_p[i, j] = _act(z, code, slope) if code != _LINEAR else z
    if layer + 1 < n_layers:
        d2 = dims[layer + 2]
        ow2 = w_off[layer + 1, p]
        oq = part_off[layer + 1] + p * bs * d2
        np.dot(post_p, w[ow2:ow2 + width * d2].reshape((width, d2)),
               part[oq:oq + nb * d2].reshape((nb, d2)))


@njit(cache=True, error_model="numpy")
def _backward_piece(layer, p, nb, bs, dims, cols, w_off, b_off, act_off, part_off, codes, slope,
                    w, g, a_in, post, pre, gout, part, dz, acc64):
    """Piece ``p`` of the pair starting at COL layer ``layer``, backward: with a ROW layer
    above (whose full cotangent is ready), its rows' weight gradient and this piece's
    cotangent ``dz @ W1[p, :]^T``, else the loss gradient's columns; then Dense's backward of
    the COL piece and, above the first layer, its partial input cotangent ``gout @ W0_p^T``."""
    n_layers = codes.shape[0]
    din = dims[layer]
    c0 = cols[layer, p]
    width = cols[layer, p + 1] - c0
    if width == 0:
        return
    op = act_off[layer] + bs * c0
    gp = gout[op:op + nb * width].reshape((nb, width))
    if layer + 1 < n_layers:
        d2 = dims[layer + 2]
        o2 = act_off[layer + 1]
        g2 = gout[o2:o2 + nb * d2].reshape((nb, d2))
        ow2 = w_off[layer + 1, p]
        _weight_gradient(post[op:op + nb * width].reshape((nb, width)), g2,
                         g[ow2:ow2 + width * d2].reshape((width, d2)))
        np.dot(g2, w[ow2:ow2 + width * d2].reshape((width, d2)).T, gp)
    else:
        for i in range(nb):
            for j in range(width):
                gp[i, j] = dz[i, c0 + j]
    _backward_epilogue(gp, pre[op:op + nb * width].reshape((nb, width)), codes[layer], slope,
                       acc64[p])
    gbias = g[b_off[layer, p]:b_off[layer, p] + width]
    for j in range(width):
        gbias[j] = acc64[p, j]
    ow = w_off[layer, p]
    _weight_gradient(_pair_input(layer, nb, dims, act_off, a_in, post), gp,
                     g[ow:ow + din * width].reshape((din, width)))
    if layer > 0:
        oq = part_off[layer] + p * bs * din
        np.dot(gp, w[ow:ow + din * width].reshape((din, width)).T,
               part[oq:oq + nb * din].reshape((nb, din)))


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
def _join_forward(layer, nb, bs, n_pieces, dims, cols, b_off, act_off, part_off, codes, slope,
                  w, post, pre, part):
    """ROW layer ``layer``: ``pre = sum of the pieces' z_p + b``, ``post = f(pre)``."""
    dout = dims[layer + 1]
    o = act_off[layer]
    pre_f = pre[o:o + nb * dout].reshape((nb, dout))
    post_f = post[o:o + nb * dout].reshape((nb, dout))
    _sum_pieces(pre_f, part, part_off[layer], bs, cols[layer - 1], n_pieces)
    code = codes[layer]
    for q in range(n_pieces):
        c0, c1 = cols[layer, q], cols[layer, q + 1]
        bias = w[b_off[layer, q]:b_off[layer, q] + c1 - c0]
        for i in range(nb):
            for j in range(c0, c1):
                z = pre_f[i, j] + bias[j - c0]
                pre_f[i, j] = z
                post_f[i, j] = _act(z, code, slope) if code != _LINEAR else z


@njit(cache=True, error_model="numpy")
def _join_backward(layer, nb, bs, n_pieces, dims, cols, b_off, act_off, part_off, codes, slope,
                   g, pre, gout, part, dz, acc64):
    """ROW layer ``layer``: its full cotangent (the loss gradient, or the sum of the next COL
    layer's partials), times ``f'(pre)``, and its bias gradient into the pieces' blocks."""
    n_layers = codes.shape[0]
    dout = dims[layer + 1]
    o = act_off[layer]
    gf = gout[o:o + nb * dout].reshape((nb, dout))
    if layer == n_layers - 1:
        for i in range(nb):
            for j in range(dout):
                gf[i, j] = dz[i, j]
    else:
        _sum_pieces(gf, part, part_off[layer + 1], bs, cols[layer + 1], n_pieces)
    _backward_epilogue(gf, pre[o:o + nb * dout].reshape((nb, dout)), codes[layer], slope,
                       acc64)
    for q in range(n_pieces):
        c0, c1 = cols[layer, q], cols[layer, q + 1]
        for j in range(c0, c1):
            g[b_off[layer, q] + j - c0] = acc64[j]


# ---------------------------------------------------------------------------------------------
# parallel regions: one per pair and direction

@njit(cache=True, parallel=True, error_model="numpy")
def _forward_pair(threads, layer, update, nb, bs, n_pieces, dims, cols, w_off, b_off, act_off,
                  part_off, codes, slope, w, a_in, post, pre, part, blk, kind, g, a, b, c,
                  clip_mode, clip, total):
    """The pair starting at ``layer`` forward, ``threads`` at a time; with ``update``, each
    thread first applies the previous step's pending update to its own pieces' parameter
    blocks (the only parameters its pieces read). ``layer = -1``: the update alone."""
    if threads == 1:
        old = kopt.enter_ftz()
        for p in range(n_pieces):
            if update:
                sk.update_block(blk[p], blk[p + 1], kind, w, g, a, b, c, clip_mode, clip,
                                total)
            if layer >= 0:
                _forward_piece(layer, p, nb, bs, dims, cols, w_off, b_off, act_off, part_off,
                               codes, slope, w, a_in, post, pre, part)
        kopt.leave_ftz(old)
        return
    for t in prange(threads):
        old = kopt.enter_ftz()  # per worker thread: the control word is thread-local
        for p in range(t, n_pieces, threads):
            if update:
                sk.update_block(blk[p], blk[p + 1], kind, w, g, a, b, c, clip_mode, clip,
                                total)
            if layer >= 0:
                _forward_piece(layer, p, nb, bs, dims, cols, w_off, b_off, act_off, part_off,
                               codes, slope, w, a_in, post, pre, part)
        kopt.leave_ftz(old)


@njit(cache=True, parallel=True, error_model="numpy")
def _backward_pair(threads, layer, nb, bs, n_pieces, dims, cols, w_off, b_off, act_off,
                   part_off, codes, slope, w, g, a_in, post, pre, gout, part, dz, blk, sumsq, x,
                   order, next_start, next_nb, a_next, acc64):
    """The pair starting at ``layer`` backward; at the first pair, each piece's sum of squared
    gradients (float64) into ``sumsq`` for the step's guard and norm clipping, and each
    thread's share of the next batch's rows gathered into ``a_next`` (the other buffer: this
    step's batch is still being read)."""
    if threads == 1:
        old = kopt.enter_ftz()
        for p in range(n_pieces):
            _backward_piece(layer, p, nb, bs, dims, cols, w_off, b_off, act_off, part_off,
                            codes, slope, w, g, a_in, post, pre, gout, part, dz, acc64)
            if layer == 0:
                sumsq[p] = kopt._sum_squares(g[blk[p]:blk[p + 1]])
        if layer == 0:
            _gather(x, order, next_start, 0, next_nb, a_next)
        kopt.leave_ftz(old)
        return
    for t in prange(threads):
        old = kopt.enter_ftz()
        for p in range(t, n_pieces, threads):
            _backward_piece(layer, p, nb, bs, dims, cols, w_off, b_off, act_off, part_off,
                            codes, slope, w, g, a_in, post, pre, gout, part, dz, acc64)
            if layer == 0:
                sumsq[p] = kopt._sum_squares(g[blk[p]:blk[p + 1]])
        if layer == 0:
            _gather(x, order, next_start, (t * next_nb) // threads,
                    ((t + 1) * next_nb) // threads, a_next)
        kopt.leave_ftz(old)


# ---------------------------------------------------------------------------------------------
# the epoch

@njit(cache=True, error_model="numpy")
def epoch(x, yi, yf, order, batch_size, threads, dims, cols, w_off, b_off, blk, act_off,
          part_off, codes, slope, loss_code, kind, coeffs, clip_mode, clip, w, a, b, g, a_in,
          post, pre, gout, part, logits_buf, dz_buf, acc64):
    """Train one epoch; returns (loss_sum, correct, skipped, updates, diverged_batch, loss).

    Per step: gather the batch; per pair, one forward region and the serial join of the ROW
    layer's pieces; the loss (serial); per pair from the top, the serial join of the ROW
    layer's cotangent and one backward region; the guard. The update is applied at the start
    of the next step's first forward region (or after the loop). Buffers (flat, laid out by
    ``mlp_schedule.run``): ``a_in`` the gathered batch; ``pre``, ``post`` and ``gout`` per
    layer (bs x width: COL layers piece by piece, ROW layers whole); ``part`` the pieces'
    partial products (ROW layers, forward) and partial input cotangents (COL layers above the
    first); ``logits_buf`` a lone last COL layer's output joined for the loss; ``dz_buf`` the
    loss gradient; ``acc64`` (pieces + 1, widest layer) float64, the bias gradients' sums of
    each piece and of the joins. NaN/Inf rules: a non-finite loss returns at once (the caller restores
    weights); a non-finite gradient skips the update (``skipped``), as the generic path does.
    """
    # NOTE: flush-to-zero (see fastlib.kernels.optim) for the serial parts of the epoch, and
    # inside every region for each thread. The regions are launched with the caller's control
    # word restored: a worker thread that a launch creates inherits the launching thread's
    # MXCSR, and a pool started under FTZ/DAZ kept it for every later parallel kernel of the
    # process (a parallel float32 log then read subnormal inputs as 0 and returned -inf).
    old_fp = kopt.enter_ftz()
    n_samples = x.shape[0]
    n_layers = codes.shape[0]
    n_pieces = blk.shape[0] - 1
    last = n_layers - 1
    bs = batch_size
    width_in = dims[0]
    c_out = dims[n_layers]
    sumsq = np.zeros(n_pieces, np.float64)
    loss_sum = 0.0
    correct_sum = 0.0
    skipped = 0
    updates = 0
    batch = 0
    pending = False
    total = 0.0
    # NOTE: two batch buffers: the backward pass gathers the next batch in parallel while
    # this batch's buffer is still in use (a serial gather was ~8% of a batch-64 MNIST epoch)
    in_size = bs * width_in
    _gather(x, order, 0, 0, min(bs, n_samples), a_in[:in_size])
    for start in range(0, n_samples, bs):
        nb = min(bs, n_samples - start)
        step_in = a_in[(batch % 2) * in_size:(batch % 2 + 1) * in_size]
        next_in = a_in[(1 - batch % 2) * in_size:(2 - batch % 2) * in_size]
        next_nb = max(0, min(bs, n_samples - start - bs))
        for layer in range(0, n_layers, 2):
            # the pending update of the previous step uses its coefficient row, updates - 1
            kopt.leave_ftz(old_fp)
            _forward_pair(threads, layer, pending and layer == 0, nb, bs, n_pieces, dims, cols,
                          w_off, b_off, act_off, part_off, codes, slope, w, step_in, post, pre,
                          part, blk, kind, g, a, b, coeffs[max(updates - 1, 0):][:1], clip_mode,
                          clip, total)
            kopt.enter_ftz()
            if layer + 1 < n_layers:
                _join_forward(layer + 1, nb, bs, n_pieces, dims, cols, b_off, act_off,
                              part_off, codes, slope, w, post, pre, part)
        pending = False
        ol = act_off[last]
        if last % 2 == 1:  # a ROW layer's output is already whole
            logits = post[ol:ol + nb * c_out].reshape((nb, c_out))
        else:  # a lone COL layer: its pieces side by side
            logits = logits_buf[:nb * c_out].reshape((nb, c_out))
            for q in range(n_pieces):
                c0, c1 = cols[last, q], cols[last, q + 1]
                src = post[ol + bs * c0:ol + bs * c0 + nb * (c1 - c0)].reshape((nb, c1 - c0))
                for i in range(nb):
                    for j in range(c0, c1):
                        logits[i, j] = src[i, j - c0]
        dz = dz_buf[:nb * c_out].reshape((nb, c_out))
        loss, correct = _loss_and_grad(loss_code, logits, yi, yf, order[start:start + nb], dz)
        if not math.isfinite(loss):
            kopt.leave_ftz(old_fp)
            return loss_sum, correct_sum, skipped, updates, batch, loss
        loss_sum += loss * nb
        correct_sum += correct
        for layer in range(last - last % 2, -1, -2):
            if layer + 1 < n_layers:
                _join_backward(layer + 1, nb, bs, n_pieces, dims, cols, b_off, act_off,
                               part_off, codes, slope, g, pre, gout, part, dz, acc64[n_pieces])
            kopt.leave_ftz(old_fp)
            _backward_pair(threads, layer, nb, bs, n_pieces, dims, cols, w_off, b_off, act_off,
                           part_off, codes, slope, w, g, step_in, post, pre, gout, part, dz, blk,
                           sumsq, x, order, start + bs, next_nb, next_in, acc64)
            kopt.enter_ftz()
        # -- the skeleton's guard: the pieces' sums are added in piece order (each piece owns
        # one block of the parameters); the update is applied at the next forward region
        total, apply = sk.guard(sumsq, g)
        batch += 1
        if not apply:
            skipped += 1
            continue
        pending = True
        updates += 1
    kopt.leave_ftz(old_fp)
    if pending:
        _forward_pair(threads, -1, True, 0, bs, n_pieces, dims, cols, w_off, b_off, act_off,
                      part_off, codes, slope, w, a_in, post, pre, part, blk, kind, g, a, b,
                      coeffs[updates - 1:updates], clip_mode, clip, total)
    return loss_sum, correct_sum, skipped, updates, -1, 0.0
