"""``spec.evaluate``: the exact oracle. Forward and every VJP of a registry op, in mpmath.

The formulas evaluated are the registry's own (the ones ``spec.prove`` proves), run on the
mpmath backend with object arrays, so any shape the op accepts works and nothing is compiled.
Work is done with ``GUARD_DIGITS`` extra digits and the results are rounded to ``dps`` digits.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping

import mpmath
import numpy as np

import spec.domains as _domains
from spec.backends import MPMATH
from spec.errors import UnknownOpError, did_you_mean
from spec.opspec import OpSpec
from spec.precision import converge

# NOTE: inputs are exact (binary floats); 20 guard digits absorb the rounding of up to ~1e20-fold
# cancellation (e.g. layer_norm of a nearly constant row) before the result is rounded to dps.
GUARD_DIGITS = 20
MIN_DPS = 15


def lookup(name):
    """The ``OpSpec`` for ``name`` (or ``name`` itself when it is an OpSpec)."""
    from spec.catalog import OPS

    if isinstance(name, OpSpec):
        return name
    if not isinstance(name, str):
        raise TypeError(f"op name must be a string; got {type(name).__name__}")
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}{did_you_mean(name, OPS)} (see "
                             f"`verigrad spec --list` for all {len(OPS)} ops)") from None


def _check_dps(dps):
    if not isinstance(dps, numbers.Integral) or isinstance(dps, bool) or dps < MIN_DPS:
        raise ValueError(f"dps must be an int >= {MIN_DPS} (decimal digits); got {dps!r}")
    return int(dps)


def _to_mpf(value, where):
    if isinstance(value, mpmath.mpf):
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: booleans are not numbers here; pass floats (x.astype(float))")
    if isinstance(value, (numbers.Integral, np.integer)):
        return mpmath.mpf(int(value))
    if isinstance(value, (float, np.floating)):
        return mpmath.mpf(float(value))
    raise TypeError(f"{where}: entries must be real numbers (float, int or mpmath.mpf); got "
                    f"{type(value).__name__}")


def as_array(x, where):
    """``x`` as a float64 ndarray, or an object ndarray when it holds mpf; TypeError otherwise."""
    if isinstance(x, np.ndarray) and x.dtype == object:
        out = np.empty(x.shape, dtype=object)
        out.reshape(-1)[:] = [_to_mpf(v, where) for v in x.reshape(-1)]
        return out
    arr = np.asarray(x)
    if arr.dtype == object:  # a list holding mpf
        return as_array(arr, where)
    if arr.dtype.kind == "b":
        raise TypeError(f"{where}: got a boolean array; pass floats (x.astype(np.float64))")
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{where}: dtype {arr.dtype} is not a real number type; pass float32, "
                        f"float64 or integers")
    return arr


def _finite_mask(arr):
    if arr.dtype == object:
        # np.asarray: frompyfunc hands back a plain bool, not an array, for a 0-d input
        return np.asarray(np.frompyfunc(lambda v: bool(mpmath.isfinite(v)), 1, 1)(arr), dtype=bool)
    return np.isfinite(arr)


def _first_bad(mask):
    idx = np.argwhere(np.asarray(mask))
    return tuple(int(i) for i in idx[0]) if idx.size else None


def check_input(op, name, arr, num_classes=None):
    """Reject NaN/Inf and values outside the input's domain, naming the entry and the fix."""
    domain = _domains.get(op.domains[name])
    bad = _first_bad(~_finite_mask(arr))
    if bad is not None:
        raise ValueError(f"{op.name}: input {name!r} holds {arr[bad]} at index {bad}; inputs "
                         f"must be finite (clean NaN/Inf before calling)")
    if domain.name == "class_index":
        vals = arr.astype(np.float64) if arr.dtype != object else np.array(
            [float(v) for v in arr.reshape(-1)]).reshape(arr.shape)
        wrong = (vals < 0) | (vals != np.floor(vals)) | (vals >= (num_classes or 0))
        bad = _first_bad(wrong)
        if bad is not None:
            raise ValueError(f"{op.name}: input {name!r} must hold class indices, integers in "
                             f"[0, {num_classes}); got {arr[bad]} at index {bad}")
        return vals.astype(np.int64)
    wrong = domain.bad(arr)
    bad = _first_bad(wrong)
    if bad is not None:
        raise ValueError(f"{op.name}: input {name!r} must be in domain {domain.name!r} "
                         f"({domain.description}); got {arr[bad]} at index {bad}")
    return arr


def _mpf_array(arr):
    """An object array of mpf (exact conversion of binary floats and ints)."""
    out = np.empty(arr.shape, dtype=object)
    if arr.dtype == object:
        out.reshape(-1)[:] = [+v for v in arr.reshape(-1)]   # round to the working precision
        return out
    flat = out.reshape(-1)
    kind_int = arr.dtype.kind in "iu"
    for i, v in enumerate(arr.reshape(-1).tolist()):
        flat[i] = mpmath.mpf(int(v) if kind_int else v)
    return out


def _rounded(x):
    """An object array of mpf rounded to the ambient precision (0-d for scalars)."""
    x = np.asarray(x, dtype=object)
    out = np.empty(x.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(x.reshape(-1)):
        flat[i] = +mpmath.mpf(v)
    return out


def prepare(op, inputs, params):
    """Validate ``inputs`` and ``params``; return (arrays, resolved params, output shape)."""
    if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
        raise TypeError(f"{op.name}: inputs must be a list or tuple with one array per input "
                        f"({', '.join(op.inputs)}); wrap a single array as [x]")
    if len(inputs) != len(op.inputs):
        raise ValueError(f"{op.name}: takes {len(op.inputs)} input(s) ({', '.join(op.inputs)}); "
                         f"got {len(inputs)}")
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"{op.name}: params must be a dict of keyword parameters; got "
                        f"{type(params).__name__}")
    arrays = [as_array(x, f"{op.name}: input {n!r}") for n, x in zip(op.inputs, inputs)]
    out_shape = op.check_shapes([a.shape for a in arrays], params)
    resolved = op.resolve_params(params)
    first = arrays[0].shape
    num_classes = first[-1] if first else None
    arrays = [check_input(op, n, a, num_classes) for n, a in zip(op.inputs, arrays)]
    return arrays, resolved, out_shape


def _run(op, inputs, grad, params, dps):
    dps = _check_dps(dps)
    arrays, resolved, out_shape = prepare(op, inputs, params)
    if grad is not None:
        g = as_array(grad, f"{op.name}: grad")
        if g.shape != tuple(out_shape):
            raise ValueError(f"{op.name}: grad has shape {g.shape} but the output has shape "
                             f"{tuple(out_shape)}; pass a cotangent shaped like the output")
        bad = _first_bad(~_finite_mask(g))
        if bad is not None:
            raise ValueError(f"{op.name}: grad holds {g[bad]} at index {bad}; it must be finite")
    def compute():
        values = [a if op.domains[n] == "class_index" else _mpf_array(a)
                  for n, a in zip(op.inputs, arrays)]
        try:
            result = np.asarray(op.run_forward(MPMATH, values, resolved), dtype=object)
            grads = ()
            if grad is not None:
                grads = tuple(op.run_vjp(MPMATH, values, resolved, result, _mpf_array(g)))
        except ZeroDivisionError as exc:  # pragma: no cover - domains exclude the poles
            raise ValueError(f"{op.name}: division by zero at these inputs ({exc})") from None
        return (result,) + grads

    # NOTE: the working precision grows until the answer stops moving (spec.precision), so
    # saturated tails such as 1 - tanh(80)^2 come back right, not as cancelled zeros.
    result, *grads = converge(compute, dps, GUARD_DIGITS)
    if grad is None:
        grads = None
    with mpmath.workdps(dps):
        out = _rounded(result)
        if grads is None:
            return out, None
        return out, tuple(None if gi is None else _rounded(gi) for gi in grads)


def evaluate(name, inputs, grad, params=None, dps=50):
    """Forward and one VJP per input of a registry op, exactly (mpmath at ``dps`` digits).

    Parameters
    ----------
    name : str
        A registry op name (``spec.OPS``).
    inputs : list or tuple of array_like
        One array per input, in the registry's input order. Floats are converted exactly; object
        arrays of ``mpmath.mpf`` are accepted as they are.
    grad : array_like
        The cotangent, shaped like the output (0-d for losses).
    params : dict, optional
        Keyword parameters (defaults from the registry fill the rest).
    dps : int, default 50
        Decimal digits of the results.

    Returns
    -------
    output : numpy.ndarray of mpmath.mpf
        The forward value (0-d for scalar outputs).
    grads : tuple
        One object array of mpf per input, shaped like that input; ``None`` for an input that is
        not differentiable (class indices).

    Raises
    ------
    UnknownOpError
        ``name`` is not a registry op (the message lists close names).
    ValueError
        Wrong number of inputs, shapes the op does not accept, a bad parameter, NaN/Inf, a value
        outside an input's domain, a grad of the wrong shape.
    TypeError
        A non-numeric dtype, or ``inputs`` not a list/tuple.

    Examples
    --------
    >>> import numpy as np
    >>> out, (gx,) = evaluate("tanh", [np.array([0.5])], np.array([1.0]), dps=30)
    >>> str(gx[0])[:12]
    '0.7864477329'
    """
    op = lookup(name)
    if grad is None:
        raise ValueError(f"{op.name}: grad is required (use evaluate_forward for the value only)")
    return _run(op, inputs, grad, params, dps)


def evaluate_forward(name, inputs, params=None, dps=50):
    """The forward value only (see ``evaluate``); an object array of mpf at ``dps`` digits."""
    return _run(lookup(name), inputs, None, params, dps)[0]
