"""fastlib's op table and the engine protocol: ``forward``, ``vjp``, ``value_and_vjp``.

The public wrapper around the private Numba kernels: it looks the op up and checks inputs,
params and cotangent at the boundary (``optable.boundary``) before any kernel runs, so bad input
gets an error that names the fix, never one from inside Numba.

The long story: docs/fastlib-kernels.md, section ``fastlib/ops.py``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

import optable
from fastlib.kernels import binary as _binary
from fastlib.kernels import elementwise as _elementwise
from fastlib.kernels import half as _half
from fastlib.kernels import linalg as _linalg
from fastlib.kernels import loss as _loss
from fastlib.kernels import norm as _norm
from fastlib.kernels import reduce as _reduce
from fastlib.kernels import scalar as _scalar
from fastlib.kernels import structure as _structure
from optable import REQUIRED, UnknownOpError  # noqa: F401 (public names of fastlib.ops)
from optable import shapes as _shapes

__all__ = ["OPS", "OpEntry", "UnknownOpError", "forward", "vjp", "value_and_vjp", "bind",
           "BoundOp", "op_names", "COMPUTES_IN"]


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: ``{storage format: the precision fastlib computes it in}``: bfloat16 and float16 inputs are
#: widened to float32 exactly, every op runs in the float32 kernels (their sums in float32 or
#: wider) and each result is rounded once, to nearest even, back to the storage format. The
#: conformance suite holds fastlib to that promise (docs/engines.md, "16-bit formats").
COMPUTES_IN = MappingProxyType({name: "float32" for name in optable.formats.STORAGE})
_ACCEPTED = ("float32", "float64") + optable.formats.STORAGE


@dataclass(frozen=True)
class OpEntry:
    """One op of the table.

    ``check(arrays, params) -> (ctx, out_shape)`` validates shapes and the resolved params and
    returns what the launchers need; ``forward(arrays, ctx) -> ndarray``;
    ``vjp(arrays, grad, ctx) -> tuple`` (None for a non-differentiable input);
    ``value_and_vjp(arrays, grad, ctx) -> (output, grads)`` when one pass does both.
    """

    name: str
    inputs: tuple
    params: Mapping[str, Any]
    check: Callable
    forward: Callable
    vjp: Callable
    value_and_vjp: Callable | None = None
    finite_only: bool | tuple = False      # True: every float input; a tuple: those inputs
    class_index: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))


# --- param checks ------------------------------------------------------------------------------

def _fail(op, message):
    raise ValueError(f"{op}: {message}")


def _real(op, pname, value, positive=False):
    return float(_shapes.PARAM_KINDS["positive" if positive else "real"](op, pname, value))


_int, _bool = _shapes.PARAM_KINDS["int"], _shapes.PARAM_KINDS["bool"]


# --- checkers: (arrays, params) -> (ctx, out_shape); the shapes are the op table's rules ------

def _shape(name, a, p):
    return optable.output_shape(name, [x.shape for x in a], p)


def _check_unary(a, p):
    return {"negative_slope": _real("leaky_relu", "negative_slope", p["negative_slope"])} \
        if "negative_slope" in p else {}, a[0].shape


def _check_shape_only(name):
    def check(a, p):
        return {}, _shape(name, a, p)
    return check


def _check_reduction_for(name):
    def check(a, p):
        keepdims = _bool(name, "keepdims", p["keepdims"])
        axes = _shapes.resolve_axes(name, p["axis"], a[0].ndim)
        return {"axes": axes, "keepdims": keepdims}, _shape(name, a, p)
    return check


def _check_transpose(a, p):
    perm = _shapes.permutation("transpose", p["axes"], a[0].ndim)
    return {"perm": perm}, tuple(a[0].shape[i] for i in perm)


def _check_reshape(a, p):
    if _shapes._is_int(p["shape"]) or (isinstance(p["shape"], (tuple, list))
                                        and all(_shapes._is_int(d) for d in p["shape"])):
        shape = _shape("reshape", a, p)
        return {"shape": shape}, shape
    _fail("reshape", f"shape must be a tuple of ints, got {p['shape']!r}")


def _check_concat(a, p):
    shape = _shape("concat", a, {"axis": _int("concat", "axis", p["axis"])})
    return {"axis": _shapes.one_axis("concat", p["axis"], a[0].ndim)}, shape


def _check_slice(a, p):
    x = a[0]
    start, stop = (None if p[k] is None else _int_or_none("slice", k, p[k])
                   for k in ("start", "stop"))
    step = p["step"]
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, numbers.Integral) or step < 1:
        _fail("slice", f"step must be an int >= 1, got {step!r}")
    if x.ndim and not (_is_plain_int(p["axis"]) and -x.ndim <= p["axis"] < x.ndim):
        _fail("slice", f"axis must be an int in [-{x.ndim}, {x.ndim}), got {p['axis']!r}")
    shape = _shape("slice", a, {**p, "start": start, "stop": stop})
    axis, kept = _shapes.slice_range(x.shape, p["axis"], start, stop, int(step))
    return {"plan": (axis, kept.start, kept.step, shape)}, shape


def _is_plain_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _int_or_none(op, pname, value):
    if not _is_plain_int(value):
        _fail(op, f"{pname} must be an int or None, got {value!r}")
    return int(value)


def _check_along_axis_for(name):
    def check(a, p):
        shape = _shape(name, a, p)
        return {"axis": _shapes.one_axis(name, p["axis"], a[0].ndim)}, shape
    return check


def _check_last_axis_for(name):
    def check(a, p):
        shape = _shape(name, a, p)
        return {"eps": _real(name, "eps", p["eps"], positive=True)}, shape
    return check


def _check_same_shape_loss_for(name):
    def check(a, p):
        _shape(name, a, p)
        if name.startswith("binary_cross_entropy"):
            if name == "binary_cross_entropy":
                _in_unit_interval(name, "p", a[0], "probabilities; apply sigmoid first, or use "
                                                   "binary_cross_entropy_with_logits")
            _in_unit_interval(name, "target", a[1], "binary targets")
        return {}, ()
    return check


def _in_unit_interval(name, what, x, hint):
    i = _reduce.first_outside(x, 0.0, 1.0)
    if i >= 0:
        idx = [int(k) for k in np.unravel_index(i, x.shape)]
        _fail(name, f"{what} must lie in [0, 1] ({hint}); {what}{idx} = {x.reshape(-1)[i].item()}")


def _check_cross_entropy(a, p):
    z, t = a
    _shape("cross_entropy", a, p)
    c = z.shape[1]
    flat = t.reshape(-1)
    if flat.dtype.kind == "f":
        whole = np.isfinite(flat) & (flat == np.round(flat))
        if not whole.all():
            i = int(np.argmin(whole))
            _fail("cross_entropy", f"class indices must be whole numbers; target[{i}] = "
                                   f"{flat[i].item()}")
    bad = (flat < 0) | (flat >= c)
    if bad.any():
        i = int(np.argmax(bad))
        _fail("cross_entropy", f"class index target[{i}] = {flat[i].item()} is outside [0, {c}) "
                               f"for logits with C = {c} classes")
    return {"index": flat.astype(np.int64)}, ()


def _check_categorical(a, p):
    return {}, _shape("categorical_cross_entropy", a, p)


# --- launchers -----------------------------------------------------------------------------------

def _entry(name, check, forward, vjp, **flags):
    """An ``OpEntry`` whose inputs and params (with defaults) are the op table's."""
    sig = optable.OPS[name]
    return OpEntry(name, sig.inputs, sig.defaults, check, forward, vjp, **flags)


def _unary_entry(name):
    sig = optable.OPS[name]
    return OpEntry(
        name=name, inputs=sig.inputs, params=sig.defaults, check=_check_unary,
        forward=lambda a, c: _elementwise.unary_forward(name, a[0], **c),
        vjp=lambda a, g, c: (_elementwise.unary_vjp(name, a[0], g, **c),))


def _binary_entry(name):
    return OpEntry(
        name=name, inputs=optable.OPS[name].inputs, params={}, check=_check_shape_only(name),
        forward=lambda a, c: _binary.binary_forward(name, a[0], a[1]),
        vjp=lambda a, g, c: _binary.binary_vjp(name, a[0], a[1], g))


def _reduction_entry(name, fwd, bwd, finite_only=False):
    sig = optable.OPS[name]
    return OpEntry(
        name=name, inputs=sig.inputs, params=sig.defaults,
        check=_check_reduction_for(name), finite_only=finite_only,
        forward=lambda a, c: fwd(a[0], c["axes"], c["keepdims"]),
        vjp=lambda a, g, c: (bwd(a[0], c["axes"], g),))


def _loss_entry(name, check, fn, finite_only=True):
    class_index = optable.OPS[name].class_index

    def value_and_vjp(a, g, c):
        args = (a[0], c["index"]) if class_index else (a[0], a[1])
        return fn(*args, grad=g)

    def forward(a, c):
        args = (a[0], c["index"]) if class_index else (a[0], a[1])
        return fn(*args)[0]

    return OpEntry(name=name, inputs=optable.OPS[name].inputs, params={}, check=check,
                   forward=forward,
                   vjp=lambda a, g, c: value_and_vjp(a, g, c)[1],
                   value_and_vjp=value_and_vjp, finite_only=finite_only,
                   class_index=class_index)


def _build_table():
    entries = [_unary_entry(n) for n in _elementwise.UNARY_OPS]
    entries += [_binary_entry(n) for n in _binary.BINARY_OPS]
    entries += [
        _reduction_entry("sum", _reduce.sum_forward, _reduce.sum_vjp),
        _reduction_entry("mean", _reduce.mean_forward, _reduce.mean_vjp),
        _reduction_entry("logsumexp", _reduce.logsumexp_forward, _reduce.logsumexp_vjp,
                         finite_only=True),
        _entry("matmul", _check_shape_only("matmul"),
               lambda a, c: _linalg.matmul_forward(a[0], a[1]),
               lambda a, g, c: _linalg.matmul_vjp(a[0], a[1], g)),
        _entry("transpose", _check_transpose,
               lambda a, c: _structure.transpose_forward(a[0], c["perm"]),
               lambda a, g, c: (_structure.transpose_vjp(a[0], c["perm"], g),)),
        _entry("reshape", _check_reshape,
               lambda a, c: _structure.reshape_forward(a[0], c["shape"]),
               lambda a, g, c: (_structure.reshape_vjp(a[0], c["shape"], g),)),
        _entry("concat", _check_concat,
               lambda a, c: _structure.concat_forward(a[0], a[1], c["axis"]),
               lambda a, g, c: _structure.concat_vjp(a[0], a[1], c["axis"], g)),
        _entry("slice", _check_slice,
               lambda a, c: _structure.slice_forward(a[0], c["plan"]),
               lambda a, g, c: (_structure.slice_vjp(a[0], c["plan"], g),)),
        _entry("softmax", _check_along_axis_for("softmax"),
               lambda a, c: _norm.softmax_forward(a[0], c["axis"]),
               lambda a, g, c: (_norm.softmax_vjp(a[0], c["axis"], g),), finite_only=True),
        _entry("log_softmax", _check_along_axis_for("log_softmax"),
               lambda a, c: _norm.log_softmax_forward(a[0], c["axis"]),
               lambda a, g, c: (_norm.log_softmax_vjp(a[0], c["axis"], g),),
               finite_only=True),
        _entry("layer_norm", _check_last_axis_for("layer_norm"),
               lambda a, c: _norm.layer_norm_forward(a[0], c["eps"]),
               lambda a, g, c: (_norm.layer_norm_vjp(a[0], c["eps"], g),), finite_only=True),
        _entry("rms_norm", _check_last_axis_for("rms_norm"),
               lambda a, c: _norm.rms_norm_forward(a[0], c["eps"]),
               lambda a, g, c: (_norm.rms_norm_vjp(a[0], c["eps"], g),), finite_only=True),
        _loss_entry("mse", _check_same_shape_loss_for("mse"), _loss.mse),
        _loss_entry("cross_entropy", _check_cross_entropy, _loss.cross_entropy),
        _loss_entry("categorical_cross_entropy", _check_categorical,
                    _loss.categorical_cross_entropy),
        # the [0, 1] range checks of the binary losses also reject NaN and inf
        _loss_entry("binary_cross_entropy", _check_same_shape_loss_for("binary_cross_entropy"),
                    _loss.binary_cross_entropy, finite_only=()),
        _loss_entry("binary_cross_entropy_with_logits",
                    _check_same_shape_loss_for("binary_cross_entropy_with_logits"),
                    _loss.binary_cross_entropy_with_logits, finite_only=("logits",)),
    ]
    return MappingProxyType({e.name: e for e in entries})


OPS = _build_table()

#: ``{op: {path: dtypes}}``: the results (``"forward"`` or ``"vjp"``) fastlib returns as the
#: exact value rounded once, in those dtypes, up to float64 rounding. Read from the kernel
#: modules' own promises (their NOTEs say why they hold); the conformance suite holds fastlib
#: to the single-rounding bound there (docs/engines.md, "Declaring results rounded once").
ROUNDED_ONCE = MappingProxyType(
    {**{n: {"vjp": _binary.ROUNDED_ONCE_VJP_DTYPES} for n in _binary.BINARY_OPS},
     **{n: {"forward": _reduce.ROUNDED_ONCE_FORWARD_DTYPES} for n in ("sum", "mean")},
     **{n: {"vjp": d} for n, d in _scalar.ROUNDED_ONCE_VJP_DTYPES.items()}})


def op_names():
    """The names of every op in the table, sorted."""
    return sorted(OPS)


# --- the boundary: name, params, inputs, grad -----------------------------------------------

def _lookup(name):
    return optable.lookup(OPS, name)


def _resolve_params(entry, params):
    return optable.resolve_params(entry.name, entry.params, params)


def _as_float_array(op, what, value):
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if arr.dtype not in _FLOATS and not (arr.dtype.name in COMPUTES_IN and arr.dtype.isnative):
        if arr.dtype.kind == "f" and arr.dtype.itemsize in (2, 4, 8):   # non-native byte order
            arr = arr.astype(arr.dtype.newbyteorder("="))
        else:
            optable.float_format(f"{op}: {what}", arr, _ACCEPTED, "fastlib")
    # NOTE: not np.ascontiguousarray, which turns a 0-d array into shape (1,)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _as_class_index(op, what, value):
    arr = np.asarray(value)
    optable.check_class_index(f"{op}: {what}", arr)
    return arr


_FLOAT_MAX = {np.dtype(np.float32): float(np.finfo(np.float32).max),
              np.dtype(np.float64): float(np.finfo(np.float64).max)}


def _check_finite(op, what, arr):
    if arr.ndim == 0:                            # a loss cotangent: no kernel call needed
        i = -1 if math.isfinite(arr[()]) else 0
    else:
        big = _FLOAT_MAX[arr.dtype]
        i = _reduce.first_outside(arr, -big, big)     # one vectorised pass in the common case
    if i >= 0:
        idx = [int(k) for k in np.unravel_index(i, arr.shape)]
        raise ValueError(f"{op}: {what} holds a non-finite value {arr.reshape(-1)[i].item()} "
                         f"at index {idx}; {op} needs finite inputs (a NaN or inf here usually "
                         f"means the values upstream diverged)")


def _widened(name, dtype, arrays, class_index, storage):
    """``arrays`` with 16-bit storage widened to float32 (exactly), or a TypeError where the
    caller computes in float32 and float64 only (``storage=False``)."""
    if dtype.name not in COMPUTES_IN:
        return [a for _, a in arrays]
    if not storage:
        raise TypeError(f"{name}: the inputs are {dtype}; forward mode and second order run in "
                        f"float32 and float64 (forward, vjp, value_and_vjp and bind take 16-bit "
                        f"storage): cast them with .astype(np.float32)")
    return [a if n in class_index else _half.widen(a) for n, a in arrays]


def _stored(result, dtype):
    """A float32 result rounded once to the 16-bit storage ``dtype`` (unchanged otherwise)."""
    if dtype.name not in COMPUTES_IN or result is None:
        return result
    return _half.narrow(np.asarray(result), dtype)


def _prepare(name, inputs, params, storage=False):
    entry = _lookup(name)
    merged = _resolve_params(entry, params)
    optable.check_input_list(name, entry.inputs, inputs, container=(list, tuple))
    arrays = []
    for iname, value in zip(entry.inputs, inputs):
        if iname in entry.class_index:
            arrays.append(_as_class_index(name, f"input {iname!r}", value))
        else:
            arrays.append(_as_float_array(name, f"input {iname!r}", value))
    floats = [(n, a) for n, a in zip(entry.inputs, arrays) if n not in entry.class_index]
    optable.common_dtype(name, floats)
    dtype = floats[0][1].dtype
    arrays = _widened(name, dtype, list(zip(entry.inputs, arrays)), entry.class_index, storage)
    if entry.finite_only:
        for n, a in zip(entry.inputs, arrays):
            if n not in entry.class_index and (entry.finite_only is True
                                               or n in entry.finite_only):
                _check_finite(name, f"input {n!r}", a)
    ctx, out_shape = entry.check(arrays, merged)
    return entry, arrays, ctx, out_shape, dtype


def _prepare_grad(entry, grad, out_shape, dtype):
    g = _as_float_array(entry.name, "grad", grad)
    optable.check_grad(entry.name, g.shape, g.dtype, out_shape, dtype)
    if dtype.name in COMPUTES_IN:
        g = _half.widen(g)
    if entry.finite_only:
        _check_finite(entry.name, "grad", g)
    return g


class BoundOp:
    """An op bound to validated inputs and params: ``forward()`` and ``vjp(grad)`` run the
    kernels without checking the inputs again (for loops that call the same op many times,
    and for timing the kernels alone). Build it with :func:`bind`.
    """

    __slots__ = ("entry", "arrays", "ctx", "out_shape", "dtype")

    def __init__(self, entry, arrays, ctx, out_shape, dtype):
        self.entry, self.arrays, self.ctx = entry, arrays, ctx
        self.out_shape, self.dtype = tuple(out_shape), dtype

    def forward(self):
        """The op's output (a new array)."""
        return _stored(self.entry.forward(self.arrays, self.ctx), self.dtype)

    def vjp(self, grad, check=True):
        """One cotangent per input for the cotangent ``grad`` of the output.

        ``check=False`` skips the checks of ``grad`` (shape, dtype, finiteness): the caller
        vouches that it is a C-contiguous array of the output's shape and the inputs' dtype.
        """
        if check:
            g = _prepare_grad(self.entry, grad, self.out_shape, self.dtype)
        else:
            g = _half.widen(grad) if self.dtype.name in COMPUTES_IN else grad
        return tuple(_stored(r, self.dtype) for r in self.entry.vjp(self.arrays, g, self.ctx))


def bind(name, inputs, **params):
    """Validate ``inputs`` and ``params`` for op ``name`` once; a :class:`BoundOp`.

    Raises what :func:`forward` raises. The arrays are kept by reference: mutating them
    afterwards changes what the bound op computes (and skips the checks).
    """
    return BoundOp(*_prepare(name, inputs, params, storage=True))


def forward(name, inputs, **params):
    """Evaluate op ``name`` on ``inputs`` with fastlib's kernels.

    Parameters
    ----------
    name : str
        An op of docs/CONTRACTS.md's table (``"tanh"``, ``"matmul"``, ``"cross_entropy"``, ...).
    inputs : list or tuple of array_like
        The op's inputs in the table's order (``[x]``, ``[a, b]``, ``[logits, target]``),
        float32 or float64, or the 16-bit storage formats bfloat16 (``ml_dtypes``) and float16
        (computed in float32, the result rounded once: ``COMPUTES_IN``); one dtype for all
        (class indices excepted).
    **params
        The op's params (``axis=``, ``keepdims=``, ``eps=``, ...); omitted ones take defaults.

    Returns
    -------
    numpy.ndarray
        A new array of the inputs' dtype; losses give shape ``()``.

    Raises
    ------
    UnknownOpError
        A name not in the table (a KeyError; the message lists close names).
    ValueError
        A wrong number of inputs, shapes that do not fit, an unknown or bad param, or a
        non-finite input to an op that needs finite ones (see the module docstring).
    TypeError
        Inputs of a dtype other than float32/float64/bfloat16/float16, or of mixed dtypes.
    """
    entry, arrays, ctx, _, dtype = _prepare(name, inputs, params, storage=True)
    return _stored(entry.forward(arrays, ctx), dtype)


def vjp(name, inputs, grad, **params):
    """Vector-Jacobian product of op ``name``: one cotangent per input.

    Parameters
    ----------
    name, inputs, **params
        As for :func:`forward`.
    grad : array_like
        The cotangent of the output: the output's shape (``()`` for losses) and the inputs'
        dtype.

    Returns
    -------
    tuple of (numpy.ndarray or None)
        One new array per input, shaped like it; None for ``cross_entropy``'s class indices.

    Raises
    ------
    UnknownOpError, ValueError, TypeError
        As for :func:`forward`, and for a ``grad`` of the wrong shape or dtype.
    """
    entry, arrays, ctx, out_shape, dtype = _prepare(name, inputs, params, storage=True)
    g = _prepare_grad(entry, grad, out_shape, dtype)
    return tuple(_stored(r, dtype) for r in entry.vjp(arrays, g, ctx))


def value_and_vjp(name, inputs, grad, **params):
    """``(forward(...), vjp(...))`` with one validation, fused into one pass where that pays.

    The losses compute the loss and its gradient in one kernel call (the cross-entropies fuse
    the softmax with its gradient); other ops validate once and call both launchers.

    Parameters
    ----------
    name, inputs, grad, **params
        As for :func:`vjp`.

    Returns
    -------
    (numpy.ndarray, tuple of (numpy.ndarray or None))
        The output and one cotangent per input.
    """
    entry, arrays, ctx, out_shape, dtype = _prepare(name, inputs, params, storage=True)
    g = _prepare_grad(entry, grad, out_shape, dtype)
    if entry.value_and_vjp is not None:
        out, grads = entry.value_and_vjp(arrays, g, ctx)
    else:
        out, grads = entry.forward(arrays, ctx), entry.vjp(arrays, g, ctx)
    return _stored(out, dtype), tuple(_stored(r, dtype) for r in grads)
