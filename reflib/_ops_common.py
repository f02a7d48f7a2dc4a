"""Shared pieces of the reference ops: the op record, axis handling, broadcasting, checks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from optable import REQUIRED  # noqa: F401 (a param with no default; reflib.program reads it here)
from optable import checks as _checks
# the param and domain checks every engine shares
from optable.checks import check_int, check_real, fail, one_axis, reduce_axes  # noqa: F401


@dataclass(frozen=True)
class OpDef:
    """One reference op: input names, params with defaults (the op table's), forward and VJP.

    ``forward(F, *inputs, **params) -> array`` validates shapes and domains, then computes.
    ``vjp(F, *inputs, out, g, **params) -> tuple`` gets the forward's ``out`` and the cotangent
    ``g`` and returns one array per input (None for ``class_index`` inputs).
    """

    inputs: tuple
    forward: Callable
    vjp: Callable
    params: dict = field(default_factory=dict)
    class_index: frozenset = frozenset()  # inputs that hold class indices (not differentiable)


def implementations(namespace, names):
    """``{op name: (forward, vjp)}`` of the functions named ``name`` (or ``name_``, where the
    name is a Python builtin) and ``name_vjp`` in ``namespace`` (a module's ``globals()``)."""
    return {n: (namespace[n] if n in namespace else namespace[n + "_"], namespace[n + "_vjp"])
            for n in names.split()}


def keepdims_shape(shape, axes):
    """The shape of a reduction over ``axes`` with keepdims=True."""
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def expand_to(g, shape, axes):
    """Broadcast a reduction's cotangent (keepdims or not) back to the input ``shape``."""
    return np.broadcast_to(np.reshape(g, keepdims_shape(shape, axes)), shape)


def broadcast_shape(op, a, b):
    try:
        return np.broadcast_shapes(np.shape(a), np.shape(b))
    except ValueError:
        fail(op, f"shapes {np.shape(a)} and {np.shape(b)} do not broadcast (NumPy rules); "
                 f"make trailing dimensions equal or 1")


def unbroadcast(g, shape):
    """Sum a broadcast cotangent back to ``shape``: over leading axes, then over size-1 axes."""
    g = np.asarray(g)
    lead = g.ndim - len(shape)
    if lead:
        g = np.sum(g, axis=tuple(range(lead)))
    ones = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if ones:
        g = np.sum(g, axis=ones, keepdims=True)
    return np.reshape(g, shape)


def require_domain(F, op, name, x, test, what):
    """Raise unless ``test`` holds elementwise on ``x`` (``F``, the numeric, is not needed)."""
    _checks.require_domain(op, name, x, test, what)
