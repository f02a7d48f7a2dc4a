"""Dense: ``y = activation(x @ weight + bias)``, its forward and backward the kernels the
compiled program's rows run (``fastlib.kernels.dense.dense_forward`` / ``dense_backward``).
"""
from __future__ import annotations

import numpy as np

import optable
from fastlib.kernels import dense as kernels
from fastlib.kernels.instructions import GRAD_SKIP, GRAD_WRITE
from fastlib.layers.activations import ACTIVATIONS, LEAKY_SLOPE, LINEAR, check_activation
from fastlib.layers.base import Layer, set_sizes


def as_matrix(x, width):
    """``x`` as a C-contiguous 2-D ``(rows, width)`` array, without a copy when it is one."""
    return np.ascontiguousarray(x if x.ndim == 2 else x.reshape(-1, width))


def input_cotangent(need, rows, width, dtype):
    """``(buffer, mode)`` for a kernel's input cotangent: a new ``(rows, width)`` array written
    (``GRAD_WRITE``), or an empty one skipped (``GRAD_SKIP``) when it is not needed."""
    if need:
        return np.empty((rows, width), dtype), GRAD_WRITE
    return np.empty((0, width), dtype), GRAD_SKIP


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

    @property
    def output_range(self):
        """The bounds of its activation's values (``optable``'s activation table)."""
        return optable.ACTIVATIONS[self.activation].values

    def _run(self, x):
        w, b = self._params["weight"], self._params["bias"]
        x2 = as_matrix(x, self.in_features)
        pre = np.empty((x2.shape[0], self.out_features), self.dtype)
        post = pre if self._code == LINEAR else np.empty_like(pre)
        kernels.dense_forward(x2, w, b, pre, post, self._code, self.dtype.type(LEAKY_SLOPE))
        lead = x.shape[:-1]
        self.hist_in, self.hist_pre, self.hist_post = x, pre, post
        out = post if x.ndim == 2 else post.reshape(lead + (self.out_features,))
        self._out_shape = out.shape
        return out

    def backward(self, grad_out, need_input_grad=True):
        g = as_matrix(self._cotangent(grad_out), self.out_features)
        x = self.hist_in
        x2 = as_matrix(x, self.in_features)
        grads = {"weight": np.empty((self.in_features, self.out_features), self.dtype),
                 "bias": np.empty(self.out_features, self.dtype)}
        # the pre-activation's cotangent: g itself when linear (left unwritten), else new
        gpre = g if self._code == LINEAR else np.empty_like(g)
        gin, mode = input_cotangent(need_input_grad, g.shape[0], self.in_features, self.dtype)
        kernels.dense_backward(x2, self._params["weight"], self.hist_pre, self.hist_post, g, gpre,
                               grads["weight"], grads["bias"],
                               np.empty(self.out_features, np.float64), gin, mode,
                               np.empty(0, self.dtype), self._code,
                               self.dtype.type(LEAKY_SLOPE))
        if not need_input_grad:
            return None, grads
        return (gin if x.ndim == 2 else gin.reshape(x.shape)), grads

    def get_config(self):
        return {"type": "Dense", "in_features": self.in_features,
                "out_features": self.out_features, "activation": self.activation}
