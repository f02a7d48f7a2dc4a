"""The unary ops over arrays: forward ``y = f(x)``, VJP ``g f'(x)`` and the second order ``g f''(x) t``.

One chunk kernel per direction maps the op's scalar functions (``fastlib.kernels.scalar``) over a
contiguous slice, the op chosen by the op table's code outside the loop; a ``prange`` driver
splits large arrays into ``config.num_chunks`` slices. The kernels are generated from the table
(``fastlib.kernels.switch``): a branch per unary op, calling ``<name>_f``, ``<name>_vjp`` where
scalar has one (rounded once: exp, log, sqrt, tanh, sigmoid, silu, gelu, gelu_tanh), else
``g * <name>_df``, and ``<name>_d2f``. An op of the table without its scalar functions is an
ImportError; a code the kernels do not know raises ``ValueError`` (never an identity fallback).
docs/fastlib.md has the details.
"""
from __future__ import annotations

import inspect

import numpy as np
from numba import njit, prange

import optable
from fastlib import config
from fastlib.kernels import scalar as S
from fastlib.kernels.switch import compile_switch, switch_source

_FM = config.FASTMATH

# op name -> code: the op table's stable codes (compiled into the kernels as constants)
UNARY_OPS = optable.names(category="unary")
CODES = optable.codes(UNARY_OPS)
# NOTE: a code the kernels do not know raises (never an identity fallback); the launchers
# check the name first, so this is the message of a direct kernel call with a bad code.
_UNKNOWN = "unknown unary op code (not a code of optable's unary ops):"


def _scalar(name, suffix):
    fn = getattr(S, name + suffix, None)
    if fn is None:
        raise ImportError(f"fastlib.kernels.elementwise: unary op {name!r} of the op table has no "
                          f"scalar function {name}{suffix} in fastlib/kernels/scalar.py")
    return fn


def _takes_param(name):
    """Whether ``name``'s scalar functions take the op's param (leaky_relu's slope)."""
    fn = _scalar(name, "_f")
    return len(inspect.signature(getattr(fn, "py_func", fn)).parameters) > 1


def _call(name, suffix, *args):
    return f"{name}{suffix}({', '.join(args + (('slope',) if _takes_param(name) else ()))})"


def _direction(kernel, params, element):
    """The chunk kernel ``kernel(op, params)``: ``out[i] = element(name)`` for op ``name``."""
    cases = [(CODES[n], n, ["for i in range(n):", f"    out[i] = {element(n)}"]) for n in UNARY_OPS]
    source = switch_source(kernel, f"op, {params}", "op", cases, head=["    n = x.size"],
                           tail=["    else:", "        raise ValueError(_UNKNOWN, op)"])
    names = {n + suffix: _scalar(n, suffix) for n in UNARY_OPS for suffix in ("_f", "_df", "_d2f")}
    names.update({n + "_vjp": getattr(S, n + "_vjp") for n in UNARY_OPS if hasattr(S, n + "_vjp")})
    return compile_switch(source, kernel, {**names, "_UNKNOWN": _UNKNOWN}, njit(inline="always"))


def _vjp_element(name):
    if hasattr(S, name + "_vjp"):
        return f"{name}_vjp(x[i], g[i])"
    return "g[i] * " + _call(name, "_df", "x[i]")


# The generated switches (inlined into the cached chunk kernels below).
_forward_switch = _direction("forward", "x, out, slope", lambda n: _call(n, "_f", "x[i]"))
_vjp_switch = _direction("vjp", "x, g, out, slope", _vjp_element)
_hvp_switch = _direction("hvp", "x, g, t, out, slope",
                         lambda n: "g[i] * " + _call(n, "_d2f", "x[i]") + " * t[i]")


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _forward_chunk(op, x, out, slope):
    _forward_switch(op, x, out, slope)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _vjp_chunk(op, x, g, out, slope):
    _vjp_switch(op, x, g, out, slope)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _hvp_chunk(op, x, g, t, out, slope):
    _hvp_switch(op, x, g, t, out, slope)


@njit(cache=True, parallel=True, error_model="numpy")
def _forward(op, x, out, slope, nchunks):
    n = x.size
    for c in prange(nchunks):
        lo = n * c // nchunks
        hi = n * (c + 1) // nchunks
        _forward_chunk(op, x[lo:hi], out[lo:hi], slope)


@njit(cache=True, parallel=True, error_model="numpy")
def _vjp(op, x, g, out, slope, nchunks):
    n = x.size
    for c in prange(nchunks):
        lo = n * c // nchunks
        hi = n * (c + 1) // nchunks
        _vjp_chunk(op, x[lo:hi], g[lo:hi], out[lo:hi], slope)


def _launch(name, what, serial, parallel, x, *arrays, negative_slope=0.01):
    """``out`` of the kernel of ``name`` over the flat arrays, one chunk or ``prange``'s."""
    code = optable.code_of(name, "unary", what)
    out = np.empty_like(x)
    flat = [a.reshape(-1) for a in (x, *arrays, out)]
    nchunks = config.num_chunks(flat[0].size)
    slope = x.dtype.type(negative_slope)
    if nchunks == 1 or parallel is None:  # no parallel region: no thread hand-off
        serial(code, *flat, slope)
    else:
        parallel(code, *flat, slope, nchunks)
    return out


def unary_forward(name, x, negative_slope=0.01):
    """``name(x)`` for a unary op on a C-contiguous float32/float64 array (new array).

    Parameters
    ----------
    name : str
        One of ``UNARY_OPS``.
    x : ndarray
        C-contiguous float32 or float64 input (validated by ``fastlib.ops``).
    negative_slope : float
        leaky_relu's slope (ignored by the other ops).

    Returns
    -------
    ndarray
        Same shape and dtype as ``x``.
    """
    return _launch(name, "unary_forward", _forward_chunk, _forward, x,
                   negative_slope=negative_slope)


def unary_vjp(name, x, grad, negative_slope=0.01):
    """``grad * name'(x)`` (the VJP of a unary op) for C-contiguous arrays of one shape/dtype.

    Parameters
    ----------
    name : str
        One of ``UNARY_OPS``.
    x, grad : ndarray
        The op's input and the cotangent of its output (same shape, same dtype).
    negative_slope : float
        leaky_relu's slope (ignored by the other ops).

    Returns
    -------
    ndarray
        The cotangent of ``x``.
    """
    return _launch(name, "unary_vjp", _vjp_chunk, _vjp, x, grad,
                   negative_slope=negative_slope)


def unary_hvp(name, x, grad, tangent, negative_slope=0.01):
    """``grad * name''(x) * tangent``: the derivative of the VJP in direction ``tangent``.

    Parameters
    ----------
    name : str
        One of ``UNARY_OPS``.
    x, grad, tangent : ndarray
        C-contiguous arrays of one shape and dtype.
    negative_slope : float
        leaky_relu's slope (ignored by the other ops).

    Returns
    -------
    ndarray
        The Hessian-vector product of ``<grad, name(x)>`` in direction ``tangent``.
    """
    return _launch(name, "unary_hvp", _hvp_chunk, None, x, grad, tangent,
                   negative_slope=negative_slope)
