"""Parameter checks for the registry: each parameter kind validates one value.

Parameter kinds (``"axis"``, ``"bool"``, ...) validate a single value the same way for every
op that uses them. The shape rules themselves are the op table's (``optable.shapes``), which
every engine calls.
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
