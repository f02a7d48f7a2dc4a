"""Structure ops: ``matmul`` (2-D and batched), ``transpose``, ``reshape``, ``concat``, ``slice``.

Their VJPs only move, transpose and add entries of ``grad``; matmul's are the two products
``grad @ bᵀ`` and ``aᵀ @ grad`` (the latter summed over the batch when ``b`` is shared).
"""
from __future__ import annotations

import numpy as np

from spec.backends import sum_to_shape
from spec.opspec import Example, declare


def _T(x):
    """Swap the last two axes (the matrix transpose of every batch element)."""
    return np.swapaxes(x, -1, -2)


def _inverse_axes(axes, ndim):
    if axes is None:
        return None                                  # reversing twice is the identity
    return tuple(int(i) for i in np.argsort([a % ndim for a in axes]))


def _concat_part(grad, a, axis, first):
    """The slice of ``grad`` that came from ``a`` (first) or from ``b`` (second)."""
    axis = axis % grad.ndim
    n = a.shape[axis]
    index = [slice(None)] * grad.ndim
    index[axis] = slice(0, n) if first else slice(grad.shape[axis] - n, None)
    return grad[tuple(index)] + 0


def _slice_forward(M, x, axis, start, stop, step):
    index = [slice(None)] * x.ndim
    index[axis % x.ndim] = slice(start, stop, step)
    return x[tuple(index)] + 0


def _slice_vjp(M, grad, x, axis, start, stop, step):
    out = M.zeros(x.shape)
    index = [slice(None)] * x.ndim
    index[axis % x.ndim] = slice(start, stop, step)
    out[tuple(index)] = grad                          # a step >= 1 never repeats an index
    return out


OPS = (
    declare(
        "matmul",
        forward=lambda M, a, b: np.matmul(a, b),
        vjp={"a": lambda M, grad, b: np.matmul(grad, _T(b)),
             "b": lambda M, grad, a, b: sum_to_shape(M, np.matmul(_T(a), grad), b.shape)},
        examples=(Example([(2, 3), (3, 2)]),
                  Example([(2, 2, 2), (2, 2, 2)]),         # batched, equal batch shapes
                  Example([(2, 1, 3), (3, 2)])),           # batched a, shared b
        math="a @ b"),
    declare(
        "transpose",
        forward=lambda M, x, axes: np.transpose(x, axes) + 0,
        vjp={"x": lambda M, grad, x, axes: np.transpose(grad, _inverse_axes(axes, x.ndim)) + 0},
        examples=(Example([(2, 3)]), Example([(2, 1, 3)], {"axes": (1, 2, 0)}),
                  Example([(2, 3, 1)], {"axes": (0, -1, 1)})),
        math="np.transpose(x, axes)"),
    declare(
        "reshape",
        forward=lambda M, x, shape: x.reshape(shape) + 0,
        vjp={"x": lambda M, grad, x: grad.reshape(x.shape) + 0},
        examples=(Example([(2, 3)], {"shape": (3, 2)}), Example([(2, 3)], {"shape": (-1,)}),
                  Example([(4,)], {"shape": (2, 1, -1)})),
        math="np.reshape(x, shape)"),
    declare(
        "concat",
        forward=lambda M, a, b, axis: np.concatenate([a, b], axis=axis),
        vjp={"a": lambda M, grad, a, axis: _concat_part(grad, a, axis, True),
             "b": lambda M, grad, b, axis: _concat_part(grad, b, axis, False)},
        examples=(Example([(2, 1), (2, 2)]), Example([(1, 3), (2, 3)], {"axis": 0}),
                  Example([(2,), (3,)])),
        math="np.concatenate([a, b], axis)"),
    declare(
        "slice",
        forward=_slice_forward,
        vjp={"x": _slice_vjp},
        examples=(Example([(5,)], {"start": 1, "stop": 4, "step": 2}),
                  Example([(2, 4)], {"axis": 1, "start": -3}),
                  Example([(3, 2)], {"stop": -1})),
        math="x[..., start:stop:step, ...] on axis"),
)
