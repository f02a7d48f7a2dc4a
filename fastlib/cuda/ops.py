"""The CUDA engine's op table and its boundary: names, inputs, params, shapes and domains.

Everything is checked on the host (every input finite and inside its op's real domain, as
reflib requires) before the device is touched, so a bad call gets an error that says what to
change, never one from inside a kernel.

The long story: docs/fastlib.md, section ``fastlib/cuda/ops.py``.
"""
from __future__ import annotations

import numbers
from types import MappingProxyType
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import optable
from optable import REQUIRED, UnknownOpError  # noqa: F401 (public names of this module)
from optable.checks import check_int, check_real, class_indices, fail, require_domain
from optable.shapes import one_axis, output_shape, permutation, resolve_axes

from fastlib.kernels import half as _half

from . import device, elementwise, linalg, loss, norm, reduce, structure


@dataclass(frozen=True)
class CudaOp:
    """One op of the CUDA engine.

    ``check(arrays, params) -> (out_shape, params)`` validates and normalises;
    ``forward(arrays, params) -> ndarray`` and ``vjp(arrays, grad, params) -> tuple`` run it.
    """

    inputs: tuple
    check: Callable
    forward: Callable
    vjp: Callable
    params: dict = field(default_factory=dict)
    class_index: frozenset = frozenset()   # inputs holding class indices (not differentiable)
    allow_empty: bool = False              # structure ops move empty arrays fine
    check_vjp: Callable | None = None      # extra domain of the VJP (sqrt's derivative at 0)


# ---------------------------------------------------------------------------------------------
# unary and binary

def _unary(name):
    def check(arrays, params):
        (x,) = arrays
        out = dict(params)
        if name == "leaky_relu":
            slope = check_real(name, "negative_slope", params["negative_slope"])
            out["negative_slope"] = float(slope)
        if name == "log":
            require_domain(name, "x", x, x > 0, "> 0 (log is real only on positive numbers)")
        if name == "sqrt":
            require_domain(name, "x", x, x >= 0, ">= 0 (sqrt is real only on non-negative numbers)")
        return x.shape, out

    def forward(arrays, params):
        return elementwise.unary_forward(name, arrays[0], params.get("negative_slope", 0.0))

    def vjp(arrays, grad, params):
        return elementwise.unary_vjp(name, arrays[0], grad, params.get("negative_slope", 0.0))

    def check_vjp(arrays):
        require_domain(name, "x", arrays[0], arrays[0] > 0,
                       "> 0 for the VJP (the derivative 1/(2 sqrt x) is infinite at 0)")

    return CudaOp(("x",), check, forward, vjp, optable.OPS[name].defaults,
                  check_vjp=check_vjp if name == "sqrt" else None)


def _binary(name):
    def check(arrays, params):
        a, b = arrays
        shape = _shape(name, arrays, params)
        if name == "div":
            require_domain(name, "b", b, b != 0, "nonzero (the divisor)")
        return shape, params

    return CudaOp(("a", "b"), check,
                  lambda arrays, params: elementwise.binary_forward(name, *arrays),
                  lambda arrays, grad, params: elementwise.binary_vjp(name, *arrays, grad))


# ---------------------------------------------------------------------------------------------
# reductions

def _reduction(name, fwd, bwd):
    def check(arrays, params):
        (x,) = arrays
        keepdims = params["keepdims"]
        if not isinstance(keepdims, (bool, np.bool_)):
            fail(name, f"param keepdims must be True or False; got {keepdims!r}")
        shape = _shape(name, arrays, params)
        return shape, {"axes": resolve_axes(name, params["axis"], x.ndim),
                       "keepdims": bool(keepdims)}

    return CudaOp(("x",), check,
                  lambda arrays, p: fwd(arrays[0], p["axes"], p["keepdims"]),
                  lambda arrays, grad, p: bwd(arrays[0], grad, p["axes"]),
                  {"axis": None, "keepdims": False})


# ---------------------------------------------------------------------------------------------
# structure

def _shape(name, arrays, params):
    """The output shape by the op table's rule (``optable.output_shape``)."""
    return output_shape(name, [a.shape for a in arrays], params)


def _check_matmul(arrays, params):
    return _shape("matmul", arrays, params), params


def _check_transpose(arrays, params):
    (x,) = arrays
    axes = params["axes"]
    if axes is not None and not isinstance(axes, (list, tuple)):
        fail("transpose", f"param axes must be None or a sequence of ints; got {axes!r}")
    if axes is not None:
        axes = tuple(check_int("transpose", "axes", a) for a in axes)
    return _shape("transpose", arrays, params), {"axes": permutation("transpose", axes, x.ndim)}


def _check_reshape(arrays, params):
    shape = params["shape"]
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)):
        fail("reshape", f"param shape must be a tuple of ints (one may be -1); got {shape!r}")
    shape = tuple(check_int("reshape", "shape", d, minimum=-1) for d in shape)
    shape = _shape("reshape", arrays, {"shape": shape})
    return shape, {"shape": shape}


def _check_concat(arrays, params):
    shape = _shape("concat", arrays, {"axis": check_int("concat", "axis", params["axis"])})
    return shape, {"axis": one_axis("concat", params["axis"], arrays[0].ndim)}


def _check_slice(arrays, params):
    start = None if params["start"] is None else check_int("slice", "start", params["start"])
    stop = None if params["stop"] is None else check_int("slice", "stop", params["stop"])
    step = check_int("slice", "step", params["step"], minimum=1)
    checked = {"axis": check_int("slice", "axis", params["axis"]), "start": start,
               "stop": stop, "step": step}
    shape = _shape("slice", arrays, checked)
    return shape, {**checked, "axis": one_axis("slice", params["axis"], arrays[0].ndim)}


# ---------------------------------------------------------------------------------------------
# normalisation

def _check_softmax(name):
    def check(arrays, params):
        shape = _shape(name, arrays, {"axis": check_int(name, "axis", params["axis"])})
        return shape, {"axis": one_axis(name, params["axis"], arrays[0].ndim)}
    return check


def _check_last_axis(name):
    def check(arrays, params):
        (x,) = arrays
        _shape(name, arrays, params)
        eps = float(check_real(name, "eps", params["eps"], minimum=0.0))
        if eps == 0.0:
            rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
            spread = rows - rows.mean(axis=1, keepdims=True) if name == "layer_norm" else rows
            if not (np.abs(spread).max(axis=1) > 0).all():
                fail(name, f"the normaliser is 0 (a row of x is constant"
                           f"{' zero' if name == 'rms_norm' else ''} and eps = 0); pass eps > 0")
        return x.shape, {"axis": x.ndim - 1, "eps": eps}
    return check


def _norm(name, check, params):
    return CudaOp(("x",), check,
                  lambda arrays, p: norm.norm_forward(name, arrays[0], p["axis"], p.get("eps", 0)),
                  lambda arrays, grad, p: norm.norm_vjp(name, arrays[0], grad, p["axis"],
                                                        p.get("eps", 0)),
                  params)


# ---------------------------------------------------------------------------------------------
# losses

def _check_same_shape(name, names):
    def check(arrays, params):
        a, b = arrays
        _shape(name, arrays, params)
        if name == "binary_cross_entropy":
            require_domain(name, "p", a, (a > 0) & (a < 1), "strictly inside (0, 1) "
                           "(probabilities; for logits use binary_cross_entropy_with_logits)")
        if name.startswith("binary_cross_entropy"):
            require_domain(name, "target", b, (b >= 0) & (b <= 1), "in [0, 1] (binary targets)")
        return (), params
    return check


def _check_cross_entropy(arrays, params):
    z, t = arrays
    _shape("cross_entropy", arrays, params)
    class_indices("cross_entropy", t, *z.shape)
    return (), params


def _check_categorical(arrays, params):
    return _shape("categorical_cross_entropy", arrays, params), params


def _elementwise_loss(name, names):
    return CudaOp(names, _check_same_shape(name, names),
                  lambda arrays, p: loss.elementwise_loss_forward(name, *arrays),
                  lambda arrays, grad, p: loss.elementwise_loss_vjp(name, *arrays, grad))


def _ce_forward(arrays, p):
    z, t = arrays
    return loss.cross_entropy_forward(z, class_indices("cross_entropy", t, *z.shape))


def _ce_vjp(arrays, grad, p):
    z, t = arrays
    return loss.cross_entropy_vjp(z, class_indices("cross_entropy", t, *z.shape), grad)


# ---------------------------------------------------------------------------------------------
# the table

UNARY = optable.names(category="unary")

OPS: dict[str, CudaOp] = {name: _unary(name) for name in UNARY}
OPS.update({name: _binary(name) for name in elementwise.BINARY})
OPS.update({
    "sum": _reduction("sum", reduce.sum_forward, reduce.sum_vjp),
    "mean": _reduction("mean", reduce.mean_forward, reduce.mean_vjp),
    "logsumexp": _reduction("logsumexp", reduce.logsumexp_forward, reduce.logsumexp_vjp),
    "matmul": CudaOp(("a", "b"), _check_matmul,
                     lambda arrays, p: linalg.matmul_forward(*arrays),
                     lambda arrays, grad, p: linalg.matmul_vjp(*arrays, grad)),
    "transpose": CudaOp(("x",), _check_transpose,
                        lambda arrays, p: structure.transpose_forward(arrays[0], p["axes"]),
                        lambda arrays, grad, p: structure.transpose_vjp(arrays[0], grad,
                                                                        p["axes"]),
                        {"axes": None}, allow_empty=True),
    "reshape": CudaOp(("x",), _check_reshape,
                      lambda arrays, p: structure.reshape_forward(arrays[0], p["shape"]),
                      lambda arrays, grad, p: structure.reshape_vjp(arrays[0], grad, p["shape"]),
                      {"shape": REQUIRED}, allow_empty=True),
    "concat": CudaOp(("a", "b"), _check_concat,
                     lambda arrays, p: structure.concat_forward(*arrays, p["axis"]),
                     lambda arrays, grad, p: structure.concat_vjp(*arrays, grad, p["axis"]),
                     {"axis": -1}, allow_empty=True),
    "slice": CudaOp(("x",), _check_slice,
                    lambda arrays, p: structure.slice_forward(arrays[0], p["axis"], p["start"],
                                                              p["stop"], p["step"]),
                    lambda arrays, grad, p: structure.slice_vjp(arrays[0], grad, p["axis"],
                                                                p["start"], p["stop"],
                                                                p["step"]),
                    {"axis": 0, "start": 0, "stop": None, "step": 1}, allow_empty=True),
    "softmax": _norm("softmax", _check_softmax("softmax"), {"axis": -1}),
    "log_softmax": _norm("log_softmax", _check_softmax("log_softmax"), {"axis": -1}),
    "layer_norm": _norm("layer_norm", _check_last_axis("layer_norm"), {"eps": 1e-5}),
    "rms_norm": _norm("rms_norm", _check_last_axis("rms_norm"), {"eps": 1e-6}),
    "mse": _elementwise_loss("mse", ("pred", "target")),
    "cross_entropy": CudaOp(("logits", "target"), _check_cross_entropy, _ce_forward, _ce_vjp,
                            class_index=frozenset({"target"})),
    "categorical_cross_entropy": CudaOp(
        ("logits", "target"), _check_categorical,
        lambda arrays, p: loss.categorical_cross_entropy_forward(*arrays),
        lambda arrays, grad, p: loss.categorical_cross_entropy_vjp(*arrays, grad)),
    "binary_cross_entropy": _elementwise_loss("binary_cross_entropy", ("p", "target")),
    "binary_cross_entropy_with_logits": _elementwise_loss("binary_cross_entropy_with_logits",
                                                          ("logits", "target")),
})


#: ``{op: {path: dtypes}}``: the results fastlib-cuda returns as the exact value rounded once,
#: up to float64 rounding (the kernel modules' NOTEs say why they hold); the conformance suite
#: holds the engine to the single-rounding bound there, as ``fastlib.ops.ROUNDED_ONCE`` does
#: for the CPU engine (docs/CONTRACTS.md, "fastlib-cuda").
ROUNDED_ONCE = MappingProxyType(
    {**{n: {"vjp": elementwise.ROUNDED_ONCE_VJP_DTYPES} for n in elementwise.BINARY},
     **{n: {"forward": reduce.ROUNDED_ONCE_FORWARD_DTYPES} for n in ("sum", "mean")}})


# ---------------------------------------------------------------------------------------------
# the boundary

def lookup(name) -> CudaOp:
    """The table entry of ``name``, or :class:`UnknownOpError` listing the closest names."""
    return optable.lookup(OPS, name)


def _params(name, op, params):
    return optable.resolve_params(name, op.params, params)


#: ``{storage format: the precision the CUDA engine computes it in}``, as
#: ``fastlib.ops.COMPUTES_IN`` for the CPU: bfloat16 and float16 host arrays are widened to
#: float32 exactly (``fastlib.kernels.half``), computed by the float32 kernels on the device and
#: each result rounded once to the storage format. Data that lives on the device converts with
#: ``fastlib.cuda.half``'s kernels, compiled from the same source.
COMPUTES_IN = MappingProxyType({name: "float32" for name in optable.formats.STORAGE})
_ACCEPTED = ("float32", "float64") + optable.formats.STORAGE


def _float_array(what, value):
    """``value`` as a C-ordered float32 or float64 array (16-bit storage widened exactly), or
    the TypeError / ValueError of a bad dtype or a non-finite entry."""
    arr = np.asarray(value)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    optable.float_format(what, arr, _ACCEPTED, "the CUDA engine")
    if arr.dtype.name in COMPUTES_IN:
        arr = _half.widen(arr)
    if not np.isfinite(arr).all():
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        raise ValueError(f"{what} holds a non-finite value {arr[idx]} at index {idx}; the CUDA "
                         f"engine takes finite numbers")
    return np.asarray(arr, order="C")  # (ascontiguousarray would turn a 0-d array into 1-d)


def _stored(result, dtype):
    """A float32 result rounded once to the 16-bit storage ``dtype`` (unchanged otherwise)."""
    if result is None or dtype.name not in COMPUTES_IN:
        return result
    return _half.narrow(np.asarray(result, dtype=np.float32), dtype)


def _inputs(name, op, inputs):
    """The op's arrays (16-bit storage widened to float32) and the inputs' own dtype."""
    optable.check_input_list(name, op.inputs, inputs)
    arrays, dtype = [], None
    for iname, value in zip(op.inputs, inputs):
        what = f"{name}: input {iname}"
        if iname in op.class_index:
            arr = np.asarray(value)
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"{what} has dtype {arr.dtype}; pass integer class indices")
            arrays.append(arr)
            continue
        given = np.asarray(value).dtype.newbyteorder("=")
        if dtype is not None and given != dtype:
            raise TypeError(f"{name}: inputs mix {dtype} and {given}; cast them to one dtype")
        dtype = given
        arr = _float_array(what, value)
        if arr.size == 0 and not op.allow_empty:
            fail(name, f"input {iname} is empty (shape {arr.shape}); pass at least one element")
        arrays.append(arr)
    return arrays, dtype


def forward(name, inputs, **params):
    """Evaluate registry op ``name`` on the CUDA device (a GPU, or numba's simulator).

    Parameters
    ----------
    name : str
        An op of docs/CONTRACTS.md's table.
    inputs : sequence of array_like
        The op's inputs in the table's order, float32 or float64, or bfloat16 / float16
        storage (``COMPUTES_IN``) (one dtype); class indices for
        cross_entropy's target.
    **params
        The op's params; omitted ones take the table's defaults.

    Returns
    -------
    numpy.ndarray
        Of the inputs' dtype; losses give shape ``()``.

    Raises
    ------
    UnknownOpError, ValueError, TypeError
        For an unknown name; bad shapes, params, domains or non-finite values; bad dtypes.
    fastlib.cuda.CudaUnavailableError
        A RuntimeError, when neither a GPU nor the simulator is available.
    """
    op = lookup(name)
    merged = _params(name, op, params)
    arrays, dtype = _inputs(name, op, inputs)
    _, normalised = op.check(arrays, merged)
    device.require_device()
    return _stored(op.forward(arrays, normalised), dtype)


def vjp(name, inputs, grad, **params):
    """Vector-Jacobian product of registry op ``name`` on the CUDA device: the parameters,
    results and errors of :func:`fastlib.vjp` (one cotangent per input, None for class indices),
    and :func:`forward`'s device errors."""
    op = lookup(name)
    merged = _params(name, op, params)
    arrays, dtype = _inputs(name, op, inputs)
    out_shape, normalised = op.check(arrays, merged)
    given = np.asarray(grad).dtype
    g = _float_array(f"{name}: grad", grad)
    optable.check_grad(name, g.shape, given.newbyteorder("="), out_shape, dtype)
    if op.check_vjp is not None:
        op.check_vjp(arrays)
    device.require_device()
    return tuple(_stored(r, dtype) for r in op.vjp(arrays, g, normalised))
