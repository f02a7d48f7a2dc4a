"""Elementwise ops on the device: the fifteen unary activations and the five broadcasting binary
ops, forward and VJP.

Unary kernels are made per op by closing over the device-function twins of :mod:`.scalar`
(``<name>_f`` / ``<name>_df``), so each op gets a kernel specialised to its math. Binary ops
broadcast by index math: each operand is read through strides that are 0 on its broadcast axes.
Their VJPs write the local cotangents at the output's shape and sum them back to each input's
shape with the reduction kernel (:func:`.reduce.sum_to_shape_device`).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float64

import optable

from . import device
from .device import kernel, signatures, strided_offset
from .reduce import sum_to_shape_device
from .scalar import ACTIVATIONS, WITH_PARAM


# ---------------------------------------------------------------------------------------------
# unary

@functools.lru_cache(maxsize=None)
def unary_kernels(name):
    """``(forward, vjp)`` kernels of the activation ``name``, compiled at first launch.

    forward(x, out, param): out = f(x);  vjp(x, g, out, param): out = g * f'(x).
    ``param`` is leaky_relu's slope and ignored by the others.
    """
    f, df = ACTIVATIONS[name]
    if name in WITH_PARAM:
        def fwd(x, out, param):
            i = cuda.grid(1)
            step = cuda.gridsize(1)
            while i < x.shape[0]:
                out[i] = f(float64(x[i]), param)
                i += step

        def vjp(x, g, out, param):
            i = cuda.grid(1)
            step = cuda.gridsize(1)
            while i < x.shape[0]:
                out[i] = g[i] * df(float64(x[i]), param)
                i += step
    else:
        def fwd(x, out, param):
            i = cuda.grid(1)
            step = cuda.gridsize(1)
            while i < x.shape[0]:
                out[i] = f(float64(x[i]))
                i += step

        def vjp(x, g, out, param):
            i = cuda.grid(1)
            step = cuda.gridsize(1)
            while i < x.shape[0]:
                out[i] = g[i] * df(float64(x[i]))
                i += step

    return (kernel(*signatures("void({t}[::1], {t}[::1], float64)"), name=f"unary[{name}]")(fwd),
            kernel(*signatures("void({t}[::1], {t}[::1], {t}[::1], float64)"),
                   name=f"unary_vjp[{name}]")(vjp))


def unary_forward_device(name, d_x, param=0.0):
    """Apply activation ``name`` to a flat device array; a new flat device array."""
    d_out = device.empty(d_x.shape[0], d_x.dtype)
    unary_kernels(name)[0][device.grid_1d(d_x.shape[0])](d_x, d_out, float(param))
    return d_out


def unary_vjp_device(name, d_x, d_g, param=0.0):
    """``g * f'(x)`` for activation ``name`` on flat device arrays; a new flat device array."""
    d_out = device.empty(d_x.shape[0], d_x.dtype)
    unary_kernels(name)[1][device.grid_1d(d_x.shape[0])](d_x, d_g, d_out, float(param))
    return d_out


def unary_forward(name, x, param=0.0):
    """Host function: activation ``name`` of the host array ``x``, computed on the device."""
    return device.get(unary_forward_device(name, device.put(x), param), x.shape)


def unary_vjp(name, x, grad, param=0.0):
    """Host function: the VJP of activation ``name`` at ``x`` for cotangent ``grad``."""
    d_out = unary_vjp_device(name, device.put(x), device.put(grad), param)
    return (device.get(d_out, x.shape),)


# ---------------------------------------------------------------------------------------------
# binary

# the op table's codes (compiled in as constants)
BINARY = optable.codes(optable.names(category="binary"))
ADD, SUB, MUL, DIV, MAXIMUM = (BINARY[n] for n in ("add", "sub", "mul", "div", "maximum"))


@cuda.jit(device=True)
def binary_f(op, a, b):
    """The value of binary op ``op`` (a code of :data:`BINARY`)."""
    if op == ADD:
        return a + b
    if op == SUB:
        return a - b
    if op == MUL:
        return a * b
    if op == DIV:
        return a / b
    return a if a >= b else b


@cuda.jit(device=True)
def binary_vjp_pair(op, a, b, g):
    """``(g * d op/da, g * d op/db)`` in float64, the CPU's formulas (``fastlib.kernels.binary``).

    NOTE: div's ``g * d/da`` is the quotient ``g / b``: one correctly rounded IEEE division
    (numba.cuda compiles ``/`` with prec-div, as long as no kernel asks for fastmath). The old
    ``g * (1 / b)`` rounded twice (a reciprocal, then a product): up to 0.84 ulp in float64 on a
    GPU, against the half ulp of one rounding. Nothing here has the form ``x * y + z``, so the
    device's FMA contraction cannot change these values.
    """
    if op == MUL:
        return g * b, g * a
    if op == DIV:
        q = g / b
        return q, -q * (a / b)
    if op == MAXIMUM:
        # NOTE: a tie sends the whole gradient to the first argument (a >= b).
        return (g, 0.0) if a >= b else (0.0, g)
    if op == SUB:
        return g, -g
    return g, g  # add


def _binary_forward_body(a, b, out, shape, a_strides, b_strides, op):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.shape[0]:
        out[i] = binary_f(op, a[strided_offset(i, shape, a_strides)],
                          b[strided_offset(i, shape, b_strides)])
        i += step


def _binary_vjp_body(a, b, g, ga, gb, shape, a_strides, b_strides, op):
    # Local cotangents at the output's shape, kept in float64 (exact products of float32
    # numbers); the host sums them back to each input's shape in float64 and rounds once.
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < g.shape[0]:
        x = float64(a[strided_offset(i, shape, a_strides)])
        y = float64(b[strided_offset(i, shape, b_strides)])
        ga[i], gb[i] = binary_vjp_pair(op, x, y, float64(g[i]))
        i += step


_binary_forward = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], int64[::1], int64[::1], int64[::1], int64)"
))(_binary_forward_body)
_binary_vjp = kernel(*signatures(
    "void({t}[::1], {t}[::1], {t}[::1], float64[::1], float64[::1], int64[::1], int64[::1], "
    "int64[::1], int64)"))(_binary_vjp_body)

# NOTE (the promise the conformance suite holds fastlib-cuda to, ``ROUNDED_ONCE``): in these
# dtypes every binary op's VJP is the exact value rounded once, up to float64 rounding: the
# local cotangents are formed in float64 and summed over broadcast axes in float64
# (:func:`.reduce.sum_to_shape_device`), then rounded to the dtype once. float64 makes no such
# promise (its broadcast sums round at every step), but its d/da of div and both VJPs of mul
# are single IEEE operations, correctly rounded without a declaration.
ROUNDED_ONCE_VJP_DTYPES = ("float32",)


def _operand_vectors(a_shape, b_shape, out_shape):
    d_shape, d_as = device.index_vectors(out_shape, device.broadcast_strides(a_shape, out_shape))
    _, d_bs = device.index_vectors(out_shape, device.broadcast_strides(b_shape, out_shape))
    return d_shape, d_as, d_bs


def binary_forward_device(name, d_a, a_shape, d_b, b_shape):
    """``name(a, b)`` with broadcasting on flat device arrays; (flat result, result shape)."""
    out_shape = np.broadcast_shapes(tuple(a_shape), tuple(b_shape))
    n = int(np.prod(out_shape, dtype=np.int64))
    d_out = device.empty(n, d_a.dtype)
    d_shape, d_as, d_bs = _operand_vectors(a_shape, b_shape, out_shape)
    _binary_forward[device.grid_1d(n)](d_a, d_b, d_out, d_shape, d_as, d_bs, BINARY[name])
    return d_out, out_shape


def binary_forward(name, a, b):
    """Host function: ``name(a, b)`` with NumPy broadcasting, computed on the device."""
    d_out, out_shape = binary_forward_device(name, device.put(a), a.shape,
                                             device.put(b), b.shape)
    return device.get(d_out, out_shape)


def binary_vjp(name, a, b, grad):
    """Host function: the two cotangents of ``name(a, b)``, each summed to its input's shape."""
    out_shape = np.broadcast_shapes(a.shape, b.shape)
    n = int(np.prod(out_shape, dtype=np.int64))
    d_ga, d_gb = device.empty(n, np.float64), device.empty(n, np.float64)
    d_shape, d_as, d_bs = _operand_vectors(a.shape, b.shape, out_shape)
    _binary_vjp[device.grid_1d(n)](device.put(a), device.put(b),
                                   device.put(grad), d_ga, d_gb, d_shape, d_as, d_bs,
                                   BINARY[name])
    grads = []
    for d_full, shape in ((d_ga, a.shape), (d_gb, b.shape)):
        if tuple(shape) == tuple(out_shape):
            grads.append(device.get(d_full, shape).astype(a.dtype))  # the one rounding
        else:
            d_sum = sum_to_shape_device(d_full, out_shape, shape)
            grads.append(device.get(d_sum, shape).astype(a.dtype))
    return tuple(grads)
