"""MyGrad as an engine: stock ``mygrad`` / ``mygrad.nnet`` functions, VJPs by
``Tensor.backward``. Install: ``pip install 'verigrad[mygrad]'``.

MyGrad mirrors NumPy's functions (``mg.exp``, ``mg.sum``, ``mg.maximum``, ...) and ships a
few neural-network functions (``mygrad.nnet``: relu, leaky_relu, sigmoid, tanh, softmax,
logsoftmax, softmax_crossentropy). Every op it has is one stock call with the stock defaults;
nothing is corrected. Where it has no such function the adapter composes MyGrad functions the
way a MyGrad user would, and says so per op (``COMPOSED``); ``gelu`` needs ``erf``, which
MyGrad does not have, so it is declared unsupported.

MyGrad has no optimizers, so none is declared supported.
"""
from __future__ import annotations

import math

import numpy as np

from reports.conformance.adapters._peer import PeerEngine, slice_index
from reports.conformance.engines import FLOAT32, FLOAT64

__all__ = ["MygradEngine", "mygrad_ops", "COMPOSED", "UNSUPPORTED"]

COMPOSED = {
    "silu": "no silu in MyGrad: x * nnet.sigmoid(x)",
    "gelu_tanh": "no gelu in MyGrad: x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
    "softplus": "no softplus in MyGrad: mg.logaddexp(0, x)",
    "logsumexp": "no logsumexp in MyGrad: m + log(sum(exp(x - m))), m = max(x) as a constant",
    "layer_norm": "no layer norm in MyGrad: (x - mean) / sqrt(var + eps) over the last axis",
    "rms_norm": "no RMS norm in MyGrad: x / sqrt(mean(x^2) + eps) over the last axis",
    "mse": "no MSE loss in MyGrad: mean((p - t)^2)",
    "categorical_cross_entropy": "nnet.softmax_crossentropy takes class indices only: "
                                 "-sum(t * nnet.logsoftmax(z)) / N",
    "binary_cross_entropy": "no BCE in MyGrad: -mean(t log p + (1 - t) log1p(-p))",
    "binary_cross_entropy_with_logits": "no BCE with logits in MyGrad: "
                                        "mean(logaddexp(0, z) - z t)",
}
UNSUPPORTED = {"gelu": "MyGrad has no erf, which the exact GELU needs"}


def mygrad_ops(mg, nnet):
    """The op table: registry name -> function of MyGrad tensors (params as keywords)."""

    def k(x, value):
        # NOTE: a Python float becomes a float64 tensor in MyGrad and promotes a float32 input;
        # the composed ops write their constants in the input's dtype, as a careful user would
        return np.asarray(value, dtype=x.dtype)

    def logsumexp(x, axis=None, keepdims=False):
        if axis is not None and not (axis if isinstance(axis, tuple) else (axis,)):
            return mg.positive(x)              # NumPy: axis=() reduces nothing
        m = mg.max(x, axis=axis, keepdims=True, constant=True)
        out = mg.log(mg.sum(mg.exp(x - m), axis=axis, keepdims=True)) + m
        return out if keepdims else mg.squeeze(out, axis=axis) if axis is not None \
            else mg.reshape(out, ())

    def layer_norm(x, eps=1e-5):
        centred = x - mg.mean(x, axis=-1, keepdims=True)
        return centred / mg.sqrt(mg.mean(centred ** 2, axis=-1, keepdims=True) + k(x, eps))

    def categorical(z, t):
        return -mg.sum(t * nnet.logsoftmax(z, axis=-1)) / k(z, z.shape[0])

    def bce(p, t):
        return -mg.mean(t * mg.log(p) + (k(t, 1) - t) * mg.log1p(-p))

    c = math.sqrt(2.0 / math.pi)
    return {
        "neg": mg.negative, "exp": mg.exp, "log": mg.log, "sqrt": mg.sqrt,
        "square": mg.square, "abs": mg.abs, "relu": nnet.relu,
        "leaky_relu": lambda x, negative_slope=0.01: nnet.leaky_relu(x, negative_slope),
        "silu": lambda x: x * nnet.sigmoid(x),
        "gelu_tanh": lambda x: k(x, 0.5) * x * (k(x, 1) + mg.tanh(
            k(x, c) * (x + k(x, 0.044715) * x ** k(x, 3)))),
        "tanh": mg.tanh, "sigmoid": nnet.sigmoid,
        "softplus": lambda x: mg.logaddexp(k(x, 0), x),
        "identity": mg.positive,
        "add": mg.add, "sub": mg.subtract, "mul": mg.multiply, "div": mg.divide,
        "maximum": mg.maximum,
        "sum": lambda x, axis=None, keepdims=False: mg.sum(x, axis=axis, keepdims=keepdims),
        "mean": lambda x, axis=None, keepdims=False: mg.mean(x, axis=axis, keepdims=keepdims),
        "logsumexp": logsumexp,
        "matmul": mg.matmul,
        "transpose": lambda x, axes=None: mg.transpose(x, axes),
        "reshape": lambda x, shape: mg.reshape(x, tuple(shape)),
        "concat": lambda a, b, axis=-1: mg.concatenate([a, b], axis=axis),
        "slice": lambda x, **p: x[slice_index(x.ndim, **p)],
        "softmax": lambda x, axis=-1: nnet.softmax(x, axis=axis),
        "log_softmax": lambda x, axis=-1: nnet.logsoftmax(x, axis=axis),
        "layer_norm": layer_norm,
        "rms_norm": lambda x, eps=1e-6: x / mg.sqrt(mg.mean(x ** 2, axis=-1, keepdims=True)
                                                    + k(x, eps)),
        "mse": lambda p, t: mg.mean((p - t) ** 2),
        "cross_entropy": lambda z, t: nnet.softmax_crossentropy(z, t.data.reshape(-1)),
        "categorical_cross_entropy": categorical,
        "binary_cross_entropy": bce,
        "binary_cross_entropy_with_logits": lambda z, t: mg.mean(mg.logaddexp(k(z, 0), z)
                                                                 - z * t),
    }


class MygradEngine(PeerEngine):
    """MyGrad through ``Tensor.backward``."""

    name = "mygrad"
    dtypes = (FLOAT32, FLOAT64)
    description = "MyGrad through Tensor.backward"
    composed = COMPOSED
    unsupported = UNSUPPORTED
    optimizer_reasons = {n: "MyGrad has no optimizers" for n in (
        "SGD", "Momentum", "NAG", "Adagrad", "RMSprop", "Adam", "AdamW")}

    def __init__(self):
        import mygrad as mg
        import mygrad.nnet as nnet

        self._mg = mg
        self.ops = mygrad_ops(mg, nnet)

    def _tensor(self, array, differentiable):
        return self._mg.tensor(array, constant=not differentiable)

    def _numpy(self, tensor):
        return np.array(tensor.data if hasattr(tensor, "data") else tensor)

    def _gradients(self, out, wanted, grad):
        out.backward(grad)
        return [None if t.grad is None else np.array(t.grad) for t in wanted]
