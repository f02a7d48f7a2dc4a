"""HIPS autograd as an engine: ``autograd.numpy`` / ``autograd.scipy.special`` functions,
VJPs by ``autograd.make_vjp``. Install: ``pip install 'verigrad[autograd]'``.

autograd differentiates NumPy itself: its forward values are NumPy's and SciPy's, its VJPs
its own. It has NumPy's functions plus ``logsumexp``, ``expit`` and ``erf`` from
``autograd.scipy.special``, and no neural-network functions at all, so the activations,
normalisations and losses are composed from those functions the way an autograd user would
write them; ``COMPOSED`` says so per op. Nothing is corrected: ``relu`` is
``np.maximum(x, 0)``, ``abs`` is ``np.abs``, so their kink conventions are autograd's.

The long story: docs/reports-peers.md, section ``reports/conformance/adapters/autograd.py``.
"""
from __future__ import annotations

import math

import numpy as np

from reports.conformance.adapters._peer import PeerEngine, class_index_inputs, slice_index
from reports.conformance.engines import FLOAT32, FLOAT64

__all__ = ["AutogradEngine", "autograd_ops", "COMPOSED"]

COMPOSED = {
    "identity": "no identity in autograd: x + 0",
    "relu": "no relu in autograd: np.maximum(x, 0)",
    "leaky_relu": "no leaky_relu in autograd: np.where(x > 0, x, slope * x)",
    "silu": "no silu in autograd: x * expit(x)",
    "gelu": "no gelu in autograd: x/2 * (1 + erf(x / sqrt(2)))",
    "gelu_tanh": "no gelu in autograd: x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
    "softplus": "no softplus in autograd: np.logaddexp(0, x)",
    "softmax": "no softmax in autograd: exp(x - logsumexp(x, axis, keepdims=True))",
    "log_softmax": "no log_softmax in autograd: x - logsumexp(x, axis, keepdims=True)",
    "layer_norm": "no layer norm in autograd: (x - mean) / sqrt(var + eps) over the last axis",
    "rms_norm": "no RMS norm in autograd: x / sqrt(mean(x^2) + eps) over the last axis",
    "mse": "no MSE loss in autograd: mean((p - t)^2)",
    "cross_entropy": "no cross-entropy in autograd: -mean(log_softmax(z)[n, t[n]])",
    "categorical_cross_entropy": "no cross-entropy in autograd: -sum(t log_softmax(z)) / N",
    "binary_cross_entropy": "no BCE in autograd: -mean(t log p + (1 - t) log1p(-p))",
    "binary_cross_entropy_with_logits": "no BCE with logits in autograd: "
                                        "mean(logaddexp(0, z) - z t)",
}


def autograd_ops(anp, special):
    """The op table: registry name -> function of autograd-traced arrays (params as kw)."""

    def log_softmax(x, axis=-1):
        return x - special.logsumexp(x, axis=axis, keepdims=True)

    def layer_norm(x, eps=1e-5):
        centred = x - anp.mean(x, axis=-1, keepdims=True)
        return centred / anp.sqrt(anp.mean(centred ** 2, axis=-1, keepdims=True) + eps)

    def cross_entropy(z, t):
        rows = anp.arange(z.shape[0])
        return -anp.mean(log_softmax(z)[rows, np.asarray(t).reshape(-1)])

    c = math.sqrt(2.0 / math.pi)
    return {
        "neg": anp.negative, "exp": anp.exp, "log": anp.log, "sqrt": anp.sqrt,
        "square": anp.square, "abs": anp.abs, "relu": lambda x: anp.maximum(x, 0.0),
        "leaky_relu": lambda x, negative_slope=0.01: anp.where(x > 0, x, negative_slope * x),
        "silu": lambda x: x * special.expit(x),
        "gelu": lambda x: 0.5 * x * (1 + special.erf(x / math.sqrt(2.0))),
        "gelu_tanh": lambda x: 0.5 * x * (1 + anp.tanh(c * (x + 0.044715 * x ** 3))),
        "tanh": anp.tanh, "sigmoid": special.expit,
        "softplus": lambda x: anp.logaddexp(0.0, x),
        "identity": lambda x: x + 0,
        "add": anp.add, "sub": anp.subtract, "mul": anp.multiply, "div": anp.divide,
        "maximum": anp.maximum,
        "sum": lambda x, axis=None, keepdims=False: anp.sum(x, axis=axis, keepdims=keepdims),
        "mean": lambda x, axis=None, keepdims=False: anp.mean(x, axis=axis, keepdims=keepdims),
        "logsumexp": lambda x, axis=None, keepdims=False: special.logsumexp(
            x, axis=axis, keepdims=keepdims),
        "matmul": anp.matmul,
        "transpose": lambda x, axes=None: anp.transpose(x, axes),
        "reshape": lambda x, shape: anp.reshape(x, tuple(shape)),
        "concat": lambda a, b, axis=-1: anp.concatenate([a, b], axis=axis),
        "slice": lambda x, **p: x[slice_index(anp.ndim(x), **p)],
        "softmax": lambda x, axis=-1: anp.exp(log_softmax(x, axis)),
        "log_softmax": log_softmax,
        "layer_norm": layer_norm,
        "rms_norm": lambda x, eps=1e-6: x / anp.sqrt(anp.mean(x ** 2, axis=-1, keepdims=True)
                                                     + eps),
        "mse": lambda p, t: anp.mean((p - t) ** 2),
        "cross_entropy": cross_entropy,
        "categorical_cross_entropy": lambda z, t: -anp.sum(t * log_softmax(z)) / z.shape[0],
        "binary_cross_entropy": lambda p, t: -anp.mean(t * anp.log(p)
                                                       + (1 - t) * anp.log1p(-p)),
        "binary_cross_entropy_with_logits": lambda z, t: anp.mean(anp.logaddexp(0.0, z)
                                                                  - z * t),
    }


_OPTIMIZER_REASONS = {
    "Momentum": "autograd.misc.optimizers.sgd(mass=beta) is the registry's Momentum but keeps "
                "its velocity inside the loop, where the check cannot read it",
    "NAG": "autograd.misc.optimizers has no Nesterov optimizer",
    "Adagrad": "autograd.misc.optimizers has no Adagrad",
    "RMSprop": "autograd.misc.optimizers.rmsprop puts eps outside the square root (registry: "
               "inside)",
    "Adam": "autograd.misc.optimizers.adam keeps m and v inside its loop, where the check "
            "cannot read them",
    "AdamW": "autograd.misc.optimizers has no AdamW",
}


class AutogradEngine(PeerEngine):
    """HIPS autograd through ``autograd.make_vjp`` of ``autograd.numpy`` functions; second
    order by ``autograd.make_jvp`` and ``autograd.grad`` of a VJP."""

    name = "autograd"
    dtypes = (FLOAT32, FLOAT64)
    description = "HIPS autograd through autograd.make_vjp"
    composed = COMPOSED
    optimizers = ("SGD",)
    optimizer_reasons = _OPTIMIZER_REASONS

    def __init__(self):
        import autograd
        import autograd.numpy as anp
        import autograd.scipy.special as special

        self._autograd = autograd
        self.ops = autograd_ops(anp, special)

    # autograd is functional: no tensors to build, the VJP wraps the whole call
    def _tensor(self, array, differentiable):
        return array

    def _numpy(self, tensor):
        return np.array(tensor)

    second_order_route = ("J t by autograd.make_jvp (forward mode); H t by autograd.grad of "
                          "<t, make_vjp(f)(x)(g)> (reverse over reverse)")

    def _call(self, name, inputs, params):
        """(function of the differentiable inputs, their positions, all inputs as arrays)."""
        fixed = class_index_inputs(name)
        arrays = [np.array(np.asarray(x), dtype=np.int64) if i in fixed else np.array(x)
                  for i, x in enumerate(inputs)]
        free = [i for i in range(len(arrays)) if i not in fixed]

        def call(free_values):
            args = list(arrays)
            for i, v in zip(free, free_values):
                args[i] = v
            return self.ops[name](*args, **params)

        return call, free, arrays

    def _vjp(self, name, inputs, grad, **params):
        call, free, arrays = self._call(name, inputs, params)
        dtype = arrays[free[0]].dtype
        vjp, _ = self._autograd.make_vjp(call)(tuple(arrays[i] for i in free))
        got = dict(zip(free, vjp(np.array(grad, dtype=dtype))))
        return tuple(None if i not in got else np.array(got[i]) for i in range(len(arrays)))

    def _jvp(self, name, inputs, tangents, **params):
        call, free, arrays = self._call(name, inputs, params)
        tans = tuple(np.array(tangents[i], dtype=arrays[i].dtype) for i in free)
        out, jt = self._autograd.make_jvp(call)(tuple(arrays[i] for i in free))(tans)
        return np.array(out), np.array(jt)

    def _hvp(self, name, inputs, cotangent, tangents, **params):
        import warnings

        import autograd.numpy as anp

        call, free, arrays = self._call(name, inputs, params)
        dtype = arrays[free[0]].dtype
        g = np.array(cotangent, dtype=dtype)
        tans = tuple(np.array(tangents[i], dtype=arrays[i].dtype) for i in free)

        def pairing(xs):
            vjp, _ = self._autograd.make_vjp(call)(xs)
            return sum(anp.sum(f * t) for f, t in zip(vjp(g), tans))

        with warnings.catch_warnings():
            # a linear op: "Output seems independent of input", and its Hessian is 0
            warnings.simplefilter("ignore", UserWarning)
            second = self._autograd.grad(pairing)(tuple(arrays[i] for i in free))
        got = dict(zip(free, second))
        return tuple(None if i not in got else np.array(got[i]) for i in range(len(arrays)))

    def _optimizer_step(self, name, w, g, state, t, **hyper):
        from autograd.misc import optimizers

        w = np.asarray(w)
        g = np.array(g, dtype=w.dtype)
        new = optimizers.sgd(lambda x, i: g, np.array(w), num_iters=1,
                             step_size=hyper.get("lr", 0.01), mass=0.0)
        return np.array(new), {}
