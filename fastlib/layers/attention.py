"""Multi-head self-attention over ``(batch, seq, d_model)``; heads are contiguous slices of d."""
from __future__ import annotations

import numpy as np

from fastlib.kernels import attention as kernels
from fastlib.kernels import reduce as _reduce
from fastlib.layers.base import Layer
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

    def forward(self, x):
        p = self._params
        batch, steps, d = x.shape
        x2 = x.reshape(batch * steps, d)
        w_qkv, b_qkv = self._stacked_qkv()
        qkv = np.dot(x2, w_qkv)
        qkv += b_qkv
        qkv = qkv.reshape(batch, steps, 3 * d)
        att = np.empty((batch, steps, d), dtype=self.dtype)
        lse = np.empty((batch, self.heads, steps), dtype=self.dtype)
        scale = self.dtype.type(1.0 / np.sqrt(d // self.heads))
        kernels.attention_forward(qkv, self.heads, scale, self.causal, att, lse)
        y = np.dot(att.reshape(batch * steps, d), p["w_o"])
        y += p["b_o"]
        self.hist_in, self.hist_pre = x, att
        # q, k, v as views of the packed projections (fastlib.targetprop reads q and k)
        self._cache = (qkv[:, :, :d], qkv[:, :, d:2 * d], qkv[:, :, 2 * d:], lse, scale)
        self._qkv = qkv
        self._out_shape = x.shape
        return y.reshape(batch, steps, d)

    def backward(self, grad_out, need_input_grad=True):
        g = self._cotangent(grad_out)
        x, att = self.hist_in, self.hist_pre
        _, _, _, lse, scale = self._cache
        qkv = self._qkv
        p = self._params
        batch, steps, d = x.shape
        g = g.reshape(batch * steps, d)
        att2 = att.reshape(batch * steps, d)
        grads = {"w_o": np.dot(att2.T, g)}
        datt = np.dot(g, p["w_o"].T).reshape(batch, steps, d)
        dqkv = np.empty((batch, steps, 3 * d), dtype=self.dtype)
        kernels.attention_backward(qkv, att, datt, lse, self.heads, scale, self.causal, dqkv)
        x2 = x.reshape(batch * steps, d)
        dqkv2 = dqkv.reshape(batch * steps, 3 * d)
        gw = np.dot(x2.T, dqkv2)                                 # (d, 3d): [gw_q | gw_k | gw_v]
        # NOTE: bias gradients are column sums accumulated in float64 (reduce.py's NOTE)
        gb = _reduce.sum_forward(dqkv2, (0,), serial=True)
        for i, n in enumerate("qkv"):
            grads[f"w_{n}"] = np.ascontiguousarray(gw[:, i * d:(i + 1) * d])
            grads[f"b_{n}"] = gb[i * d:(i + 1) * d].copy()
        grads["b_o"] = _reduce.sum_forward(g, (0,), serial=True)
        dx = None
        if need_input_grad:
            w_qkv, _ = self._stacked_qkv()
            dx = np.dot(dqkv2, w_qkv.T).reshape(batch, steps, d)   # the three parts, one GEMM
        ordered = {name: grads[name] for name in p}  # keyed in parameters() order
        return dx, ordered

