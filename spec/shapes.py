"""Shape rules and parameter checks for the registry.

A shape rule takes the input shapes (a tuple of tuples, in the op's input order) and the op's
resolved parameters, returns the output shape, and raises ``ValueError`` with a message that
names the op, the shapes and the fix. Parameter kinds (``"axis"``, ``"bool"``, ...) validate a
single value the same way for every op that uses them.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

# ---------------------------------------------------------------------------------------------
# Parameter kinds


def _is_int(v):
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_axis(op, name, v):
    if v is None or _is_int(v):
        return None if v is None else int(v)
    if isinstance(v, (tuple, list)) and all(_is_int(a) for a in v):
        return tuple(int(a) for a in v)
    raise ValueError(f"{op}: {name} must be None, an int or a tuple of ints; got {v!r}")


def _check_int(op, name, v):
    if _is_int(v):
        return int(v)
    raise ValueError(f"{op}: {name} must be an int; got {v!r}")


def _check_optional_int(op, name, v):
    return None if v is None else _check_int(op, name, v)


def _check_bool(op, name, v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    raise ValueError(f"{op}: {name} must be True or False; got {v!r}")


def _check_real(op, name, v):
    if isinstance(v, (numbers.Real, np.floating, np.integer)) and not isinstance(v, (bool, np.bool_)):
        if math.isfinite(float(v)):
            return float(v) if not _is_int(v) else int(v)
    raise ValueError(f"{op}: {name} must be a finite real number; got {v!r}")


def _check_positive(op, name, v):
    v = _check_real(op, name, v)
    if v <= 0:
        raise ValueError(f"{op}: {name} must be > 0; got {v!r}")
    return v


def _check_shape(op, name, v):
    if _is_int(v):
        v = (v,)
    if isinstance(v, (tuple, list)) and all(_is_int(a) for a in v):
        v = tuple(int(a) for a in v)
        if sum(1 for a in v if a == -1) > 1:
            raise ValueError(f"{op}: {name} may hold at most one -1; got {v!r}")
        if any(a < -1 for a in v):
            raise ValueError(f"{op}: {name} entries must be >= 0 (or one -1); got {v!r}")
        return v
    raise ValueError(f"{op}: {name} must be a tuple of ints (one may be -1); got {v!r}")


PARAM_KINDS = {
    "axis": _check_axis,             # None, int, or tuple of ints
    "axes": _check_axis,             # a permutation, or None
    "int": _check_int,
    "optional_int": _check_optional_int,
    "bool": _check_bool,
    "real": _check_real,
    "positive": _check_positive,
    "shape": _check_shape,
}


# ---------------------------------------------------------------------------------------------
# Helpers


def fmt(shape):
    """A shape as NumPy prints it: (2, 3), (3,), ()."""
    return str(tuple(shape))


def resolve_axes(op, axis, ndim, name="axis"):
    """``axis`` as a sorted tuple of distinct non-negative axes of an ``ndim``-d array."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if _is_int(axis) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim or (ndim == 0):
            raise ValueError(
                f"{op}: {name}={axis!r} is out of range for an input with {ndim} dimension(s); "
                f"use an axis in [{-ndim}, {ndim - 1}] or None" if ndim else
                f"{op}: {name}={axis!r} given for a 0-d input; use {name}=None")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: {name}={axis!r} repeats an axis; list each axis once")
    return tuple(sorted(out))


def _nonempty_reduction(op, shape, axes, what):
    reduced = math.prod(shape[a] for a in axes)
    kept = math.prod(n for i, n in enumerate(shape) if i not in axes)
    if reduced == 0 and kept > 0:
        raise ValueError(f"{op}: {what} over an empty axis of input shape {fmt(shape)} is "
                         f"undefined; give the reduced axes at least one element")


# ---------------------------------------------------------------------------------------------
# Shape rules (op, shapes, params) -> output shape


def same_shape(op, shapes, params):
    """Elementwise: the output has the input's shape."""
    return tuple(shapes[0])


def broadcast(op, shapes, params):
    """NumPy broadcasting of two inputs."""
    a, b = shapes
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise ValueError(
            f"{op}: shapes {fmt(a)} and {fmt(b)} do not broadcast (NumPy rules: trailing "
            f"dimensions must be equal or 1); reshape one input, e.g. add a length-1 axis"
        ) from None


def reduction(op, shapes, params):
    """``sum``/``mean``/``logsumexp``: NumPy's reduction over ``axis`` with ``keepdims``."""
    (x,) = shapes
    axes = resolve_axes(op, params["axis"], len(x))
    if op in ("mean", "logsumexp"):
        _nonempty_reduction(op, x, axes, "a " + op)
    if params["keepdims"]:
        return tuple(1 if i in axes else n for i, n in enumerate(x))
    return tuple(n for i, n in enumerate(x) if i not in axes)


def along_axis(op, shapes, params):
    """``softmax``/``log_softmax``: same shape, ``axis`` must exist and be non-empty."""
    (x,) = shapes
    if len(x) == 0:
        raise ValueError(f"{op}: needs an input with at least one dimension; got shape (); "
                         f"reshape a scalar to (1,)")
    axes = resolve_axes(op, params["axis"], len(x))
    if len(axes) != 1:
        raise ValueError(f"{op}: axis must be a single int; got {params['axis']!r}")
    _nonempty_reduction(op, x, axes, "a normalisation")
    return tuple(x)


def last_axis(op, shapes, params):
    """``layer_norm``/``rms_norm``: normalise over the last axis, which must be non-empty."""
    (x,) = shapes
    if len(x) == 0:
        raise ValueError(f"{op}: normalises over the last axis, so it needs at least one "
                         f"dimension; got shape (); reshape a scalar to (1,)")
    _nonempty_reduction(op, x, (len(x) - 1,), "a normalisation")
    return tuple(x)


def matmul(op, shapes, params):
    """``a (..., m, k) @ b (..., k, n)`` with equal batch shapes, or ``b (k, n)`` shared."""
    a, b = (tuple(s) for s in shapes)
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"matmul: needs inputs with at least 2 dimensions; got {fmt(a)} @ "
                         f"{fmt(b)}; reshape a vector to (1, k) or (k, 1)")
    if a[-1] != b[-2]:
        raise ValueError(f"matmul: inner dimensions differ: a {fmt(a)} has k={a[-1]} but b "
                         f"{fmt(b)} has k={b[-2]}; transpose or reshape so a[-1] == b[-2]")
    if len(b) > 2 and a[:-2] != b[:-2]:
        raise ValueError(f"matmul: batch shapes differ: a {fmt(a)} has batch {fmt(a[:-2])}, b "
                         f"{fmt(b)} has batch {fmt(b[:-2])}; give both the same batch shape or "
                         f"pass b as a shared (k, n) matrix")
    return a[:-1] + (b[-1],)


def transpose(op, shapes, params):
    """``np.transpose(x, axes)``; ``axes`` must be a permutation of the dimensions."""
    (x,) = shapes
    axes = params["axes"]
    if axes is None:
        return tuple(reversed(x))
    axes = (axes,) if _is_int(axes) else tuple(axes)
    n = len(x)
    norm = [a % n if -n <= a < n else None for a in axes] if n else [None for _ in axes]
    if len(axes) != n or None in norm or sorted(norm) != list(range(n)):
        raise ValueError(f"transpose: axes={params['axes']!r} is not a permutation of the "
                         f"{n} dimensions of shape {fmt(x)}; give each of 0..{n - 1} once")
    return tuple(x[a] for a in norm)


def reshape(op, shapes, params):
    """``np.reshape(x, shape)``: same element count; one -1 is inferred."""
    (x,) = shapes
    target = params["shape"]
    size = math.prod(x)
    if -1 in target:
        known = math.prod(n for n in target if n != -1)
        if known == 0 or size % known:
            raise ValueError(f"reshape: cannot infer -1 in shape {target!r} for an input of "
                             f"{size} elements (shape {fmt(x)})")
        target = tuple(size // known if n == -1 else n for n in target)
    if math.prod(target) != size:
        raise ValueError(f"reshape: shape {fmt(target)} holds {math.prod(target)} elements but "
                         f"the input {fmt(x)} has {size}; the element count must match")
    return tuple(target)


def concat(op, shapes, params):
    """``np.concatenate([a, b], axis)``: equal shapes except along ``axis``."""
    a, b = (tuple(s) for s in shapes)
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"concat: inputs need the same number (>= 1) of dimensions; got "
                         f"{fmt(a)} and {fmt(b)}")
    (axis,) = resolve_axes(op, params["axis"], len(a)) if _is_int(params["axis"]) else (None,)
    if axis is None:
        raise ValueError(f"concat: axis must be an int; got {params['axis']!r}")
    for i, (m, n) in enumerate(zip(a, b)):
        if i != axis and m != n:
            raise ValueError(f"concat: shapes {fmt(a)} and {fmt(b)} differ on axis {i}, which "
                             f"is not the concatenation axis {axis}; only axis {axis} may differ")
    return tuple(m + n if i == axis else m for i, (m, n) in enumerate(zip(a, b)))


def slice_(op, shapes, params):
    """``x[..., start:stop:step, ...]`` on ``axis``; ``step >= 1``."""
    (x,) = shapes
    if len(x) == 0:
        raise ValueError("slice: cannot slice a 0-d input; reshape it to (1,) first")
    if not _is_int(params["axis"]):
        raise ValueError(f"slice: axis must be an int; got {params['axis']!r}")
    (axis,) = resolve_axes(op, params["axis"], len(x))
    if params["step"] < 1:
        raise ValueError(f"slice: step must be >= 1 (a reverse slice is not supported); got "
                         f"{params['step']}")
    n = len(range(*slice(params["start"], params["stop"], params["step"]).indices(x[axis])))
    return tuple(n if i == axis else m for i, m in enumerate(x))


def slice_indices(shape, params):
    """The kept indices of a slice along its axis (a Python ``range``)."""
    axis = params["axis"] % len(shape)
    return axis, range(*slice(params["start"], params["stop"], params["step"]).indices(shape[axis]))


def same_shape_loss(op, shapes, params):
    """``mse``/``binary_cross_entropy(_with_logits)``: equal shapes, a 0-d output."""
    a, b = (tuple(s) for s in shapes)
    if a != b:
        raise ValueError(f"{op}: prediction {fmt(a)} and target {fmt(b)} must have the same "
                         f"shape (no broadcasting in losses); reshape the target to {fmt(a)}")
    if math.prod(a) == 0:
        raise ValueError(f"{op}: the mean over zero elements is undefined; pass a non-empty batch")
    return ()


def class_index_loss(op, shapes, params):
    """``cross_entropy``: logits (N, C), class indices (N,) or (N, 1)."""
    z, t = (tuple(s) for s in shapes)
    if len(z) != 2:
        raise ValueError(f"cross_entropy: logits must be (N, C); got {fmt(z)}")
    n, c = z
    if t not in ((n,), (n, 1)):
        hint = (f"; got one-hot-like targets {fmt(t)}: use categorical_cross_entropy for "
                f"one-hot targets, or pass class indices" if len(t) == 2 and t[1] == c and c > 1
                else "")
        raise ValueError(f"cross_entropy expects class indices [batch, 1] (or [batch]) for "
                         f"logits {fmt(z)}, i.e. target shape ({n}, 1) or ({n},); got {fmt(t)}{hint}")
    if n == 0 or c == 0:
        raise ValueError(f"cross_entropy: needs N >= 1 rows and C >= 1 classes; got logits {fmt(z)}")
    return ()


def distribution_loss(op, shapes, params):
    """``categorical_cross_entropy``: logits (N, C) and targets (N, C)."""
    z, t = (tuple(s) for s in shapes)
    if len(z) != 2:
        raise ValueError(f"categorical_cross_entropy: logits must be (N, C); got {fmt(z)}")
    if t != z:
        hint = ("; these look like class indices: use cross_entropy, or one-hot encode them"
                if t in ((z[0],), (z[0], 1)) else "")
        raise ValueError(f"categorical_cross_entropy expects one-hot targets {fmt(z)} (the "
                         f"logits' shape); got {fmt(t)}{hint}")
    if z[0] == 0 or z[1] == 0:
        raise ValueError(f"categorical_cross_entropy: needs N >= 1 rows and C >= 1 classes; "
                         f"got {fmt(z)}")
    return ()
