"""The Dense layer on the device: ``pre = x @ W + b``, ``out = activation(pre)``, and its backward.

Forward is one launch of the tiled GEMM of :mod:`.linalg` with a bias + activation epilogue:
each thread adds the bias to its finished dot product, stores the pre-activation (the history
backward needs) and the activation, so ``pre`` and ``out`` never make a second trip through
memory. ``softmax`` is a row op, so it runs as the row kernel of :mod:`.norm` after a bias-only
epilogue. Backward is the activation's VJP (one elementwise pass, or the softmax row VJP),
then ``grad_W = x^T g``, ``grad_x = g W^T`` (the same GEMM with swapped strides) and
``grad_b = sum over rows of g`` (a block tree reduction).

Arrays may be NumPy arrays (copied to the device and back) or numba device arrays (left on the
device: the results are device arrays too), so a training loop can keep weights resident.
"""
from __future__ import annotations

import difflib
import functools

import numpy as np
from numba import cuda, float64

import optable

from . import device
from .elementwise import unary_vjp_device
from .linalg import gemm_device
from .norm import SOFTMAX, rows_forward_device, rows_vjp_device
from .reduce import reduce_device
from .scalar import ACTIVATIONS, WITH_PARAM

#: Activation names a Dense layer takes (docs/CONTRACTS.md) -> the scalar twin's name.
DENSE_ACTIVATIONS = {a.name: a.op for a in optable.ACTIVATIONS.values()}


@functools.lru_cache(maxsize=None)
def bias_activation_epilogue(name):
    """GEMM epilogue ``c = acc + bias[col]; out = f(c)`` for the scalar activation ``name``."""
    f = ACTIVATIONS[name][0]
    if name in WITH_PARAM:
        def store(c, out, bias, index, col, acc, param):
            v = acc + bias[col]
            c[index] = v
            out[index] = f(float64(c[index]), param)
    else:
        def store(c, out, bias, index, col, acc, param):
            v = acc + bias[col]
            c[index] = v
            out[index] = f(float64(c[index]))
    store.__name__ = store.__qualname__ = f"bias_{name}"   # names the GEMM kernel that uses it
    return cuda.jit(device=True)(store)


def _dense_forward_device(d_x, d_w, d_b, rows, n_in, n_out, activation, param):
    """(flat out, flat pre) device arrays of one Dense forward."""
    dtype = d_x.dtype
    if d_b is None:
        d_b = device.zeros(n_out, dtype)
    d_out = device.empty(rows * n_out, dtype)
    scalar = "identity" if activation == "softmax" else DENSE_ACTIVATIONS[activation]
    d_pre = gemm_device(d_x, (0, n_in, 1), d_w, (0, n_out, 1), 1, rows, n_out, n_in, dtype,
                        epilogue=bias_activation_epilogue(scalar), d_out=d_out, d_bias=d_b,
                        param=param)
    if activation == "softmax":
        d_out = rows_forward_device(SOFTMAX, d_pre, (rows, n_out), 1)
    return d_out, d_pre


def _dense_backward_device(d_gout, d_x, d_w, d_pre, rows, n_in, n_out, activation, param):
    """(flat grad_x, flat grad_W, flat float64 grad_b) device arrays of one Dense backward."""
    dtype = d_x.dtype
    if activation == "linear":
        d_gpre = d_gout
    elif activation == "softmax":
        d_gpre = rows_vjp_device(SOFTMAX, d_pre, d_gout, (rows, n_out), 1)
    else:
        d_gpre = unary_vjp_device(DENSE_ACTIVATIONS[activation], d_pre, d_gout, param)
    # grad_W = x^T (in, rows) @ g (rows, out): x read transposed (row stride 1, column n_in).
    d_gw = gemm_device(d_x, (0, 1, n_in), d_gpre, (0, n_out, 1), 1, n_in, n_out, rows, dtype)
    # grad_x = g (rows, out) @ W^T (out, in): W read transposed.
    d_gx = gemm_device(d_gpre, (0, n_out, 1), d_w, (0, 1, n_out), 1, rows, n_in, n_out, dtype)
    d_gb = reduce_device(d_gpre, (rows, n_out), (0,))
    return d_gx, d_gw, d_gb


# ---------------------------------------------------------------------------------------------
# public host functions (validation, then movement)

def _check_activation(activation):
    if not isinstance(activation, str) or activation.lower() not in DENSE_ACTIVATIONS:
        close = difflib.get_close_matches(str(activation).lower(), DENSE_ACTIVATIONS, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"dense: unknown activation {activation!r}{hint}; use one of "
                         f"{', '.join(DENSE_ACTIVATIONS)}")
    return activation.lower()


def _kind(arrays):
    """'device' when every given array is a device array, 'host' when every one is NumPy."""
    flags = [device.is_device_array(a) for a in arrays if a is not None]
    if all(flags):
        return "device"
    if not any(flags):
        return "host"
    raise TypeError("dense: mix of NumPy and device arrays; pass all NumPy arrays (results come "
                    "back as NumPy) or all device arrays (fastlib.cuda.to_device)")


def _check_arrays(op, named, dtype=None):
    """Dtype checks shared by host and device arrays; returns the common float dtype."""
    for name, a in named.items():
        if a is None:
            continue
        dt = np.dtype(a.dtype)
        if dt not in (np.float32, np.float64):
            raise TypeError(f"{op}: {name} has dtype {dt}; pass float32 or float64 arrays")
        if dtype is None:
            dtype = dt
        elif dt != dtype:
            raise TypeError(f"{op}: {name} is {dt} but the other arrays are {dtype}; cast them "
                            f"to one dtype")
        if isinstance(a, np.ndarray) and not np.isfinite(a).all():
            raise ValueError(f"{op}: {name} holds NaN or Inf; pass finite values")
    return dtype


def _check_layout(op, x, weight, bias):
    x_shape, w_shape = _shape(x), _shape(weight)
    if len(w_shape) != 2:
        raise ValueError(f"{op}: weight must be 2-d (in, out); got shape {w_shape}")
    n_in, n_out = w_shape
    if len(x_shape) < 1 or x_shape[-1] != n_in:
        raise ValueError(f"{op}: x has shape {x_shape} but weight is ({n_in}, {n_out}); "
                         f"x's last axis must be the layer's input width {n_in}")
    if bias is not None and _shape(bias) != (n_out,):
        raise ValueError(f"{op}: bias has shape {_shape(bias)}; expected ({n_out},)")
    rows = int(np.prod(x_shape[:-1], dtype=np.int64))
    if rows == 0 or n_in == 0 or n_out == 0:
        raise ValueError(f"{op}: empty arrays (x {tuple(x.shape)}, weight {tuple(weight.shape)}); "
                         "pass at least one row and one unit")
    return rows, n_in, n_out


def _shape(a):
    """The shape as a tuple of ints (device arrays' shapes are not always plain tuples)."""
    return tuple(int(d) for d in a.shape)


def _flat(a, mode):
    if a is None:
        return None
    if mode == "host":
        return device.put(a)
    if not a.is_c_contiguous():
        raise ValueError("dense: device arrays must be C-contiguous")
    return a.reshape(int(np.prod(_shape(a), dtype=np.int64)))


def _out(d, shape, mode):
    return device.get(d, shape) if mode == "host" else d.reshape(tuple(shape))


def dense_forward(x, weight, bias=None, activation="linear", *, negative_slope=0.01):
    """Dense layer forward on the device: ``pre = x @ weight + bias``, ``out = act(pre)``.

    Parameters
    ----------
    x : ndarray or device array, shape (..., in)
    weight : ndarray or device array, shape (in, out)
    bias : ndarray or device array, shape (out,), optional
    activation : str
        ``linear relu leaky_relu tanh sigmoid silu gelu gelu_tanh softplus softmax``.
    negative_slope : float
        leaky_relu's slope.

    Returns
    -------
    (out, pre)
        Arrays of shape (..., out), NumPy when the inputs were NumPy, device arrays otherwise.
    """
    activation = _check_activation(activation)
    mode = _kind([x, weight, bias])
    _check_arrays("dense_forward", {"x": x, "weight": weight, "bias": bias})
    rows, n_in, n_out = _check_layout("dense_forward", x, weight, bias)
    device.require_device()
    d_out, d_pre = _dense_forward_device(_flat(x, mode), _flat(weight, mode), _flat(bias, mode),
                                         rows, n_in, n_out, activation, float(negative_slope))
    shape = _shape(x)[:-1] + (n_out,)
    return _out(d_out, shape, mode), _out(d_pre, shape, mode)


def dense_backward(grad_out, x, weight, pre, activation="linear", *, negative_slope=0.01):
    """Dense layer backward on the device, from the forward's input ``x`` and ``pre``.

    Parameters
    ----------
    grad_out : cotangent of ``out``, shape (..., out)
    x, weight : the forward's input and weight
    pre : the forward's pre-activation (history), shape (..., out)
    activation, negative_slope : as in :func:`dense_forward`

    Returns
    -------
    (grad_x, grad_weight, grad_bias)
        Shapes of x, weight and (out,); NumPy or device arrays like the inputs.
    """
    activation = _check_activation(activation)
    mode = _kind([grad_out, x, weight, pre])
    dtype = _check_arrays("dense_backward",
                          {"grad_out": grad_out, "x": x, "weight": weight, "pre": pre})
    rows, n_in, n_out = _check_layout("dense_backward", x, weight, None)
    expected = _shape(x)[:-1] + (n_out,)
    for name, a in (("grad_out", grad_out), ("pre", pre)):
        if _shape(a) != expected:
            raise ValueError(f"dense_backward: {name} has shape {_shape(a)}; expected "
                             f"{expected} (x's rows by the weight's output width)")
    device.require_device()
    d_gx, d_gw, d_gb = _dense_backward_device(
        _flat(grad_out, mode), _flat(x, mode), _flat(weight, mode), _flat(pre, mode), rows, n_in,
        n_out, activation, float(negative_slope))
    if mode == "host":
        return (device.get(d_gx, x.shape), device.get(d_gw, weight.shape),
                device.get(d_gb, (n_out,)).astype(dtype))
    return (d_gx.reshape(_shape(x)), d_gw.reshape(_shape(weight)), device.cast(d_gb, dtype))
