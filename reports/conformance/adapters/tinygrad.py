"""tinygrad as an engine: stock ``Tensor`` methods, VJPs by ``Tensor.gradient``.
Install: ``pip install 'verigrad[tinygrad]'``.

Backend. tinygrad compiles a kernel per op and shape. Its ``CPU`` backend compiles C with
**clang** (``clang`` on PATH; gcc will not do: tinygrad passes clang's ``--target``); its
``PYTHON`` backend interprets the kernels and needs no compiler. The adapter uses tinygrad's
own ``DEV`` variable when it is set, else ``PYTHON`` (``tinygrad_device``): on the suite's
small arrays the time goes into compiling, so PYTHON finishes the dev profile in about a third
of CPU's time here (docs/peers.md), and it needs nothing installed. ``DEV=CPU`` checks
the compiled backend, whose long sums differ (see docs/peers.md).

The long story: docs/reports-peers.md, section ``reports/conformance/adapters/tinygrad.py``.
"""
from __future__ import annotations

import os
import shutil

import numpy as np

from reports.conformance.adapters._peer import (GraphSecondOrder, PeerEngine, numpy_axes,
                                                slice_index)
from reports.conformance.engines import (BFLOAT16, FLOAT16, FLOAT32, FLOAT64,
                                         EngineUnavailableError)

__all__ = ["TinygradEngine", "tinygrad_ops", "tinygrad_device", "COMPOSED"]

COMPOSED = {
    "identity": "tinygrad has no identity op: Tensor.clone (a differentiable copy)",
    "mse": "tinygrad has no MSE loss: ((p - t) ** 2).mean()",
    "sum": "axis=() reduces nothing in NumPy but everything in tinygrad: clone there",
    "mean": "axis=() reduces nothing in NumPy but everything in tinygrad: clone there",
    "logsumexp": "axis=() reduces nothing in NumPy but everything in tinygrad: clone there",
    "(every op)": "a 0-d input enters as shape (1,) reshaped to (): tinygrad's PYTHON backend "
                  "copies a 0-d NumPy array with a CPU kernel, which needs clang",
}


def tinygrad_device():
    """The tinygrad backend to use: ``$DEV``, else PYTHON (no compiler, and the faster here).

    Raises
    ------
    EngineUnavailableError
        ``DEV=CPU`` without ``clang`` on PATH (tinygrad would fail at its first kernel).
    """
    chosen = os.environ.get("DEV") or "PYTHON"
    if chosen.upper() == "CPU" and not shutil.which("clang"):
        raise EngineUnavailableError(
            "tinygrad: DEV=CPU compiles with clang, which is not on PATH (apt-get install "
            "clang), or unset DEV to use tinygrad's PYTHON backend")
    return chosen


def tinygrad_ops(Tensor, nn):
    """The op table: registry name -> function of tinygrad tensors (params as keywords)."""

    def reduce(method, x, axis, keepdims):
        axes = numpy_axes(axis, x.ndim)
        if axis is not None and not axes:
            return x.clone()
        if axis is None:
            return getattr(x, method)(axis=None, keepdim=keepdims)
        # NOTE: one axis as an int: tinygrad's logsumexp accepts no tuple of axes
        return getattr(x, method)(axis=axes[0] if len(axes) == 1 else axes, keepdim=keepdims)

    def rms_norm(x, eps=1e-6):
        return nn.RMSNorm(x.shape[-1], eps=eps, elementwise_affine=False)(x)

    return {
        "neg": lambda x: -x, "exp": Tensor.exp, "log": Tensor.log, "sqrt": Tensor.sqrt,
        "square": Tensor.square, "abs": Tensor.abs, "relu": Tensor.relu,
        "leaky_relu": lambda x, negative_slope=0.01: x.leaky_relu(negative_slope),
        "silu": Tensor.silu, "gelu": lambda x: x.gelu(approximate="none"),
        "gelu_tanh": lambda x: x.gelu(approximate="tanh"),
        "tanh": Tensor.tanh, "sigmoid": Tensor.sigmoid, "softplus": Tensor.softplus,
        "identity": Tensor.clone,
        "add": Tensor.add, "sub": Tensor.sub, "mul": Tensor.mul, "div": Tensor.div,
        "maximum": Tensor.maximum,
        "sum": lambda x, axis=None, keepdims=False: reduce("sum", x, axis, keepdims),
        "mean": lambda x, axis=None, keepdims=False: reduce("mean", x, axis, keepdims),
        "logsumexp": lambda x, axis=None, keepdims=False: reduce("logsumexp", x, axis,
                                                                 keepdims),
        "matmul": Tensor.matmul,
        "transpose": lambda x, axes=None: x.permute(
            tuple(axes) if axes is not None else tuple(reversed(range(x.ndim)))),
        "reshape": lambda x, shape: x.reshape(tuple(shape)),
        "concat": lambda a, b, axis=-1: a.cat(b, dim=axis),
        "slice": lambda x, **p: x[slice_index(x.ndim, **p)],
        "softmax": lambda x, axis=-1: x.softmax(axis),
        "log_softmax": lambda x, axis=-1: x.log_softmax(axis),
        "layer_norm": lambda x, eps=1e-5: x.layernorm(-1, eps),
        "rms_norm": rms_norm,
        "mse": lambda p, t: ((p - t) ** 2).mean(),
        "cross_entropy": lambda z, t: z.sparse_categorical_crossentropy(t.reshape(-1)),
        "categorical_cross_entropy": lambda z, t: z.cross_entropy(t),
        "binary_cross_entropy": lambda p, t: p.binary_crossentropy(t),
        "binary_cross_entropy_with_logits": lambda z, t: z.binary_crossentropy_logits(t),
    }


_OPTIMIZER_REASONS = {
    "Momentum": "tinygrad's SGD(momentum=beta) keeps b = beta*b + g (no (1 - beta) on g)",
    "NAG": "tinygrad's SGD(nesterov=True) is another look-ahead form than the registry's",
    "Adagrad": "tinygrad.nn.optim has no Adagrad",
    "RMSprop": "tinygrad.nn.optim has no RMSprop",
}


def _no_path(gradient):
    """Whether tinygrad's ``gradient`` is its "no path" answer: a broadcast constant 0 (which
    ``Tensor.gradient`` returns for a target the output does not depend on, and whose
    realization on the PYTHON device compiles a CPU kernel with clang). The adapters read a
    missing path as a zero gradient (``PeerEngine._vjp``)."""
    from tinygrad.uop.ops import Ops

    base = gradient._uop.base
    if base.op is not Ops.CONST:
        return False
    try:
        return float(base.arg) == 0.0
    except (TypeError, ValueError):
        return False


class TinygradEngine(GraphSecondOrder, PeerEngine):
    """tinygrad (``tinygrad_device()``: ``$DEV``, else PYTHON) via ``Tensor.gradient``; second
    order by ``Tensor.gradient`` of its own gradients (tinygrad has no forward mode)."""

    name = "tinygrad"
    dtypes = (FLOAT32, FLOAT64, BFLOAT16, FLOAT16)
    description = "tinygrad through Tensor.gradient"
    # NOTE: tinygrad sums half and bfloat16 in float32 (sum_acc_dtype in tinygrad/dtype.py,
    # used by Tensor.sum and by the gradient's sums over broadcast axes), casting back after
    accumulates = {"bfloat16": "float32", "float16": "float32"}
    composed = COMPOSED
    optimizers = ("SGD", "Adam", "AdamW")
    optimizer_reasons = _OPTIMIZER_REASONS
    second_order_route = ("tinygrad has no forward mode: J t by the double-backward trick "
                          "(Tensor.gradient in u of <t, Tensor.gradient(f, u)>); H t by "
                          "Tensor.gradient of <t, Tensor.gradient(<g, f>)>")

    def __init__(self):
        from tinygrad import Tensor, dtypes, nn

        self._Tensor, self._dtypes, self._nn = Tensor, dtypes, nn
        self.device = tinygrad_device()
        self.description = f"tinygrad through Tensor.gradient (DEV={self.device})"
        self.ops = tinygrad_ops(Tensor, nn)
        self._live = None

    def _tensor(self, array, differentiable):
        array = np.array(array, order="C")
        if array.dtype == BFLOAT16:
            # NOTE: tinygrad's buffers take no ml_dtypes array: the 16-bit patterns go in and
            # are read as bfloat16 (bitcast), the same numbers
            bits = self._tensor(array.view(np.uint16), differentiable)
            return bits.bitcast(self._dtypes.bfloat16)
        if array.ndim == 0:
            # NOTE: a 0-d NumPy array reaches the PYTHON device through a CPU copy kernel
            # (compiled with clang, even under DEV=PYTHON); a 1-element one does not
            return self._Tensor(array.reshape(1), device=self.device).reshape(())
        return self._Tensor(array, device=self.device)

    def _numpy(self, tensor):
        out = np.array(tensor.numpy())
        # NOTE: tinygrad hands a bfloat16 tensor back as float32 (the same numbers)
        return out.astype(BFLOAT16) if tensor.dtype == self._dtypes.bfloat16 else out

    def _gradients(self, out, wanted, grad):
        grads = out.gradient(*wanted, gradient=self._tensor(grad, False))
        return [self._numpy(g) for g in grads]

    def _graph_gradients(self, out, wanted, grad, keep=True):
        # NOTE: tinygrad's gradients are lazy tensors of the same graph: differentiable again.
        # A scalar's seed is passed as a tensor of ones built like the inputs (tinygrad's own
        # 0-d seed reaches the PYTHON device through a clang-compiled CPU kernel)
        if grad is None:
            grad = self._tensor(np.ones(out.shape, self._numpy(out).dtype), False)
        return [None if _no_path(g) else g for g in out.gradient(*wanted, gradient=grad)]

    def _optimizer_step(self, name, w, g, state, t, **hyper):
        """One step of the tinygrad optimizer; a trajectory keeps one optimizer alive."""
        from tinygrad import Context
        from tinygrad.nn import optim

        w = np.asarray(w)
        live = self._live
        if t == 1 or live is None or state is not live[0]:
            p = self._tensor(np.array(w), True)
            lr = hyper.get("lr", 0.01 if name == "SGD" else 0.001)
            if name == "SGD":
                opt = optim.SGD([p], lr=lr)
            else:
                opt = optim.LAMB([p], lr=lr, b1=hyper.get("beta1", 0.9),
                                 b2=hyper.get("beta2", 0.999), eps=hyper.get("eps", 1e-8),
                                 weight_decay=hyper.get("weight_decay", 0.01)
                                 if name == "AdamW" else 0.0, adam=True)
        else:
            _, p, opt = live
        p.assign(self._tensor(np.array(w), True))
        p.grad = self._tensor(np.array(g, dtype=w.dtype), False)
        with Context(TRAINING=1):
            opt.step()
        new_state = {} if name == "SGD" else {
            "m": np.array(opt.m[0].numpy(), dtype=w.dtype),
            "v": np.array(opt.v[0].numpy(), dtype=w.dtype)}
        self._live = (new_state, p, opt)
        return np.array(p.numpy()), new_state
