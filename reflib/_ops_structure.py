"""Structure ops: matmul, transpose, reshape, concat, slice. Their VJPs move values, never mix them
(except matmul, and a shared matmul weight's VJP summed over the batch)."""
from __future__ import annotations

import numbers

import numpy as np

from reflib._ops_common import check_int, fail, implementations, one_axis


def _matmul_shapes(a, b):
    if a.ndim < 2 or b.ndim < 2:
        fail("matmul", f"inputs must be 2-D or batched (..., m, k) @ (..., k, n); got shapes "
                       f"{a.shape} and {b.shape}; reshape a vector to (1, k) or (k, 1)")
    if a.shape[-1] != b.shape[-2]:
        fail("matmul", f"inner dimensions differ: a {a.shape} has k={a.shape[-1]} columns but b "
                       f"{b.shape} has {b.shape[-2]} rows")
    if b.ndim > 2 and a.shape[:-2] != b.shape[:-2]:
        fail("matmul", f"batch shapes differ: a {a.shape} has batch {a.shape[:-2]}, b {b.shape} has "
                       f"{b.shape[:-2]}; give b the same batch shape or pass a 2-D b (k, n) to share it")


def _swap_last(x):
    return np.swapaxes(x, -1, -2)


def matmul(F, a, b):
    _matmul_shapes(a, b)
    return np.matmul(a, b)


def matmul_vjp(F, a, b, out, g):
    ga = np.matmul(g, _swap_last(b))
    gb = np.matmul(_swap_last(a), g)
    if b.ndim == 2 and gb.ndim > 2:  # b (k, n) shared across the batch: sum its VJP over the batch
        gb = np.sum(gb.reshape((-1,) + b.shape), axis=0)
    return ga, gb


def _perm(x, axes):
    if axes is None:
        return tuple(reversed(range(x.ndim)))
    if isinstance(axes, numbers.Integral) or not hasattr(axes, "__len__"):
        fail("transpose", f"param axes must be None or a sequence of ints; got {axes!r}")
    perm = tuple(one_axis("transpose", a, x.ndim, "axes") for a in axes)
    if sorted(perm) != list(range(x.ndim)):
        fail("transpose", f"axes={tuple(axes)!r} is not a permutation of the {x.ndim} axes of an "
                          f"input of shape {x.shape}; name every axis 0..{x.ndim - 1} once")
    return perm


def transpose(F, x, axes=None):
    return np.transpose(x, _perm(x, axes))


def transpose_vjp(F, x, out, g, axes=None):
    return (np.transpose(g, np.argsort(_perm(x, axes))),)


def _target_shape(x, shape):
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        fail("reshape", f"param shape must be a tuple of ints (one may be -1); got {shape!r}")
    shape = tuple(check_int("reshape", "shape", d, minimum=-1) for d in shape)
    if shape.count(-1) > 1:
        fail("reshape", f"shape={shape} holds more than one -1; at most one dimension can be inferred")
    try:
        return np.empty(x.shape, dtype=np.int8).reshape(shape).shape
    except ValueError:
        fail("reshape", f"cannot reshape an input of shape {x.shape} ({x.size} elements) to {shape}")


def reshape(F, x, shape):
    return np.reshape(x, _target_shape(x, shape))


def reshape_vjp(F, x, out, g, shape):
    return (np.reshape(g, x.shape),)


def _concat_axis(a, b, axis):
    if a.ndim != b.ndim or a.ndim == 0:
        fail("concat", f"inputs need the same number (>= 1) of dimensions; got shapes {a.shape} "
                       f"and {b.shape}")
    ax = one_axis("concat", axis, a.ndim)
    if a.shape[:ax] + a.shape[ax + 1:] != b.shape[:ax] + b.shape[ax + 1:]:
        fail("concat", f"shapes {a.shape} and {b.shape} differ off axis {axis}; all other "
                       f"dimensions must match")
    return ax


def concat(F, a, b, axis=-1):
    return np.concatenate([a, b], axis=_concat_axis(a, b, axis))


def concat_vjp(F, a, b, out, g, axis=-1):
    ax = _concat_axis(a, b, axis)
    ga, gb = np.split(g, [a.shape[ax]], axis=ax)
    return ga, gb


def _slicer(x, axis, start, stop, step):
    if x.ndim == 0:
        fail("slice", "cannot slice a 0-d input; it has no axis")
    ax = one_axis("slice", axis, x.ndim)
    start = check_int("slice", "start", start)
    stop = None if stop is None else check_int("slice", "stop", stop)
    step = check_int("slice", "step", step, minimum=1)
    return (slice(None),) * ax + (slice(start, stop, step),)


def slice_(F, x, axis=0, start=0, stop=None, step=1):
    return x[_slicer(x, axis, start, stop, step)]


def slice_vjp(F, x, out, g, axis=0, start=0, stop=None, step=1):
    gx = F.zeros(x.shape)
    gx[_slicer(x, axis, start, stop, step)] = g
    return (gx,)


# op name -> (forward, vjp), paired by name (``abs_`` / ``abs_vjp``)
OPS = implementations(globals(), "matmul transpose reshape concat slice")
