"""fastlib.cuda under numba's CUDA simulator: every check in one process, one JSON line each.

Run by tests/test_cuda.py in a subprocess whose environment has ``NUMBA_ENABLE_CUDASIM=1``: the
variable is read when numba is first imported, and the pytest process may already have imported
numba without it. Standalone::

    NUMBA_ENABLE_CUDASIM=1 python tests/cuda_sim_check.py [--only SUBSTRING]

On a GPU, without the variable, it runs the groups of :data:`DEVICE_GROUPS` (the GEMM's
operand loads and split) on the device.

Each line is ``{"check": name, "ok": bool, "detail": str}``. :func:`check_names` lists every
name without running anything, so the pytest side can parametrize over the full list and a
check that never reports fails instead of vanishing.

References are independent of the code under test:

- ops: ``reflib.forward / reflib.vjp`` evaluated exactly (mpmath, 40 digits). Inputs are drawn
  as float32 numbers, so one exact reference serves both dtypes;
- kink conventions: values derived by hand from docs/CONTRACTS.md;
- device-function twins: the CPU scalars of ``fastlib/kernels/scalar.py`` (their Python bodies);
- optimizers: DataCode's update table written out below in float64 NumPy (NAG in its original
  form, compared through the look-ahead substitution w~ = w - beta v), and fastlib.optim's CPU
  kernels;
- Dense: NumPy float64 GEMMs plus the exact activation from reflib.

Tolerances. Every comparison is elementwise, ``|got - exact| <= tol``, with

    tol = eps(dtype) * |exact|        (the final rounding; only for kernels that compute in float64)
        + c * eps(kind) * S           (the computation's own error)

where ``kind`` is float64 for kernels that widen to float64 internally (activations, reductions,
normalisations, losses) and the dtype for kernels that compute in the dtype (binary ops, GEMM),
``S`` is the op's error scale (the magnitude of the terms the kernel adds; for a sum, sum |x_i|),
and ``c`` a small count of roundings derived next to each op below; plus the dtype's smallest
subnormal, the absolute error of rounding a result that underflows. Structure ops copy values,
so they must match exactly (tol = 0).
"""
from __future__ import annotations

import json
import math
import os
import sys
import traceback

import numpy as np
from numba import cuda  # a module global: the simulator swaps it inside simulated kernels

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # checkout
import optable  # noqa: E402  (the op table: NumPy only, no device needed)

E64 = 2.0 ** -52
EPS = {"float32": 2.0 ** -23, "float64": E64}
DTYPES = ("float32", "float64")
DPS = 40
# The saturation cases need more digits: the reference forms 1 - tanh^2, s (1 - s) and
# (1 + erf) / 2 cancel down to values like 1e-196, which 40 digits cannot resolve.
DPS_TAILS = 320

# ---------------------------------------------------------------------------------------------
# input cases: tiny shapes (the simulator runs each CUDA thread as a Python thread)

UNARY = optable.names(category="unary")                    # the op table's groups
BINARY = optable.names(category="binary")
POSITIVE = tuple(n for n in UNARY if optable.OPS[n].domains["x"] == "positive")


def _f32(a):
    """Values representable in float32, held as float64: one exact reference for both dtypes."""
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def _uniform(rng, lo, hi, shape):
    return _f32(rng.uniform(lo, hi, shape))


def _signed(rng, lo, hi, shape):
    return _f32(rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape))


def op_cases():
    """[(case name, op, inputs builder(rng), params)] for every op."""
    cases = []
    for name in UNARY:
        lo, hi = (0.1, 4.0) if name in POSITIVE else (-3.0, 3.0)
        cases.append((f"{name}", name, lambda r, lo=lo, hi=hi: [_uniform(r, lo, hi, (2, 3))], {}))
        # tails: saturation and large magnitudes (relative bounds catch a formula that flushes)
        tails = ([1e-6, 0.3, 7.0, 30.0, 80.0] if name in POSITIVE else
                 [-80.0, -30.0, -7.0, -1e-6, 2e-6, 8.0, 31.0, 80.0])
        if name == "exp":
            tails = [-80.0, -30.0, -1e-6, 2e-6, 8.0, 31.0, 80.0]
        cases.append((f"{name}:tails", name, lambda r, t=tails: [_f32(t)], {}))
    cases.append(("leaky_relu:slope=0.2", "leaky_relu",
                  lambda r: [_uniform(r, -3, 3, (5,))], {"negative_slope": 0.2}))
    for name in BINARY:
        b_lo = 0.5 if name == "div" else -2.0
        # "outer" has 48 elements: more than the simulator's grid (4 blocks of 8 threads), so
        # the grid-stride loops run more than once
        for label, sa, sb in (("same", (2, 3), (2, 3)), ("row", (2, 3), (3,)),
                              ("outer", (3, 1, 4), (4, 1)), ("scalar", (3, 2), ())):
            if name == "div":
                build = (lambda r, sa=sa, sb=sb: [_uniform(r, -2, 2, sa), _signed(r, 0.5, 2, sb)])
            else:
                build = (lambda r, sa=sa, sb=sb, lo=b_lo: [_uniform(r, -2, 2, sa),
                                                           _uniform(r, lo, 2, sb)])
            cases.append((f"{name}:{label}", name, build, {}))
    x3 = lambda r: [_uniform(r, -2, 2, (2, 3, 4))]  # noqa: E731
    for name in ("sum", "mean", "logsumexp"):
        for axis, keep in ((None, False), (0, False), (1, True), (2, False), (-1, True),
                           ((0, 2), False), ((0, 1, 2), True)):
            cases.append((f"{name}:axis={axis}:keepdims={keep}", name, x3,
                          {"axis": axis, "keepdims": keep}))
    cases.append(("logsumexp:big", "logsumexp", lambda r: [_f32([[1e4, -1e4, 9999.0],
                                                                 [-1e4, -9999.5, -1e4]])],
                  {"axis": 1}))
    cases.append(("sum:long", "sum", lambda r: [_f32([1.0] + [2.0 ** -25] * 63)], {}))
    for label, sa, sb in (("2d", (3, 4), (4, 5)), ("ragged", (5, 9), (9, 6)),
                          ("batched", (2, 3, 4), (2, 4, 5)), ("shared", (2, 3, 5), (5, 2)),
                          ("batch2x2", (2, 2, 3, 2), (2, 2, 2, 3)),
                          # more tiles / batch items than the simulator's grid: stride loops
                          ("tall", (18, 3), (3, 2)), ("batch5", (5, 2, 3), (5, 3, 2))):
        cases.append((f"matmul:{label}", "matmul",
                      lambda r, sa=sa, sb=sb: [_uniform(r, -2, 2, sa), _uniform(r, -2, 2, sb)],
                      {}))
    for axes in (None, (1, 0, 2), (2, 0, 1)):
        cases.append((f"transpose:{axes}", "transpose", x3, {"axes": axes}))
    for shape in ((4, -1), (24,), (2, 12, 1)):
        cases.append((f"reshape:{shape}", "reshape", x3, {"shape": shape}))
    for label, sa, sb, axis in (("last", (2, 3), (2, 2), -1), ("first", (1, 3), (2, 3), 0),
                                ("middle", (2, 1, 3), (2, 2, 3), 1)):
        cases.append((f"concat:{label}", "concat",
                      lambda r, sa=sa, sb=sb: [_uniform(r, -2, 2, sa), _uniform(r, -2, 2, sb)],
                      {"axis": axis}))
    for label, params in (("step2", {"axis": 0, "start": 1, "stop": 4, "step": 2}),
                          ("negative", {"axis": 1, "start": -3}),
                          ("past-end", {"axis": 1, "start": 1, "stop": 10, "step": 3}),
                          ("empty", {"axis": 0, "start": 3, "stop": 1})):
        cases.append((f"slice:{label}", "slice", lambda r: [_uniform(r, -2, 2, (5, 4))], params))
    for name in ("softmax", "log_softmax"):
        cases.append((f"{name}:last", name, lambda r: [_uniform(r, -3, 3, (6, 4))], {}))
        cases.append((f"{name}:axis1", name, lambda r: [_uniform(r, -3, 3, (2, 3, 2))],
                      {"axis": 1}))
        cases.append((f"{name}:axis0", name, lambda r: [_uniform(r, -3, 3, (3, 2))], {"axis": 0}))
        cases.append((f"{name}:1e4", name, lambda r: [_f32([[1e4, -1e4, 9990.0],
                                                            [-1e4, 0.0, 1e4]])], {}))
    for name in ("layer_norm", "rms_norm"):
        cases.append((f"{name}:2d", name, lambda r: [_uniform(r, -2, 2, (3, 5))], {}))
        cases.append((f"{name}:3d", name, lambda r: [_uniform(r, -2, 2, (2, 2, 4))], {}))
        # |mean| >> std: a one-pass variance (E[x^2] - mean^2) would lose ~1e6 ulps here
        cases.append((f"{name}:offset", name, lambda r: [_uniform(r, 1000, 1001, (2, 6))],
                      {"eps": 1e-3}))
    cases.append(("mse", "mse", lambda r: [_uniform(r, -2, 2, (3, 4)),
                                           _uniform(r, -2, 2, (3, 4))], {}))
    cases.append(("cross_entropy:N1", "cross_entropy",
                  lambda r: [_uniform(r, -3, 3, (6, 3)),
                             np.array([[2], [0], [1], [2], [1], [0]])], {}))
    cases.append(("cross_entropy:float-index", "cross_entropy",
                  lambda r: [_uniform(r, -3, 3, (3, 5)), np.array([4.0, 0.0, 2.0])], {}))
    cases.append(("cross_entropy:1e4", "cross_entropy",
                  lambda r: [_f32([[1e4, -1e4, 0.0], [-1e4, 1e4, 9999.0]]), np.array([1, 2])],
                  {}))
    cases.append(("categorical_cross_entropy:onehot", "categorical_cross_entropy",
                  lambda r: [_uniform(r, -3, 3, (4, 3)), np.eye(3)[[0, 2, 1, 2]]], {}))
    cases.append(("categorical_cross_entropy:soft", "categorical_cross_entropy",
                  lambda r: [_uniform(r, -3, 3, (2, 4)),
                             _f32([[0.25, 0.25, 0.5, 0.0], [0.125, 0.375, 0.25, 0.25]])], {}))
    cases.append(("binary_cross_entropy", "binary_cross_entropy",
                  lambda r: [_uniform(r, 0.05, 0.95, (3, 3)), _uniform(r, 0, 1, (3, 3))], {}))
    cases.append(("binary_cross_entropy:hard", "binary_cross_entropy",
                  lambda r: [_uniform(r, 0.01, 0.99, (6,)), _f32([0, 1, 1, 0, 1, 0])], {}))
    cases.append(("binary_cross_entropy_with_logits", "binary_cross_entropy_with_logits",
                  lambda r: [_uniform(r, -4, 4, (2, 5)), _uniform(r, 0, 1, (2, 5))], {}))
    cases.append(("binary_cross_entropy_with_logits:big", "binary_cross_entropy_with_logits",
                  lambda r: [_f32([-1e4, 50.0, -50.0, 1e4]), _f32([0.0, 1.0, 0.5, 1.0])], {}))
    return cases


# ---------------------------------------------------------------------------------------------
# error scales: (S, c, kind) for the output and each input's cotangent

def _lse_parts(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    lse = m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return m, lse, x.shape[axis]


def _unbroadcast(g, shape):
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    ones = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if ones:
        g = g.sum(axis=ones, keepdims=True)
    return g.reshape(shape)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _unary_terms(name, x, g, exact_grad):
    """Magnitude of the terms of g * f'(x) before they cancel (the derivative's error scale)."""
    if name == "silu":
        s = _sigmoid(x)
        return np.abs(g) * s * (1 + np.abs(x) * (1 - s))
    if name == "gelu":  # (1 + x^2): the argument roundings of erfc and exp(-x^2/2), amplified
        cdf = 0.5 * np.vectorize(math.erfc)(-x / math.sqrt(2))
        return np.abs(g) * (cdf + np.abs(x) * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)) \
            * (1 + x * x)
    if name == "gelu_tanh":
        u2 = 2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        s = _sigmoid(u2)
        du2 = 2 * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x * x)
        return np.abs(g) * (s + np.abs(x) * s * (1 - s) * du2) * (1 + np.abs(u2))
    return np.abs(exact_grad)


def scales(name, inputs, grad, params, out, grads):
    """(S, c, kind) of the forward and of each cotangent; kind 'f64', 'dtype' or 'exact'."""
    a = [np.asarray(v, dtype=np.float64) for v in inputs]
    ab = [np.abs(v) for v in a]
    g = np.asarray(grad, dtype=np.float64)
    if name in UNARY:
        x = a[0]
        s_out = np.abs(out)
        if name == "gelu_tanh":  # sigmoid(2u) amplifies the rounding of u by |2u|
            s_out = s_out * (1 + np.abs(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        if name == "gelu":  # erfc(z) ~ exp(-z^2): the rounding of z = -x/sqrt2 grows by 2z^2
            s_out = s_out * (1 + x * x)
        # 8: libm (<= 2 ulp) plus up to four float64 roundings; 16 for g * f'(x) on top.
        return (s_out, 8, "f64"), [(_unary_terms(name, x, g, grads[0]), 16, "f64")]
    if name in BINARY:
        da = {"add": 1, "sub": 1, "mul": ab[1], "div": 1 / ab[1],
              "maximum": (a[0] >= a[1]) * 1.0}[name]
        db = {"add": 1, "sub": 1, "mul": ab[0], "div": ab[0] / ab[1] ** 2,
              "maximum": (a[0] < a[1]) * 1.0}[name]
        shape = np.broadcast_shapes(a[0].shape, a[1].shape)
        ga = _unbroadcast(np.broadcast_to(np.abs(g) * da, shape), a[0].shape)
        gb = _unbroadcast(np.broadcast_to(np.abs(g) * db, shape), a[1].shape)
        # forward: one correctly rounded op. VJP: up to 3 roundings in the dtype (div's
        # -(a/b)/b * g) and one when the float64 sum over broadcast axes is stored.
        return (np.abs(out), 1, "dtype"), [(ga, 4, "dtype"), (gb, 4, "dtype")]
    if name in ("sum", "mean", "logsumexp"):
        x = a[0]
        axis = params.get("axis")
        axes = tuple(range(x.ndim)) if axis is None else \
            tuple(k % x.ndim for k in (axis if isinstance(axis, tuple) else (axis,)))
        n = int(np.prod([x.shape[k] for k in axes]))
        keep = params.get("keepdims", False)
        if name == "logsumexp":
            m = np.max(x, axis=axes, keepdims=True)
            lse = m + np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True))
            # m + log(s): log of a float64 sum of n terms, each exp with relative error ~u.
            s_out = np.abs(m) + math.log(n) + n
            s_out = s_out if keep else np.squeeze(s_out, axis=axes)
            s_g = np.abs(grads[0]) * (1 + np.abs(x - lse) + np.abs(m) + n)
            return (s_out, 4, "f64"), [(s_g, 4, "f64")]
        s_out = np.sum(ab[0], axis=axes, keepdims=keep) / (n if name == "mean" else 1)
        # float64 accumulation of n terms (serial runs + tree): gamma_n; mean adds its 1/n.
        return (s_out, n + 3, "f64"), [(np.abs(grads[0]), 2, "f64")]
    if name == "matmul":
        A, B = ab
        G = np.abs(g)
        m, k = A.shape[-2:]
        n = B.shape[-1]
        shared = B.ndim == 2 and A.ndim > 2
        s_gb = np.swapaxes(A, -1, -2) @ G
        if shared:
            s_gb = s_gb.reshape(-1, k, n).sum(axis=0)
        batch = int(np.prod(A.shape[:-2])) if shared else 1
        # gamma_k: one rounding per product and per accumulated term, k terms.
        return ((A @ B, k + 1, "dtype"),
                [(G @ np.swapaxes(B, -1, -2), n + 1, "dtype"), (s_gb, m * batch + 1, "dtype")])
    if name in ("transpose", "reshape", "concat", "slice"):
        return (None, 0, "exact"), [(None, 0, "exact") for _ in inputs]
    if name in ("softmax", "log_softmax"):
        x = a[0]
        axis = params.get("axis", -1)
        m, lse, n = _lse_parts(x, axis)
        y = np.exp(x - lse)
        dev = np.abs(x - lse)
        if name == "softmax":
            # exp(x - lse): lse off by ~(|m| + n) u, the difference by |x - lse| u.
            s_out = y * (1 + dev + np.abs(m) + n)
            s_g = y * (np.abs(g) + np.sum(np.abs(g) * y, axis=axis, keepdims=True)) * \
                (n + 1 + dev + np.max(dev, axis=axis, keepdims=True) + np.abs(m))
        else:
            s_out = np.abs(x) + np.abs(lse) + np.abs(m) + n
            s_g = np.abs(g) + y * np.sum(np.abs(g), axis=axis, keepdims=True) * \
                (n + 1 + dev + np.abs(m))
        return (s_out, 4, "f64"), [(s_g, 4, "f64")]
    if name in ("layer_norm", "rms_norm"):
        x = a[0]
        n = x.shape[-1]
        eps = params.get("eps", 1e-5 if name == "layer_norm" else 1e-6)
        if name == "layer_norm":
            d = x - x.mean(axis=-1, keepdims=True)
            s = 1 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)
            # rounding of x and of the mean is amplified by 1 / std: kappa = 1 + max|x| / std
            kappa = 1 + s * np.max(np.abs(x), axis=-1, keepdims=True)
            xhat = d * s
            s_g = s * (np.abs(g) + np.abs(g).mean(axis=-1, keepdims=True)
                       + np.abs(xhat) * np.abs(g * xhat).mean(axis=-1, keepdims=True))
            return ((np.abs(out) + 1) * kappa * n, 4, "f64"), [(s_g * kappa * n, 8, "f64")]
        s = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
        s_g = s * np.abs(g) + np.abs(x) * s ** 3 * np.abs(g * x).mean(axis=-1, keepdims=True)
        return (np.abs(out) * n, 4, "f64"), [(s_g * n, 8, "f64")]
    # losses: scalar output, 0-d cotangent
    sg = abs(float(g)) / (a[0].shape[0] if name in ("cross_entropy",
                                                    "categorical_cross_entropy") else a[0].size)
    if name == "mse":
        n = a[0].size
        return (abs(out), n + 4, "f64"), [(np.abs(grads[0]), 4, "f64"),
                                           (np.abs(grads[1]), 4, "f64")]
    if name in ("cross_entropy", "categorical_cross_entropy"):
        z = a[0]
        rows, c = z.shape
        m, lse, _ = _lse_parts(z, 1)
        y = np.exp(z - lse)
        dev = np.abs(z - lse)
        if name == "cross_entropy":
            idx = np.asarray(inputs[1]).reshape(-1).astype(int)
            onehot = np.eye(c)[idx]
            s_out = np.mean(np.abs(lse[:, 0]) + np.abs(z[np.arange(rows), idx]) + np.abs(m[:, 0])
                            + c) + rows * abs(out)
            return (s_out, 4, "f64"), [(sg * (y + onehot) * (c + 1 + dev + np.abs(m)), 4, "f64"),
                                       None]
        t = ab[1]
        s_out = np.mean(np.sum(t * (np.abs(lse) + np.abs(z) + np.abs(m) + c), axis=1)) + \
            rows * abs(out)
        s_gz = sg * (y * t.sum(axis=1, keepdims=True) + t) * (c + 1 + dev + np.abs(m))
        s_gt = sg * (np.abs(z) + np.abs(lse) + np.abs(m) + c)
        return (s_out, 4 + c, "f64"), [(s_gz, 4 + c, "f64"), (s_gt, 4, "f64")]
    if name == "binary_cross_entropy":
        p, t = a
        n = p.size
        terms = np.abs(t * np.log(p)) + np.abs((1 - t) * np.log1p(-p))
        return ((terms.mean() * (n + 4), 4, "f64"),
                [(np.abs(grads[0]), 8, "f64"),
                 (sg * (np.abs(np.log1p(-p)) + np.abs(np.log(p))), 8, "f64")])
    if name == "binary_cross_entropy_with_logits":
        z, t = a
        n = z.size
        terms = np.maximum(z, 0) + np.abs(z * t) + np.log1p(np.exp(-np.abs(z)))
        return ((terms.mean() * (n + 4), 4, "f64"),
                [(sg * (_sigmoid(z) + np.abs(t)), 8, "f64"), (np.abs(grads[1]), 4, "f64")])
    raise KeyError(name)


def compare(got, exact, scale, c, kind, dtype):
    """(ok, detail): elementwise ``|got - exact| <= tol`` (module docstring)."""
    got = np.asarray(got)
    exact = np.asarray(exact, dtype=np.float64)
    if got.shape != exact.shape:
        return False, f"shape {got.shape} != expected {exact.shape}"
    if got.dtype != np.dtype(dtype):
        return False, f"dtype {got.dtype} != expected {dtype}"
    err = np.abs(got.astype(np.float64) - exact)
    if kind == "exact":
        tol = np.zeros_like(exact)
    else:
        tol = c * EPS["float64" if kind == "f64" else dtype] * np.broadcast_to(scale, exact.shape)
        if kind == "f64":
            tol = tol + EPS[dtype] * np.abs(exact)
        # results below the normal range round to the subnormal grid, not relative to |exact|
        tol = tol + np.finfo(dtype).smallest_subnormal
    if not np.isfinite(got).all():
        return False, f"non-finite result {got.tolist()}"
    bad = err > tol
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        return False, (f"at {i}: got {got[i]!r}, exact {exact[i]!r}, |err| {err[i]:.3g} > tol "
                       f"{tol[i]:.3g} ({bad.sum()} of {bad.size} elements off)")
    worst = float(np.max(err / np.where(tol > 0, tol, 1.0))) if err.size else 0.0
    return True, f"max err/tol {worst:.3g}"


# ---------------------------------------------------------------------------------------------
# checks

def _exact(values):
    return np.asarray(values, dtype=object).astype(np.float64)


def run_op_checks(report, only):
    import reflib
    import fastlib.cuda as fc

    for index, (label, name, build, params) in enumerate(op_cases()):
        if only and only not in label:
            continue
        rng = np.random.default_rng(1000 + index)
        inputs = build(rng)
        dps = DPS_TAILS if "tails" in label else DPS
        out = _exact(reflib.forward(name, inputs, dps=dps, **params))
        grad = _uniform(rng, -1, 1, out.shape)
        grads = [None if gi is None else _exact(gi)
                 for gi in reflib.vjp(name, inputs, grad, dps=dps, **params)]
        s_out, s_grads = scales(name, inputs, grad, params, out, grads)
        for dtype in DTYPES:
            cast = [v.astype(dtype) if v.dtype.kind == "f" and not
                    (name == "cross_entropy" and k == 1) else v for k, v in enumerate(inputs)]
            try:
                got = fc.forward(name, cast, **params)
                report(f"forward:{label}:{dtype}", *compare(got, out, *s_out, dtype))
            except Exception:
                report(f"forward:{label}:{dtype}", False, traceback.format_exc(limit=3))
            try:
                got = fc.vjp(name, cast, grad.astype(dtype), **params)
                for k, (gi, exact) in enumerate(zip(got, grads)):
                    if exact is None:
                        ok = gi is None
                        report(f"vjp:{label}:{dtype}:{k}", ok, "None for class indices" if ok
                               else f"expected None (not differentiable), got {type(gi)}")
                    else:
                        report(f"vjp:{label}:{dtype}:{k}", *compare(gi, exact, *s_grads[k],
                                                                     dtype))
            except Exception:
                for k in range(len(inputs)):
                    report(f"vjp:{label}:{dtype}:{k}", False, traceback.format_exc(limit=3))


def run_kink_checks(report, only):
    """Conventions at kinks, from docs/CONTRACTS.md by hand: exact equality."""
    import fastlib.cuda as fc

    for dtype in DTYPES:
        x = np.array([-1.0, 0.0, 2.0], dtype)
        g = np.array([3.0, 5.0, 7.0], dtype)
        expect = {"relu": [0.0, 0.0, 7.0],            # relu'(0) = 0
                  "abs": [-3.0, 0.0, 7.0],            # abs'(0) = 0
                  "leaky_relu": [0.75, 1.25, 7.0]}    # slope at 0 (slope 0.25)
        for name, want in expect.items():
            label = f"kink:{name}:{dtype}"
            if only and only not in label:
                continue
            params = {"negative_slope": 0.25} if name == "leaky_relu" else {}
            (got,) = fc.vjp(name, [x], g, **params)
            report(label, bool(np.array_equal(got, np.array(want, dtype))), f"got {got.tolist()}")
        label = f"overflow:exp:{dtype}"
        if not only or only in label:
            # IEEE: exp overflows to +inf (float32 above ~88.72, float64 above ~709.78)
            big = np.array([1.0, 100.0 if dtype == "float32" else 710.0], dtype)
            got = fc.forward("exp", [big])
            (grad_got,) = fc.vjp("exp", [big], np.ones(2, dtype))
            ok = bool(np.isposinf(got[1]) and np.isposinf(grad_got[1])
                      and got[0] == np.asarray(math.e, dtype) and got.dtype == big.dtype)
            report(label, ok, f"got {got.tolist()}, vjp {grad_got.tolist()}")
        label = f"kink:maximum-tie:{dtype}"
        if not only or only in label:
            a = np.array([1.0, 2.0, -3.0], dtype)
            b = np.array([1.0, 5.0, -3.0], dtype)
            ga, gb = fc.vjp("maximum", [a, b], g)
            ok = np.array_equal(ga, [3.0, 0.0, 7.0]) and np.array_equal(gb, [0.0, 5.0, 0.0])
            report(label, bool(ok), f"ties go to a: got {ga.tolist()}, {gb.tolist()}")


TWIN_VALUES = [0.0, -0.0, 1e-30, -1e-30, 1e-8, -1e-8, 0.5, -0.5, 1.0, -1.0, 1.2785, -1.2785,
               3.0, -3.0, 10.0, -10.0, 30.0, -30.0, 100.0, -100.0, 700.0, -700.0]


def run_twin_checks(report, only):
    """Each device twin ``<name>_f/_df`` against the CPU scalar's own (Python) body, float64."""
    from fastlib.cuda import scalar as twins
    from fastlib.kernels import scalar as cpu

    for name, (f, df) in twins.ACTIVATIONS.items():
        label = f"twin:{name}"
        if only and only not in label:
            continue
        values = [v for v in TWIN_VALUES if v > 0] if name in POSITIVE else TWIN_VALUES
        x = np.array(values, dtype=np.float64)
        slope = 0.2
        if name in twins.WITH_PARAM:
            @cuda.jit
            def evaluate(x, fv, dv):
                i = cuda.grid(1)
                if i < x.shape[0]:
                    fv[i] = f(x[i], slope)
                    dv[i] = df(x[i], slope)
        else:
            @cuda.jit
            def evaluate(x, fv, dv):
                i = cuda.grid(1)
                if i < x.shape[0]:
                    fv[i] = f(x[i])
                    dv[i] = df(x[i])
        fv, dv = np.zeros_like(x), np.zeros_like(x)
        evaluate[1, x.size](x, fv, dv)
        cf, cdf = getattr(cpu, f"{name}_f").py_func, getattr(cpu, f"{name}_df").py_func
        args = (lambda v: (np.float64(v), slope)) if name in twins.WITH_PARAM else \
            (lambda v: (np.float64(v),))
        want_f = np.array([cf(*args(v)) for v in values], dtype=np.float64)
        want_df = np.array([cdf(*args(v)) for v in values], dtype=np.float64)
        # Same formula, float64 libm on both sides: a few ulps relative; the derivatives that
        # are sums of opposite-signed terms get the terms' magnitude as scale.
        terms = _unary_terms(name, x, np.ones_like(x), want_df)
        for part, got, want, scale in (("f", fv, want_f, np.abs(want_f)),
                                       ("df", dv, want_df, np.maximum(np.abs(want_df), terms))):
            ok, detail = compare(got, want, scale, 8, "f64", "float64")
            report(f"{label}:{part}", ok, detail)


# -- optimizers -------------------------------------------------------------------------------

HYPER = {  # non-default values, so that every term of every rule moves the result visibly
    "SGD": {"lr": 0.05},
    "Momentum": {"lr": 0.05, "beta": 0.8},
    "NAG": {"lr": 0.05, "beta": 0.8},
    "Adagrad": {"lr": 0.05, "eps": 1e-2},
    "RMSprop": {"lr": 0.05, "gamma": 0.7, "eps": 1e-2},
    "Adam": {"lr": 0.05, "beta1": 0.8, "beta2": 0.9, "eps": 1e-2},
    "AdamW": {"lr": 0.05, "beta1": 0.8, "beta2": 0.9, "eps": 1e-2, "weight_decay": 0.1},
}
STEPS = 5


def datacode_steps(name, w0, target, curv, h):
    """DataCode's documented optimizer table literally, in float64, on f(w) = sum curv (w - target)^2 / 2.

    Returns the sequence of points the engine should hold: w itself, except for NAG, whose
    engine holds the look-ahead point w - beta v where DataCode evaluates the gradient.
    """
    grad = lambda w: curv * (w - target)  # noqa: E731
    w = w0.copy()
    v = np.zeros_like(w)
    m = np.zeros_like(w)
    s = np.zeros_like(w)
    held = []
    for t in range(1, STEPS + 1):
        if name == "SGD":
            w = w - h["lr"] * grad(w)
        elif name == "Momentum":
            v = h["beta"] * v + (1 - h["beta"]) * grad(w)
            w = w - h["lr"] * v
        elif name == "NAG":
            v = h["beta"] * v + h["lr"] * grad(w - h["beta"] * v)
            w = w - v
        elif name == "Adagrad":
            g = grad(w)
            s = s + g * g
            w = w - h["lr"] / np.sqrt(s + h["eps"]) * g
        elif name == "RMSprop":
            g = grad(w)
            s = h["gamma"] * s + (1 - h["gamma"]) * g * g
            w = w - h["lr"] / np.sqrt(s + h["eps"]) * g
        else:
            g = grad(w)
            m = h["beta1"] * m + (1 - h["beta1"]) * g
            v = h["beta2"] * v + (1 - h["beta2"]) * g * g
            m_hat = m / (1 - h["beta1"] ** t)
            v_hat = v / (1 - h["beta2"] ** t)
            step = m_hat / (np.sqrt(v_hat) + h["eps"])
            if name == "AdamW":
                step = step + h["weight_decay"] * w
            w = w - h["lr"] * step
        held.append(w - h["beta"] * v if name == "NAG" else w.copy())
    return held


def _engine_steps(update, init, name, params, target, curv, h, host):
    state = init(name, params, **h)
    held = []
    for _ in range(STEPS):
        current = {k: (p if host else p.copy_to_host()) for k, p in params.items()}
        grads = {k: (curv[k] * (current[k] - target[k])).astype(current[k].dtype)
                 for k in params}
        if not host:
            from fastlib.cuda import to_device
            grads = {k: to_device(g) for k, g in grads.items()}
        update(name, params, grads, state, **h)
        held.append({k: (p.copy() if host else p.copy_to_host()) for k, p in params.items()})
    return held, state


def run_optimizer_checks(report, only):
    import fastlib.cuda as fc
    from fastlib import optim as cpu_optim

    rng = np.random.default_rng(7)
    shapes = {"weight": (2, 3), "bias": (3,)}
    w0 = {k: _uniform(rng, -1, 1, s) for k, s in shapes.items()}
    target = {k: _uniform(rng, -1, 1, s) for k, s in shapes.items()}
    curv = {k: _uniform(rng, 0.5, 2, s) for k, s in shapes.items()}
    for name, h in HYPER.items():
        ref = {k: datacode_steps(name, w0[k], target[k], curv[k], h) for k in shapes}
        for dtype in DTYPES:
            label = f"optim:{name}:{dtype}"
            if only and only not in label:
                continue
            params = {k: w0[k].astype(dtype) for k in shapes}
            held, state = _engine_steps(fc.optimizer_update, fc.optimizer_init, name, params,
                                        {k: target[k].astype(dtype) for k in shapes},
                                        {k: curv[k].astype(dtype) for k in shapes}, h, True)
            # vs DataCode in float64: every step rounds w, the gradient and the state a few
            # times in the dtype and the differences add up over the steps: 4 roundings per step
            # of |w|-sized quantities (|w| <= 1 here). A wrong term moves w by ~lr * 1e-2.
            errs = [max(np.max(np.abs(held[s][k] - ref[k][s])) for k in shapes)
                    for s in range(STEPS)]
            tol = 4 * STEPS * EPS[dtype]
            report(f"{label}:datacode", max(errs) <= tol and state.t == STEPS,
                   f"max |w - w_datacode| per step {['%.3g' % e for e in errs]} (tol {tol:.3g}), "
                   f"t = {state.t}")
            # vs fastlib.optim (CPU kernel, same coefficient vector and same order of operations):
            # identical in float64 up to fused multiply-adds (GPU), a few ulps in float32 where
            # the simulator's math.sqrt runs in float64.
            cpu_params = {k: w0[k].astype(dtype) for k in shapes}
            cpu_held, _ = _engine_steps(
                lambda n, p, g, st, **hh: cpu_optim.get(n, **hh).update(p, g, st),
                lambda n, p, **hh: cpu_optim.get(n, **hh).init(p), name, cpu_params,
                {k: target[k].astype(dtype) for k in shapes},
                {k: curv[k].astype(dtype) for k in shapes}, h, True)
            err = max(np.max(np.abs(held[s][k] - cpu_held[s][k]))
                      for s in range(STEPS) for k in shapes)
            tol = 4 * STEPS * EPS[dtype]
            report(f"{label}:cpu", err <= tol, f"max |w - w_cpu| {err:.3g} (tol {tol:.3g})")
            if dtype == "float32":
                # device-resident parameters and state: the same kernel, so the same bits
                d_params = {k: fc.to_device(w0[k].astype(dtype)) for k in shapes}
                d_held, d_state = _engine_steps(
                    fc.optimizer_update, fc.optimizer_init, name, d_params,
                    {k: target[k].astype(dtype) for k in shapes},
                    {k: curv[k].astype(dtype) for k in shapes}, h, False)
                same = all(np.array_equal(d_held[s][k], held[s][k])
                           for s in range(STEPS) for k in shapes)
                slots_same = all(np.array_equal(d_state.slots[s][k].copy_to_host(),
                                                state.slots[s][k])
                                 for s in state.slots for k in shapes)
                report(f"{label}:device-arrays", same and slots_same,
                       "device-resident run equals the host run bit for bit" if same and
                       slots_same else "device-resident run differs from the host run")


# -- Dense --------------------------------------------------------------------------------------

DENSE_ACTS = ("linear", "relu", "leaky_relu", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh",
              "softplus", "softmax")


def run_dense_checks(report, only):
    import reflib
    import fastlib.cuda as fc

    rows, n_in, n_out = 5, 6, 3
    for index, act in enumerate(DENSE_ACTS):
        rng = np.random.default_rng(50 + index)
        x = _uniform(rng, -1, 1, (rows, n_in))
        w = _uniform(rng, -1, 1, (n_in, n_out))
        b = _uniform(rng, -1, 1, (n_out,))
        gout = _uniform(rng, -1, 1, (rows, n_out))
        pre64 = x @ w + b  # products of float32 numbers are exact in float64; k+1 roundings
        op = "identity" if act == "linear" else act
        out_exact = _exact(reflib.forward(op, [pre64], dps=DPS))
        s_pre = np.abs(x) @ np.abs(w) + np.abs(b)
        for dtype in DTYPES:
            label = f"dense:{act}:{dtype}"
            if only and only not in label:
                continue
            eps = EPS[dtype]
            args = [v.astype(dtype) for v in (x, w, b)]
            out, pre = fc.dense_forward(*args, act)
            # pre: the GEMM's gamma_k plus the bias add, and the reference's own k+1 float64
            # roundings (negligible for float32, the same order for float64).
            ok, detail = compare(pre, pre64, s_pre, 2 * n_in + 4, "dtype", dtype)
            report(f"{label}:pre", ok, detail)
            # out = act(pre_engine): the error of pre propagates through |act'|; softmax's
            # Jacobian rows sum |dy_i| <= 2 y_i max |d pre|.
            if act == "softmax":
                sens = 2 * out_exact * np.max(s_pre, axis=1, keepdims=True)
            else:
                sens = np.abs(_exact(reflib.vjp(op, [pre64], np.ones_like(pre64), dps=DPS)[0])) \
                    * s_pre
            ok, detail = compare(out, out_exact, sens * (2 * n_in + 4) * eps / E64 +
                                 8 * np.abs(out_exact), 1, "f64", dtype)
            report(f"{label}:out", ok, detail)
            # backward from the engine's own pre: the reference takes the same pre.
            pre_used = pre.astype(np.float64)
            gx, gw, gb = fc.dense_backward(gout.astype(dtype), args[0], args[1], pre, act)
            gpre = _exact(reflib.vjp(op, [pre_used], gout, dps=DPS)[0])
            if act == "softmax":
                y = np.exp(pre_used - _lse_parts(pre_used, 1)[1])
                terms = y * (np.abs(gout) + np.sum(np.abs(gout) * y, axis=1, keepdims=True)) * \
                    (n_out + 2 + np.abs(pre_used).max())
            else:
                terms = _unary_terms(op, pre_used, gout, gpre)
            # g_pre carries one rounding to the dtype (+ the float64 activation VJP), then the
            # GEMM / row sum add gamma_rows or gamma_out; the NumPy reference adds as many.
            for part, got, want, scale, c in (
                    ("grad_x", gx, gpre @ w.T, terms @ np.abs(w).T, 2 * n_out + 20),
                    ("grad_weight", gw, x.T @ gpre, np.abs(x).T @ terms, 2 * rows + 20),
                    ("grad_bias", gb, gpre.sum(axis=0), terms.sum(axis=0), 2 * rows + 20)):
                report(f"{label}:{part}", *compare(got, want, scale, c, "dtype", dtype))
            if dtype == "float32":
                d_args = [fc.to_device(v) for v in args]
                d_out, d_pre = fc.dense_forward(*d_args, act)
                d_grads = fc.dense_backward(fc.to_device(gout.astype(dtype)), d_args[0],
                                            d_args[1], d_pre, act)
                same = (np.array_equal(fc.to_host(d_out), out)
                        and np.array_equal(fc.to_host(d_pre), pre)
                        and all(np.array_equal(fc.to_host(d), h)
                                for d, h in zip(d_grads, (gx, gw, gb))))
                report(f"{label}:device-arrays", same,
                       "device arrays in, device arrays out, the same bits as the host call")


def run_training_check(report, only):
    """Three Adam steps of a tanh Dense layer on mse, every array resident on the device."""
    label = "train:dense-adam:float64"
    if only and only not in label:
        return
    import fastlib.cuda as fc

    rng = np.random.default_rng(99)
    x, y = _uniform(rng, -1, 1, (6, 4)), _uniform(rng, -1, 1, (6, 3))
    w, b = _uniform(rng, -1, 1, (4, 3)), _uniform(rng, -0.5, 0.5, (3,))
    h = HYPER["Adam"]
    params = {"weight": fc.to_device(w), "bias": fc.to_device(b)}
    state = fc.optimizer_init("Adam", params, **h)
    d_x = fc.to_device(x)
    for _ in range(3):
        out, pre = fc.dense_forward(d_x, params["weight"], params["bias"], "tanh")
        gout = fc.to_device(2 * (fc.to_host(out) - y) / y.size)     # d mse / d out
        _, g_w, g_b = fc.dense_backward(gout, d_x, params["weight"], pre, "tanh")
        fc.optimizer_update("Adam", params, {"weight": g_w, "bias": g_b}, state, **h)
    # the same three steps in float64 NumPy, DataCode's Adam written out
    ref = {"weight": w.copy(), "bias": b.copy()}
    m = {k: np.zeros_like(v) for k, v in ref.items()}
    v2 = {k: np.zeros_like(v) for k, v in ref.items()}
    for t in range(1, 4):
        out = np.tanh(x @ ref["weight"] + ref["bias"])
        gpre = 2 * (out - y) / y.size * (1 - out * out)
        grads = {"weight": x.T @ gpre, "bias": gpre.sum(axis=0)}
        for k in ref:
            m[k] = h["beta1"] * m[k] + (1 - h["beta1"]) * grads[k]
            v2[k] = h["beta2"] * v2[k] + (1 - h["beta2"]) * grads[k] ** 2
            m_hat, v_hat = m[k] / (1 - h["beta1"] ** t), v2[k] / (1 - h["beta2"] ** t)
            ref[k] = ref[k] - h["lr"] * m_hat / (np.sqrt(v_hat) + h["eps"])
    # Two float64 implementations of the same three steps differ by a few dozen roundings of
    # O(1) numbers (~1e-14); a wrong term in any piece moves the weights by >= lr * 1e-3.
    err = max(np.max(np.abs(fc.to_host(params[k]) - ref[k])) for k in ref)
    report(label, err <= 1e-12 and state.t == 3, f"max |w - w_numpy| {err:.3g} after 3 steps")


SPLIT_DTYPES = ("float32", "float64")


def run_split_checks(report, only):
    """The GEMM's split inner axis (per-chunk float64 partials, the last block of a tile adds
    them in chunk order) and its fused column sums: a Dense backward over 37 rows (10 chunks
    of the simulator's 4-deep slices on 2 fake SMs' worth of blocks) against NumPy float64,
    and run twice for equal bits. Bounds as for the Dense checks: each chunk's sum is a
    float-dtype dot product of at most ``chunk`` terms, the chunks' float64 sum rounds once."""
    import reflib
    import fastlib.cuda as fc
    from fastlib.cuda import linalg

    rows, n_in, n_out = 37, 6, 3
    rng = np.random.default_rng(77)
    x = _uniform(rng, -1, 1, (rows, n_in))
    w = _uniform(rng, -1, 1, (n_in, n_out))
    b = _uniform(rng, -1, 1, (n_out,))
    gout = _uniform(rng, -1, 1, (rows, n_out))
    for dtype in SPLIT_DTYPES:
        label = f"split:dense-tanh:{dtype}"
        if only and only not in label:
            continue
        splits = linalg.split_count(n_in, n_out, rows, 1)
        args = [v.astype(dtype) for v in (x, w, b)]
        _, pre = fc.dense_forward(*args, "tanh")
        pre_used = pre.astype(np.float64)
        gpre = _exact(reflib.vjp("tanh", [pre_used], gout, dps=DPS)[0])
        terms = np.abs(gpre) + np.abs(gout)
        first = fc.dense_backward(gout.astype(dtype), args[0], args[1], pre, "tanh")
        again = fc.dense_backward(gout.astype(dtype), args[0], args[1], pre, "tanh")
        same = all(np.array_equal(p, q) for p, q in zip(first, again))
        report(f"{label}:splits", splits > 1 and same,
               f"{splits} chunks of the 37-row inner axis; two runs equal bit for bit: {same}")
        gx, gw, gb = first
        for part, got, want, scale, c in (
                ("grad_x", gx, gpre @ w.T, terms @ np.abs(w).T, 2 * n_out + 20),
                ("grad_weight", gw, x.T @ gpre, np.abs(x).T @ terms, 2 * rows + 20),
                ("grad_bias", gb, gpre.sum(axis=0), terms.sum(axis=0), 2 * rows + 20)):
            report(f"{label}:{part}", *compare(got, want, scale, c, "dtype", dtype))


# The register-blocked GEMM's operand staging (128-bit loads where aligned, double-buffered
# slices) on the simulator's 8 x 8 tiles, 4-deep slices: (name, batch, m, k, n, A transposed,
# B transposed, A's row pitch (None: k or m, dense), B shared by the batch). Dimensions that are
# multiples of 4 let float32's 4-wide and float64's 2-wide loads apply; 20 columns end in a
# partial tile; "pitched" reads a 10-deep A from rows 12 apart, so its last group of each row
# straddles the end and is read element by element; "split" has one tile and a 40-deep inner
# axis (4 chunks); "batched" shares B across two products.
GEMM_CASES = (("plain", 1, 12, 12, 20, False, False, None, False),
              ("a-transposed", 1, 12, 12, 20, True, False, None, False),
              ("b-transposed", 1, 12, 12, 20, False, True, None, False),
              ("both-transposed", 1, 12, 12, 20, True, True, None, False),
              ("pitched", 1, 12, 10, 8, False, False, 12, False),
              ("split", 1, 4, 40, 4, True, False, None, False),
              ("batched", 2, 8, 12, 12, False, False, None, True))


def _placed(host, aligned):
    """A flat device copy of ``host`` whose first element is (or is not) 16 bytes aligned."""
    import fastlib.cuda as fc
    from fastlib.cuda import vector_load

    flat = np.ascontiguousarray(host).reshape(-1)
    width = 16 // flat.dtype.itemsize
    buf = fc.to_device(np.zeros(flat.size + 2 * width, flat.dtype))
    for off in range(2 * width):
        view = buf[off:off + flat.size]
        if vector_load.aligned(view, 0) == aligned:
            view.copy_to_device(flat)
            return view
    raise AssertionError("no offset with the asked alignment")


def run_gemm_checks(report, only):
    """Each case against NumPy float64 (products of float32 numbers, exact in float64; the
    GEMM's chunk sums in the dtype, gamma_k with k terms, plus the chunks' float64 sum rounded
    once: c = 2k + 4), twice for equal bits, and from aligned and unaligned copies of the same
    operands: the aligned run takes the 128-bit loads (the host's flag says so), the unaligned
    one element loads, and both must give the same bits (the same values, added in the same
    order)."""
    from fastlib.cuda import linalg

    for name, batch, m, k, n, ta, tb, pitch, shared in GEMM_CASES:
        rng = np.random.default_rng(hash(name) % 1000)
        pa = pitch or (m if ta else k)
        a_host = _signed(rng, 0.5, 2.0, (batch, k, pa) if ta else (batch, m, pa))
        b_host = _signed(rng, 0.5, 2.0, (1 if shared else batch,) + ((n, k) if tb else (k, n)))
        a_used = a_host[:, :, :m] if ta else a_host[:, :, :k]
        a_mat = np.swapaxes(a_used, 1, 2) if ta else a_used
        b_mat = np.swapaxes(b_host, 1, 2) if tb else b_host
        want = a_mat @ b_mat
        scale = np.abs(a_mat) @ np.abs(b_mat)
        a_strides = (a_host[0].size, 1, pa) if ta else (a_host[0].size, pa, 1)
        b_strides = (0 if shared else b_host[0].size,) + ((1, k) if tb else (n, 1))
        for dtype in DTYPES:
            label = f"gemm:{name}:{dtype}"
            if only and only not in label:
                continue
            runs, flags = [], []
            for aligned in (True, False):
                d_a, d_b = (_placed(v.astype(dtype), aligned) for v in (a_host, b_host))
                flags.append((linalg.vector_flag(d_a, d_a, linalg.load_plain, a_strides[0],
                                                 *((a_strides[1], a_strides[2]) if ta else
                                                   (a_strides[1], a_strides[2])),
                                                 a_strides[1] == 1, batch),
                              linalg.vector_flag(d_b, d_b, linalg.load_plain, b_strides[0],
                                                 b_strides[2], b_strides[1],
                                                 not (b_strides[1] == 1 and b_strides[2] != 1),
                                                 batch)))
                for _ in range(2):
                    c = linalg.gemm_device(d_a, a_strides, d_b, b_strides, batch, m, n, k, dtype)
                    runs.append(c.copy_to_host().reshape(batch, m, n))
            ok, detail = compare(runs[0], want, scale, 2 * k + 4, "dtype", dtype)
            report(f"{label}:accuracy", ok, detail)
            same = all(np.array_equal(runs[0], r) for r in runs[1:])
            vector = flags[0] == (1, 1) and flags[1] == (0, 0)
            report(f"{label}:aligned and unaligned equal bit for bit", same and vector,
                   f"128-bit loads (A, B) aligned {flags[0]}, unaligned {flags[1]}; two runs "
                   f"each, all four equal: {same}")


# ---------------------------------------------------------------------------------------------

# the groups that also run on a GPU (the others call device functions from the host, which
# only the simulator allows; the device's op rows are the conformance suite's)
DEVICE_GROUPS = ("gemm", "split")
GROUPS = {"gemm": run_gemm_checks, "split": run_split_checks, "ops": run_op_checks, "kinks": run_kink_checks, "twins": run_twin_checks,
          "optim": run_optimizer_checks, "dense": run_dense_checks, "train": run_training_check}


def check_names():
    """Every check name the full run reports (computed from the tables, nothing is run)."""
    names = []
    for label, name, build, params in op_cases():
        n_inputs = len(build(np.random.default_rng(0)))
        for dtype in DTYPES:
            names.append(f"forward:{label}:{dtype}")
            names += [f"vjp:{label}:{dtype}:{k}" for k in range(n_inputs)]
    for dtype in DTYPES:
        names += [f"kink:{n}:{dtype}" for n in ("relu", "abs", "leaky_relu", "maximum-tie")]
        names.append(f"overflow:exp:{dtype}")
    for name in UNARY:
        names += [f"twin:{name}:f", f"twin:{name}:df"]
    for name in HYPER:
        for dtype in DTYPES:
            names += [f"optim:{name}:{dtype}:datacode", f"optim:{name}:{dtype}:cpu"]
        names.append(f"optim:{name}:float32:device-arrays")
    for act in DENSE_ACTS:
        for dtype in DTYPES:
            names += [f"dense:{act}:{dtype}:{p}" for p in ("pre", "out", "grad_x",
                                                            "grad_weight", "grad_bias")]
        names.append(f"dense:{act}:float32:device-arrays")
    names.append("train:dense-adam:float64")
    for dtype in SPLIT_DTYPES:
        names += [f"split:dense-tanh:{dtype}:{p}" for p in ("splits", "grad_x", "grad_weight",
                                                            "grad_bias")]
    for case in GEMM_CASES:
        for dtype in DTYPES:
            names += [f"gemm:{case[0]}:{dtype}:{p}" for p in (
                "accuracy", "aligned and unaligned equal bit for bit")]
    return names


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # checkout
    if not simulator:
        import fastlib.cuda as fc
        if not fc.is_available():
            sys.exit("run with NUMBA_ENABLE_CUDASIM=1 in the environment (numba reads it at "
                     f"import), or on a GPU ({fc.unavailable_reason()})")
    # The simulator runs each CUDA thread as a Python thread and polls them while they wait at
    # cuda.syncthreads(); with Python's default 5 ms switch interval every barrier costs several
    # milliseconds of idle polling. A 0.1 ms interval makes the block reductions ~15x faster.
    sys.setswitchinterval(1e-4)
    import fastlib.cuda as fc
    if not fc.is_available():
        sys.exit(f"the CUDA simulator is not active: {fc.unavailable_reason()}")

    def report(check, ok, detail):
        print(json.dumps({"check": check, "ok": bool(ok), "detail": str(detail)}), flush=True)

    for group, run in GROUPS.items():
        if not simulator and group not in DEVICE_GROUPS:
            continue
        try:
            run(report, only)
        except Exception:
            report(f"group:{group}", False, traceback.format_exc())


if __name__ == "__main__":
    main()
