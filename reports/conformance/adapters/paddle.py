"""PaddlePaddle (CPU) as an engine: stock ``paddle`` / ``paddle.nn.functional`` ops, VJPs by
``paddle.grad`` (dynamic graph mode). Install: ``pip install 'verigrad[paddle]'``.

The long story: docs/reports-peers.md, section ``reports/conformance/adapters/paddle.py``.
"""
from __future__ import annotations

import numpy as np

from reports.conformance.adapters._peer import (GraphSecondOrder, PeerEngine,
                                                class_index_inputs, numpy_axes,
                                                slice_index)
from reports.conformance.engines import BFLOAT16, FLOAT16, FLOAT32, FLOAT64

__all__ = ["PaddleEngine", "paddle_ops", "COMPOSED", "NO_GRAD_OP"]

COMPOSED = {
    "identity": "Paddle has no identity op: paddle.assign (a differentiable copy)",
    "layer_norm": "a 1-D input gets a leading axis of 1 (Paddle's norms reject 1-D input)",
    "rms_norm": "F.rms_norm has no CPU kernel in Paddle (\"The kernel `rms_norm` is not "
                "registered\"): x * rsqrt(mean(square(x), -1) + eps) from Paddle's ops",
    "sum": "axis=() reduces nothing in NumPy but everything in Paddle: paddle.assign there",
    "mean": "axis=() reduces nothing in NumPy but everything in Paddle: paddle.assign there",
    "logsumexp": "axis=() reduces nothing in NumPy but everything in Paddle: paddle.assign "
                 "there",
    "categorical_cross_entropy": "F.cross_entropy(soft_label=True) gives the target no "
                                 "gradient: d/dtarget from paddle.grad of -sum(t*log_softmax(z))/N",
    "binary_cross_entropy": "F.binary_cross_entropy gives the target no gradient: d/dtarget "
                            "from paddle.grad of -mean(t*(log p - log1p(-p)))",
    "binary_cross_entropy_with_logits": "F.binary_cross_entropy_with_logits gives the target "
                                        "no gradient: d/dtarget from paddle.grad of -mean(z*t)",
}


def paddle_ops(paddle):
    """The op table: registry name -> function of Paddle tensors (params as keywords)."""
    F = paddle.nn.functional

    def reduce(fn, x, axis, keepdims):
        axes = numpy_axes(axis, x.ndim)
        if axis is not None and not axes:
            return paddle.assign(x)
        return fn(x, axis=list(axes) if axis is not None else None, keepdim=keepdims)

    def last_axis(fn, x):
        # NOTE: Paddle's norms reject a 1-D input (begin_norm_axis must be > 0): a leading
        # axis of 1 is added and taken off again, which changes no value.
        return fn(x) if x.ndim > 1 else fn(x.reshape([1, -1])).reshape(x.shape)

    return {
        "neg": paddle.neg, "exp": paddle.exp, "log": paddle.log, "sqrt": paddle.sqrt,
        "square": paddle.square, "abs": paddle.abs, "relu": F.relu,
        "leaky_relu": lambda x, negative_slope=0.01: F.leaky_relu(x, negative_slope),
        "silu": F.silu, "gelu": lambda x: F.gelu(x, approximate=False),
        "gelu_tanh": lambda x: F.gelu(x, approximate=True),
        "tanh": paddle.tanh, "sigmoid": F.sigmoid, "softplus": F.softplus,
        "identity": paddle.assign,
        "add": paddle.add, "sub": paddle.subtract, "mul": paddle.multiply,
        "div": paddle.divide, "maximum": paddle.maximum,
        "sum": lambda x, axis=None, keepdims=False: reduce(paddle.sum, x, axis, keepdims),
        "mean": lambda x, axis=None, keepdims=False: reduce(paddle.mean, x, axis, keepdims),
        "logsumexp": lambda x, axis=None, keepdims=False: reduce(paddle.logsumexp, x, axis,
                                                                 keepdims),
        "matmul": paddle.matmul,
        "transpose": lambda x, axes=None: paddle.transpose(
            x, list(axes) if axes is not None else list(reversed(range(x.ndim)))),
        "reshape": lambda x, shape: paddle.reshape(x, list(shape)),
        "concat": lambda a, b, axis=-1: paddle.concat([a, b], axis=axis),
        "slice": lambda x, **p: x[slice_index(x.ndim, **p)],
        "softmax": lambda x, axis=-1: F.softmax(x, axis=axis),
        "log_softmax": lambda x, axis=-1: F.log_softmax(x, axis=axis),
        "layer_norm": lambda x, eps=1e-5: last_axis(
            lambda v: F.layer_norm(v, v.shape[-1:], epsilon=eps), x),
        # F.rms_norm has no CPU kernel ("The kernel `rms_norm` is not registered"): composed
        "rms_norm": lambda x, eps=1e-6: x * paddle.rsqrt(
            paddle.mean(paddle.square(x), axis=-1, keepdim=True) + eps),
        "mse": F.mse_loss,
        "cross_entropy": lambda z, t: F.cross_entropy(z, t.reshape([-1, 1])),
        "categorical_cross_entropy": lambda z, t: F.cross_entropy(z, t, soft_label=True),
        "binary_cross_entropy": F.binary_cross_entropy,
        "binary_cross_entropy_with_logits": F.binary_cross_entropy_with_logits,
    }


def paddle_label_parts(paddle):
    """Target-dependent terms of the losses whose stock target gets no gradient.

    Each is differentiated in its target only for the first order (the logits' or the
    probabilities' gradient is the stock loss's); the second order adds its cross terms
    (``GraphSecondOrder``).
    """
    F = paddle.nn.functional
    return {
        "categorical_cross_entropy": ((1,), lambda z, t: -paddle.sum(
            t * F.log_softmax(z, axis=-1)) / z.shape[0]),
        "binary_cross_entropy": ((1,), lambda p, t: -paddle.mean(
            t * (paddle.log(p) - paddle.log1p(-p)))),
        "binary_cross_entropy_with_logits": ((1,), lambda z, t: -paddle.mean(z * t)),
    }


# Paddle 3.3.1 has no grad op for these ops' backward kernels (it raises "RuntimeError: The Op
# X doesn't have any grad op"), so it cannot take the derivative the check needs of them:
# {derivative: {registry op: the backward op without a grad op}}. J t goes through
# paddle.incubate.autograd.jvp, which in dynamic mode differentiates the backward of the
# backward (the double-backward trick); H t differentiates the backward once more.
NO_GRAD_OP = {
    "jvp2": {"relu": "relu_double_grad", "leaky_relu": "leaky_relu_double_grad",
             "softplus": "softplus_double_grad", "sqrt": "sqrt_double_grad",
             "square": "square_double_grad", "mse": "square_double_grad",
             "rms_norm": "square_double_grad", "div": "divide_double_grad",
             "gelu": "gelu_grad", "gelu_tanh": "gelu_grad", "layer_norm": "layer_norm_grad",
             "softmax": "softmax_grad", "log_softmax": "log_softmax_grad",
             "logsumexp": "logsumexp_grad", "slice": "strided_slice_grad",
             "cross_entropy": "mean_all_grad", "categorical_cross_entropy": "mean_all_grad",
             "binary_cross_entropy": "mean_all_grad",
             "binary_cross_entropy_with_logits": "mean_all_grad"},
    "hvp": {"gelu": "gelu_grad", "gelu_tanh": "gelu_grad", "layer_norm": "layer_norm_grad",
            "softmax": "softmax_grad", "log_softmax": "log_softmax_grad",
            "logsumexp": "logsumexp_grad", "slice": "strided_slice_grad",
            "cross_entropy": "mean_all_grad", "categorical_cross_entropy": "mean_all_grad",
            "binary_cross_entropy": "mean_all_grad",
            "binary_cross_entropy_with_logits": "mean_all_grad"},
}
_HOW = {"jvp2": "J t (paddle.incubate.autograd.jvp differentiates the backward of the backward)",
        "hvp": "H t (paddle.grad of the backward)"}


def _no_grad_op_reasons():
    """``unsupported_derivatives`` of the adapter: each entry of :data:`NO_GRAD_OP` in words."""
    return {kind: {op: f"{_HOW[kind]} needs a grad op of {grad}, which Paddle lacks "
                       f"(RuntimeError: The Op {grad} doesn't have any grad op)"
                   for op, grad in ops.items()}
            for kind, ops in NO_GRAD_OP.items()}


_OPTIMIZER_REASONS = {
    "Momentum": "paddle.optimizer.Momentum updates v = beta*v + g (no (1 - beta) on g)",
    "NAG": "Paddle has no optimizer in the registry's look-ahead form (Momentum's "
           "use_nesterov is another form)",
    "Adagrad": "paddle.optimizer.Adagrad puts epsilon outside the square root (registry: "
               "inside)",
}
# registry name -> (Paddle accumulator name -> registry state name)
_STATE = {"SGD": {}, "RMSprop": {"mean_square": "E"},
          "Adam": {"moment1": "m", "moment2": "v"}, "AdamW": {"moment1": "m", "moment2": "v"}}


class PaddleEngine(GraphSecondOrder, PeerEngine):
    """PaddlePaddle (CPU, dynamic graph) through ``paddle.grad``; second order by
    ``paddle.incubate.autograd.jvp`` and ``paddle.grad(create_graph=True)`` twice."""

    name = "paddle"
    dtypes = (FLOAT32, FLOAT64, BFLOAT16, FLOAT16)
    description = "PaddlePaddle (CPU) through paddle.grad"
    composed = COMPOSED
    optimizers = tuple(_STATE)
    optimizer_reasons = _OPTIMIZER_REASONS
    unsupported_derivatives = _no_grad_op_reasons()
    second_order_route = ("J t by paddle.incubate.autograd.jvp (in dynamic mode Paddle's "
                          "double-backward trick); H t by paddle.grad(create_graph=True) of "
                          "<t, paddle.grad(<g, f>)>")

    def __init__(self):
        import paddle

        paddle.set_device("cpu")
        paddle.disable_static()
        self._paddle = paddle
        self.ops = paddle_ops(paddle)
        self.label_parts = paddle_label_parts(paddle)
        self._live = None      # (state dict returned last, parameter, optimizer)
        self._missing = {}     # (op, dtype) -> Paddle's words when it has no kernel there

    def _tensor(self, array, differentiable):
        array = np.asarray(array)
        if array.dtype == BFLOAT16:     # Paddle holds bfloat16 as its 16-bit pattern (uint16)
            tensor = self._paddle.to_tensor(array.view(np.uint16)).view(self._paddle.bfloat16)
            tensor.stop_gradient = not differentiable
            return tensor
        return self._paddle.to_tensor(array, stop_gradient=not differentiable)

    def _numpy(self, tensor):
        if tensor.dtype == self._paddle.bfloat16:
            return np.array(tensor.numpy()).view(BFLOAT16)
        return np.array(tensor.numpy())

    def _gradients(self, out, wanted, grad):
        grads = self._paddle.grad([out], wanted, [self._tensor(grad, False)], allow_unused=True)
        return [None if g is None else self._numpy(g) for g in grads]

    def _format_reason(self, op, dtype):
        """Paddle's CPU build registers few bfloat16 and float16 kernels: run the op's first
        example (forward and VJP) in ``dtype`` once; where Paddle answers that a kernel is not
        registered, the op is unsupported in that format, in Paddle's words."""
        key = (op, dtype.name)
        if key not in self._missing:
            self._missing[key] = None
            try:
                self._example_call(op, dtype)
            except Exception as exc:  # noqa: BLE001 - only a missing kernel is an answer
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                if "is not registered" in first:
                    self._missing[key] = f"Paddle's CPU has no {dtype} kernel: {first[:160]}"
        return self._missing[key]

    def _example_call(self, op, dtype):
        import spec

        example = spec.OPS[op].examples[0]
        fixed = class_index_inputs(op)
        inputs = spec.sample_inputs(op, np.random.default_rng(0), shapes=example.shapes,
                                    params=dict(example.params))
        inputs = [x if i in fixed else np.asarray(x).astype(dtype) for i, x in enumerate(inputs)]
        out = self.ops[op](*self._tensors(op, inputs, True), **dict(example.params))
        grad = np.ones(tuple(out.shape), dtype)
        PeerEngine._vjp(self, op, inputs, grad, **dict(example.params))

    def _graph_gradients(self, out, wanted, grad, keep=True):
        if out.stop_gradient:      # nothing left to differentiate (a constant first VJP)
            return [None] * len(wanted)
        return list(self._paddle.grad([out], wanted, None if grad is None else [grad],
                                      create_graph=keep, allow_unused=True))

    def _detach(self, tensor):
        return tensor.detach()

    def _jvp(self, name, inputs, tangents, **params):
        from paddle.incubate.autograd import jvp

        free = self._free(name, inputs)
        tensors = self._tensors(name, inputs, True)

        def call(*xs):
            args = list(tensors)
            for i, x in zip(free, xs):
                args[i] = x
            return self._second_order_output(name, args, params)

        tans = [self._tensor(np.array(tangents[i], dtype=np.asarray(inputs[i]).dtype), False)
                for i in free]
        out, jt = jvp(call, [tensors[i] for i in free], tans)
        return self._numpy(out), self._numpy(jt)

    def _optimizer_step(self, name, w, g, state, t, **hyper):
        """One step of the Paddle optimizer; a trajectory keeps one optimizer alive.

        Paddle's optimizers keep their state internally (moments and the powers of beta), so
        step 1 builds the parameter and optimizer and later steps of the same trajectory
        (recognised by the state dict this method returned) reuse them.
        """
        paddle = self._paddle
        w = np.asarray(w)
        live = self._live
        if t == 1 or live is None or state is not live[0]:
            p = paddle.create_parameter(list(w.shape), dtype=str(w.dtype))
            opt = self._make(name, p, hyper)
        else:
            _, p, opt = live
        p.set_value(np.array(w))
        p.grad = None
        p._set_grad_ivar(paddle.to_tensor(np.array(g, dtype=w.dtype)))
        opt.step()
        new_state = {}
        for acc, key in _STATE[name].items():
            new_state[key] = np.array(opt._accumulators[acc][p.name].numpy())
        self._live = (new_state, p, opt)
        return np.array(p.numpy()), new_state

    def _make(self, name, p, hyper):
        opt = self._paddle.optimizer
        lr = hyper.get("lr")
        if name == "SGD":
            return opt.SGD(learning_rate=lr if lr is not None else 0.01, parameters=[p])
        if name == "RMSprop":
            return opt.RMSProp(learning_rate=lr if lr is not None else 0.001,
                               rho=hyper.get("gamma", 0.9), epsilon=hyper.get("eps", 1e-8),
                               parameters=[p])
        kwargs = dict(learning_rate=lr if lr is not None else 0.001,
                      beta1=hyper.get("beta1", 0.9), beta2=hyper.get("beta2", 0.999),
                      epsilon=hyper.get("eps", 1e-8), parameters=[p])
        if name == "AdamW":
            return opt.AdamW(weight_decay=hyper.get("weight_decay", 0.01), **kwargs)
        return opt.Adam(**kwargs)
