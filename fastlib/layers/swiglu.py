"""SwiGLU feed-forward: ``y = (silu(x @ w_gate) * (x @ w_up)) @ w_down`` (no biases); its
forward and backward the kernels the compiled program's rows run."""
from __future__ import annotations

import numpy as np

from fastlib.kernels import dense as kernels
from fastlib.layers.base import UNBOUNDED, Layer, set_sizes
from fastlib.layers.dense import as_matrix, input_cotangent


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
    output_range = UNBOUNDED

    def __init__(self, d, hidden, out, *, dtype=np.float32, seed=None, rng=None):
        super().__init__(dtype)
        set_sizes(self, d=d, hidden=hidden, out=out)
        self.reset_parameters(seed, rng)

    def _stacked(self):
        """``[w_gate | w_up]`` (d, 2 hidden): both projections as one product (restacked on
        every call, so that in-place updates of the parameters are always seen)."""
        return np.concatenate((self._params["w_gate"], self._params["w_up"]), axis=1)

    def _run(self, x):
        x2 = as_matrix(x, self.d)
        rows = x2.shape[0]
        au = np.empty((rows, 2 * self.hidden), self.dtype)
        hidden = np.empty((rows, self.hidden), self.dtype)
        y = np.empty((rows, self.out), self.dtype)
        kernels.swiglu_forward(x2, self._stacked(), self._params["w_down"], au, hidden, y)
        self.hist_in, self.hist_pre = x, au
        self.hist_hidden = hidden
        y = y if x.ndim == 2 else y.reshape(x.shape[:-1] + (self.out,))
        self._out_shape = y.shape
        return y

    def backward(self, grad_out, need_input_grad=True):
        g = as_matrix(self._cotangent(grad_out), self.out)
        x, au = self.hist_in, self.hist_pre
        rows, h = g.shape[0], self.hidden
        gw_gu = np.empty((self.d, 2 * h), self.dtype)
        gw_down = np.empty((h, self.out), self.dtype)
        dx, mode = input_cotangent(need_input_grad, rows, self.d, self.dtype)
        kernels.swiglu_backward(as_matrix(x, self.d), self._stacked(), self._params["w_down"], au,
                                self.hist_hidden, g, np.empty((rows, h), self.dtype),
                                np.empty((rows, 2 * h), self.dtype), gw_gu, gw_down, dx, mode,
                                np.empty(0, self.dtype))
        grads = {"w_gate": np.ascontiguousarray(gw_gu[:, :h]),
                 "w_up": np.ascontiguousarray(gw_gu[:, h:]), "w_down": gw_down}
        if not need_input_grad:
            return None, grads
        return (dx if x.ndim == 2 else dx.reshape(x.shape)), grads

    def get_config(self):
        return {"type": "SwiGLU", "d": self.d, "hidden": self.hidden, "out": self.out}
