"""RNN (tanh) and LSTM (gates i, f, g, o) over ``(batch, seq, features)``; h0 = c0 = 0.

Each layer runs the kernels the compiled program's rows run (``fastlib.kernels.recurrent``):
its input projection for all steps as one GEMM, the recurrence on groups of sequences laid out
time-major, every weight gradient as one GEMM over the whole sequence.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import recurrent as kernels
from fastlib.layers.base import Layer
from fastlib.layers.dense import input_cotangent
from optable.layers import RecurrentShell


class _Recurrent(RecurrentShell, Layer):
    """Shared shell of RNN and LSTM: shapes, layout changes and the GEMMs (sizes, the initial
    draw and the config: ``optable.layers.RecurrentShell``)."""

    output_range = (-1.0, 1.0)     # hidden states: tanh (RNN), o * tanh(c) (LSTM)

    def __init__(self, input_size, hidden_size, return_sequences=False, *, dtype=np.float32,
                 seed=None, rng=None):
        super().__init__(dtype)
        self._setup(input_size, hidden_size, return_sequences, seed, rng)

    def infer_shape(self, shape):
        out = super().infer_shape(shape)
        return out if self.return_sequences else (out[0], out[2])

    def _run(self, x):
        batch, steps, _ = x.shape
        rows, width = batch * steps, self._gates * self.hidden_size
        p = self._params
        x2 = np.ascontiguousarray(x, dtype=self.dtype).reshape(rows, self.input_size)
        lstm = self._gates > 1
        gates = np.empty((rows, width), self.dtype)
        hs = np.empty((rows, self.hidden_size), self.dtype) if lstm else gates
        cs = np.empty_like(hs) if lstm else hs
        tcs = np.empty_like(hs) if lstm else hs
        y = np.empty((rows if self.return_sequences else batch, self.hidden_size), self.dtype)
        cells = min(kernels.PIECE, batch)
        kernels.recurrent_forward(x2, p["w_ih"], p["w_hh"], p["b"], gates, hs, cs, tcs, y,
                                  np.empty((rows, width), self.dtype), batch, steps, lstm,
                                  self.return_sequences, 1,
                                  np.empty(cells * width, self.dtype))
        self.hist_in, self.hist_pre = x, gates
        self._cache = (x2, gates, hs, cs, tcs)
        out = y.reshape(batch, steps, self.hidden_size) if self.return_sequences else y
        self._out_shape = out.shape
        return out

    def backward(self, grad_out, need_input_grad=True):
        x = self._history("hist_in")
        x2, gates, hs, cs, tcs = self._cache
        batch, steps, _ = x.shape
        rows, hidden, width = batch * steps, self.hidden_size, self._gates * self.hidden_size
        p = self._params
        g = np.ascontiguousarray(self._cotangent(grad_out), self.dtype).reshape(-1, hidden)
        grads = {"w_ih": np.empty((self.input_size, width), self.dtype),
                 "w_hh": np.empty((hidden, width), self.dtype),
                 "b": np.empty(width, self.dtype)}
        dx, mode = input_cotangent(need_input_grad, rows, self.input_size, self.dtype)
        cells = min(kernels.PIECE, batch)
        kernels.recurrent_backward(x2, p["w_ih"], p["w_hh"], gates, hs, cs, tcs, g,
                                   np.empty_like(g), np.empty((rows, width), self.dtype),
                                   np.empty((rows, width), self.dtype), grads["w_ih"],
                                   grads["w_hh"], grads["b"], np.empty(width, np.float64), dx,
                                   mode, np.empty(hidden * width, self.dtype), batch, steps,
                                   self._gates > 1, self.return_sequences, 1,
                                   np.empty(2 * cells * hidden, self.dtype))
        return (dx.reshape(x.shape) if need_input_grad else None), grads


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

    _gates = 1


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

    _gates = 4
