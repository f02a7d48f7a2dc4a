"""PyTorch as an engine: every registry op through ``torch`` and ``torch.autograd.grad``.

The long story: docs/reports-peers.md, section ``reports/conformance/adapters/torch.py``.
"""
from __future__ import annotations

import numpy as np
import torch

import optable
from reports.conformance.engines import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, Engine

TF = torch.nn.functional

__all__ = ["TORCH_OPS", "TorchEngine"]


def _dims(axis, ndim):
    return tuple(range(ndim)) if axis is None else axis


def _slice(x, axis=0, start=0, stop=None, step=1):
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop, step)
    return x[tuple(index)]


def _softplus(x):
    return TF.softplus(x, beta=1.0, threshold=40.0 if x.dtype == torch.float64 else 20.0)


def to_torch(x):
    """A torch tensor holding the NumPy array ``x`` (bfloat16 through its 16-bit pattern:
    ``torch.from_numpy`` does not take ``ml_dtypes.bfloat16``)."""
    x = np.array(x)
    if x.dtype == BFLOAT16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def to_numpy(t):
    """A NumPy copy of the torch tensor ``t`` (bfloat16 as ``ml_dtypes.bfloat16``)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(force=True).copy().view(BFLOAT16)
    return t.numpy(force=True).copy()


def _transpose(x, axes=None):
    dims = tuple(axes) if axes is not None else tuple(reversed(range(x.ndim)))
    return torch.permute(x, dims)


def _reduce(fn, x, axis, keepdims):
    """``fn`` over NumPy's ``axis`` (None: all axes; ``()``: none, as in NumPy)."""
    dims = _dims(axis, x.ndim)
    if isinstance(dims, int):
        dims = (dims,)
    if not dims:  # NOTE: torch reads an empty dim list as "all axes"; NumPy as "no axis"
        return x.clone()
    return fn(x, dims, keepdims)


TORCH_OPS = {
    "neg": lambda x: -x, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "square": torch.square, "abs": torch.abs, "relu": torch.relu,
    "leaky_relu": lambda x, negative_slope=0.01: TF.leaky_relu(x, negative_slope),
    "silu": TF.silu, "gelu": TF.gelu, "gelu_tanh": lambda x: TF.gelu(x, approximate="tanh"),
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "softplus": _softplus,
    "identity": lambda x: x.clone(),
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": lambda a, b: torch.where(a >= b, a, b),
    "sum": lambda x, axis=None, keepdims=False: _reduce(torch.sum, x, axis, keepdims),
    "mean": lambda x, axis=None, keepdims=False: _reduce(torch.mean, x, axis, keepdims),
    "logsumexp": lambda x, axis=None, keepdims=False: _reduce(torch.logsumexp, x, axis,
                                                              keepdims),
    "matmul": torch.matmul,
    "transpose": _transpose,
    "reshape": lambda x, shape: x.reshape(shape),
    "concat": lambda a, b, axis=-1: torch.cat([a, b], axis),
    "slice": _slice,
    "softmax": lambda x, axis=-1: torch.softmax(x, axis),
    "log_softmax": lambda x, axis=-1: torch.log_softmax(x, axis),
    "layer_norm": lambda x, eps=1e-5: TF.layer_norm(x, x.shape[-1:], eps=eps),
    "rms_norm": lambda x, eps=1e-6: TF.rms_norm(x, x.shape[-1:], eps=eps),
    "mse": TF.mse_loss,
    "cross_entropy": lambda z, t: TF.cross_entropy(z, t.reshape(-1).long()),
    "categorical_cross_entropy": TF.cross_entropy,  # probability targets
    # torch's binary_cross_entropy has no derivative for its target: spell the formula out
    "binary_cross_entropy": lambda p, t: -(t * torch.log(p) + (1 - t) * torch.log1p(-p)).mean(),
    "binary_cross_entropy_with_logits": TF.binary_cross_entropy_with_logits,
}

# Inputs that hold class indices (not differentiable), and every op's input names: the op table's.
CLASS_INDEX = {n: tuple(sorted(sig.class_index)) for n, sig in optable.OPS.items()
               if sig.class_index}
_INPUTS = {n: sig.inputs for n, sig in optable.OPS.items()}

_OPTIMIZER_REASONS = {
    "Momentum": "torch.optim.SGD(momentum, dampening) starts its buffer at g, not (1 - beta) g",
    "NAG": "torch.optim.SGD(nesterov=True) uses another look-ahead form than the registry's",
    "Adagrad": "torch.optim.Adagrad puts eps outside the square root (registry: inside)",
    "RMSprop": "torch.optim.RMSprop puts eps outside the square root (registry: inside)",
}


class TorchEngine(Engine):
    """PyTorch (CPU) as an engine: forward with torch ops, VJPs with ``torch.autograd.grad``."""

    name = "torch"
    dtypes = (FLOAT32, FLOAT64, BFLOAT16, FLOAT16)
    # NOTE: PyTorch's CPU sums of bfloat16 and float16 accumulate in float32 (the cascade sum of
    # aten/src/ATen/native/cpu/SumKernel.cpp takes at::acc_type<scalar_t, true>, float for
    # both; softmax, the norms and the GEMMs likewise accumulate in float); every op's result,
    # and each step of a composite backward formula, is rounded to the tensor's dtype
    accumulates = {"bfloat16": "float32", "float16": "float32"}
    description = "PyTorch (CPU) through torch.autograd"
    optimizers = ("SGD", "Adam", "AdamW")
    optimizer_reasons = _OPTIMIZER_REASONS
    # an op of the table that this adapter does not map yet is declared, not a KeyError
    unsupported = {n: "the torch adapter has no mapping for it yet (TORCH_OPS)"
                   for n in optable.OPS if n not in TORCH_OPS}

    def _tensors(self, name, inputs, requires_grad):
        wanted = CLASS_INDEX.get(name, ())
        tensors = []
        for iname, x in zip(_INPUTS[name], inputs):
            x = np.asarray(x)
            if iname in wanted:
                tensors.append(torch.from_numpy(np.array(x, dtype=np.int64)))
            else:
                tensors.append(to_torch(x).requires_grad_(requires_grad))
        return tensors

    def _forward(self, name, inputs, **params):
        with torch.no_grad():
            out = TORCH_OPS[name](*self._tensors(name, inputs, False), **params)
        return to_numpy(out)

    def _vjp(self, name, inputs, grad, **params):
        tensors = self._tensors(name, inputs, True)
        out = TORCH_OPS[name](*tensors, **params)
        wanted = [t for t in tensors if t.requires_grad]
        g = to_torch(np.asarray(grad)).to(out.dtype)
        grads = iter(torch.autograd.grad(out, wanted, g, allow_unused=True))
        result = []
        for t in tensors:
            if not t.requires_grad:
                result.append(None)
                continue
            gi = next(grads)
            result.append(to_numpy(torch.zeros_like(t)) if gi is None else to_numpy(gi))
        return tuple(result)

    def _jvp(self, name, inputs, tangents, **params):
        tensors = self._tensors(name, inputs, False)
        diff = [i for i, t in enumerate(tensors) if t.is_floating_point()]

        def fn(*xs):
            full = list(tensors)
            for i, x in zip(diff, xs):
                full[i] = x
            return TORCH_OPS[name](*full, **params)

        tans = tuple(torch.from_numpy(np.array(tangents[i], dtype=tensors[i].numpy().dtype))
                     for i in diff)
        out, jv = torch.func.jvp(fn, tuple(tensors[i] for i in diff), tans)
        return out.detach().numpy().copy(), jv.detach().numpy().copy()

    def _hvp(self, name, inputs, cotangent, tangents, **params):
        # reverse over reverse: d/dx <t, ∇_x <g, f(x)>>, with create_graph on the first VJP
        tensors = self._tensors(name, inputs, True)
        out = TORCH_OPS[name](*tensors, **params)
        wanted = [t for t in tensors if t.requires_grad]
        g = torch.from_numpy(np.array(cotangent, dtype=out.detach().numpy().dtype))
        first = torch.autograd.grad(out, wanted, g, create_graph=True, allow_unused=True)
        tans = [torch.from_numpy(np.array(t, dtype=w.detach().numpy().dtype))
                for t, w in zip([t for t, x in zip(tangents, tensors) if x.requires_grad],
                                wanted)]
        pairing = sum((f * t).sum() for f, t in zip(first, tans) if f is not None)
        if not torch.is_tensor(pairing) or not pairing.requires_grad:
            second = [None] * len(wanted)         # a linear op: its Hessian is 0
        else:
            second = torch.autograd.grad(pairing, wanted, allow_unused=True)
        result, it = [], iter(second)
        for t in tensors:
            if not t.requires_grad:
                result.append(None)
                continue
            h = next(it)
            # NOTE: torch returns an efficient ZeroTensor for a rule that is constant (abs'),
            # which refuses .numpy() unless forced
            result.append(np.zeros(tuple(t.shape), t.detach().numpy().dtype) if h is None
                          else h.detach().numpy(force=True).copy())
        return tuple(result)

    def _optimizer_step(self, name, w, g, state, t, **hyper):
        w = np.asarray(w)
        p = torch.nn.Parameter(torch.from_numpy(np.array(w, copy=True)))
        p.grad = torch.from_numpy(np.array(g, dtype=w.dtype, copy=True))
        lr = hyper.pop("lr", 0.01 if name == "SGD" else 0.001)
        if name == "SGD":
            opt = torch.optim.SGD([p], lr=lr)
        else:
            betas = (hyper.get("beta1", 0.9), hyper.get("beta2", 0.999))
            kwargs = dict(lr=lr, betas=betas, eps=hyper.get("eps", 1e-8))
            if name == "AdamW":
                opt = torch.optim.AdamW([p], weight_decay=hyper.get("weight_decay", 0.01),
                                        **kwargs)
            else:
                opt = torch.optim.Adam([p], **kwargs)
            state = state or {}
            opt.state[p] = {
                "step": torch.tensor(float(t - 1)),
                "exp_avg": torch.from_numpy(np.array(state.get("m", np.zeros_like(w)),
                                                     dtype=w.dtype)),
                "exp_avg_sq": torch.from_numpy(np.array(state.get("v", np.zeros_like(w)),
                                                        dtype=w.dtype)),
            }
        opt.step()
        new_w = p.detach().numpy().copy()
        if name == "SGD":
            return new_w, {}
        s = opt.state[p]
        return new_w, {"m": s["exp_avg"].numpy().copy(), "v": s["exp_avg_sq"].numpy().copy()}
