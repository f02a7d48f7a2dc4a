"""fastlib's forward mode and second order per op: ``jvp`` and ``hvp``, float32 and float64.

``jvp(name, inputs, tangents)`` gives ``(f(x), J t)``; ``hvp(name, inputs, cotangent,
tangents)`` gives ``∇_x <g, J(x) t>`` per input (the derivative of the VJP in direction ``t``).
The unary ops' rules are their scalar sources' (``fastlib.kernels.scalar``: ``f'`` through the
VJP kernel, ``f''`` from ``<name>_d2f``, run by ``fastlib.kernels.elementwise``); the other
ops' are written here from their derivatives (the differentiated VJP), in NumPy on the inputs'
dtype, with fastlib's own kernels for values and VJPs. ``fastlib.model_hvp`` composes them for a
model's loss. The exact referee: ``spec.jvp`` / ``spec.hvp`` (``verigrad conform``).
"""
from __future__ import annotations

import numpy as np

import optable
from fastlib import ops as _ops
from fastlib.kernels import elementwise as _elementwise

__all__ = ["jvp", "hvp"]


def _sigmoid_slopes(x):
    """(σ(x), σ'(x)): σ' as σ(x)·σ(-x), never 1 - σ (which cancels once σ saturates: at
    x = 30 it would keep 3 digits of σ' = 9e-14)."""
    s = _elementwise.unary_forward("sigmoid", np.ascontiguousarray(x))
    return s, s * _elementwise.unary_forward("sigmoid", np.ascontiguousarray(-x))


def _sum_to(g, shape):
    """Sum a broadcast array back to ``shape`` (the inverse of broadcasting)."""
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return (g.sum(axis=axes, keepdims=True) if axes else g).reshape(shape)


# --- binary: first and second partials ----------------------------------------------------------

def _binary_partials(name, a, b):
    """(fa, fb, faa, fab, fbb), broadcast arrays (or scalars)."""
    one, zero = a.dtype.type(1), a.dtype.type(0)
    if name == "add":
        return one, one, zero, zero, zero
    if name == "sub":
        return one, -one, zero, zero, zero
    if name == "mul":
        return b, a, zero, one, zero
    if name == "div":
        return 1 / b, -a / (b * b), zero, -1 / (b * b), 2 * a / (b * b * b)
    # maximum: ties go to the first argument
    first = (a >= b).astype(a.dtype)
    return first, 1 - first, zero, zero, zero


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if np.isscalar(axis) else axis
    return tuple(sorted(int(a) % ndim for a in axis))


def _expand(r, x, axis, keepdims):
    """``r`` reduced over ``axis`` broadcast back to ``x``'s shape."""
    if not keepdims:
        r = np.expand_dims(r, _axes(axis, x.ndim)) if x.ndim else r
    return np.broadcast_to(r, x.shape)


def _sm_jvp(s, t, axis):
    """softmax's JVP: s·(t - Σ s t)."""
    return s * (t - np.sum(s * t, axis=axis, keepdims=True))


def _norm_parts(name, x, eps):
    """(y, σ) of layer_norm / rms_norm over the last axis, and the centred input."""
    if name == "layer_norm":
        c = x - x.mean(axis=-1, keepdims=True)
    else:
        c = x
    sigma = np.sqrt((c * c).mean(axis=-1, keepdims=True) + x.dtype.type(eps))
    return c / sigma, sigma


def _norm_jvp(name, y, sigma, t):
    """The norm's Jacobian is symmetric: J t = (t - mean(t) - y·mean(y t)) / σ (no mean for rms)."""
    centred = t - t.mean(axis=-1, keepdims=True) if name == "layer_norm" else t
    return (centred - y * (y * t).mean(axis=-1, keepdims=True)) / sigma


def _norm_hvp(name, x, g, t, eps):
    y, sigma = _norm_parts(name, x, eps)
    dy = _norm_jvp(name, y, sigma, t)
    dsigma = (y * t).mean(axis=-1, keepdims=True)
    v = _norm_jvp(name, y, sigma, g)          # the VJP (the Jacobian is symmetric)
    return (-dy * (g * y).mean(axis=-1, keepdims=True)
            - y * (g * dy).mean(axis=-1, keepdims=True)) / sigma - v * dsigma / sigma


# --- losses: d/dε of the VJP --------------------------------------------------------------------

def _rows(x):
    return x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x


def _loss_rules(name, arrays, tangents):
    """(JVP as a 0-d array, per-input HVP for a unit cotangent)."""
    if name == "mse":
        p, t = arrays
        tp, tt = tangents
        n = p.size
        d = tp - tt
        return np.sum(2 * (p - t) * d) / n, (2 * d / n, -2 * d / n)
    if name == "cross_entropy":
        z, target = arrays
        tz = tangents[0]
        s = _ops.forward("softmax", [z], axis=-1)
        idx = np.asarray(target).reshape(-1).astype(np.int64)
        n = z.shape[0]
        picked = tz[np.arange(n), idx]
        jvp = (np.sum(s * tz) - np.sum(picked)) / n
        return jvp, (_sm_jvp(s, tz, -1) / n, None)
    if name == "categorical_cross_entropy":
        z, t = arrays
        tz, tt = tangents
        n = z.shape[0]
        s = _ops.forward("softmax", [z], axis=-1)
        ls = _ops.forward("log_softmax", [z], axis=-1)
        dls = tz - np.sum(s * tz, axis=-1, keepdims=True)
        jvp = -(np.sum(tt * ls) + np.sum(t * dls)) / n
        ds = s * dls
        hz = (ds * t.sum(axis=-1, keepdims=True) + s * tt.sum(axis=-1, keepdims=True) - tt) / n
        return jvp, (hz, -dls / n)
    if name == "binary_cross_entropy":
        p, t = arrays
        tp, tt = tangents
        n = p.size
        q = p * (1 - p)
        dp, dt = (p - t) / q / n, (np.log1p(-p) - np.log(p)) / n
        dpp = (t / (p * p) + (1 - t) / ((1 - p) * (1 - p))) / n
        dpt = -1 / q / n
        return np.sum(dp * tp + dt * tt), (dpp * tp + dpt * tt, dpt * tp)
    # binary_cross_entropy_with_logits
    z, t = arrays
    tz, tt = tangents
    n = z.size
    s, ds = _sigmoid_slopes(z)
    jvp = np.sum((s - t) * tz - z * tt) / n
    return jvp, ((ds * tz - tt) / n, -tz / n)


LOSSES = optable.names(category="loss")
LINEAR = ("transpose", "reshape", "concat", "slice", "sum", "mean", "add", "sub")
UNARY = frozenset(_elementwise.UNARY_OPS)


# --- the public functions ------------------------------------------------------------------------

def _prepared(name, inputs, tangents, params):
    params = dict(params or {})
    entry, arrays, ctx, out_shape, dtype = _ops._prepare(name, inputs, params)
    tans = [None if t is None else np.array(t, order="C") for t in optable.check_tangents(
        name, entry.inputs, entry.class_index, arrays, tangents, dtype=dtype)]
    return entry, arrays, ctx, tans, _ops._resolve_params(entry, params), out_shape, dtype


def jvp(name, inputs, tangents, params=None):
    """Forward value and Jacobian-vector product ``J t`` of op ``name``.

    Parameters
    ----------
    name : str
        An op of the op table (``fastlib.OPS``).
    inputs : list or tuple of array_like
        As for ``fastlib.forward`` (float32 or float64, one dtype).
    tangents : list or tuple
        One array per input, its shape and dtype (``None`` for class indices).
    params : dict, optional
        The op's params (defaults fill the rest).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        The output and ``Σ_i J_i t_i``, both the output's shape and the inputs' dtype.
    """
    entry, arrays, ctx, tans, p, _, _ = _prepared(name, inputs, tangents, params)
    out = entry.forward(arrays, ctx)
    return out, np.array(_jvp(name, arrays, tans, p, out),
                         dtype=out.dtype).reshape(out.shape)


def _jvp(name, arrays, tans, p, out):
    if name in UNARY:  # f'(x) t: the VJP kernel with the tangent as the cotangent
        return _elementwise.unary_vjp(name, arrays[0], tans[0], **p)
    if name in ("add", "sub", "mul", "div", "maximum"):
        fa, fb, *_ = _binary_partials(name, *arrays)
        return (fa * tans[0] + fb * tans[1]).astype(out.dtype)
    if name in ("transpose", "reshape", "slice", "sum", "mean", "concat"):
        return _ops.forward(name, list(tans), **p)
    if name == "matmul":
        a, b = arrays
        return _ops.forward("matmul", [tans[0], b]) + _ops.forward("matmul", [a, tans[1]])
    if name == "logsumexp":
        s = np.exp(arrays[0] - _expand(out, arrays[0], p["axis"], p["keepdims"]))
        return np.sum(s * tans[0], axis=p["axis"], keepdims=p["keepdims"]).astype(out.dtype)
    if name == "softmax":
        return _sm_jvp(out, tans[0], p["axis"])
    if name == "log_softmax":
        t = tans[0]
        return t - np.sum(np.exp(out) * t, axis=p["axis"], keepdims=True)
    if name in ("layer_norm", "rms_norm"):
        y, sigma = _norm_parts(name, arrays[0], p["eps"])
        return _norm_jvp(name, y, sigma, tans[0])
    if name in LOSSES:
        return np.asarray(_loss_rules(name, arrays, tans)[0], dtype=out.dtype)
    raise NotImplementedError(f"fastlib.jvp: no rule for op {name!r}")  # pragma: no cover


def hvp(name, inputs, cotangent, tangents, params=None):
    """Hessian-vector product ``∇_x <g, J(x) t>`` of op ``name``, per input.

    (``fastlib.hvp`` also takes a model: ``fastlib.model_hvp.hvp``.)

    Parameters
    ----------
    name : str
        An op of the op table.
    inputs, tangents, params
        As for :func:`jvp`.
    cotangent : array_like
        ``g``, the output's shape (``()`` for losses) and the inputs' dtype.

    Returns
    -------
    tuple of (numpy.ndarray or None)
        One array per input, shaped and typed like it; ``None`` for class indices.
    """
    entry, arrays, ctx, tans, p, out_shape, dtype = _prepared(name, inputs, tangents, params)
    g = _ops._prepare_grad(entry, cotangent, out_shape, dtype)
    return tuple(None if h is None else np.array(h, dtype=dtype).reshape(t.shape)
                 for h, t in zip(_hvp(entry, ctx, name, arrays, tans, p, g), tans))


def _hvp(entry, ctx, name, arrays, tans, p, g):
    if name in LINEAR:
        return [np.zeros_like(a) for a in arrays]
    if name in UNARY:  # g f''(x) t, f'' the op's scalar second derivative
        return [_elementwise.unary_hvp(name, arrays[0], np.ascontiguousarray(g), tans[0], **p)]
    if name in ("mul", "div", "maximum"):
        a, b = arrays
        _, _, faa, fab, fbb = _binary_partials(name, a, b)
        ha = g * (faa * tans[0] + fab * tans[1])
        hb = g * (fab * tans[0] + fbb * tans[1])
        shape = np.broadcast_shapes(a.shape, b.shape)
        return [_sum_to(np.broadcast_to(ha, shape), a.shape),
                _sum_to(np.broadcast_to(hb, shape), b.shape)]
    if name == "matmul":
        a, b = arrays
        # the bilinear cross terms: d/dε (g bᵀ) = g ṫ_bᵀ, d/dε (aᵀ g) = ṫ_aᵀ g
        return [_ops.vjp("matmul", [a, tans[1]], g)[0], _ops.vjp("matmul", [tans[0], b], g)[1]]
    x, t = arrays[0], tans[0]
    if name == "logsumexp":
        lse = _ops.forward("logsumexp", [x], axis=p["axis"], keepdims=True)
        s = np.exp(x - lse)
        ds = s * (t - np.sum(s * t, axis=p["axis"], keepdims=True))
        return [_expand(g, x, p["axis"], p["keepdims"]) * ds]
    if name == "softmax":
        s = _ops.forward("softmax", [x], axis=p["axis"])
        ds = _sm_jvp(s, t, p["axis"])
        return [ds * (g - np.sum(g * s, axis=p["axis"], keepdims=True))
                - s * np.sum(g * ds, axis=p["axis"], keepdims=True)]
    if name == "log_softmax":
        s = _ops.forward("softmax", [x], axis=p["axis"])
        return [-_sm_jvp(s, t, p["axis"]) * np.sum(g, axis=p["axis"], keepdims=True)]
    if name in ("layer_norm", "rms_norm"):
        return [_norm_hvp(name, x, g, t, p["eps"])]
    if name in LOSSES:
        _, per_input = _loss_rules(name, arrays, tans)
        return [None if h is None else g * h for h in per_input]
    raise NotImplementedError(f"fastlib.hvp: no rule for op {name!r}")  # pragma: no cover
