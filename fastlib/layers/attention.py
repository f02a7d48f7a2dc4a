"""Multi-head self-attention over ``(batch, seq, d_model)``; heads are contiguous slices of d."""
from __future__ import annotations

import numpy as np

from fastlib.kernels import attention as kernels
from fastlib.layers.base import Layer, check_bool, check_positive_int, xavier_uniform


class MultiHeadAttention(Layer):
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
        owner = "MultiHeadAttention"
        self.d_model = check_positive_int(d_model, "d_model", owner)
        self.heads = check_positive_int(heads, "heads", owner)
        if self.d_model % self.heads:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            raise ValueError(f"{owner}: heads ({heads}) must divide d_model ({d_model}); pick "
                             f"one of {divisors}")
        self.causal = check_bool(causal, "causal", owner)
        self.reset_parameters(seed, rng)

    def _init_parameters(self, rng):
        d = self.d_model
        params = {f"w_{n}": xavier_uniform(rng, (d, d)) for n in "qkvo"}
        params.update({f"b_{n}": np.zeros(d) for n in "qkvo"})
        return params

    @property
    def in_width(self):
        return self.d_model

    def out_width(self, in_width):
        return self.d_model

    def infer_shape(self, shape):
        if len(shape) != 3 or shape[-1] != self.d_model:
            raise ValueError(f"MultiHeadAttention({self.d_model}, {self.heads}): expected input "
                             f"(batch, seq, d_model) = (batch, seq, {self.d_model}), got shape "
                             f"{tuple(shape)}")
        if shape[1] < 1:
            raise ValueError(f"MultiHeadAttention: the sequence is empty (shape {tuple(shape)})")
        return tuple(shape)

    def forward(self, x):
        p = self._params
        batch, steps, d = x.shape
        x2 = x.reshape(batch * steps, d)
        q, k, v = ((np.dot(x2, p[f"w_{n}"]) + p[f"b_{n}"]).reshape(batch, steps, d)
                   for n in "qkv")
        att = np.empty_like(q)
        lse = np.empty((batch, self.heads, steps), dtype=self.dtype)
        scale = self.dtype.type(1.0 / np.sqrt(d // self.heads))
        kernels.attention_forward(q, k, v, self.heads, scale, self.causal, att, lse)
        y = np.dot(att.reshape(batch * steps, d), p["w_o"])
        y += p["b_o"]
        self.hist_in, self.hist_pre = x, att
        self._cache = (q, k, v, lse, scale)
        self._out_shape = x.shape
        return y.reshape(batch, steps, d)

    def backward(self, grad_out, need_input_grad=True):
        g = self._cotangent(grad_out)
        x, att = self.hist_in, self.hist_pre
        q, k, v, lse, scale = self._cache
        p = self._params
        batch, steps, d = x.shape
        g = g.reshape(batch * steps, d)
        att2 = att.reshape(batch * steps, d)
        grads = {"w_o": np.dot(att2.T, g)}
        datt = np.dot(g, p["w_o"].T).reshape(batch, steps, d)
        dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
        kernels.attention_backward(q, k, v, att, datt, lse, self.heads, scale, self.causal,
                                   dq, dk, dv)
        x2 = x.reshape(batch * steps, d)
        dx = None
        for n, dm in zip("qkv", (dq, dk, dv)):
            dm2 = dm.reshape(batch * steps, d)
            grads[f"w_{n}"] = np.dot(x2.T, dm2)
            grads[f"b_{n}"] = dm2.sum(axis=0, dtype=np.float64).astype(self.dtype)
            if need_input_grad:
                part = np.dot(dm2, p[f"w_{n}"].T)
                dx = part if dx is None else dx + part
        grads["b_o"] = g.sum(axis=0, dtype=np.float64).astype(self.dtype)
        ordered = {name: grads[name] for name in p}  # keyed in parameters() order
        return (None if dx is None else dx.reshape(batch, steps, d)), ordered

    def get_config(self):
        return {"type": "MultiHeadAttention", "d_model": self.d_model, "heads": self.heads,
                "causal": self.causal}
