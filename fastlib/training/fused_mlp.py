"""The whole-epoch compiled path for MLPs: ``Sequential`` of ``Dense`` layers, back-propagation.

At batch size 1 an epoch of MNIST is 60000 steps, so a step must cost ~100 µs including the
optimizer update: Python must not be in the loop. For a model that is a flat ``Sequential`` of
``Dense`` layers with activations in :data:`FUSED_ACTIVATIONS`, trained by ``"bp"`` on the CPU
with ``cross_entropy``, ``categorical_cross_entropy``, ``mse`` or
``binary_cross_entropy_with_logits`` on 2-D inputs, :func:`run_epoch` runs the epoch in one
Numba call: gather the batch, forward (BLAS ``dot`` plus the Dense epilogue), loss and its
gradient, backward, finiteness check and clipping, and the optimizer update over all parameters
at once. Anything else returns None and trains through the generic per-batch path.

The math is the generic path's, operation for operation: the same activation functions and
derivatives (``fastlib.kernels.scalar``, which Dense's epilogue also calls), float64
accumulators for bias gradients and losses, the same clipping rules, and the same per-element
optimizer rule (``fastlib.kernels.optim``) with the same coefficients
(``Optimizer.coefficient_table``). The loss kernel is this module's own log-sum-exp form, and
BLAS's summation order inside the matrix products may differ from NumPy's, so the two paths
agree to rounding, not bit for bit (tested in float64). Like the optimizer kernels, the epoch
runs with flush-to-zero (``fastlib.kernels.optim``'s NOTE): subnormal intermediates, which the
generic path's NumPy code keeps, become 0 here.

Parameters and optimizer state are copied into flat buffers at the start of the epoch and back
at its end (a few hundred kilobytes, once per epoch), so the kernel sees one contiguous array
per quantity. ``train(..., fused=False)`` turns this path off.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from fastlib.kernels import optim as kopt
from fastlib.kernels import scalar
from fastlib.layers.activations import ACTIVATIONS
from fastlib.training.algorithms import EpochStats

# loss codes of the kernel
CE, CCE, MSE, BCE_LOGITS = range(4)
LOSS_CODES = {"cross_entropy": CE, "categorical_cross_entropy": CCE, "mse": MSE,
              "binary_cross_entropy_with_logits": BCE_LOGITS}
CLIP_NONE, CLIP_VALUE, CLIP_NORM = range(3)

# NOTE (speed): the fused epoch updates serially. Its steps are ~0.1-0.5 ms, so a parallel
# region per step (thread wake-up and barrier, next to BLAS's own threads in the GEMMs) costs
# more than the ~40 µs update it would split, and it degrades badly when the cores are shared.
FUSED_UPDATE_CHUNKS = 1

# Activations the fused kernel handles (others train through the generic path).
FUSED_ACTIVATIONS = ("linear", "relu", "leaky_relu", "tanh", "sigmoid")
_LINEAR, _RELU, _LEAKY, _TANH, _SIGMOID = (ACTIVATIONS[a] for a in FUSED_ACTIVATIONS)
_FUSED_CODES = frozenset((_LINEAR, _RELU, _LEAKY, _TANH, _SIGMOID))


# ---------------------------------------------------------------------------------------------
# kernels

@njit(cache=True, error_model="numpy")
def _loss_and_grad(code, z, yi, yf, rows, dz):
    """Mean loss of the logits ``z`` (rows x C) and its gradient into ``dz``; correct count."""
    n, c = z.shape
    total = 0.0
    correct = 0.0
    one = z.dtype.type(1)
    if code == CE or code == CCE:
        inv_n = one / z.dtype.type(n)
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
        return total / n, correct
    inv_m = one / z.dtype.type(n * c)
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
    return total / (n * c), correct


@njit(inline="always", error_model="numpy")
def _act(z, code, slope):
    # NOTE: the scalar functions Dense's epilogue uses (fastlib.kernels.scalar), restricted to
    # the activations of FUSED_ACTIVATIONS so the compiled epoch stays small.
    if code == _RELU:
        return scalar.relu_f(z)
    if code == _LEAKY:
        return scalar.leaky_relu_f(z, slope)
    if code == _TANH:
        return scalar.tanh_f(z)
    if code == _SIGMOID:
        return scalar.sigmoid_f(z)
    return z


@njit(inline="always", error_model="numpy")
def _act_derivative(z, code, slope):
    if code == _RELU:
        return scalar.relu_df(z)
    if code == _LEAKY:
        return scalar.leaky_relu_df(z, slope)
    if code == _TANH:
        return scalar.tanh_df(z)
    return scalar.sigmoid_df(z)


@njit(cache=True, error_model="numpy")
def _forward_epilogue(pre, bias, post, code, slope):
    """``pre += bias ; post = f(pre)``, as Dense's ``bias_activation``."""
    rows, cols = pre.shape
    for i in range(rows):
        for j in range(cols):
            z = pre[i, j] + bias[j]
            pre[i, j] = z
            post[i, j] = _act(z, code, slope) if code != _LINEAR else z


@njit(cache=True, error_model="numpy")
def _backward_epilogue(gout, pre, gbias, code, slope):
    """``gout *= f'(pre)`` in place and ``gbias = column sums``, as Dense's backward."""
    rows, cols = gout.shape
    acc = np.zeros(cols, np.float64)  # NOTE: float64 bias-gradient sums, as Dense's kernel
    for i in range(rows):
        for j in range(cols):
            v = gout[i, j]
            if code != _LINEAR:
                v = v * _act_derivative(pre[i, j], code, slope)
                gout[i, j] = v
            acc[j] += v
    for j in range(cols):
        gbias[j] = acc[j]


@njit(cache=True, error_model="numpy")
def _clip_flat(g, clip_mode, clip, total):
    """Clip ``g`` in place by value, or by the global norm ``sqrt(total)``."""
    if clip_mode == CLIP_VALUE:
        lim = g.dtype.type(clip)
        for i in range(g.shape[0]):
            if g[i] > lim:
                g[i] = lim
            elif g[i] < -lim:
                g[i] = -lim
    elif clip_mode == CLIP_NORM:
        norm = math.sqrt(total)
        if norm > clip:
            s = g.dtype.type(clip / norm)
            for i in range(g.shape[0]):
                g[i] = g[i] * s


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
def _epoch(x, yi, yf, order, batch_size, dims, codes, slope, loss_code, kind, coeffs,
           clip_mode, clip, w, a, b, g, acts, grads, chunks):
    """Train one epoch; returns (loss_sum, correct, skipped, updates, diverged_batch, loss).

    Buffers: ``acts`` holds the gathered batch (bs x dims[0]) and, per layer, its pre-activation
    and output (bs x dims[l+1] each); ``grads`` holds, per layer, the cotangent of its output
    (bs x dims[l+1]), turned in place into the cotangent of its pre-activation; ``g`` is the
    flat parameter gradient (layout of ``w``: weight then bias, layer by layer).
    NaN/Inf rules: a non-finite loss returns at once (the caller restores weights); a
    non-finite gradient skips the update (``skipped``), as the generic path does.
    """
    # NOTE: flush-to-zero for the whole epoch (see fastlib.kernels.optim), restored on return
    old_fp = kopt.enter_ftz()
    n_samples = x.shape[0]
    n_layers = codes.shape[0]
    bs = batch_size
    width_in = dims[0]
    loss_sum = 0.0
    correct_sum = 0.0
    skipped = 0
    updates = 0
    batch = 0
    rows = np.empty(bs, np.int64)
    pre_off = np.empty(n_layers, np.int64)
    in_off = np.empty(n_layers, np.int64)
    w_off = np.empty(n_layers, np.int64)
    gp_off = np.empty(n_layers, np.int64)
    off, offw, offg = bs * width_in, 0, 0
    for layer in range(n_layers):
        in_off[layer] = 0 if layer == 0 else pre_off[layer - 1] + bs * dims[layer]
        pre_off[layer] = off
        off += 2 * bs * dims[layer + 1]
        w_off[layer] = offw
        offw += dims[layer] * dims[layer + 1] + dims[layer + 1]
        gp_off[layer] = offg
        offg += bs * dims[layer + 1]
    for start in range(0, n_samples, bs):
        nb = min(bs, n_samples - start)
        for i in range(nb):
            rows[i] = order[start + i]
        a_in = acts[:nb * width_in].reshape((nb, width_in))
        for i in range(nb):
            a_in[i, :] = x[rows[i], :]
        # -- forward: pre = a @ W, then the Dense epilogue
        for layer in range(n_layers):
            din, dout = dims[layer], dims[layer + 1]
            a_prev = acts[in_off[layer]:in_off[layer] + nb * din].reshape((nb, din))
            ow, op = w_off[layer], pre_off[layer]
            pre = acts[op:op + nb * dout].reshape((nb, dout))
            post = acts[op + bs * dout:op + bs * dout + nb * dout].reshape((nb, dout))
            np.dot(a_prev, w[ow:ow + din * dout].reshape((din, dout)), pre)
            _forward_epilogue(pre, w[ow + din * dout:ow + din * dout + dout], post,
                              codes[layer], slope)
        dlast = dims[n_layers]
        ol = pre_off[n_layers - 1] + bs * dlast
        logits = acts[ol:ol + nb * dlast].reshape((nb, dlast))
        ogl = gp_off[n_layers - 1]
        dz = grads[ogl:ogl + nb * dlast].reshape((nb, dlast))
        loss, correct = _loss_and_grad(loss_code, logits, yi, yf, rows[:nb], dz)
        if not math.isfinite(loss):
            kopt.leave_ftz(old_fp)
            return loss_sum, correct_sum, skipped, updates, batch, loss
        loss_sum += loss * nb
        correct_sum += correct
        # -- backward, last layer first
        for layer in range(n_layers - 1, -1, -1):
            din, dout = dims[layer], dims[layer + 1]
            ow, op, ogp = w_off[layer], pre_off[layer], gp_off[layer]
            gout = grads[ogp:ogp + nb * dout].reshape((nb, dout))
            _backward_epilogue(gout, acts[op:op + nb * dout].reshape((nb, dout)),
                               g[ow + din * dout:ow + din * dout + dout], codes[layer], slope)
            a_prev = acts[in_off[layer]:in_off[layer] + nb * din].reshape((nb, din))
            gw = g[ow:ow + din * dout].reshape((din, dout))
            if nb > 1:
                np.dot(a_prev.T, gout, gw)
            else:
                _outer(a_prev[0], gout[0], gw)
            if layer > 0:
                ogi = gp_off[layer - 1]
                gin = grads[ogi:ogi + nb * din].reshape((nb, din))
                np.dot(gout, w[ow:ow + din * dout].reshape((din, dout)).T, gin)
        # -- guard and clip (the rules of fastlib.training.clipping), then one update over all
        total = kopt._sum_squares(g)
        if not (math.isfinite(total) or kopt._all_finite(g)):
            skipped += 1
            batch += 1
            continue
        _clip_flat(g, clip_mode, clip, total)
        if chunks > 1:
            kopt._update_parallel(kind, w, g, a, b, coeffs[updates], chunks)
        else:
            kopt.update_arrays(kind, w, g, a, b, coeffs[updates])
        updates += 1
        batch += 1
    kopt.leave_ftz(old_fp)
    return loss_sum, correct_sum, skipped, updates, -1, 0.0


# ---------------------------------------------------------------------------------------------
# the Python side

class _Plan:
    """Flat layout of one model: dims, activation codes, and parameter offsets."""

    def __init__(self, dense_layers, names, dtype, loss_code):
        self.dims = np.array([dense_layers[0].in_features] +
                             [d.out_features for d in dense_layers], np.int64)
        self.codes = np.array([ACTIVATIONS[d.activation] for d in dense_layers], np.int64)
        self.names = names  # parameter names in flat order: 0.weight, 0.bias, 1.weight, ...
        self.dtype = dtype
        self.loss_code = loss_code


def plan_for(ctx):
    """A :class:`_Plan` when the fused path applies to this run, else None (cached per run)."""
    if "fused_plan" in ctx.scratch:
        return ctx.scratch["fused_plan"]
    ctx.scratch["fused_plan"] = plan = _make_plan(ctx)
    return plan


def _make_plan(ctx):
    from fastlib.layers import Dense, Sequential
    from fastlib.layers.activations import LEAKY_SLOPE

    model, cfg = ctx.model, ctx.config
    if not cfg.extra.get("fused", True) or cfg.device != "cpu" or cfg.algorithm != "bp":
        return None
    if type(model) is not Sequential or ctx.loss_type not in LOSS_CODES:
        return None
    layers = list(model.layers)
    if not layers or any(type(d) is not Dense or ACTIVATIONS[d.activation] not in _FUSED_CODES
                         for d in layers):
        return None
    names = []
    for i, d in enumerate(layers):
        names += [f"{i}.weight", f"{i}.bias"]
    if list(ctx.params) != names:
        return None
    plan = _Plan(layers, names, np.dtype(model.dtype), LOSS_CODES[ctx.loss_type])
    plan.slope = LEAKY_SLOPE
    return plan


def _flatten(arrays, names, dtype):
    return np.concatenate([arrays[k].reshape(-1) for k in names]).astype(dtype, copy=False)


def _unflatten(flat, arrays, names):
    off = 0
    for k in names:
        dst = arrays[k]
        np.copyto(dst, flat[off:off + dst.size].reshape(dst.shape))
        off += dst.size


def run_epoch(ctx, x, y, order):
    """Train one epoch in the compiled kernel; None when the model or run does not fit it.

    Parameters
    ----------
    ctx : StepContext
        The run's context (model, optimizer and its state, rate, clipping).
    x : ndarray
        Inputs ``[N, D]`` in the model's dtype (validated by ``train``).
    y : ndarray
        Targets as ``fastlib.losses.validate_targets`` normalised them.
    order : ndarray or None
        The epoch's sample order (None: 0..N-1).

    Returns
    -------
    EpochStats or None
    """
    plan = plan_for(ctx)
    if plan is None or x.ndim != 2:
        return None
    dtype = plan.dtype
    n = x.shape[0]
    bs = ctx.config.batch_size
    if order is None:
        order = np.arange(n, dtype=np.int64)
    if plan.loss_code == CE:
        yi, yf = np.ascontiguousarray(y, dtype=np.int64).reshape(-1), np.zeros((0, 0), dtype)
    else:
        yi, yf = np.zeros(0, np.int64), np.ascontiguousarray(y, dtype=dtype).reshape(n, -1)
    params, opt, state = ctx.params, ctx.optimizer, ctx.opt_state
    w = _flatten(params, plan.names, dtype)
    slots = [_flatten(state.slots[s], plan.names, dtype) for s in opt.state_names]
    while len(slots) < 2:
        slots.append(np.zeros(0, dtype))
    g = np.zeros_like(w)
    dims = plan.dims
    acts = np.zeros(bs * (int(dims[0]) + 2 * int(dims[1:].sum())), dtype)
    grads = np.zeros(bs * int(dims[1:].sum()), dtype)
    n_batches = -(-n // bs)
    coeffs = opt.coefficient_table(state.t + 1, n_batches, ctx.lr, dtype)
    clip = ctx.config.gradient_clip
    clip_mode = CLIP_NONE if clip == 0 else (CLIP_VALUE if ctx.config.clip_mode == "value"
                                             else CLIP_NORM)
    loss_sum, correct, skipped, updates, diverged, bad_loss = _epoch(
        x, yi, yf, np.ascontiguousarray(order, dtype=np.int64), bs, dims, plan.codes,
        dtype.type(plan.slope), plan.loss_code, opt.kind, coeffs, clip_mode, float(clip), w,
        slots[0], slots[1], g, acts, grads, FUSED_UPDATE_CHUNKS)
    _unflatten(w, params, plan.names)
    for s, flat in zip(opt.state_names, slots):
        _unflatten(flat, state.slots[s], plan.names)
    state.t += int(updates)
    batches_run = n_batches if diverged < 0 else diverged + 1
    ctx.step += batches_run
    samples = n if diverged < 0 else diverged * bs
    stats = EpochStats(loss_sum=float(loss_sum),
                       correct=None if ctx.loss_type == "mse" else float(correct),
                       count=samples, skipped=int(skipped), diverged_batch=int(diverged),
                       diverged_loss=float(bad_loss), fused=True)
    return stats
