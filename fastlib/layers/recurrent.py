"""RNN (tanh) and LSTM (gates i, f, g, o) over ``(batch, seq, features)``; h0 = c0 = 0.

Each layer does its input projection for all steps as one GEMM, runs the recurrence in a fused
Numba kernel (``fastlib.kernels.recurrent``), and forms every weight gradient with one GEMM over
the whole sequence. Internally the sequence is time-major ``(T, B, ...)`` so each step is a
contiguous block.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import recurrent as kernels
from fastlib.kernels import reduce as _reduce
from fastlib.layers.base import Layer
from optable.layers import RecurrentShell


class _Recurrent(RecurrentShell, Layer):
    """Shared shell of RNN and LSTM: shapes, layout changes and the GEMMs (sizes, the initial
    draw and the config: ``optable.layers.RecurrentShell``)."""

    def __init__(self, input_size, hidden_size, return_sequences=False, *, dtype=np.float32,
                 seed=None, rng=None):
        super().__init__(dtype)
        self._setup(input_size, hidden_size, return_sequences, seed, rng)

    def infer_shape(self, shape):
        out = super().infer_shape(shape)
        return out if self.return_sequences else (out[0], out[2])

    # -- shared pieces ------------------------------------------------------------------------
    def _project(self, x):
        """Time-major input ``(T*B, I)`` and its projections ``(T, B, k*H)`` (bias added)."""
        batch, steps, _ = x.shape
        xt = np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(steps * batch, self.input_size)
        xw = np.dot(xt, self._params["w_ih"])
        xw += self._params["b"]
        return xt, xw.reshape(steps, batch, -1)

    def _output(self, hs):
        """(T, B, H) states -> the layer output (last state, or batch-major sequence)."""
        out = np.ascontiguousarray(hs.transpose(1, 0, 2)) if self.return_sequences \
            else hs[-1].copy()
        self._out_shape = out.shape
        return out

    def _output_cotangent(self, grad_out, steps, batch):
        """The layer's output cotangent as time-major per-step cotangents ``(T, B, H)``."""
        g = self._cotangent(grad_out)
        if self.return_sequences:
            return np.ascontiguousarray(g.transpose(1, 0, 2))
        dhs = np.zeros((steps, batch, self.hidden_size), dtype=self.dtype)
        dhs[-1] = g
        return dhs

    def _weight_grads(self, xt, hs, dz, need_input_grad, batch):
        """Gradients of w_ih, w_hh, b and x from the pre-activation cotangents ``dz``."""
        steps = hs.shape[0]
        width = dz.shape[2]
        dz2 = dz.reshape(steps * batch, width)
        h_prev = hs[:-1].reshape((steps - 1) * batch, self.hidden_size)
        grads = {"w_ih": np.dot(xt.T, dz2),
                 "w_hh": np.dot(h_prev.T, dz2[batch:]),
                 "b": _reduce.sum_forward(dz2, (0,), serial=True)}  # float64 accumulation
        if not need_input_grad:
            return None, grads
        dx = np.dot(dz2, self._params["w_ih"].T).reshape(steps, batch, self.input_size)
        return np.ascontiguousarray(dx.transpose(1, 0, 2)), grads


class RNN(_Recurrent):
    """Elman RNN: ``h_t = tanh(x_t @ w_ih + h_{t-1} @ w_hh + b)``, ``h_0 = 0``.

    Parameters
    ----------
    input_size, hidden_size : int
        ``w_ih (input_size, hidden_size)``, ``w_hh (hidden_size, hidden_size)`` (Xavier-uniform,
        in that order), ``b (hidden_size,)`` zeros.
    return_sequences : bool, default False
        False: the last state ``(batch, hidden)``; True: every state ``(batch, seq, hidden)``.
    dtype, seed, rng :
        As for ``Dense``.
    """

    def forward(self, x):
        xt, xw = self._project(x)
        hs = np.empty_like(xw)
        kernels.rnn_forward(xw, self._params["w_hh"], hs)
        self.hist_in, self.hist_pre = x, xw
        self._cache = (xt, hs)
        return self._output(hs)

    def backward(self, grad_out, need_input_grad=True):
        x = self._history("hist_in")
        xt, hs = self._cache
        steps, batch = hs.shape[0], hs.shape[1]
        dhs = self._output_cotangent(grad_out, steps, batch)
        dpre = np.empty_like(hs)
        kernels.rnn_backward(dhs, hs, np.ascontiguousarray(self._params["w_hh"].T), dpre)
        return self._weight_grads(xt, hs, dpre, need_input_grad, x.shape[0])


class LSTM(_Recurrent):
    """LSTM: gates ``x_t @ w_ih + h_{t-1} @ w_hh + b`` split i, f, g, o (H columns each).

    ``i, f, o = sigmoid``, ``g = tanh``, ``c_t = f c_{t-1} + i g``, ``h_t = o tanh(c_t)``,
    ``h_0 = c_0 = 0``.

    Parameters
    ----------
    input_size, hidden_size : int
        ``w_ih (input_size, 4H)``, ``w_hh (H, 4H)`` (Xavier-uniform, in that order), ``b (4H,)``
        zeros (no forget-gate offset, as reflib).
    return_sequences : bool, default False
    dtype, seed, rng :
        As for ``Dense``.
    """

    def forward(self, x):
        xt, xw = self._project(x)
        steps, batch, _ = xw.shape
        gates = np.empty_like(xw)
        cs = np.empty((steps, batch, self.hidden_size), dtype=self.dtype)
        tcs = np.empty_like(cs)
        hs = np.empty_like(cs)
        kernels.lstm_forward(xw, self._params["w_hh"], gates, cs, tcs, hs)
        self.hist_in, self.hist_pre = x, xw
        self._cache = (xt, gates, cs, tcs, hs)
        return self._output(hs)

    def backward(self, grad_out, need_input_grad=True):
        x = self._history("hist_in")
        xt, gates, cs, tcs, hs = self._cache
        steps, batch = hs.shape[0], hs.shape[1]
        dhs = self._output_cotangent(grad_out, steps, batch)
        dz = np.empty_like(gates)
        kernels.lstm_backward(dhs, gates, cs, tcs, np.ascontiguousarray(self._params["w_hh"].T),
                              dz)
        return self._weight_grads(xt, hs, dz, need_input_grad, x.shape[0])
