"""The unary ops over arrays: forward ``y = f(x)`` and VJP ``gx = g * f'(x)``.

One chunk kernel per direction maps the op's scalar function (``fastlib.kernels.scalar``) over a
contiguous slice, the op chosen by an integer code outside the loop; a ``prange`` driver splits
large arrays into ``config.num_chunks`` slices. The VJPs of exp, sqrt, tanh, sigmoid, silu,
gelu and gelu_tanh call ``scalar.<name>_vjp(x, g)``, which rounds ``g * f'(x)`` once (float32
via float64, float64 silu / gelu / gelu_tanh in double-double); the others are
``g * scalar.<name>_df(x)``. A code the kernels do not know raises ``ValueError`` (never an
identity fallback). docs/fastlib.md has the details.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

import optable
from fastlib import config
from fastlib.kernels import scalar as S

_FM = config.FASTMATH

# op name -> code: the op table's stable codes (compiled into the kernels as constants)
UNARY_OPS = optable.names(category="unary")
CODES = optable.codes(UNARY_OPS)
_NEG, _EXP, _LOG, _SQRT, _SQUARE = (CODES[n] for n in ("neg", "exp", "log", "sqrt", "square"))
_ABS, _RELU, _LEAKY, _SILU, _GELU = (CODES[n] for n in ("abs", "relu", "leaky_relu", "silu",
                                                        "gelu"))
_GELU_TANH, _TANH, _SIGMOID = (CODES[n] for n in ("gelu_tanh", "tanh", "sigmoid"))
_SOFTPLUS, _IDENTITY = CODES["softplus"], CODES["identity"]
# NOTE: a code the kernels do not know raises (never an identity fallback); the launchers
# check the name first, so this is the message of a direct kernel call with a bad code.
_UNKNOWN = "unknown unary op code (not a code of optable's unary ops):"


def _code(name, what):
    """The op table's code of unary op ``name``; ``ValueError`` naming it and the table."""
    code = CODES.get(name)
    if code is None:
        raise ValueError(f"{what}: unknown unary op {name!r}: not a unary op of optable "
                         f"(unary ops: {', '.join(UNARY_OPS)})")
    return code


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _forward_chunk(op, x, out, slope):
    n = x.size
    if op == _NEG:
        for i in range(n):
            out[i] = S.neg_f(x[i])
    elif op == _EXP:
        for i in range(n):
            out[i] = S.exp_f(x[i])
    elif op == _LOG:
        for i in range(n):
            out[i] = S.log_f(x[i])
    elif op == _SQRT:
        for i in range(n):
            out[i] = S.sqrt_f(x[i])
    elif op == _SQUARE:
        for i in range(n):
            out[i] = S.square_f(x[i])
    elif op == _ABS:
        for i in range(n):
            out[i] = S.abs_f(x[i])
    elif op == _RELU:
        for i in range(n):
            out[i] = S.relu_f(x[i])
    elif op == _LEAKY:
        for i in range(n):
            out[i] = S.leaky_relu_f(x[i], slope)
    elif op == _SILU:
        for i in range(n):
            out[i] = S.silu_f(x[i])
    elif op == _GELU:
        for i in range(n):
            out[i] = S.gelu_f(x[i])
    elif op == _GELU_TANH:
        for i in range(n):
            out[i] = S.gelu_tanh_f(x[i])
    elif op == _TANH:
        for i in range(n):
            out[i] = S.tanh_f(x[i])
    elif op == _SIGMOID:
        for i in range(n):
            out[i] = S.sigmoid_f(x[i])
    elif op == _SOFTPLUS:
        for i in range(n):
            out[i] = S.softplus_f(x[i])
    elif op == _IDENTITY:
        for i in range(n):
            out[i] = S.identity_f(x[i])
    else:
        raise ValueError(_UNKNOWN, op)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def _vjp_chunk(op, x, g, out, slope):
    n = x.size
    if op == _NEG:
        for i in range(n):
            out[i] = -g[i]
    elif op == _EXP:
        for i in range(n):
            out[i] = S.exp_vjp(x[i], g[i])
    elif op == _LOG:
        for i in range(n):
            out[i] = g[i] / x[i]
    elif op == _SQRT:
        for i in range(n):
            out[i] = S.sqrt_vjp(x[i], g[i])
    elif op == _SQUARE:
        for i in range(n):
            out[i] = g[i] * S.square_df(x[i])
    elif op == _ABS:
        for i in range(n):
            out[i] = g[i] * S.abs_df(x[i])
    elif op == _RELU:
        for i in range(n):
            out[i] = g[i] * S.relu_df(x[i])
    elif op == _LEAKY:
        for i in range(n):
            out[i] = g[i] * S.leaky_relu_df(x[i], slope)
    elif op == _SILU:
        for i in range(n):
            out[i] = S.silu_vjp(x[i], g[i])
    elif op == _GELU:
        for i in range(n):
            out[i] = S.gelu_vjp(x[i], g[i])
    elif op == _GELU_TANH:
        for i in range(n):
            out[i] = S.gelu_tanh_vjp(x[i], g[i])
    elif op == _TANH:
        for i in range(n):
            out[i] = S.tanh_vjp(x[i], g[i])
    elif op == _SIGMOID:
        for i in range(n):
            out[i] = S.sigmoid_vjp(x[i], g[i])
    elif op == _SOFTPLUS:
        for i in range(n):
            out[i] = g[i] * S.softplus_df(x[i])
    elif op == _IDENTITY:
        for i in range(n):
            out[i] = g[i]
    else:
        raise ValueError(_UNKNOWN, op)


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
    code = _code(name, "unary_forward")
    out = np.empty_like(x)
    flat = x.reshape(-1)
    nchunks = config.num_chunks(flat.size)
    slope = x.dtype.type(negative_slope)
    if nchunks == 1:    # no parallel region at all: no thread hand-off on a busy machine
        _forward_chunk(code, flat, out.reshape(-1), slope)
    else:
        _forward(code, flat, out.reshape(-1), slope, nchunks)
    return out


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
    code = _code(name, "unary_vjp")
    out = np.empty_like(x)
    flat = x.reshape(-1)
    nchunks = config.num_chunks(flat.size)
    slope = x.dtype.type(negative_slope)
    if nchunks == 1:
        _vjp_chunk(code, flat, grad.reshape(-1), out.reshape(-1), slope)
    else:
        _vjp(code, flat, grad.reshape(-1), out.reshape(-1), slope, nchunks)
    return out
