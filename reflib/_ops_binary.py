"""Binary reference ops with NumPy broadcasting; each VJP is summed back to its input's shape."""
from __future__ import annotations

import numpy as np

from reflib._ops_common import broadcast_shape, implementations, require_domain, unbroadcast


def add(F, a, b):
    broadcast_shape("add", a, b)
    return a + b


def add_vjp(F, a, b, out, g):
    return unbroadcast(g, a.shape), unbroadcast(g, b.shape)


def sub(F, a, b):
    broadcast_shape("sub", a, b)
    return a - b


def sub_vjp(F, a, b, out, g):
    return unbroadcast(g, a.shape), unbroadcast(-g, b.shape)


def mul(F, a, b):
    broadcast_shape("mul", a, b)
    return a * b


def mul_vjp(F, a, b, out, g):
    return unbroadcast(g * b, a.shape), unbroadcast(g * a, b.shape)


def div(F, a, b):
    broadcast_shape("div", a, b)
    require_domain(F, "div", "b", b, b != 0, "nonzero (the divisor)")
    return a / b


def div_vjp(F, a, b, out, g):
    # d(a/b)/da = 1/b, d(a/b)/db = -a/b^2 = -out/b
    return unbroadcast(g / b, a.shape), unbroadcast(-g * out / b, b.shape)


def maximum(F, a, b):
    broadcast_shape("maximum", a, b)
    return np.where(a >= b, a, b)


def maximum_vjp(F, a, b, out, g):
    # NOTE: a tie (a == b) sends the whole gradient to the first argument a.
    first = np.broadcast_to(a >= b, g.shape)
    return unbroadcast(np.where(first, g, 0.0), a.shape), unbroadcast(np.where(first, 0.0, g), b.shape)


# op name -> (forward, vjp), paired by name (``abs_`` / ``abs_vjp``)
OPS = implementations(globals(), "add sub mul div maximum")
