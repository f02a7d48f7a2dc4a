"""Shared pieces of the reference ops: the op record, axis handling, broadcasting, checks."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from optable import REQUIRED  # noqa: F401 (a param with no default; reflib.program reads it here)


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


def fail(op, message):
    """Raise the ValueError every bad shape / param / domain gets: ``op: what to fix``."""
    raise ValueError(f"{op}: {message}")


def check_int(op, pname, value, minimum=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(op, f"param {pname} must be an int; got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        fail(op, f"param {pname} must be >= {minimum}; got {value}")
    return value


def check_real(op, pname, value, positive=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(float(value)):
        fail(op, f"param {pname} must be a finite real number; got {value!r}")
    if positive and value <= 0:
        fail(op, f"param {pname} must be > 0; got {value!r}")
    return value


def one_axis(op, axis, ndim, pname="axis"):
    """Normalise a single axis to 0..ndim-1 (negative counts from the end, as in NumPy)."""
    axis = check_int(op, pname, axis)
    if not -ndim <= axis < ndim:
        fail(op, f"{pname}={axis} is out of range for an input with {ndim} dimension(s); "
                 f"use -{ndim} <= {pname} < {ndim}")
    return axis % ndim


def reduce_axes(op, axis, ndim):
    """Normalise ``axis`` (None, int or tuple of ints) to a sorted tuple of distinct axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (list, tuple)):
        axes = tuple(one_axis(op, a, ndim) for a in axis)
    else:
        axes = (one_axis(op, axis, ndim),)
    if len(set(axes)) != len(axes):
        fail(op, f"axis={axis!r} repeats an axis; name each axis once")
    return tuple(sorted(axes))


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
    """Raise unless ``test`` holds elementwise on ``x``; the message names the first offender."""
    ok = np.asarray(test, dtype=bool)
    if not ok.all():
        idx = tuple(int(i) for i in np.argwhere(~ok)[0])
        fail(op, f"{name} must be {what}; {name}[{idx}] = {x[idx]}" if idx else
                 f"{name} must be {what}; got {x[()]}")
