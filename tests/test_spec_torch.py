"""spec.evaluate against PyTorch autograd in float64: a third, independent implementation.

PyTorch is an optional extra (``pip install .[torch]``); without it this module is reported as
skipped with the reason, never silently.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spec

torch = pytest.importorskip("torch", reason="PyTorch is optional: pip install '.[torch]'")
F = torch.nn.functional


def _reduce(fn, x, axis, keepdims):
    if x.ndim == 0:
        return x * 1                         # any reduction of a scalar is the scalar
    dims = tuple(range(x.ndim)) if axis is None else axis
    return fn(x, dim=dims, keepdim=keepdims)


def _torch_forward(name, xs, p):
    x = xs[0]
    unary = {
        "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
        "square": torch.square, "abs": torch.abs, "relu": F.relu, "silu": F.silu,
        "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
        "tanh": torch.tanh, "sigmoid": torch.sigmoid, "softplus": F.softplus,
        "identity": lambda v: v * 1,
        "leaky_relu": lambda v: F.leaky_relu(v, p.get("negative_slope", 0.01)),
    }
    if name in unary:
        return unary[name](x)
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
              "maximum": torch.maximum, "matmul": torch.matmul}
    if name in binary:
        return binary[name](*xs)
    if name in ("sum", "mean", "logsumexp"):
        fn = {"sum": torch.sum, "mean": torch.mean, "logsumexp": torch.logsumexp}[name]
        return _reduce(fn, x, p.get("axis"), p.get("keepdims", False))
    if name == "transpose":
        axes = p.get("axes")
        return x.permute(*(reversed(range(x.ndim)) if axes is None else axes))
    if name == "reshape":
        return x.reshape(p["shape"])
    if name == "concat":
        return torch.cat(xs, dim=p.get("axis", -1))
    if name == "slice":
        index = [slice(None)] * x.ndim
        index[p.get("axis", 0)] = slice(p.get("start", 0), p.get("stop"), p.get("step", 1))
        return x[tuple(index)]
    if name == "softmax":
        return F.softmax(x, dim=p.get("axis", -1))
    if name == "log_softmax":
        return F.log_softmax(x, dim=p.get("axis", -1))
    if name == "layer_norm":
        return F.layer_norm(x, x.shape[-1:], eps=p.get("eps", 1e-5))
    if name == "rms_norm":
        return F.rms_norm(x, x.shape[-1:], eps=p.get("eps", 1e-6))
    t = xs[1]
    if name == "mse":
        return F.mse_loss(x, t)
    if name == "cross_entropy":
        return F.cross_entropy(x, t.reshape(-1))
    if name == "categorical_cross_entropy":
        return -(t * F.log_softmax(x, dim=-1)).sum() / x.shape[0]
    if name == "binary_cross_entropy":
        # torch's F.binary_cross_entropy has no derivative for the target: write it out.
        return -(t * torch.log(x) + (1 - t) * torch.log1p(-x)).mean()
    if name == "binary_cross_entropy_with_logits":
        return F.binary_cross_entropy_with_logits(x, t)
    raise AssertionError(name)


@pytest.mark.parametrize("name", list(spec.OPS))
@settings(max_examples=min(10, settings.default.max_examples))
@given(seed=st.integers(0, 2**32 - 1))
def test_evaluate_matches_torch_float64(name, seed):
    op = spec.OPS[name]
    rng = np.random.default_rng(seed)
    inputs, params = spec.sample_case(name, rng)      # away from kinks: torch splits ties
    out_shape = op.check_shapes([x.shape for x in inputs], params)
    grad = rng.uniform(-2, 2, size=out_shape)
    out, grads = spec.evaluate(name, inputs, grad, params)

    tensors = []
    for n, x in zip(op.inputs, inputs):
        differentiable = op.vjp[n] is not None
        tensors.append(torch.tensor(x, dtype=torch.float64 if differentiable else torch.int64,
                                    requires_grad=differentiable))
    y = _torch_forward(name, tensors, params)
    y.backward(torch.tensor(grad, dtype=torch.float64))

    # float64 against 50 digits: a few ulps per elementary operation, amplified by at most
    # the modest condition numbers of the sampled domains (|x| <= 3, p in [0.05, 0.95]).
    def close(a, b):
        a = np.array([float(v) for v in np.reshape(a, -1)])
        b = np.reshape(b, -1)
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)

    close(out, y.detach().numpy())
    for n, g_spec, t in zip(op.inputs, grads, tensors):
        if g_spec is None:
            assert not t.requires_grad
        else:
            close(g_spec, t.grad.numpy())
