"""Engines with planted accuracy bugs: fastlib with one op replaced by a classic mistake.

Each class is a plugin engine (``verigrad conform --engines tests/conformance/planted_engines.py:
SigmoidCancel``); ``tests/conformance/test_conform_planted.py`` shows that the dev profile
catches every one of them, and what it reports. The bugs are written here, apart from fastlib,
as a user's engine would have them.
"""
from __future__ import annotations

import numpy as np

from reports.conformance.engines import FastlibEngine


class _Planted(FastlibEngine):
    """fastlib, except for ``op``, computed by ``_bad_forward`` / ``_bad_vjp``."""

    op = ""

    def _forward(self, name, inputs, **params):
        if name == self.op and hasattr(self, "_bad_forward"):
            with np.errstate(all="ignore"):
                return self._bad_forward(*[np.asarray(x) for x in inputs], **params)
        return FastlibEngine._forward(self, name, inputs, **params)

    def _vjp(self, name, inputs, grad, **params):
        if name == self.op and hasattr(self, "_bad_vjp"):
            with np.errstate(all="ignore"):
                return self._bad_vjp([np.asarray(x) for x in inputs], np.asarray(grad),
                                     **params)
        return super()._vjp(name, inputs, grad, **params)


class SigmoidCancel(_Planted):
    """sigmoid(x) for x < 0 as 1 - sigmoid(-x): sigmoid(-80) comes out as 0."""

    name = "planted-sigmoid-cancel"
    op = "sigmoid"

    def _bad_forward(self, x):
        pos = 1 / (1 + np.exp(-np.abs(x)))
        return np.where(x >= 0, pos, 1 - pos).astype(x.dtype)


class SoftplusNoLog1p(_Planted):
    """softplus(x) as log(1 + exp(x)) (no log1p, no shift): 0 below x ~ -37, inf above 710."""

    name = "planted-softplus-no-log1p"
    op = "softplus"

    def _bad_forward(self, x):
        return np.log(1 + np.exp(x)).astype(x.dtype)


class SoftplusFlush32(_Planted):
    """float32 softplus returning 0 for every x <= -17 (a cut-off meant for exp(x) < eps)."""

    name = "planted-softplus-flush32"
    op = "softplus"

    def _bad_forward(self, x):
        good = FastlibEngine._forward(self, "softplus", [x])
        if x.dtype == np.float32:
            return np.where(x <= -17, np.float32(0), good).astype(x.dtype)
        return good


class TanhTinyZero(_Planted):
    """tanh flushing tiny arguments to 0: tanh(1e-150) returned as 0."""

    name = "planted-tanh-tiny-zero"
    op = "tanh"

    def _bad_forward(self, x):
        good = FastlibEngine._forward(self, "tanh", [x])
        return np.where(np.abs(x) < 1e-100, 0, good).astype(x.dtype)


class TanhSmallByExp(_Planted):
    """tanh(x) as (1 - e^(-2x)) / (1 + e^(-2x)) near 0: tanh(1e-5) off by about 2e4 eps."""

    name = "planted-tanh-small-by-exp"
    op = "tanh"

    def _bad_forward(self, x):
        good = FastlibEngine._forward(self, "tanh", [x])
        e = np.exp(-2 * x)
        bad = (1 - e) / (1 + e)
        return np.where(np.abs(x) < 1e-3, bad, good).astype(x.dtype)


class MatmulOneEntryOff(_Planted):
    """matmul's d/da with its smallest entry 1e-3 off (relative), in VJPs of 8+ entries."""

    name = "planted-matmul-one-entry-off"
    op = "matmul"

    def _bad_vjp(self, inputs, grad, **params):
        ga, gb = FastlibEngine._vjp(self, "matmul", inputs, grad, **params)
        ga = np.array(ga, copy=True)
        if ga.size >= 8:
            flat = ga.reshape(-1)
            i = int(np.argmin(np.abs(flat)))
            flat[i] = flat[i] * (1 + 1e-3)
        return ga, gb


class SoftmaxLseRounded(_Planted):
    """softmax as exp(x - lse) with lse rounded to float32 inside a float64 kernel."""

    name = "planted-softmax-lse-rounded"
    op = "softmax"

    def _bad_forward(self, x, axis=-1):
        if x.dtype != np.float64:
            return FastlibEngine._forward(self, "softmax", [x], axis=axis)
        m = np.max(x, axis=axis, keepdims=True)
        lse = m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
        return np.exp(x - lse.astype(np.float32).astype(np.float64))


class MaximumTieDoubled(_Planted):
    """maximum's VJP sending the whole cotangent to both tied arguments (doubled)."""

    name = "planted-maximum-tie-doubled"
    op = "maximum"

    def _bad_vjp(self, inputs, grad, **params):
        a, b = inputs
        shape = np.broadcast_shapes(a.shape, b.shape)
        A, B = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
        g = np.broadcast_to(grad, shape)
        ga = np.where(A >= B, g, 0).astype(grad.dtype)
        gb = np.where(B >= A, g, 0).astype(grad.dtype)
        return _sum_to(ga, a.shape), _sum_to(gb, b.shape)


class ReluHalf(_Planted):
    """relu'(0) = 0.5 (autograd's convention): a valid subgradient, not the registry's."""

    name = "planted-relu-half"
    op = "relu"

    def _bad_vjp(self, inputs, grad, **params):
        (x,) = inputs
        d = np.where(x > 0, 1.0, np.where(x == 0, 0.5, 0.0))
        return ((grad * d).astype(grad.dtype),)


def _sum_to(g, shape):
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return np.asarray(g).reshape(shape)


#: (class, op) of every planted bug; all must fail ``verigrad conform --profile dev``
PLANTED = (
    (SigmoidCancel, "sigmoid"), (SoftplusNoLog1p, "softplus"), (SoftplusFlush32, "softplus"),
    (TanhTinyZero, "tanh"), (TanhSmallByExp, "tanh"), (MatmulOneEntryOff, "matmul"),
    (SoftmaxLseRounded, "softmax"), (MaximumTieDoubled, "maximum"),
)


class BroadcastVjpFloat32(_Planted):
    """mul's float32 VJP summed back over broadcast axes in float32 (each product rounded,
    then a float32 running sum): within the general binary-op bound, not within the single
    rounding fastlib promises."""

    name = "planted-broadcast-vjp-f32"
    op = "mul"

    def _bad_vjp(self, inputs, grad):
        a, b = inputs
        shape = np.broadcast_shapes(a.shape, b.shape)
        g = np.broadcast_to(grad, shape)
        terms = (g * np.broadcast_to(b, shape), g * np.broadcast_to(a, shape))
        return tuple(_sum_back_f32(t, x.shape) for t, x in zip(terms, inputs))


def _sum_back_f32(t, shape):
    """Sum ``t`` back to ``shape`` with a running sum in t's dtype (recursive accumulation)."""
    lead = t.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and t.shape[lead + i] != 1)
    for ax in sorted(axes, reverse=True):
        t = np.cumsum(t, axis=ax, dtype=t.dtype).take([-1], axis=ax)
    return t.reshape(shape)


class SigmoidVjpFloat32(_Planted):
    """sigmoid's float32 VJP g e / (1 + e)^2 evaluated in float32 (five roundings): within the
    general transcendental bound, not within the single rounding fastlib promises."""

    name = "planted-sigmoid-vjp-f32"
    op = "sigmoid"

    def _bad_vjp(self, inputs, grad):
        (x,) = inputs
        e = np.exp(-np.abs(x)).astype(x.dtype)
        d = (1 + e).astype(x.dtype)
        return ((grad * e / (d * d)).astype(x.dtype),)


# -- second-order bugs (the jvp2 / hvp checks, reports.conformance.second_order) ------------------

class _PlantedSecondOrder(FastlibEngine):
    """fastlib, except for ``op``'s HVP, computed by ``_bad_hvp``."""

    op = ""

    def _hvp(self, name, inputs, cotangent, tangents, **params):
        if name == self.op:
            return self._bad_hvp([np.asarray(x) for x in inputs], np.asarray(cotangent),
                                 [None if t is None else np.asarray(t) for t in tangents],
                                 **params)
        return FastlibEngine._hvp(self, name, inputs, cotangent, tangents, **params)


class MulDroppedCrossTerm(_PlantedSecondOrder):
    """mul's HVP without its cross term: d²(ab)/da db = 1 forgotten (all of mul's Hessian)."""

    name, op = "mul-dropped-cross-term", "mul"

    def _bad_hvp(self, inputs, g, tangents):
        return tuple(np.zeros_like(x) for x in inputs)


class SoftmaxSecondOrderSign(_PlantedSecondOrder):
    """softmax's HVP with the sign of the term ``s · Σ g ṡ`` flipped."""

    name, op = "softmax-hvp-sign", "softmax"

    def _bad_hvp(self, inputs, g, tangents, axis=-1):
        (x,), (t,) = inputs, tangents
        s = np.exp(x - x.max(axis=axis, keepdims=True))
        s /= s.sum(axis=axis, keepdims=True)
        ds = s * (t - np.sum(s * t, axis=axis, keepdims=True))
        return (ds * (g - np.sum(g * s, axis=axis, keepdims=True))
                + s * np.sum(g * ds, axis=axis, keepdims=True),)


class TanhFloat32Intermediate(_PlantedSecondOrder):
    """tanh's HVP with tanh(x) kept in float32 whatever the dtype."""

    name, op = "tanh-hvp-float32", "tanh"

    def _bad_hvp(self, inputs, g, tangents):
        (x,), (t,) = inputs, tangents
        y = np.tanh(x.astype(np.float32)).astype(x.dtype)
        return (g * (-2 * y * (1 - y * y)) * t,)


SECOND_ORDER_PLANTED = (MulDroppedCrossTerm, SoftmaxSecondOrderSign, TanhFloat32Intermediate)
