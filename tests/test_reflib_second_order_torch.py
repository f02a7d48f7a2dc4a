"""reflib's model HVPs and Gauss-Newton products against PyTorch's, in float64.

Independent source: PyTorch's autograd (``torch.func.jvp`` of ``torch.func.grad``: forward over
reverse; ``torch.autograd.functional`` for the Gauss-Newton factors) on PyTorch twins of the
reference models (their forward is held to reflib's in tests/test_reflib_models.py). Skipped,
with the reason, where torch is not installed.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch comparisons need torch (the 'torch' "
                                            "extra)")

import torch.nn.functional as TF  # noqa: E402

import reflib  # noqa: E402
from reflib.models import MultiHeadAttention  # noqa: E402
from tests.test_reflib_models import _torch  # noqa: E402
from tests.test_reflib_second_order import MODELS, model_case  # noqa: E402

# NOTE: float64 products through these tiny O(1) graphs (a few hundred roundings of O(1) terms
# per entry) by two engines in different orders: 1e-12 relative to the largest entry is ~4e3
# ulps of room, and a wrong term, sign or layout is off by O(1).
RTOL = 1e-12


def t64(a):
    return torch.tensor(np.asarray(a, dtype=np.float64))


def torch_attention(m, x, p):
    """reflib's documented attention, written out (torch's fused kernel has no double backward):
    heads of contiguous columns, softmax(q kᵀ / √dh) v, causal rows see keys 0..t."""
    q, k, v = (x @ p[f"w_{n}"] + p[f"b_{n}"] for n in "qkv")
    dh = m.d_model // m.heads
    seq = x.shape[1]
    outs = []
    for h in range(m.heads):
        cols = slice(h * dh, (h + 1) * dh)
        scores = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(dh)
        if m.causal:
            mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
            scores = scores.masked_fill(mask, float("-inf"))
        outs.append(torch.softmax(scores, -1) @ v[..., cols])
    return torch.cat(outs, -1) @ p["w_o"] + p["b_o"]


def torch_output(model, x, p):
    if isinstance(model, MultiHeadAttention):
        return torch_attention(model, t64(x), p)
    return _torch(model, x, p)


def torch_loss(loss, out, y):
    y = np.asarray(y)
    if loss == "mse":
        return ((out - t64(y)) ** 2).mean()
    if loss == "cross_entropy":
        return TF.cross_entropy(out, torch.as_tensor(y.reshape(-1), dtype=torch.int64))
    if loss == "categorical_cross_entropy":
        return -(t64(y) * torch.log_softmax(out, -1)).sum() / out.shape[0]
    if loss == "binary_cross_entropy_with_logits":
        return TF.binary_cross_entropy_with_logits(out, t64(y))
    raise AssertionError(loss)


def assert_close(got, expected, what):
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, what
    scale = max(1.0, float(np.max(np.abs(expected))))
    err = float(np.max(np.abs(got - expected))) / scale
    assert err <= RTOL, f"{what}: normwise error {err:.3e} > {RTOL:.0e}"


def _setup(name):
    model, x, y, loss, v = model_case(name)
    names = list(model.parameters())
    theta = {k: t64(w) for k, w in model.parameters().items()}
    direction = {k: t64(v[k]) for k in names}
    return model, x, y, loss, v, names, theta, direction


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_hvp_matches_torch_func(name):
    model, x, y, loss, v, names, theta, direction = _setup(name)

    def loss_of(params):
        return torch_loss(loss, torch_output(model, x, params), y)

    _, expected = torch.func.jvp(torch.func.grad(loss_of), (theta,), (direction,))
    got = reflib.model_hvp(model, x, y, loss, v)
    for k in names:
        assert_close(got[k], expected[k].numpy(), f"{name}: {k}")


@pytest.mark.parametrize("name", ["mlp", "rnn", "layernorm_mlp", "attention_causal"])
def test_gauss_newton_product_matches_torch(name):
    model, x, y, loss, v, names, theta, direction = _setup(name)

    def output_of(*params):
        return torch_output(model, x, dict(zip(names, params)))

    params = tuple(theta[k] for k in names)
    out, jv = torch.autograd.functional.jvp(output_of, params, tuple(direction[k] for k in names))
    _, hjv = torch.autograd.functional.hvp(lambda o: torch_loss(loss, o, y), out.detach(), jv)
    _, expected = torch.autograd.functional.vjp(output_of, params, hjv)
    got = reflib.gnvp(model, x, y, loss, v)
    for k, e in zip(names, expected):
        assert_close(got[k], e.numpy(), f"{name}: {k}")


@pytest.mark.parametrize("name", ["rnn", "lstm", "layernorm_mlp", "attention_causal", "embedding"])
def test_fastlib_model_hvp_matches_torch_func(name):
    # fastlib's forward over reverse, op by op, on the reference model's fastlib twin
    import fastlib
    from tests.test_fastlib_model_hvp import fastlib_twin

    model, x, y, loss, v, names, theta, direction = _setup(name)

    def loss_of(params):
        return torch_loss(loss, torch_output(model, x, params), y)

    _, expected = torch.func.jvp(torch.func.grad(loss_of), (theta,), (direction,))
    got = fastlib.hvp(fastlib_twin(model), x, y, loss, v)
    for k in names:
        assert_close(got[k], expected[k].numpy(), f"{name}: {k}")
