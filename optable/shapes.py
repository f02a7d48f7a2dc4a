"""The shape rules and param kinds, written once: each op's output shape from its input shapes.

``output_shape(name, shapes, params)`` applies op ``name``'s rule (the table's ``shape`` field)
and raises ``ValueError("op: what to fix")``; spec, fastlib and fastlib.cuda call it after
checking their params (``PARAM_KINDS``: one check per kind of the table's ``Param.kind``). The
helpers normalise what a kernel needs besides the shape (a reduction's axes, an axis, a
permutation, a reshape's target, a slice's range).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from optable.table import SIGNATURES

__all__ = ["output_shape", "SHAPE_RULES", "PARAM_KINDS", "fmt", "resolve_axes", "one_axis", "permutation",
           "reshape_target", "slice_range"]


def fmt(shape):
    """A shape as NumPy prints it: (2, 3), (3,), ()."""
    return str(tuple(shape))


def _is_int(v):
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _fail(op, message):
    raise ValueError(f"{op}: {message}")


# --- param kinds: each validates one value of a param of that kind (the table's ``kind``) ----

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


# --- normalising helpers -------------------------------------------------------------------------

def resolve_axes(op, axis, ndim):
    """A reduction's ``axis`` (None, an int or a tuple of ints) as a sorted tuple of distinct
    non-negative axes of an ``ndim``-d array."""
    if axis is None:
        return tuple(range(ndim))
    items = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    if not all(_is_int(a) for a in items):
        _fail(op, f"axis must be None, an int or a tuple of ints; got {axis!r}")
    for a in items:
        if not -ndim <= a < ndim:
            _fail(op, f"axis {a} is out of range for an input with {ndim} dimension(s); use "
                      f"-{ndim} <= axis < {ndim} or None" if ndim else
                      f"axis {a} is out of range for a 0-d input (0 dimension(s)); use "
                      f"axis=None")
    out = [int(a) % ndim for a in items]
    if len(set(out)) != len(out):
        _fail(op, f"axis {tuple(items)!r} repeats an axis; name each axis once")
    return tuple(sorted(out))


def one_axis(op, axis, ndim, name="axis"):
    """A single ``axis`` of an ``ndim``-d array, from 0 to ndim - 1."""
    if not _is_int(axis):
        _fail(op, f"{name} must be a single int; got {axis!r}")
    if not -ndim <= axis < ndim:
        _fail(op, f"{name}={axis} is out of range for an input with {ndim} dimension(s); use "
                  f"-{ndim} <= {name} < {ndim}")
    return int(axis) % ndim


def permutation(op, axes, ndim):
    """Transpose's ``axes`` (None reverses) as a permutation of range(ndim)."""
    if axes is None:
        return tuple(range(ndim - 1, -1, -1))
    items = (axes,) if _is_int(axes) else tuple(axes)
    norm = [a % ndim if _is_int(a) and -ndim <= a < ndim else None for a in items]
    if len(items) != ndim or None in norm or sorted(norm) != list(range(ndim)):
        _fail(op, f"axes {tuple(items)!r} is not a permutation of the {ndim} dimensions of the "
                  f"input; give each of 0..{ndim - 1} once")
    return tuple(norm)


def reshape_target(op, target, size):
    """A reshape's ``target`` (ints, at most one -1) resolved for ``size`` elements."""
    target = (target,) if _is_int(target) else tuple(target)
    if sum(1 for n in target if n == -1) > 1 or any(n < -1 for n in target):
        _fail(op, f"shape {target} may hold one -1 at most and sizes >= 0 otherwise (more than "
                  f"one -1 cannot be inferred)")
    known = math.prod(n for n in target if n != -1)
    if -1 in target:
        if known == 0 or size % known:
            _fail(op, f"cannot infer -1 in shape {target} for an input of {size} elements")
        return tuple(size // known if n == -1 else n for n in target)
    if known != size:
        _fail(op, f"cannot reshape {size} elements into shape {target} (it holds {known}): the "
                  f"element count must match")
    return target


def slice_range(shape, axis, start, stop, step):
    """``(axis, range of kept indices)`` of a slice along ``axis`` of ``shape``."""
    axis = int(axis) % len(shape)
    return axis, range(*slice(start, stop, step).indices(shape[axis]))


def _nonempty(op, shape, axes, what):
    reduced = math.prod(shape[a] for a in axes)
    kept = math.prod(n for i, n in enumerate(shape) if i not in axes)
    if reduced == 0 and kept > 0:
        _fail(op, f"reducing over an empty axis of input shape {fmt(shape)} is undefined ({what} "
                  f"of no terms); give the reduced axes at least one element")


def _has_axis(op, shape):
    if len(shape) == 0:
        _fail(op, "the input is 0-d; it needs at least one dimension (an axis to work along): "
                  "reshape a scalar to (1,)")


# --- the rules: (op, shapes, params) -> output shape -------------------------------------------

def same_shape(op, shapes, params):
    """Elementwise: the output has the input's shape."""
    return tuple(shapes[0])


def broadcast(op, shapes, params):
    """NumPy broadcasting of two inputs."""
    a, b = shapes
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        _fail(op, f"shapes {fmt(a)} and {fmt(b)} do not broadcast (NumPy rules: trailing "
                  f"dimensions must be equal or 1); reshape one input, e.g. add a length-1 axis")


def reduction(op, shapes, params):
    """``sum``/``mean``/``logsumexp``: NumPy's reduction over ``axis`` with ``keepdims``."""
    (x,) = shapes
    axes = resolve_axes(op, params["axis"], len(x))
    if op != "sum":
        _nonempty(op, x, axes, "a " + op)
    if params["keepdims"]:
        return tuple(1 if i in axes else n for i, n in enumerate(x))
    return tuple(n for i, n in enumerate(x) if i not in axes)


def along_axis(op, shapes, params):
    """``softmax``/``log_softmax``: same shape, ``axis`` must exist and be non-empty."""
    (x,) = shapes
    _has_axis(op, x)
    _nonempty(op, x, (one_axis(op, params["axis"], len(x)),), "a normalisation")
    return tuple(x)


def last_axis(op, shapes, params):
    """``layer_norm``/``rms_norm``: normalise over the last axis, which must be non-empty."""
    (x,) = shapes
    _has_axis(op, x)
    _nonempty(op, x, (len(x) - 1,), "a normalisation")
    return tuple(x)


def matmul(op, shapes, params):
    """``a (..., m, k) @ b (..., k, n)`` with equal batch shapes, or ``b (k, n)`` shared."""
    a, b = (tuple(s) for s in shapes)
    if len(a) < 2 or len(b) < 2:
        _fail(op, f"both inputs need at least 2 dimensions (2-D or batched (..., m, k) @ "
                  f"(..., k, n)); got {fmt(a)} @ {fmt(b)}; reshape a vector to (1, k) or (k, 1)")
    if a[-1] != b[-2]:
        _fail(op, f"inner dimensions differ: a {fmt(a)} has k={a[-1]} columns but b {fmt(b)} "
                  f"has {b[-2]} rows; transpose or reshape so a[-1] == b[-2]")
    if len(b) > 2 and a[:-2] != b[:-2]:
        _fail(op, f"batch shapes differ: a {fmt(a)} has batch {fmt(a[:-2])}, b {fmt(b)} has "
                  f"batch {fmt(b[:-2])}; give both the same batch shape or pass b as a shared "
                  f"(k, n) matrix")
    return a[:-1] + (b[-1],)


def transpose(op, shapes, params):
    """``np.transpose(x, axes)``; ``axes`` must be a permutation of the dimensions."""
    (x,) = shapes
    return tuple(x[a] for a in permutation(op, params["axes"], len(x)))


def reshape(op, shapes, params):
    """``np.reshape(x, shape)``: same element count; one -1 is inferred."""
    return reshape_target(op, params["shape"], math.prod(shapes[0]))


def concat(op, shapes, params):
    """``np.concatenate([a, b], axis)``: equal shapes except along ``axis``."""
    a, b = (tuple(s) for s in shapes)
    if len(a) != len(b) or len(a) == 0:
        _fail(op, f"inputs need the same number (>= 1) of dimensions; got {fmt(a)} and {fmt(b)}")
    axis = one_axis(op, params["axis"], len(a))
    for i, (m, n) in enumerate(zip(a, b)):
        if i != axis and m != n:
            _fail(op, f"shapes {fmt(a)} and {fmt(b)} differ on axis {i}, which is not the "
                      f"concatenation axis {axis}: they may not differ off axis {axis}")
    return tuple(m + n if i == axis else m for i, (m, n) in enumerate(zip(a, b)))


def slice_(op, shapes, params):
    """``x[..., start:stop:step, ...]`` on ``axis``; ``step >= 1``."""
    (x,) = shapes
    if len(x) == 0:
        _fail(op, "cannot slice a 0-d input; reshape it to (1,) first")
    axis = one_axis(op, params["axis"], len(x))
    if params["step"] < 1:
        _fail(op, f"step must be >= 1 (a reverse slice is not supported); got {params['step']}")
    _, kept = slice_range(x, axis, params["start"], params["stop"], params["step"])
    return tuple(len(kept) if i == axis else m for i, m in enumerate(x))


def same_shape_loss(op, shapes, params):
    """``mse``/``binary_cross_entropy(_with_logits)``: equal shapes, a 0-d output."""
    a, b = (tuple(s) for s in shapes)
    first, second = _INPUTS[op]
    if a != b:
        _fail(op, f"{first} has shape {fmt(a)} but {second} has shape {fmt(b)}; they must have "
                  f"the same shape (no broadcasting in losses): reshape the {second} to {fmt(a)}")
    if math.prod(a) == 0:
        _fail(op, f"the inputs are empty (shape {fmt(a)}): the mean over zero elements is "
                  f"undefined; pass a non-empty batch")
    return ()


def _logits(op, z):
    if len(z) != 2:
        _fail(op, f"logits must be 2-D (N, C); got shape {fmt(z)}")
    if z[0] == 0 or z[1] == 0:
        _fail(op, f"logits {fmt(z)} are empty; need N >= 1 rows and C >= 1 classes")


def class_index_loss(op, shapes, params):
    """``cross_entropy``: logits (N, C), class indices (N,) or (N, 1)."""
    z, t = (tuple(s) for s in shapes)
    _logits(op, z)
    n, c = z
    if t not in ((n,), (n, 1)):
        _fail(op, f"expects class indices [N, 1] or [N] with N = {n}, got {list(t)}; for one-hot "
                  f"targets use categorical_cross_entropy (target shape ({n}, 1) or ({n},))")
    return ()


def distribution_loss(op, shapes, params):
    """``categorical_cross_entropy``: logits (N, C) and targets (N, C)."""
    z, t = (tuple(s) for s in shapes)
    _logits(op, z)
    if t != z:
        _fail(op, f"expects one-hot targets {list(z)}, got {list(t)} (the logits' shape); for "
                  f"class indices use cross_entropy, or one-hot encode them")
    return ()


#: shape-rule names of the op table -> the rules
SHAPE_RULES = {
    "same_shape": same_shape, "broadcast": broadcast, "reduction": reduction,
    "matmul": matmul, "transpose": transpose, "reshape": reshape, "concat": concat,
    "slice": slice_, "along_axis": along_axis, "last_axis": last_axis,
    "same_shape_loss": same_shape_loss, "class_index_loss": class_index_loss,
    "distribution_loss": distribution_loss,
}
_RULE_OF = {s.name: SHAPE_RULES[s.shape] for s in SIGNATURES}
_INPUTS = {s.name: s.inputs for s in SIGNATURES}


def output_shape(name, shapes, params):
    """The output shape of op ``name`` for the input ``shapes`` (one tuple per input) and the
    resolved ``params`` (types already checked by the engine).

    Raises
    ------
    ValueError
        Shapes the op does not accept, or a param that does not fit them (an axis out of range,
        a reshape to another size); the message names the op, the shapes and the fix.
    """
    return tuple(_RULE_OF[name](name, tuple(tuple(s) for s in shapes), params))
