"""Multi-head self-attention from registry ops (slice, matmul, transpose, softmax, concat)."""
from __future__ import annotations

import numpy as np

from optable.layers import AttentionShell
from reflib.models.base import Layer, input_shape
from reflib.models.layers import affine


class MultiHeadAttention(AttentionShell, Layer):
    """Self-attention over ``(batch, seq, d_model)`` with ``heads`` contiguous slices of d.

    ``q = x @ w_q + b_q`` (likewise k, v); head ``h`` uses columns ``h*dh:(h+1)*dh`` with
    ``dh = d_model / heads``; ``a_h = softmax(q_h k_h^T / sqrt(dh)) v_h``; the heads are
    concatenated in order and ``y = concat @ w_o + b_o``, shape ``(batch, seq, d_model)``.

    Parameters
    ----------
    d_model, heads : int
        ``heads`` must divide ``d_model``. ``w_q w_k w_v w_o (d, d)`` Xavier-uniform, drawn in
        that order; ``b_q b_k b_v b_o (d,)`` zeros.
    causal : bool
        When True, query position t attends to key positions 0..t only.

    NOTE: causal masking excludes the masked keys from the softmax outright: each query row t
    is computed from the key/value rows ``0..t`` (``slice``), not by adding a large negative
    number, so the output at t is exactly independent of inputs after t, in float64 and exact.
    """

    def __init__(self, d_model, heads, causal=False, *, seed=None, rng=None):
        super().__init__()
        self._setup(d_model, heads, causal, seed, rng)

    def trace(self, tape, x, ids):
        batch, seq, d = input_shape(tape, x, "MultiHeadAttention (batch, seq, d_model)", 3,
                                    self.d_model)
        q, k, v = (affine(tape, x, ids[f"w_{n}"], ids[f"b_{n}"]) for n in "qkv")
        dh = d // self.heads
        # sqrt(dh) is computed on the tape so that exact mode gets it to full precision
        root_dh = tape.op("sqrt", tape.leaf(np.array(float(dh)), requires_grad=False))
        heads_out = None
        for h in range(self.heads):
            qh, kh, vh = (tape.op("slice", m, axis=2, start=h * dh, stop=(h + 1) * dh)
                          for m in (q, k, v))
            if self.causal:
                rows = [self._attend(tape, tape.op("slice", qh, axis=1, start=t, stop=t + 1),
                                     tape.op("slice", kh, axis=1, start=0, stop=t + 1),
                                     tape.op("slice", vh, axis=1, start=0, stop=t + 1), root_dh)
                        for t in range(seq)]
                ah = rows[0]
                for row in rows[1:]:
                    ah = tape.op("concat", ah, row, axis=1)
            else:
                ah = self._attend(tape, qh, kh, vh, root_dh)
            heads_out = ah if heads_out is None else tape.op("concat", heads_out, ah, axis=-1)
        return affine(tape, heads_out, ids["w_o"], ids["b_o"])

    @staticmethod
    def _attend(tape, q, k, v, root_dh):
        """softmax(q k^T / sqrt(dh)) v for (batch, rows, dh) blocks."""
        scores = tape.op("matmul", q, tape.op("transpose", k, axes=(0, 2, 1)))
        weights = tape.op("softmax", tape.op("div", scores, root_dh), axis=-1)
        return tape.op("matmul", weights, v)

