"""Normalisation layers over the last axis: LayerNorm, RMSNorm, and the Softmax layer."""
from __future__ import annotations

import numbers

import numpy as np

from fastlib.kernels import dense as kernels
from fastlib.layers.base import PROBABILITIES, UNBOUNDED, Layer, make_rng
from fastlib.layers.dense import as_matrix, input_cotangent
from optable.layers import NormShell


class _Norm(NormShell, Layer):
    """What LayerNorm and RMSNorm share: rows of the last axis in, each row's statistics kept
    (``hist_pre``) for the backward, parameters of ``d`` entries; each names its kernels."""

    output_range = UNBOUNDED     # scaled and shifted by its parameters

    def __init__(self, d, eps, dtype, seed, rng):
        super().__init__(dtype)
        self._setup(d, eps, seed, rng)

    def _run(self, x):
        x2 = as_matrix(x, self.d)
        y = np.empty_like(x2)
        self.hist_in, self.hist_pre = x, self._forward(x2, y)
        self._out_shape = x.shape
        return y.reshape(x.shape)

    def backward(self, grad_out, need_input_grad=True):
        g = as_matrix(self._cotangent(grad_out), self.d)
        x = self.hist_in
        dx, mode = input_cotangent(need_input_grad, g.shape[0], self.d, self.dtype)
        grads = {name: np.empty(self.d, dtype=self.dtype) for name in self._params}
        self._backward(g, as_matrix(x, self.d), dx, mode, grads)
        return (dx.reshape(x.shape) if need_input_grad else None), grads


class LayerNorm(_Norm):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance).

    Parameters
    ----------
    d : int
        Size of the last axis; ``weight (d,)`` starts at ones, ``bias (d,)`` at zeros.
    eps : float, default 1e-5
    dtype, seed, rng :
        As for ``Dense`` (nothing is drawn; accepted for a uniform signature).
    """

    def __init__(self, d, eps=1e-5, *, dtype=np.float32, seed=None, rng=None):
        super().__init__(d, eps, dtype, seed, rng)

    def _forward(self, x2, y):
        """Kept: x-hat (returned) and each row's 1/std."""
        xhat = np.empty_like(x2)
        self.hist_rstd = np.empty(x2.shape[0], dtype=self.dtype)
        kernels.layer_norm_forward(x2, self._params["weight"], self._params["bias"], self.eps,
                                   xhat, self.hist_rstd, y)
        return xhat

    def _backward(self, g, x2, dx, mode, grads):
        kernels.layer_norm_backward(g, self.hist_pre, self.hist_rstd, self._params["weight"], dx,
                                    mode, grads["weight"], grads["bias"],
                                    np.empty(2 * self.d, np.float64))


class RMSNorm(_Norm):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis; ``weight (d,)`` starts at 1.

    Parameters
    ----------
    d : int
    eps : float, default 1e-6
    dtype, seed, rng :
        As for ``LayerNorm``.
    """

    def __init__(self, d, eps=1e-6, *, dtype=np.float32, seed=None, rng=None):
        super().__init__(d, eps, dtype, seed, rng)

    def _forward(self, x2, y):
        """Kept: each row's 1/rms (returned)."""
        rinv = np.empty(x2.shape[0], dtype=self.dtype)
        kernels.rms_norm_forward(x2, self._params["weight"], self.eps, rinv, y)
        return rinv

    def _backward(self, g, x2, dx, mode, grads):
        kernels.rms_norm_backward(g, x2, self.hist_pre, self._params["weight"], dx, mode,
                                  grads["weight"], np.empty(self.d, np.float64))


class Softmax(Layer):
    """``softmax(x, axis)`` through the maximum along ``axis``; no parameters.

    Parameters
    ----------
    axis : int, default -1
    dtype, seed, rng :
        As for ``Dense`` (nothing is drawn).
    """

    output_range = PROBABILITIES

    def __init__(self, axis=-1, *, dtype=np.float32, seed=None, rng=None):
        super().__init__(dtype)
        if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
            raise TypeError(f"Softmax: axis must be an int, got {axis!r}")
        self.axis = int(axis)
        make_rng(seed, rng)  # validated for a uniform signature; nothing to draw

    def infer_shape(self, shape):
        if not -len(shape) <= self.axis < len(shape):
            raise ValueError(f"Softmax: axis {self.axis} out of range for input of "
                             f"{len(shape)} dimensions (shape {tuple(shape)})")
        return tuple(shape)

    def _run(self, x):
        if self.axis in (-1, x.ndim - 1):
            x2 = as_matrix(np.ascontiguousarray(x), x.shape[-1])
            y = np.empty_like(x2)
            kernels.softmax_rows(x2, y)
            y = y.reshape(x.shape)
        else:
            shifted = x - x.max(axis=self.axis, keepdims=True)
            e = np.exp(shifted)
            y = e / e.sum(axis=self.axis, keepdims=True)
        self.hist_in, self.hist_pre = x, None
        self.hist_out = y
        self._out_shape = y.shape
        return y

    def backward(self, grad_out, need_input_grad=True):
        g = self._cotangent(grad_out)
        y = self.hist_out
        if not need_input_grad:
            return None, {}
        # NOTE: the softmax Jacobian-vector product y * (g - sum(g * y)) along the axis
        return y * (g - (g * y).sum(axis=self.axis, keepdims=True)), {}

    def get_config(self):
        return {"type": "Softmax", "axis": self.axis}
