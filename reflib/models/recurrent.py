"""Recurrent reference layers: RNN (tanh) and LSTM (gate order i, f, g, o), h0 = c0 = 0.

Input ``(batch, seq, features)``. Each time step is a ``slice`` of the input on axis 1, and the
outputs are joined with ``concat`` on axis 1, so the unrolled graph is made of registry ops only.
"""
from __future__ import annotations

import numpy as np

from optable.layers import RecurrentShell
from reflib.models.base import Layer, input_shape


def time_step(tape, x, t, features):
    """Node ``x[:, t, :]`` of shape (batch, features)."""
    batch = np.shape(tape.value(x))[0]
    step = tape.op("slice", x, axis=1, start=t, stop=t + 1)
    return tape.op("reshape", step, shape=(batch, features))


def stack_steps(tape, steps):
    """Join per-step nodes of shape (batch, hidden) into (batch, seq, hidden)."""
    batch, hidden = np.shape(tape.value(steps[0]))
    out = None
    for h in steps:
        h3 = tape.op("reshape", h, shape=(batch, 1, hidden))
        out = h3 if out is None else tape.op("concat", out, h3, axis=1)
    return out


class _Recurrent(RecurrentShell, Layer):
    """Shared shell of RNN and LSTM (sizes, draw, config: ``optable.layers.RecurrentShell``)."""

    def __init__(self, input_size, hidden_size, return_sequences=False, *, seed=None, rng=None):
        super().__init__()
        self._setup(input_size, hidden_size, return_sequences, seed, rng)


class RNN(_Recurrent):
    """Elman RNN: ``h_t = tanh(x_t @ w_ih + h_{t-1} @ w_hh + b)``, ``h_0 = 0``.

    Parameters
    ----------
    input_size, hidden_size : int
        ``w_ih (input_size, hidden_size)``, ``w_hh (hidden_size, hidden_size)`` (both
        Xavier-uniform, drawn in that order), ``b (hidden_size,)`` zeros.
    return_sequences : bool
        False: the last state ``(batch, hidden)``; True: every state ``(batch, seq, hidden)``.

    NOTE: with h_0 = 0 the first step has no ``h @ w_hh`` term at all (it would be exactly 0 and
    contribute exactly 0 to w_hh's gradient), so a length-1 sequence leaves w_hh unreached.
    """

    def trace(self, tape, x, ids):
        seq = input_shape(tape, x, "RNN (batch, seq, features)", 3, self.input_size)[1]
        h, states = None, []
        for t in range(seq):
            pre = tape.op("matmul", time_step(tape, x, t, self.input_size), ids["w_ih"])
            if h is not None:
                pre = tape.op("add", pre, tape.op("matmul", h, ids["w_hh"]))
            h = tape.op("tanh", tape.op("add", pre, ids["b"]))
            states.append(h)
        return stack_steps(tape, states) if self.return_sequences else h



class LSTM(_Recurrent):
    """LSTM with gates ``x_t @ w_ih + h_{t-1} @ w_hh + b`` split as i, f, g, o (H columns each).

    ``i, f, o = sigmoid(.)``, ``g = tanh(.)``, ``c_t = f * c_{t-1} + i * g``,
    ``h_t = o * tanh(c_t)``, ``h_0 = c_0 = 0``.

    Parameters
    ----------
    input_size, hidden_size : int
        ``w_ih (input_size, 4H)``, ``w_hh (H, 4H)`` (Xavier-uniform with those shapes, in that
        order), ``b (4H,)`` zeros (no forget-gate bias offset).
    return_sequences : bool
        False: the last ``h`` ``(batch, H)``; True: every ``h`` ``(batch, seq, H)``.
    """

    def trace(self, tape, x, ids):
        seq = input_shape(tape, x, "LSTM (batch, seq, features)", 3, self.input_size)[1]
        H = self.hidden_size
        h = c = None
        states = []
        for t in range(seq):
            gates = tape.op("matmul", time_step(tape, x, t, self.input_size), ids["w_ih"])
            if h is not None:
                gates = tape.op("add", gates, tape.op("matmul", h, ids["w_hh"]))
            gates = tape.op("add", gates, ids["b"])
            i, f, g, o = (tape.op("slice", gates, axis=1, start=k * H, stop=(k + 1) * H)
                          for k in range(4))
            i, f, o = tape.op("sigmoid", i), tape.op("sigmoid", f), tape.op("sigmoid", o)
            ig = tape.op("mul", i, tape.op("tanh", g))
            # NOTE: c_0 = 0, so the first step's f * c_0 term is exactly zero and is left out
            c = ig if c is None else tape.op("add", tape.op("mul", f, c), ig)
            h = tape.op("mul", o, tape.op("tanh", c))
            states.append(h)
        return stack_steps(tape, states) if self.return_sequences else h

