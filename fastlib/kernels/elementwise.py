"""The unary ops over arrays: forward ``y = f(x)``, VJP ``g f'(x)`` and second order ``g f''(x) t``.

One chunk kernel per direction maps the op's scalar functions (``fastlib.kernels.scalar``) over
a contiguous slice; a ``prange`` driver splits large arrays into ``config.num_chunks`` slices.
Each op has its own kernels, closing over its table code, which they read as a literal to pick,
at compile time, ``<name>_f``, ``<name>_vjp`` where scalar has one (rounded once) else
``g * <name>_df``, and ``<name>_d2f``. Nothing here is written per op: an op of the table
without its scalar functions is an ImportError; a code that is not the table's raises
``ValueError`` (never an identity fallback). docs/fastlib.md has the details.
"""
from __future__ import annotations

import inspect
from typing import NamedTuple

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

import optable
from fastlib import config
from fastlib.kernels import scalar as S

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


def _elements(name):
    """``(forward(x, p), vjp(x, g, p), hvp(x, g, t, p))`` of op ``name``: its scalar functions,
    each taking the op's param ``p`` last (used by leaky_relu only)."""
    f, df, d2f = (_scalar(name, s) for s in ("_f", "_df", "_d2f"))
    rounded_vjp = getattr(S, name + "_vjp", None)
    inline = njit(inline="always")
    if len(inspect.signature(f.py_func).parameters) > 1:
        forward, slope, curve = (inline(lambda x, p: f(x, p)), inline(lambda x, p: df(x, p)),
                                 inline(lambda x, p: d2f(x, p)))
    else:
        forward, slope, curve = (inline(lambda x, p: f(x)), inline(lambda x, p: df(x)),
                                 inline(lambda x, p: d2f(x)))
    vjp = (inline(lambda x, g, p: rounded_vjp(x, g)) if rounded_vjp is not None
           else inline(lambda x, g, p: g * slope(x, p)))
    return forward, vjp, inline(lambda x, g, t, p: g * curve(x, p) * t)


#: code -> the op's element functions (built at import: a missing scalar function fails here).
ELEMENTS = {CODES[n]: _elements(n) for n in UNARY_OPS}


def _element(op, direction):
    """The element function of the literal code ``op`` (None: not a literal yet, or unknown)."""
    if not isinstance(op, types.IntegerLiteral):
        return None
    return ELEMENTS.get(op.literal_value, (None,) * 3)[direction]


def _unknown(op, *arrays):
    raise ValueError(_UNKNOWN, op)


def _map_forward(op, x, out, slope):
    """``out = f(x)`` for the literal code ``op`` (typed by the overload below)."""


@overload(_map_forward, inline="always")
def _map_forward_typed(op, x, out, slope):
    e = _element(op, 0)
    if e is None:
        return _unknown if isinstance(op, types.IntegerLiteral) else None

    def impl(op, x, out, slope):
        for i in range(x.size):
            out[i] = e(x[i], slope)
    return impl


def _map_vjp(op, x, g, out, slope):
    """``out = g f'(x)`` for the literal code ``op``."""


@overload(_map_vjp, inline="always")
def _map_vjp_typed(op, x, g, out, slope):
    e = _element(op, 1)
    if e is None:
        return _unknown if isinstance(op, types.IntegerLiteral) else None

    def impl(op, x, g, out, slope):
        for i in range(x.size):
            out[i] = e(x[i], g[i], slope)
    return impl


def _map_hvp(op, x, g, t, out, slope):
    """``out = g f''(x) t`` for the literal code ``op``."""


@overload(_map_hvp, inline="always")
def _map_hvp_typed(op, x, g, t, out, slope):
    e = _element(op, 2)
    if e is None:
        return _unknown if isinstance(op, types.IntegerLiteral) else None

    def impl(op, x, g, t, out, slope):
        for i in range(x.size):
            out[i] = e(x[i], g[i], t[i], slope)
    return impl


class _OpKernels(NamedTuple):
    forward: object         # forward(x, out, slope): one chunk, serial
    vjp: object             # vjp(x, g, out, slope)
    hvp: object             # hvp(x, g, t, out, slope)
    forward_split: object   # forward_split(x, out, slope, nchunks): prange over chunks
    vjp_split: object       # vjp_split(x, g, out, slope, nchunks)


def _op_kernels(op):
    """The kernels of the op of code ``op``, compiled (and cached) on first use.

    NOTE: each closes over its op's code, a constant the ``_map_*`` overloads read as a literal
    to pick the op's scalar functions at compile time: every op compiles on its own, so a
    process compiles the ops it runs and no others.
    """
    chunk = njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    split = njit(cache=True, parallel=True, error_model="numpy", fastmath=_FM)

    def forward(x, out, slope):
        _map_forward(op, x, out, slope)

    def vjp(x, g, out, slope):
        _map_vjp(op, x, g, out, slope)

    def hvp(x, g, t, out, slope):
        _map_hvp(op, x, g, t, out, slope)

    def forward_split(x, out, slope, nchunks):
        n = x.size
        for c in prange(nchunks):
            lo, hi = n * c // nchunks, n * (c + 1) // nchunks
            _map_forward(op, x[lo:hi], out[lo:hi], slope)

    def vjp_split(x, g, out, slope, nchunks):
        n = x.size
        for c in prange(nchunks):
            lo, hi = n * c // nchunks, n * (c + 1) // nchunks
            _map_vjp(op, x[lo:hi], g[lo:hi], out[lo:hi], slope)

    return _OpKernels(chunk(forward), chunk(vjp), chunk(hvp), split(forward_split),
                      split(vjp_split))


#: code -> the op's kernels (compiled lazily, on first call).
KERNELS = {code: _op_kernels(code) for code in ELEMENTS}


def _kernels(op):
    """The kernels of code ``op``; ``ValueError`` naming it for a code that is not the table's."""
    kernels = KERNELS.get(op)
    if kernels is None:
        raise ValueError(_UNKNOWN, op)
    return kernels


def _forward_chunk(op, x, out, slope):
    """``out = f(x)`` for the op of code ``op`` (one chunk)."""
    _kernels(op).forward(x, out, slope)


def _vjp_chunk(op, x, g, out, slope):
    """``out = g f'(x)`` for the op of code ``op`` (one chunk)."""
    _kernels(op).vjp(x, g, out, slope)


def _launch(name, what, direction, x, *arrays, negative_slope=0.01):
    """``out`` of op ``name``'s kernel ``direction`` over the flat arrays: one chunk, or
    ``prange``'s chunks where the op has a split kernel for it and the size asks for one."""
    kernels = KERNELS[optable.code_of(name, "unary", what)]
    out = np.empty_like(x)
    flat = [a.reshape(-1) for a in (x, *arrays, out)]
    nchunks = config.num_chunks(flat[0].size)
    slope = x.dtype.type(negative_slope)
    split = getattr(kernels, direction + "_split", None)
    if nchunks == 1 or split is None:  # no parallel region: no thread hand-off
        getattr(kernels, direction)(*flat, slope)
    else:
        split(*flat, slope, nchunks)
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
    return _launch(name, "unary_forward", "forward", x, negative_slope=negative_slope)


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
    return _launch(name, "unary_vjp", "vjp", x, grad, negative_slope=negative_slope)


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
    return _launch(name, "unary_hvp", "hvp", x, grad, tangent, negative_slope=negative_slope)
