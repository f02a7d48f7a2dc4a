"""Checks of param values and input domains, with the messages every engine gives.

Each raises ``ValueError("op: what to fix")``. reflib and fastlib.cuda call them from their
shape checks (the values depend on the shapes the engine sees: an axis must be in range).
"""
from __future__ import annotations

import numbers

import numpy as np


def fail(op, message):
    """Raise the ValueError every bad shape / param / domain gets: ``op: what to fix``."""
    raise ValueError(f"{op}: {message}")


def check_int(op, pname, value, minimum=None):
    """``value`` as an int (not a bool), at least ``minimum`` when given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(op, f"param {pname} must be an int; got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        fail(op, f"param {pname} must be >= {minimum}; got {value}")
    return value


def check_real(op, pname, value, positive=False, minimum=None):
    """``value`` unchanged, if it is a finite real number (> 0 if ``positive``; at least
    ``minimum`` when given)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not np.isfinite(float(value)):
        fail(op, f"param {pname} must be a finite real number; got {value!r}")
    if positive and value <= 0:
        fail(op, f"param {pname} must be > 0; got {value!r}")
    if minimum is not None and value < minimum:
        fail(op, f"param {pname} must be >= {minimum}; got {value!r}")
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


def require_domain(op, name, x, test, what):
    """Raise unless ``test`` holds elementwise on ``x``; the message names the first offender."""
    ok = np.asarray(test, dtype=bool)
    if not ok.all():
        idx = tuple(int(i) for i in np.argwhere(~ok)[0])
        fail(op, f"{name} must be {what}; {name}[{idx}] = {x[idx]}" if idx else
                 f"{name} must be {what}; got {x[()]}")


def class_indices(op, target, n, c):
    """Class indices as int64 (N,) for ``n`` rows and ``c`` classes: from (N, 1) or (N,), of an
    integer dtype, or floats (or exact numbers) holding whole numbers."""
    t = np.asarray(target)
    if t.ndim == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.ndim != 1 or t.shape[0] != n:
        fail(op, f"target must hold {n} class indices, shape ({n},) or ({n}, 1); got shape "
                 f"{np.shape(target)} (for one-hot targets use categorical_cross_entropy)")
    if t.dtype.kind == "b":
        fail(op, "target must hold class indices (int), not booleans")
    if t.dtype.kind in "fO":
        if not all(np.isfinite(float(v)) and float(v) == int(v) for v in t.flat):
            fail(op, f"target must hold whole-number class indices; got {t.tolist()}")
        t = np.array([int(v) for v in t.flat], dtype=np.int64)
    idx = t.astype(np.int64)
    bad = (idx < 0) | (idx >= c)
    if bad.any():
        fail(op, f"target index {idx[bad][0]} is out of range for {c} classes; use "
                 f"0 <= target < {c}")
    return np.ascontiguousarray(idx)
