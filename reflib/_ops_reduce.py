"""Reductions with NumPy semantics: ``axis`` None / int / tuple of ints, ``keepdims``."""
from __future__ import annotations

import math

import numpy as np

from reflib._ops_common import expand_to, fail, implementations, reduce_axes


def _axes(op, x, axis, keepdims, nonempty=False):
    axes = reduce_axes(op, axis, x.ndim)
    if not isinstance(keepdims, (bool, np.bool_)):
        fail(op, f"param keepdims must be True or False; got {keepdims!r}")
    if nonempty and math.prod(x.shape[i] for i in axes) == 0:
        fail(op, f"cannot reduce over zero elements (input shape {x.shape}, axis={axis!r}); "
                 f"reduce over a non-empty axis")
    return axes


def sum_(F, x, axis=None, keepdims=False):
    axes = _axes("sum", x, axis, keepdims)
    return np.sum(x, axis=axes, keepdims=keepdims) + F.zeros(())


def sum_vjp(F, x, out, g, axis=None, keepdims=False):
    axes = reduce_axes("sum", axis, x.ndim)
    return (expand_to(g, x.shape, axes) + F.zeros(()),)


def _count(x, axes):
    return math.prod(x.shape[i] for i in axes)


def mean(F, x, axis=None, keepdims=False):
    axes = _axes("mean", x, axis, keepdims, nonempty=True)
    return np.sum(x, axis=axes, keepdims=keepdims) / _count(x, axes)


def mean_vjp(F, x, out, g, axis=None, keepdims=False):
    axes = reduce_axes("mean", axis, x.ndim)
    return (expand_to(g, x.shape, axes) / _count(x, axes),)


def shifted_exp(F, x, axes):
    """``(x - m, exp(x - m), sum of exp(x - m))`` over ``axes`` (keepdims), m the max along them.

    NOTE: the log-sum-exp shift. exp never overflows (x - m <= 0) and the sum is >= 1; softmax
    and log_softmax are built on ``x - m`` (exact near the max) rather than on ``x - lse``, whose
    rounding of a large lse would cost ~|lse| ulps of relative accuracy.
    """
    xm = x - np.max(x, axis=axes, keepdims=True)
    e = F.exp(xm)
    return xm, e, np.sum(e, axis=axes, keepdims=True)


def logsumexp_keepdims(F, x, axes):
    """log(sum(exp(x))) over ``axes``, keepdims=True, shifted by the max so exp cannot overflow."""
    m = np.max(x, axis=axes, keepdims=True)
    return m + F.log(np.sum(F.exp(x - m), axis=axes, keepdims=True))


def logsumexp(F, x, axis=None, keepdims=False):
    axes = _axes("logsumexp", x, axis, keepdims, nonempty=True)
    lse = logsumexp_keepdims(F, x, axes)
    return lse if keepdims else np.reshape(lse, [d for i, d in enumerate(x.shape) if i not in axes])


def logsumexp_vjp(F, x, out, g, axis=None, keepdims=False):
    # d lse / dx = softmax(x) over the reduced axes = exp(x - lse)
    axes = reduce_axes("logsumexp", axis, x.ndim)
    return (expand_to(g, x.shape, axes) * F.exp(x - expand_to(out, x.shape, axes)),)


# op name -> (forward, vjp), paired by name (``abs_`` / ``abs_vjp``)
OPS = implementations(globals(), "sum mean logsumexp")
