"""Dense: ``y = activation(x @ weight + bias)``, forward and backward each one fused pass.

The GEMMs go through ``np.dot`` (BLAS); the elementwise epilogue (bias, activation, and in the
backward the activation derivative and the bias gradient) is one Numba kernel.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import dense as kernels
from fastlib.layers.activations import ACTIVATIONS, LEAKY_SLOPE, LINEAR, check_activation
from fastlib.layers.base import Layer, set_sizes


def as_matrix(x, width):
    """``x`` viewed as 2-D ``(rows, width)``, without a copy when ``x`` is C-contiguous."""
    return x if x.ndim == 2 else x.reshape(-1, width)


class Dense(Layer):
    """Fully connected layer ``y = activation(x @ weight + bias)``.

    Parameters
    ----------
    in_features, out_features : int
        ``weight`` is ``(in_features, out_features)``, ``bias`` ``(out_features,)``.
    activation : str, default "linear"
        ``linear relu leaky_relu tanh sigmoid silu gelu gelu_tanh softplus softmax``
        (case-insensitive; softmax over the last axis; leaky_relu with slope 0.01).
    dtype : float32 (default) or float64
    seed : int or numpy.random.Generator, optional
        Initialisation source (None: seed 0). He-normal weight for relu and leaky_relu,
        Xavier-uniform otherwise; zero bias. Draws equal reflib's for the same seed.
    rng : numpy.random.Generator, optional
        reflib's spelling of a generator seed.

    Notes
    -----
    Input ``(..., in_features)``, output ``(..., out_features)``.
    """

    _in_attr, _out_attr = "in_features", "out_features"
    _label_attrs = ("in_features", "out_features")

    def __init__(self, in_features, out_features, activation="linear", *, dtype=np.float32,
                 seed=None, rng=None):
        super().__init__(dtype)
        set_sizes(self, in_features=in_features, out_features=out_features)
        self.activation = check_activation(activation, "Dense")
        self._code = ACTIVATIONS[self.activation]
        self.hist_post = None
        self.reset_parameters(seed, rng)

    def forward(self, x):
        w, b = self._params["weight"], self._params["bias"]
        x2 = as_matrix(x, self.in_features)
        pre = np.dot(x2, w)
        if self._code == LINEAR:
            kernels.add_bias(pre, b)
            post = pre
        else:
            post = np.empty_like(pre)
            kernels.bias_activation(pre, b, post, self._code, LEAKY_SLOPE)
        lead = x.shape[:-1]
        self.hist_in, self.hist_pre, self.hist_post = x, pre, post
        out = post if x.ndim == 2 else post.reshape(lead + (self.out_features,))
        self._out_shape = out.shape
        return out

    def backward(self, grad_out, need_input_grad=True):
        g = as_matrix(self._cotangent(grad_out), self.out_features)
        x = self.hist_in
        db = np.empty(self.out_features, dtype=self.dtype)
        if self._code == LINEAR:
            gpre = g
            kernels.column_sums(g, db)
        else:
            gpre = np.empty_like(g)
            kernels.activation_backward(g, self.hist_pre, self.hist_post, gpre, db, self._code,
                                        LEAKY_SLOPE)
        x2 = as_matrix(x, self.in_features)
        grads = {"weight": np.dot(x2.T, gpre), "bias": db}
        if not need_input_grad:
            return None, grads
        gin = np.dot(gpre, self._params["weight"].T)
        return (gin if x.ndim == 2 else gin.reshape(x.shape)), grads

    def get_config(self):
        return {"type": "Dense", "in_features": self.in_features,
                "out_features": self.out_features, "activation": self.activation}
