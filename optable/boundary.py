"""The engine boundary, written once: what every engine checks before it computes.

``lookup`` finds an op (``UnknownOpError`` with close names), ``resolve_params`` merges the
caller's params with the table's defaults (unknown names and missing ``REQUIRED`` params are
errors), ``check_input_list`` checks the inputs' container and count, ``float_dtype`` and
``common_dtype`` check dtypes, ``check_grad`` the cotangent's dtype and shape,
``check_tangents`` the tangents of forward mode and second order. Every message names the op,
the problem and the fix. reflib, fastlib and fastlib.cuda call these; a plug-in
engine may too (docs/engines.md). Values of params (an axis in range, a positive eps) are each
engine's to check: they depend on the shapes the engine sees.
"""
from __future__ import annotations

import difflib

import numpy as np

from optable import formats as _formats
from optable.errors import UnknownOpError
from optable.signature import REQUIRED


def lookup(table, name):
    """The entry of ``name`` in ``table`` (any mapping keyed by op name).

    Raises
    ------
    UnknownOpError
        A name not in ``table``; the message lists the closest names and every known one.
    """
    entry = table.get(name) if isinstance(name, str) else None
    if entry is None:
        close = difflib.get_close_matches(str(name), list(table), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownOpError(f"unknown op {name!r}; {hint}known ops: {', '.join(sorted(table))}")
    return entry


def resolve_params(name, defaults, params):
    """``defaults`` (``{param: default or REQUIRED}``) merged with the caller's ``params``.

    Raises
    ------
    ValueError
        A param the op does not take (with the close name and the op's params), or a
        ``REQUIRED`` param left out.
    """
    for key in params:
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            allowed = ", ".join(defaults) if defaults else "none"
            raise ValueError(f"{name}: unknown param {key!r}; {hint}its params are: {allowed}")
    merged = {**defaults, **params}
    for key, value in merged.items():
        if value is REQUIRED:
            raise ValueError(f"{name}: param {key!r} is required (e.g. {key}=(2, 3))")
    return merged


def check_input_list(name, input_names, inputs, container=None):
    """Check that ``inputs`` is a sequence (not an array) of ``len(input_names)`` values.

    ``container`` narrows the accepted sequence types (fastlib takes list or tuple).
    """
    bad = isinstance(inputs, np.ndarray) or (
        not isinstance(inputs, container) if container else not hasattr(inputs, "__len__"))
    if bad:
        kind = "a list or tuple" if container else "a sequence"
        raise TypeError(f"{name}: inputs must be {kind} of arrays in the order "
                        f"{tuple(input_names)}, e.g. [x]; got {type(inputs).__name__}")
    if len(inputs) != len(input_names):
        raise ValueError(f"{name}: takes {len(input_names)} input(s) {tuple(input_names)}; got "
                         f"{len(inputs)}")


def float_dtype(what, arr, dtypes, engine):
    """Raise a TypeError unless ``arr.dtype`` is one of ``dtypes`` (``engine`` names who asks)."""
    if arr.dtype not in dtypes:
        names = " or ".join(str(np.dtype(d)) for d in dtypes)
        raise TypeError(f"{what} has dtype {arr.dtype}; {engine} computes in {names}, cast it "
                        f"with .astype(np.{np.dtype(dtypes[0])})")


def float_format(what, arr, formats, engine):
    """The format name of ``arr.dtype`` when it is one of ``formats`` (names of
    ``optable.formats``, bfloat16 and float16 among them); else a TypeError that lists them.

    Apart from :func:`float_dtype` because the 16-bit formats need their own hint: bfloat16
    is not a NumPy type but ``ml_dtypes.bfloat16`` (NumPy reads its kind as ``'V'``).
    """
    name = arr.dtype.name
    if name in formats and _formats.is_float(arr.dtype):
        return name
    wide = [f for f in formats if f not in _formats.STORAGE]
    storage = [f for f in formats if f in _formats.STORAGE]
    kept = (f" and takes {' and '.join(storage)} storage (x.astype(ml_dtypes.bfloat16), "
            f"x.astype(np.float16))") if storage else ""
    raise TypeError(f"{what} has dtype {arr.dtype}; {engine} computes in {' or '.join(wide)}"
                    f"{kept}: cast it, e.g. x.astype(np.{wide[0] if wide else formats[0]})")


def common_dtype(name, named_arrays):
    """The one dtype of ``[(input name, array), ...]``; a TypeError lists them when mixed."""
    dtypes = {a.dtype for _, a in named_arrays}
    if len(dtypes) > 1:
        listed = ", ".join(f"{n} {a.dtype}" for n, a in named_arrays)
        raise TypeError(f"{name}: inputs have mixed dtypes ({listed}); cast them to one dtype, "
                        f"e.g. .astype(np.float32)")
    return next(iter(dtypes)) if dtypes else None


def check_class_index(what, arr, kinds="iuf"):
    """Raise a TypeError unless ``arr`` can hold class indices (ints, or whole-number floats)."""
    if arr.dtype.kind not in kinds:
        raise TypeError(f"{what} has dtype {arr.dtype}; pass integer class indices (an int "
                        f"array, or floats holding whole numbers)")


def check_grad(name, grad_shape, grad_dtype, out_shape, dtype=None):
    """Raise unless the cotangent has the output's shape (and the inputs' ``dtype``, if given)."""
    if dtype is not None and grad_dtype != dtype:
        raise TypeError(f"{name}: grad has dtype {grad_dtype} but the inputs are {dtype}; "
                        f"cast the cotangent to {dtype}")
    if tuple(grad_shape) != tuple(out_shape):
        raise ValueError(f"{name}: grad has shape {tuple(grad_shape)} but the output has shape "
                         f"{tuple(out_shape)}; pass a cotangent shaped like the output")


def check_tangents(name, input_names, class_index, inputs, tangents, dtype=None):
    """One tangent per input, shaped like it (and of ``dtype``, when given); None exactly for
    the class-index inputs. The forward-mode and second-order boundary of every engine.

    Returns
    -------
    list
        ``np.asarray`` of each tangent (values as given), None for a class-index input.

    Raises
    ------
    TypeError
        ``tangents`` is not a list or tuple.
    ValueError
        A wrong count, a tangent for a class-index input, None for a differentiable one, or a
        tangent of another shape (or dtype) than its input.
    """
    listed = ", ".join(input_names)
    if isinstance(tangents, np.ndarray) or not isinstance(tangents, (list, tuple)):
        raise TypeError(f"{name}: tangents must be a list or tuple with one array per input "
                        f"({listed}); wrap a single array as [t]")
    if len(tangents) != len(input_names):
        raise ValueError(f"{name}: tangents need one entry per input ({listed}); got "
                         f"{len(tangents)}")
    out = []
    for iname, x, t in zip(input_names, inputs, tangents):
        if iname in class_index:
            if t is not None:
                raise ValueError(f"{name}: input {iname!r} holds class indices and is not "
                                 f"differentiable; pass None as its tangent")
            out.append(None)
            continue
        if t is None:
            raise ValueError(f"{name}: the tangent for input {iname!r} is None; pass an array "
                             f"(zeros to hold the input fixed)")
        arr = np.asarray(t)
        if arr.shape != np.shape(x) or (dtype is not None and arr.dtype != dtype):
            like = "shaped and typed like the input" if dtype is not None else \
                "shaped like the input"
            given, wanted = (f"{arr.dtype}{arr.shape}", f"{np.dtype(dtype)}{np.shape(x)}") \
                if dtype is not None else (f"shape {arr.shape}", f"shape {np.shape(x)}")
            raise ValueError(f"{name}: the tangent for {iname!r} has {given}, the input has "
                             f"{wanted}; pass one {like}")
        out.append(arr)
    return out
