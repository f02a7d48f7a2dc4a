"""Reductions with NumPy's ``axis`` (None, int or tuple) and ``keepdims``: ``sum mean
logsumexp``. The VJP broadcasts ``grad`` back over the reduced axes (``expand_reduced``).
"""
from __future__ import annotations

import math

from spec.backends import expand_reduced, normalize_axes
from spec.opspec import Example, declare

# Every axis of a 2-D input, both keepdims, a tuple of axes, a negative axis, a 0-d input.
EXAMPLES = (
    Example([(2, 3)]),
    Example([(2, 3)], {"axis": 0}),
    Example([(2, 3)], {"axis": 1, "keepdims": True}),
    Example([(2, 3)], {"axis": (0, 1), "keepdims": True}),
    Example([(2, 1, 2)], {"axis": (0, 2)}),
    Example([(3,)], {"axis": -1}),
    Example([()]),
)


def _expand(r, x, axis, keepdims):
    """``r`` (reduced over ``axis``) broadcast back to ``x``'s shape."""
    return expand_reduced(r, x.shape, normalize_axes(axis, x.ndim), keepdims)


def _count(x, axis):
    return math.prod(x.shape[a] for a in normalize_axes(axis, x.ndim))


def _reduction(name, math_, forward, vjp):
    # inputs, domain and params (axis, keepdims) come from the op table (optable)
    return declare(name, forward=forward, vjp={"x": vjp}, examples=EXAMPLES, math=math_)


OPS = (
    _reduction("sum", "Σ x over axis",
               lambda M, x, axis, keepdims: M.sum(x, axis, keepdims),
               lambda M, grad, x, axis, keepdims: _expand(grad, x, axis, keepdims) + 0),
    _reduction("mean", "Σ x / n over axis",
               lambda M, x, axis, keepdims: M.sum(x, axis, keepdims) / _count(x, axis),
               lambda M, grad, x, axis, keepdims: _expand(grad, x, axis, keepdims)
               / _count(x, axis)),
    # NOTE: stated as log Σ exp(x); engines compute the same function as m + log Σ exp(x - m).
    _reduction("logsumexp", "log Σ exp(x) over axis",
               lambda M, x, axis, keepdims: M.log(M.sum(M.exp(x), axis, keepdims)),
               lambda M, grad, result, x, axis, keepdims: _expand(grad, x, axis, keepdims)
               * M.exp(x - _expand(result, x, axis, keepdims))),
)
