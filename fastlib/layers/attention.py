"""Multi-head self-attention over ``(batch, seq, d_model)``; heads are contiguous slices of d.
Its forward and backward are the kernels the compiled program's rows run."""
from __future__ import annotations

import numpy as np

from fastlib.kernels import attention as kernels
from fastlib.layers.base import UNBOUNDED, Layer
from fastlib.layers.dense import input_cotangent
from optable.layers import AttentionShell


class MultiHeadAttention(AttentionShell, Layer):
    """Self-attention: ``y = concat_h(softmax(q_h k_h^T / sqrt(dh)) v_h) @ w_o + b_o``.

    ``q = x @ w_q + b_q`` (likewise k, v); head h uses columns ``h*dh:(h+1)*dh``,
    ``dh = d_model / heads``.

    Parameters
    ----------
    d_model, heads : int
        ``heads`` must divide ``d_model``. ``w_q w_k w_v w_o (d, d)`` Xavier-uniform, drawn in
        that order; ``b_q b_k b_v b_o (d,)`` zeros.
    causal : bool, default False
        When True, position t attends to positions 0..t only.
    dtype, seed, rng :
        As for ``Dense``.
    """

    output_range = UNBOUNDED     # the output projection's

    def __init__(self, d_model, heads, causal=False, *, dtype=np.float32, seed=None, rng=None):
        super().__init__(dtype)
        self._setup(d_model, heads, causal, seed, rng)

    def _stacked_qkv(self):
        """``[w_q | w_k | w_v]`` (d, 3d) and ``[b_q | b_k | b_v]`` (3d,): one GEMM for all three
        projections (NOTE: restacked on every call, ~0.02 ms at d = 128, so that in-place
        updates of the parameters are always seen)."""
        p = self._params
        return (np.concatenate((p["w_q"], p["w_k"], p["w_v"]), axis=1),
                np.concatenate((p["b_q"], p["b_k"], p["b_v"])))

    def _run(self, x):
        p = self._params
        batch, steps, d = x.shape
        x2 = np.ascontiguousarray(x).reshape(batch * steps, d)
        w_qkv, b_qkv = self._stacked_qkv()
        rows, heads = batch * steps, self.heads
        qkv = np.empty((rows, 3 * d), self.dtype)
        att = np.empty((rows, d), self.dtype)
        # NOTE: each (sample, head) block's (T, T) probabilities are kept for the backward
        probs = np.empty((batch * heads * steps, steps), self.dtype)
        lse = np.empty(batch * heads * steps, self.dtype)
        y = np.empty((rows, d), self.dtype)
        scale = self.dtype.type(1.0 / np.sqrt(d // heads))
        kernels.attention_forward(x2, w_qkv, b_qkv, p["w_o"], p["b_o"], qkv, att, probs, lse, y,
                                  batch, steps, heads, scale, self.causal, 1,
                                  np.empty(4 * steps * (d // heads), self.dtype))
        self.hist_in, self.hist_pre = x, att
        qkv = qkv.reshape(batch, steps, 3 * d)
        # q, k, v as views of the packed projections, and the score rows' log-sum-exps
        # (fastlib.targetprop reads q, k and lse)
        self._cache = (qkv[:, :, :d], qkv[:, :, d:2 * d], qkv[:, :, 2 * d:],
                       lse.reshape(batch, heads, steps), scale)
        self.hist_kept = (x2, qkv.reshape(rows, 3 * d), att, probs)
        self._out_shape = x.shape
        return y.reshape(batch, steps, d)

    def backward(self, grad_out, need_input_grad=True):
        g = np.ascontiguousarray(self._cotangent(grad_out))
        x2, qkv, att, probs = self.hist_kept
        scale = self._cache[4]
        p = self._params
        batch, steps, d = self.hist_in.shape
        rows, heads = batch * steps, self.heads
        gw_qkv = np.empty((d, 3 * d), self.dtype)
        gb_qkv = np.empty(3 * d, self.dtype)
        grads = {"w_o": np.empty((d, d), self.dtype), "b_o": np.empty(d, self.dtype)}
        dx, mode = input_cotangent(need_input_grad, rows, d, self.dtype)
        w_qkv, _ = self._stacked_qkv()
        kernels.attention_backward(x2, w_qkv, p["w_o"], qkv, att, probs, g.reshape(rows, d),
                                   np.empty((rows, d), self.dtype),
                                   np.empty((rows, 3 * d), self.dtype), gw_qkv, gb_qkv,
                                   grads["w_o"], grads["b_o"], np.empty(3 * d, np.float64), dx,
                                   mode, np.empty(0, self.dtype), batch, steps, heads, scale,
                                   self.causal, 1,
                                   np.empty(4 * steps * (d // heads) + steps * steps,
                                            self.dtype))
        for i, n in enumerate("qkv"):
            grads[f"w_{n}"] = np.ascontiguousarray(gw_qkv[:, i * d:(i + 1) * d])
            grads[f"b_{n}"] = gb_qkv[i * d:(i + 1) * d].copy()
        ordered = {name: grads[name] for name in p}  # keyed in parameters() order
        return (dx.reshape(batch, steps, d) if need_input_grad else None), ordered
