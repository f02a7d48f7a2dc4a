"""`verigrad bench ops`: fastlib's kernels and layers against plain NumPy code for the same math.

Every op of the table is timed forward and VJP in float32, twice: the kernels alone (inputs
validated once through ``fastlib.ops.bind``) and the public entry points ``fastlib.forward`` /
``fastlib.vjp`` (validation included), on sizes that matter: activations, binary ops and
reductions on 1e6 elements, matmul 64x784 @ 784x128, softmax / log_softmax / layer_norm /
rms_norm on 64x1024, losses on 256x10. The NumPy column is the straightforward vectorised
NumPy (and ``scipy.special.erf`` for GELU) a user would otherwise write. The ratio is the
kernels' time over NumPy's (below 1: fastlib is faster); the api ratio adds the validation,
which matters only for tiny inputs (the 256x10 losses: ~10 us per call).

The long story: docs/reports-bench.md, section ``reports/bench/ops.py``.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from reports.bench import environment

F32 = np.float32


# --- NumPy baselines -------------------------------------------------------------------------

def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _erf(x):
    from scipy.special import erf
    return erf(x)


_C = F32(np.sqrt(2 / np.pi))
_A = F32(0.044715)
_S2 = F32(np.sqrt(2.0))


def _gelu_tanh_vjp(x, g):
    u = _C * (x + _A * x**3)
    t = np.tanh(u)
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * _A * x * x))


def _gelu_vjp(x, g):
    return g * (0.5 * (1 + _erf(x / _S2)) + x * np.exp(-0.5 * x * x) / F32(np.sqrt(2 * np.pi)))


# name -> (numpy forward(*inputs), numpy vjp(*inputs, g) -> tuple)
UNARY_NUMPY = {
    "neg": (lambda x: -x, lambda x, g: (-g,)),
    "exp": (np.exp, lambda x, g: (g * np.exp(x),)),
    "log": (np.log, lambda x, g: (g / x,)),
    "sqrt": (np.sqrt, lambda x, g: (g * 0.5 / np.sqrt(x),)),
    "square": (np.square, lambda x, g: (2 * g * x,)),
    "abs": (np.abs, lambda x, g: (g * np.sign(x),)),
    "relu": (lambda x: np.maximum(x, 0), lambda x, g: (g * (x > 0),)),
    "leaky_relu": (lambda x: np.where(x > 0, x, F32(0.01) * x),
                   lambda x, g: (np.where(x > 0, g, F32(0.01) * g),)),
    "silu": (lambda x: x * _sigmoid(x),
             lambda x, g: ((lambda s: g * s * (1 + x * (1 - s)))(_sigmoid(x)),)),
    "gelu": (lambda x: 0.5 * x * (1 + _erf(x / _S2)), lambda x, g: (_gelu_vjp(x, g),)),
    "gelu_tanh": (lambda x: 0.5 * x * (1 + np.tanh(_C * (x + _A * x**3))),
                  lambda x, g: (_gelu_tanh_vjp(x, g),)),
    "tanh": (np.tanh, lambda x, g: (g * (1 - np.tanh(x) ** 2),)),
    "sigmoid": (_sigmoid, lambda x, g: ((lambda s: g * s * (1 - s))(_sigmoid(x)),)),
    "softplus": (lambda x: np.logaddexp(F32(0), x), lambda x, g: (g * _sigmoid(x),)),
    "identity": (lambda x: x.copy(), lambda x, g: (g.copy(),)),
}

BINARY_NUMPY = {
    "add": (np.add, lambda a, b, g: (g.copy(), g.copy())),
    "sub": (np.subtract, lambda a, b, g: (g.copy(), -g)),
    "mul": (np.multiply, lambda a, b, g: (g * b, g * a)),
    "div": (np.divide, lambda a, b, g: (g / b, -g * a / (b * b))),
    "maximum": (np.maximum, lambda a, b, g: (g * (a >= b), g * (a < b))),
}


def _lse(x, axis=None, keepdims=False):
    m = x.max(axis=axis, keepdims=True)
    out = m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
    return out if keepdims else np.squeeze(out, axis=axis)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x, eps=F32(1e-5)):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)


def _layer_norm_vjp(x, g, eps=F32(1e-5)):
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    y = (x - mu) * r
    return (r * (g - g.mean(-1, keepdims=True) - y * (g * y).mean(-1, keepdims=True)),)


def _rms_norm_vjp(x, g, eps=F32(1e-6)):
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    y = x * r
    return (r * (g - y * (g * y).mean(-1, keepdims=True)),)


def _ce(z, t):
    return np.mean(_lse(z, -1) - z[np.arange(z.shape[0]), t])


def _ce_vjp(z, t, g):
    p = _softmax(z)
    p[np.arange(z.shape[0]), t] -= 1
    return (p * (g / z.shape[0]), None)


def _bce_logits(z, t):
    return np.mean(np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z))))


# --- NumPy layers (the baselines of the layer rows) ---------------------------------------

def _np_sigmoid(z):
    return 1 / (1 + np.exp(-z))


class LSTM_NUMPY:
    """A straightforward NumPy LSTM with fastlib's layout (gates i, f, g, o; h0 = c0 = 0;
    batch-major input (B, T, I), every hidden state returned): the input projections of all
    steps as one GEMM, then the recurrence step by step; the backward goes through time and
    forms each weight gradient with one GEMM over the sequence."""

    @staticmethod
    def forward(x, w_ih, w_hh, b):
        batch, steps, n_in = x.shape
        hid = w_hh.shape[0]
        xt = np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(steps * batch, n_in)
        xw = (xt @ w_ih + b).reshape(steps, batch, 4 * hid)
        gates = np.empty((steps, batch, 4 * hid), x.dtype)
        cs = np.empty((steps, batch, hid), x.dtype)
        tcs = np.empty_like(cs)
        hs = np.empty_like(cs)
        h = np.zeros((batch, hid), x.dtype)
        c = np.zeros((batch, hid), x.dtype)
        for t in range(steps):
            z = xw[t] + h @ w_hh
            g = gates[t]
            g[:, :2 * hid] = _np_sigmoid(z[:, :2 * hid])
            g[:, 2 * hid:3 * hid] = np.tanh(z[:, 2 * hid:3 * hid])
            g[:, 3 * hid:] = _np_sigmoid(z[:, 3 * hid:])
            c = g[:, hid:2 * hid] * c + g[:, :hid] * g[:, 2 * hid:3 * hid]
            tc = np.tanh(c)
            h = g[:, 3 * hid:] * tc
            cs[t], tcs[t], hs[t] = c, tc, h
        return hs.transpose(1, 0, 2).copy(), (xt, gates, cs, tcs, hs)

    @staticmethod
    def backward(dy, w_ih, w_hh, cache):
        xt, gates, cs, tcs, hs = cache
        steps, batch, hid = hs.shape
        dhs = dy.transpose(1, 0, 2)
        dz = np.empty_like(gates)
        dh = np.zeros((batch, hid), dy.dtype)
        dc = np.zeros((batch, hid), dy.dtype)
        for t in range(steps - 1, -1, -1):
            g = gates[t]
            i, f, gg, o = g[:, :hid], g[:, hid:2 * hid], g[:, 2 * hid:3 * hid], g[:, 3 * hid:]
            tc = tcs[t]
            dh = dhs[t] + dh
            dc = dh * o * (1 - tc * tc) + dc
            d = dz[t]
            d[:, :hid] = dc * gg * i * (1 - i)
            d[:, hid:2 * hid] = (dc * cs[t - 1] * f * (1 - f)) if t else 0
            d[:, 2 * hid:3 * hid] = dc * i * (1 - gg * gg)
            d[:, 3 * hid:] = dh * tc * o * (1 - o)
            dc = dc * f
            dh = d @ w_hh.T
        dz2 = dz.reshape(steps * batch, 4 * hid)
        grads = {"w_ih": xt.T @ dz2, "w_hh": hs[:-1].reshape(-1, hid).T @ dz2[batch:],
                 "b": dz2.sum(0)}
        dx = (dz2 @ w_ih.T).reshape(steps, batch, -1).transpose(1, 0, 2).copy()
        return dx, grads


class MHA_NUMPY:
    """Straightforward NumPy multi-head self-attention with fastlib's layout: projections as
    GEMMs, heads as a (B, heads, T, dh) view, batched ``np.matmul`` for scores and values, the
    probabilities kept for the backward; the causal mask sends masked scores to -inf."""

    @staticmethod
    def forward(x, p, heads, causal):
        batch, steps, d = x.shape
        dh = d // heads
        x2 = x.reshape(batch * steps, d)

        def split(m):
            return m.reshape(batch, steps, heads, dh).transpose(0, 2, 1, 3)

        q, k, v = (split(x2 @ p[f"w_{n}"] + p[f"b_{n}"]) for n in "qkv")
        scale = x.dtype.type(1 / np.sqrt(dh))
        s = (q @ k.transpose(0, 1, 3, 2)) * scale
        if causal:
            s = np.where(np.tri(steps, dtype=bool), s, -np.inf)
        s -= s.max(-1, keepdims=True)
        pr = np.exp(s)
        pr /= pr.sum(-1, keepdims=True)
        att = (pr @ v).transpose(0, 2, 1, 3).reshape(batch * steps, d)
        y = att @ p["w_o"] + p["b_o"]
        return y.reshape(batch, steps, d), (x2, q, k, v, pr, att, scale)

    @staticmethod
    def backward(dy, p, heads, cache):
        x2, q, k, v, pr, att, scale = cache
        batch, _, steps, dh = q.shape
        d = heads * dh
        g = dy.reshape(batch * steps, d)
        grads = {"w_o": att.T @ g, "b_o": g.sum(0)}
        datt = (g @ p["w_o"].T).reshape(batch, steps, heads, dh).transpose(0, 2, 1, 3)
        dv = pr.transpose(0, 1, 3, 2) @ datt
        dp = datt @ v.transpose(0, 1, 3, 2)
        ds = pr * (dp - (dp * pr).sum(-1, keepdims=True)) * scale
        dq = ds @ k
        dk = ds.transpose(0, 1, 3, 2) @ q
        dx = None
        for n, dm in zip("qkv", (dq, dk, dv)):
            dm2 = dm.transpose(0, 2, 1, 3).reshape(batch * steps, d)
            grads[f"w_{n}"] = x2.T @ dm2
            grads[f"b_{n}"] = dm2.sum(0)
            part = dm2 @ p[f"w_{n}"].T
            dx = part if dx is None else dx + part
        return dx.reshape(batch, steps, d), grads


def _dense_gemms(x, w, g):
    """The GEMMs of a Dense step, bare: forward, input gradient, weight gradient."""
    return x @ w, g @ w.T, x.T @ g


# --- cases ---------------------------------------------------------------------------------

SIZES = {
    # name: (elements, matmul (m, k, n), rows x cols of the row-wise ops, transpose side,
    #        Dense (batch, in, out), LSTM / attention (batch, seq, width), attention heads)
    "full": (1_000_000, (64, 784, 128), (64, 1024), 1000, (64, 784, 128), (32, 64, 128), 4),
    "small": (4096, (4, 12, 6), (4, 32), 64, (4, 12, 6), (2, 5, 8), 2),
}


def cases(rng, size="full"):
    """(label, op, inputs, params, numpy forward, numpy vjp) for every benchmarked op row."""
    n, (mm, mk, mn), (rr, rc), side, _, _, _ = SIZES[size]
    x = rng.standard_normal(n).astype(F32)
    xpos = (np.abs(x) + F32(0.1)).astype(F32)
    out = []
    for name, (fwd, bwd) in UNARY_NUMPY.items():
        inp = xpos if name in ("log", "sqrt") else x
        out.append((f"{name}", name, [inp], {}, fwd, bwd))
    b = rng.standard_normal(n).astype(F32)
    bnz = (np.sign(b) * (np.abs(b) + F32(0.5))).astype(F32)
    for name, (fwd, bwd) in BINARY_NUMPY.items():
        out.append((name, name, [x, bnz if name == "div" else b], {}, fwd, bwd))
    half = side // 2
    m2 = x[:side * side].reshape(side, side)
    bias = rng.standard_normal(side).astype(F32)
    out.append((f"add ({side}x{side} + bias)", "add", [m2, bias], {}, np.add,
                lambda a, c, g: (g.copy(), g.sum(0))))
    out += [
        ("sum", "sum", [x], {}, np.sum,
         lambda x, g: (np.broadcast_to(g, x.shape).copy(),)),
        ("mean", "mean", [x], {}, np.mean,
         lambda x, g: (np.broadcast_to(g / x.size, x.shape).copy(),)),
        ("logsumexp", "logsumexp", [x], {}, _lse,
         lambda x, g: (g * np.exp(x - _lse(x)),)),
        (f"sum axis=0 ({side}x{side})", "sum", [m2], {"axis": 0}, lambda v: v.sum(0),
         lambda v, g: (np.broadcast_to(g, v.shape).copy(),)),
    ]
    a = rng.standard_normal((mm, mk)).astype(F32)
    w = (rng.standard_normal((mk, mn)) / np.sqrt(mk)).astype(F32)
    out.append((f"matmul {mm}x{mk} @ {mk}x{mn}", "matmul", [a, w], {}, np.matmul,
                lambda a, w, g: (g @ w.T, a.T @ g)))
    r = rng.standard_normal((rr, rc)).astype(F32)
    out += [
        (f"softmax {rr}x{rc}", "softmax", [r], {}, _softmax,
         lambda x, g: ((lambda y: y * (g - (g * y).sum(-1, keepdims=True)))(_softmax(x)),)),
        (f"log_softmax {rr}x{rc}", "log_softmax", [r], {}, lambda x: x - _lse(x, -1, True),
         lambda x, g: (g - _softmax(x) * g.sum(-1, keepdims=True),)),
        (f"layer_norm {rr}x{rc}", "layer_norm", [r], {}, _layer_norm, _layer_norm_vjp),
        (f"rms_norm {rr}x{rc}", "rms_norm", [r], {},
         lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + F32(1e-6)), _rms_norm_vjp),
    ]
    z = rng.standard_normal((256, 10)).astype(F32)
    t = rng.integers(0, 10, 256)
    onehot = np.eye(10, dtype=F32)[t]
    p = _sigmoid(z).astype(F32)
    tb = (rng.random((256, 10)) < 0.5).astype(F32)
    g0 = F32(1.0)
    out += [
        ("mse 256x10", "mse", [z, onehot], {}, lambda p, q: np.mean((p - q) ** 2),
         lambda p, q, g: (lambda d: (d, -d))(2 * (p - q) * (g / p.size))),
        ("cross_entropy 256x10", "cross_entropy", [z, t], {}, _ce, _ce_vjp),
        ("categorical_cross_entropy 256x10", "categorical_cross_entropy", [z, onehot], {},
         lambda z, q: -np.mean((q * (z - _lse(z, -1, True))).sum(-1)),
         lambda z, q, g: ((_softmax(z) - q) * (g / z.shape[0]),
                          -(z - _lse(z, -1, True)) * (g / z.shape[0]))),
        ("binary_cross_entropy 256x10", "binary_cross_entropy", [p, tb], {},
         lambda p, q: -np.mean(q * np.log(p) + (1 - q) * np.log1p(-p)),
         lambda p, q, g: ((p - q) / (p * (1 - p)) * (g / p.size),
                          (np.log1p(-p) - np.log(p)) * (g / p.size))),
        ("binary_cross_entropy_with_logits 256x10", "binary_cross_entropy_with_logits",
         [z, tb], {}, _bce_logits,
         lambda z, q, g: ((_sigmoid(z) - q) * (g / z.size), -z * (g / z.size))),
    ]
    out += [
        (f"transpose {side}x{side}", "transpose", [m2], {}, lambda v: np.ascontiguousarray(v.T),
         lambda v, g: (np.ascontiguousarray(g.T),)),
        (f"reshape {n:.0e}".replace("e+0", "e"), "reshape", [x], {"shape": (side, n // side)},
         lambda v: v.reshape(side, n // side).copy(), lambda v, g: (g.reshape(v.shape).copy(),)),
        (f"concat 2 x {side}x{half}", "concat", [m2[:, :half].copy(), m2[:, half:].copy()],
         {"axis": 1}, lambda u, v: np.concatenate([u, v], 1),
         lambda u, v, g: (g[:, :half].copy(), g[:, half:].copy())),
        (f"slice {n:.0e} ::2".replace("e+0", "e"), "slice", [x], {"step": 2},
         lambda v: v[::2].copy(),
         lambda v, g: (lambda o: (o.__setitem__(slice(None, None, 2), g), o)[1])(
             np.zeros_like(v))),
    ]
    for row in out:
        row[2][:] = [np.ascontiguousarray(v) for v in row[2]]
    return out, g0


def _check_close(what, got, ref, tol=2e-4):
    """Raise if ``got`` differs from ``ref`` by more than ``tol`` of the largest |ref| entry of
    its group (float32 rounding; a relative test per entry would fail on exact zeros, e.g. the
    key bias gradient of attention, which is zero up to rounding)."""
    scale = max(float(np.max(np.abs(r))) for r in ref.values())
    for key, r in ref.items():
        err = float(np.max(np.abs(np.asarray(got[key], np.float64) - r)))
        if not err <= tol * scale:
            raise AssertionError(f"bench ops: {what}: the NumPy baseline and the layer differ "
                                 f"in {key} by {err:.3g} (scale {scale:.3g}); the comparison "
                                 f"would not be of the same computation")


def layer_cases(rng, size="full"):
    """(label, direction, kernel fn, api fn or None, numpy fn, requirement) for the layers.

    Each NumPy baseline is checked once against the layer's outputs and gradients (untimed).
    """
    import fastlib

    _, _, _, _, (db, din, dout), (batch, seq, width), heads = SIZES[size]
    rows = []
    # Dense forward + backward against its bare GEMMs
    dense = fastlib.Dense(din, dout, "relu", seed=0)
    xd = rng.standard_normal((db, din)).astype(F32)
    gd = rng.standard_normal((db, dout)).astype(F32)
    wd = dense.parameters()["weight"]

    def dense_step():
        dense.forward(xd)
        return dense.backward(gd)

    def dense_step_api():
        dense(xd)
        return dense.backward(gd)

    rows.append((f"Dense {din}->{dout} relu, batch {db}", "fwd+bwd", dense_step, dense_step_api,
                 lambda: _dense_gemms(xd, wd, gd), 1.5))

    # LSTM
    x = rng.standard_normal((batch, seq, width)).astype(F32)
    dy = rng.standard_normal((batch, seq, width)).astype(F32)
    lstm = fastlib.LSTM(width, width, return_sequences=True, seed=0)
    lp = lstm.parameters()
    lp["b"][:] = rng.standard_normal(lp["b"].shape) * 0.1    # a non-zero bias, in place
    y = lstm.forward(x)
    dx, grads = lstm.backward(dy)
    y_np, cache = LSTM_NUMPY.forward(x, lp["w_ih"], lp["w_hh"], lp["b"])
    dx_np, grads_np = LSTM_NUMPY.backward(dy, lp["w_ih"], lp["w_hh"], cache)
    label = f"LSTM {width}->{width}, batch {batch} seq {seq}"
    _check_close(label + " forward", {"y": y}, {"y": y_np})
    _check_close(label + " backward", dict(grads, x=dx), dict(grads_np, x=dx_np))
    rows.append((label, "forward", lambda: lstm.forward(x), lambda: lstm(x),
                 lambda: LSTM_NUMPY.forward(x, lp["w_ih"], lp["w_hh"], lp["b"]), 1.0))
    rows.append((label, "backward", lambda: lstm.backward(dy), None,
                 lambda: LSTM_NUMPY.backward(dy, lp["w_ih"], lp["w_hh"], cache), 1.0))

    # multi-head attention, without and with the causal mask
    for causal in (False, True):
        mha = fastlib.MultiHeadAttention(width, heads, causal=causal, seed=0)
        mp = mha.parameters()
        for key in mp:
            if key.startswith("b_"):
                mp[key][:] = rng.standard_normal(width) * 0.1
        y = mha.forward(x)
        dx, grads = mha.backward(dy)
        y_np, mcache = MHA_NUMPY.forward(x, mp, heads, causal)
        dx_np, grads_np = MHA_NUMPY.backward(dy, mp, heads, mcache)
        label = (f"MHA d{width} h{heads}{' causal' if causal else ''}, batch {batch} "
                 f"seq {seq}")
        _check_close(label + " forward", {"y": y}, {"y": y_np})
        _check_close(label + " backward", dict(grads, x=dx), dict(grads_np, x=dx_np))
        rows.append((label, "forward", lambda m=mha: m.forward(x),
                     lambda m=mha: m(x),
                     lambda m=mp, c=causal: MHA_NUMPY.forward(x, m, heads, c), 1.0))
        rows.append((label, "backward", lambda m=mha: m.backward(dy), None,
                     lambda m=mp, c=mcache: MHA_NUMPY.backward(dy, m, heads, c), 1.0))
    return rows


# --- timing --------------------------------------------------------------------------------

def _best_times(fns, repeat, target=0.005):
    """Best over ``repeat`` rounds of the mean time of enough calls to last ``target`` seconds,
    for each callable; within a round the callables run in turn (interleaved), so that load
    from elsewhere disturbs them alike."""
    numbers = []
    for fn in fns:
        fn()
        start = time.perf_counter()
        fn()
        once = max(time.perf_counter() - start, 1e-7)
        numbers.append(max(1, int(target / once)))
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, (fn, number) in enumerate(zip(fns, numbers)):
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best[i] = min(best[i], (time.perf_counter() - start) / number)
    return best


def _row(case, op, direction, shapes, t_kernel, t_api, t_np, requirement):
    return {"case": case, "op": op, "direction": direction, "shapes": shapes,
            "dtype": "float32", "kernel_ms": t_kernel * 1e3,
            "api_ms": None if t_api is None else t_api * 1e3, "numpy_ms": t_np * 1e3,
            "ratio": t_kernel / t_np, "api_ratio": None if t_api is None else t_api / t_np,
            "requirement": requirement}


def measure(repeat=5, only=None, seed=0, size="full", layers=True):
    """Time every case forward and VJP, and the layers; a list of result rows (dicts)."""
    import fastlib
    from fastlib.ops import bind

    rng = np.random.default_rng(seed)
    rows = []
    table, _ = cases(rng, size)
    for label, name, inputs, params, np_fwd, np_vjp in table:
        if only and name not in only and label not in only:
            continue
        out = fastlib.forward(name, inputs, **params)
        g = rng.standard_normal(out.shape).astype(F32)
        bound = bind(name, inputs, **params)
        shape = " ".join("x".join(map(str, v.shape)) or "()" for v in inputs)
        fwd = _best_times([bound.forward, lambda: fastlib.forward(name, inputs, **params),
                           lambda: np_fwd(*inputs)], repeat)
        vjp = _best_times([lambda: bound.vjp(g, check=False),
                           lambda: fastlib.vjp(name, inputs, g, **params),
                           lambda: np_vjp(*inputs, g)], repeat)
        rows.append(_row(label, name, "forward", shape, *fwd, 1.0))
        rows.append(_row(label, name, "vjp", shape, *vjp, 1.0))
    if layers:
        for label, direction, kernel, api, numpy_fn, req in layer_cases(rng, size):
            first = label.split()[0].lower()
            if only and label not in only and first not in only:
                continue
            fns = [kernel, numpy_fn] if api is None else [kernel, numpy_fn, api]
            times = _best_times(fns, max(1, repeat // 3) if size == "full" else repeat,
                                target=0.02)
            t_api = times[2] if api is not None else None
            rows.append(_row(label, first, direction, "", times[0], t_api, times[1], req))
    return rows


_STARTUP = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import fastlib
t1 = time.perf_counter()
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 784)).astype(np.float32)
dense = fastlib.Dense(784, 128, "relu")
y = dense(x)
gx, grads = dense.backward(np.ones_like(y))
t2 = time.perf_counter()
w = rng.standard_normal((784, 128)).astype(np.float32)
b = np.zeros(128, np.float32)
z = fastlib.forward("matmul", [x, w]); a = fastlib.forward("add", [z, b])
y = fastlib.forward("relu", [a]); g = np.ones_like(y)
(ga,) = fastlib.vjp("relu", [a], g); gz, gb = fastlib.vjp("add", [z, b], ga)
gx, gw = fastlib.vjp("matmul", [x, w], gz)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "dense_step_s": t2 - t1, "op_step_s": t3 - t2}))
"""


def startup_times():
    """Cold and warm start (import, first Dense layer step, first op-level step) in fresh
    subprocesses sharing one new Numba cache directory."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = {}
    with tempfile.TemporaryDirectory(prefix="verigrad-numba-cache-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache,
                   PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for label in ("cold", "warm"):
            proc = subprocess.run([sys.executable, "-c", _STARTUP], env=env, cwd=root,
                                  capture_output=True, text=True, check=True)
            result[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _fmt(value, spec):
    return format(value, spec) if value is not None else format("-", ">" + spec.split(".")[0])


def render(rows, startup=None):
    """The table as text, at most 100 columns (a case label longer than its column pushes its
    row wider)."""
    from reports.commands.tables import wrap

    head = (f"{'case':39s} {'dir':8s} {'kernel ms':>9s} {'api ms':>8s} {'numpy ms':>8s} "
            f"{'ratio':>5s} {'api':>5s} {'req':>5s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        flag = "" if r["ratio"] <= r["requirement"] else " FAILS"
        lines.append(f"{r['case']:39s} {r['direction']:8s} {r['kernel_ms']:9.4f} "
                     f"{_fmt(r['api_ms'], '8.4f')} {r['numpy_ms']:8.4f} {r['ratio']:5.2f} "
                     f"{_fmt(r['api_ratio'], '5.2f')} {'<=' + format(r['requirement'], 'g'):>5s}"
                     f"{flag}")
    failing = [r for r in rows if r["ratio"] > r["requirement"]]
    lines.append("-" * len(head))
    lines.append(wrap(f"{len(rows)} rows; {len(failing)} miss their requirement (req). ratio = "
                      f"kernel time / NumPy time (inputs validated once, fastlib.ops.bind; "
                      f"layers: their forward / backward); api = fastlib.forward / vjp (layers: "
                      f"layer(x)) with validation, over NumPy; float32"))
    if startup:
        for label in ("cold", "warm"):
            s = startup[label]
            lines.append(wrap(f"{label} start: import fastlib {s['import_s']:.3f} s, first Dense "
                              f"layer step (forward + backward) {s['dense_step_s']:.3f} s, first "
                              f"op-level step (forward + VJP) {s['op_step_s']:.3f} s",
                              indent="  "))
    return "\n".join(lines)


def add_arguments(parser):
    """Options of ``verigrad bench ops``."""
    from reports.commands import arguments as shared

    shared.add_json(parser, help="also write the rows as JSON to FILE")
    shared.add_repeats(parser, 15, help="timing repeats per measurement; the best is kept (the "
                                        "layer rows use a third as many, each a longer run)")
    shared.add_ops(parser, help="benchmark only these ops (names or case labels; dense, lstm, "
                                "mha for the layers)")
    parser.add_argument("--no-layers", action="store_true",
                        help="skip the layer rows (Dense, LSTM, MultiHeadAttention)")
    parser.add_argument("--no-startup", action="store_true",
                        help="skip the cold / warm start measurement (two subprocesses)")
    shared.add_thread_counts(parser, default=None,
                             help="threads for the parallel kernels and, through threadpoolctl, "
                                  "for the BLAS pools; several counts (1,2,4) measure each in "
                                  "its own process, one table each",
                             default_text="kernels on the idle cores, BLAS as configured")
    parser.add_argument("--small", action="store_true",
                        help="tiny sizes: checks that every row runs (timings meaningless)")
    shared.add_progress(parser, "status line while timing")


LAYER_FAMILIES = ("dense", "lstm", "mha")   # the first word of a layer row's label, lower case


def validate(args):
    """``--ops`` names only ops, case labels or layer families that have rows (None), or the
    usage error (``verigrad bench`` calls it before any timing)."""
    from reports.commands import checks

    if not args.ops:
        return None
    table, _ = cases(np.random.default_rng(0), "small" if args.small else "full")
    valid = [row[1] for row in table] + [row[0] for row in table] + list(LAYER_FAMILIES)
    given = [n for n in args.ops if n.split()[0].lower() not in LAYER_FAMILIES]
    return checks.unknown_names(given, valid, "--ops", "op")


def run(args) -> int:
    """Run the benchmark, print the table, write JSON if asked; exit code 0 (1 when a thread
    count's process failed)."""
    if args.threads and len(args.threads) > 1:
        return _run_counts(args)
    return _run_one(args, args.threads[0] if args.threads else None)


def _run_one(args, threads) -> int:
    import numba

    from fastlib import config
    from reports.commands.arguments import progress_enabled
    from reports.commands.progress import ProgressLine

    blas_limit = contextlib.nullcontext()
    if threads:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        config.THREADS = threads
        try:     # the BLAS pools too (NumPy's, and SciPy's that np.dot in Numba calls)
            from threadpoolctl import threadpool_limits
            blas_limit = threadpool_limits(threads, user_api="blas")
        except ImportError:
            pass
    progress = ProgressLine(enabled=progress_enabled(args))
    with blas_limit:
        env = environment.environment()
        print("\n".join(environment.header_lines(env)), flush=True)
        progress.update("timing the ops" + ("" if args.no_layers else " and the layers") + " ...")
        rows = measure(repeat=args.repeats, only=set(args.ops) if args.ops else None,
                       size="small" if args.small else "full", layers=not args.no_layers)
    if not args.no_startup:
        progress.update("timing a cold and a warm start (two processes) ...")
    startup = None if args.no_startup else startup_times()
    progress.clear()
    print(render(rows, startup))
    if args.json:
        meta = {"threads": threads or "idle cores (adaptive)",
                "numba_threads": numba.get_num_threads(),
                "size": "small" if args.small else "full", "environment": env,
                "loadavg": open("/proc/loadavg").read().split()[:4]
                if os.path.exists("/proc/loadavg") else None}
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "startup": startup, "meta": meta}, fh, indent=2)
    return 0


def child_command(args, threads, out):
    """The ``verigrad bench ops`` command line that measures one thread count into ``out``."""
    argv = [sys.executable, "-m", "reports", "bench", "ops", "--repeats", str(args.repeats),
            "--threads", str(threads), "--json", out, "--no-progress"]
    if args.ops:
        argv += ["--ops", *args.ops]
    argv += [flag for flag, on in (("--no-layers", args.no_layers),
                                   ("--no-startup", args.no_startup),
                                   ("--small", args.small)) if on]
    return argv


def _run_counts(args) -> int:
    """Several ``--threads`` counts: each in its own process (thread pools are sized when a
    library starts), one table each, and one JSON holding every count's."""
    from reports.bench.scaling import child_environment

    runs, code = {}, 0
    for n in args.threads:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "ops.json")
            proc = subprocess.run(child_command(args, n, out),
                                  env=child_environment(n, environment.usable_cores()),
                                  capture_output=True, text=True)
            print(f"--threads {n}:")
            if proc.returncode == 0 and os.path.exists(out):
                print(proc.stdout.rstrip(), flush=True)
                with open(out) as fh:
                    runs[str(n)] = json.load(fh)
            else:
                code = 1
                why = (proc.stderr or proc.stdout).strip()[-1500:]
                print(f"FAILED at {n} threads: exit {proc.returncode}: {why}", flush=True)
                runs[str(n)] = {"error": f"exit {proc.returncode}: {why}"}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"threads": list(args.threads), "runs": runs}, fh, indent=2)
    return code
