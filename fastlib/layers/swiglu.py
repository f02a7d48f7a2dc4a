"""SwiGLU feed-forward: ``y = (silu(x @ w_gate) * (x @ w_up)) @ w_down`` (no biases)."""
from __future__ import annotations

import numpy as np

from fastlib.kernels import dense as kernels
from fastlib.layers.base import Layer, set_sizes
from fastlib.layers.dense import as_matrix


class SwiGLU(Layer):
    """Gated feed-forward block of LLaMA-style transformers.

    Parameters
    ----------
    d, hidden, out : int
        ``w_gate (d, hidden)``, ``w_up (d, hidden)``, ``w_down (hidden, out)``, all
        Xavier-uniform, drawn in that order (as reflib).
    dtype, seed, rng :
        As for ``Dense``.

    Notes
    -----
    Input ``(..., d)``, output ``(..., out)``.
    """

    _in_attr, _out_attr = "d", "out"
    _label_attrs = ("d", "hidden", "out")

    def __init__(self, d, hidden, out, *, dtype=np.float32, seed=None, rng=None):
        super().__init__(dtype)
        set_sizes(self, d=d, hidden=hidden, out=out)
        self.reset_parameters(seed, rng)

    def forward(self, x):
        p = self._params
        x2 = as_matrix(x, self.d)
        a = np.dot(x2, p["w_gate"])
        u = np.dot(x2, p["w_up"])
        hidden = np.empty_like(a)
        kernels.swiglu_gate(a, u, hidden)
        self.hist_in, self.hist_pre = x, a
        self._cache = (u, hidden)
        y = np.dot(hidden, p["w_down"])
        y = y if x.ndim == 2 else y.reshape(x.shape[:-1] + (self.out,))
        self._out_shape = y.shape
        return y

    def backward(self, grad_out, need_input_grad=True):
        g = as_matrix(self._cotangent(grad_out), self.out)
        x, a = self.hist_in, self.hist_pre
        u, hidden = self._cache
        p = self._params
        dh = np.dot(g, p["w_down"].T)
        da, du = np.empty_like(a), np.empty_like(u)
        kernels.swiglu_gate_backward(dh, a, u, da, du)
        x2 = as_matrix(x, self.d)
        grads = {"w_gate": np.dot(x2.T, da), "w_up": np.dot(x2.T, du),
                 "w_down": np.dot(hidden.T, g)}
        if not need_input_grad:
            return None, grads
        dx = np.dot(da, p["w_gate"].T)
        dx += np.dot(du, p["w_up"].T)
        return (dx if x.ndim == 2 else dx.reshape(x.shape)), grads

    def get_config(self):
        return {"type": "SwiGLU", "d": self.d, "hidden": self.hidden, "out": self.out}
