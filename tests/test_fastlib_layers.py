"""fastlib layers and models: gradients against reflib's tape, finite differences, float32.

Oracles, all independent of the code under test:

- reflib's reference twin (``reflib.models.twin``: same config, same parameter values) traced on
  a ``reflib.Tape`` and back-propagated from the same random cotangent R, i.e. the gradient of
  ``sum(model(x) * R)``; float64 on both sides, normwise relative error <= 1e-10 (different
  code paths, each within a few ulps per op; the models are small and well conditioned);
- ``reflib.value_and_grad`` on the same config and parameters, for every loss;
- central finite differences of ``sum(model(x) * R)`` along random directions (float64,
  h = 1e-6: truncation O(h^2) ~ 1e-12, rounding ~ eps64 |L| / h ~ 1e-10, so 1e-6 relative);
- hand-written NumPy for the causal mask and the initial draws.

Gradient comparisons are normwise with a floor at the largest gradient norm of the model:
some gradients are exactly zero in exact arithmetic (the key bias of attention: softmax is
invariant to a per-row shift), where each engine returns a different rounding residue.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlib
import reflib
from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention, Parallel,
                            RMSNorm, Sequential, Softmax, SwiGLU, from_config)
from reflib.models import twin

F64 = np.float64
REF_TOL = 1e-10   # float64 vs reflib (module doc)
FD_TOL = 1e-6     # central differences (module doc)


# ------------------------------------------------------------------------------ the models
# name -> (builder(dtype), input(rng, batch, seq)); sizes small so reflib's tape stays quick
CASES = {
    **{f"dense_{a}": (lambda dt, a=a: Sequential([Dense(5, 6, a), Dense(6, 3)], dtype=dt),
                      lambda rng, b, s: rng.standard_normal((b, 5)))
       for a in fastlib.layers.ACTIVATIONS},
    "dense_3d_input": (lambda dt: Sequential([Dense(4, 3, "tanh")], dtype=dt),
                       lambda rng, b, s: rng.standard_normal((b, s, 4))),
    "rnn_last": (lambda dt: Sequential([RNN(3, 4)], dtype=dt),
                 lambda rng, b, s: rng.standard_normal((b, s, 3))),
    "rnn_sequences": (lambda dt: Sequential([RNN(3, 4, return_sequences=True)], dtype=dt),
                      lambda rng, b, s: rng.standard_normal((b, s, 3))),
    "lstm_last": (lambda dt: Sequential([LSTM(3, 4), Dense(4, 2)], dtype=dt),
                  lambda rng, b, s: rng.standard_normal((b, s, 3))),
    "lstm_sequences": (lambda dt: Sequential([LSTM(3, 4, return_sequences=True),
                                              RNN(4, 2)], dtype=dt),
                       lambda rng, b, s: rng.standard_normal((b, s, 3))),
    "attention": (lambda dt: Sequential([MultiHeadAttention(6, 2)], dtype=dt),
                  lambda rng, b, s: rng.standard_normal((b, s, 6))),
    "attention_causal": (lambda dt: Sequential([MultiHeadAttention(6, 3, causal=True)],
                                               dtype=dt),
                         lambda rng, b, s: rng.standard_normal((b, s, 6))),
    "attention_one_head": (lambda dt: Sequential([MultiHeadAttention(4, 1, causal=True)],
                                                 dtype=dt),
                           lambda rng, b, s: rng.standard_normal((b, s, 4))),
    "swiglu": (lambda dt: Sequential([SwiGLU(5, 7, 3)], dtype=dt),
               lambda rng, b, s: rng.standard_normal((b, 5))),
    "layer_norm": (lambda dt: Sequential([Dense(4, 5), LayerNorm(5), Dense(5, 3, "relu")],
                                         dtype=dt),
                   lambda rng, b, s: rng.standard_normal((b, 4))),
    "rms_norm": (lambda dt: Sequential([Dense(4, 5), RMSNorm(5), Dense(5, 3)], dtype=dt),
                 lambda rng, b, s: rng.standard_normal((b, 4))),
    "embedding": (lambda dt: Sequential([Embedding(7, 4), LSTM(4, 3)], dtype=dt),
                  lambda rng, b, s: rng.integers(0, 7, size=(b, s))),
    "softmax_layer": (lambda dt: Sequential([Dense(4, 5), Softmax()], dtype=dt),
                      lambda rng, b, s: rng.standard_normal((b, 4))),
    "softmax_axis_1": (lambda dt: Sequential([Dense(3, 2), Softmax(axis=1)], dtype=dt),
                       lambda rng, b, s: rng.standard_normal((b, s, 3))),
    "nested_concat": (lambda dt: Sequential([
        Dense(4, 5, "tanh"),
        Parallel([Sequential([Dense(5, 3, "relu"), Dense(3, 2)]), Dense(5, 4, "sigmoid")],
                 combine="concat"),
        Dense(6, 2)], dtype=dt),
        lambda rng, b, s: rng.standard_normal((b, 4))),
    "nested_add": (lambda dt: Sequential([
        Parallel([Sequential([Dense(4, 3, "silu"), Dense(3, 3)]),
                  Parallel([Dense(4, 3), Dense(4, 3, "gelu")], combine="add")], combine="add"),
        Dense(3, 2, "softplus")], dtype=dt),
        lambda rng, b, s: rng.standard_normal((b, 4))),
    "transformer_block": (lambda dt: Sequential([
        Embedding(9, 4),
        Parallel([MultiHeadAttention(4, 2, causal=True), Sequential([LayerNorm(4)])],
                 combine="add"),
        RMSNorm(4), SwiGLU(4, 6, 4), LSTM(4, 3)], dtype=dt),
        lambda rng, b, s: rng.integers(0, 9, size=(b, s))),
}
SLOW_CASES = {"lstm_sequences", "attention_causal", "transformer_block", "embedding"}


def randomize(model, rng):
    """Fresh draws plus noise on every parameter (norm weights off 1, biases off 0)."""
    model.reset_parameters(rng)
    for v in model.parameters().values():
        v += (0.2 * rng.standard_normal(v.shape)).astype(v.dtype)


def reference_backward(model, x, cotangent):
    """Output, input gradient and parameter gradients of sum(model(x) * cotangent), by reflib."""
    ref = twin(model)
    tape = reflib.Tape()
    ids = ref.attach(tape, requires_grad=True)
    xin = tape.leaf(x, requires_grad=not model.takes_indices)
    out = ref.trace(tape, xin, ids)
    grads = tape.backward_dense_all(out, cotangent)
    return tape.value(out), grads[xin], {k: grads[i] for k, i in ids.items()}


def assert_grads_close(fast, ref, tol):
    """Normwise per array, with a floor at the largest reference norm (module doc)."""
    assert list(fast) == list(ref)
    floor = max(np.linalg.norm(v) for v in ref.values())
    for name in ref:
        a, b = np.asarray(fast[name], dtype=F64), np.asarray(ref[name], dtype=F64)
        assert a.shape == b.shape, name
        err = np.linalg.norm(a - b)
        assert err <= tol * max(np.linalg.norm(b), floor), f"{name}: error {err:.3g}"


def normwise(a, b):
    return np.linalg.norm(np.asarray(a, F64) - b) / max(np.linalg.norm(b), 1e-300)


sizes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(0, 2**31 - 1))


# ------------------------------------------------------------------------------ vs reflib
@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=6)
@given(sizes)
def test_backward_matches_reference_tape(case, size):
    batch, seq, seed = size
    if case in SLOW_CASES:
        seq = min(seq, 3)
    build, make_x = CASES[case]
    rng = np.random.default_rng(seed)
    model = build(F64)
    randomize(model, rng)
    x = make_x(rng, batch, seq)
    out = model(x)
    cotangent = rng.standard_normal(out.shape)
    gx, grads = model.backward(cotangent)
    ref_out, ref_gx, ref_grads = reference_backward(model, x, cotangent)
    assert out.shape == ref_out.shape and out.dtype == F64
    assert normwise(out, ref_out) <= REF_TOL
    if model.takes_indices:
        assert gx is None
    else:
        assert normwise(gx, ref_gx) <= REF_TOL
    assert_grads_close(grads, ref_grads, REF_TOL)


LOSS_CASES = [
    ("mse", lambda rng, out: rng.standard_normal(out.shape)),
    ("cross_entropy", lambda rng, out: rng.integers(0, out.shape[1], size=(out.shape[0], 1))),
    ("categorical_cross_entropy",
     lambda rng, out: np.eye(out.shape[1])[rng.integers(0, out.shape[1], out.shape[0])]),
    ("binary_cross_entropy_with_logits", lambda rng, out: rng.uniform(0, 1, out.shape)),
]


@pytest.mark.parametrize("loss", [c[0] for c in LOSS_CASES])
@pytest.mark.parametrize("case", ["nested_concat", "lstm_last", "transformer_block",
                                  "dense_softmax", "swiglu"])
def test_value_and_grad_matches_reference(case, loss):
    build, make_x = CASES[case]
    rng = np.random.default_rng(7)
    model = build(F64)
    randomize(model, rng)
    x = make_x(rng, 3, 3)
    out = model(x)
    if out.ndim != 2:
        pytest.fail(f"case {case} must end 2-D for the losses")
    y = dict(LOSS_CASES)[loss](rng, out)
    value, grads = fastlib.value_and_grad(model, x, y, loss)
    ref_value, ref_grads = reflib.value_and_grad(model, x, y, loss)
    assert isinstance(value, float)
    assert abs(value - ref_value) <= REF_TOL * abs(ref_value)
    assert_grads_close(grads, ref_grads, REF_TOL)


def test_value_and_grad_binary_cross_entropy_on_sigmoid_outputs():
    model = Sequential([Dense(4, 3, "tanh"), Dense(3, 2, "sigmoid")], dtype=F64)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((5, 4)), rng.uniform(0, 1, (5, 2))
    value, grads = fastlib.value_and_grad(model, x, y, "Binary_Cross_Entropy")
    ref_value, ref_grads = reflib.value_and_grad(model, x, y, "binary_cross_entropy")
    assert abs(value - ref_value) <= REF_TOL * abs(ref_value)
    assert_grads_close(grads, ref_grads, REF_TOL)


# ------------------------------------------------------------------------------ vs differences
@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_matches_central_differences(case):
    build, make_x = CASES[case]
    rng = np.random.default_rng(11)
    model = build(F64)
    randomize(model, rng)
    x = make_x(rng, 2, 3)
    cotangent = rng.standard_normal(model(x).shape)
    gx, grads = model.backward(cotangent)
    params = model.parameters()
    directions = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    base = {k: v.copy() for k, v in params.items()}
    h = 1e-6

    def loss_at(step):
        for k, v in params.items():
            v[...] = base[k] + step * directions[k]  # writes through the views
        return float(np.sum(model(x) * cotangent))

    numeric = (loss_at(h) - loss_at(-h)) / (2 * h)
    loss_at(0.0)
    analytic = sum(float(np.sum(grads[k] * directions[k])) for k in params)
    assert abs(numeric - analytic) <= FD_TOL * max(abs(analytic), 1.0)
    if not model.takes_indices:
        dx = rng.standard_normal(x.shape)
        numeric_x = (np.sum(model(x + h * dx) * cotangent) -
                     np.sum(model(x - h * dx) * cotangent)) / (2 * h)
        analytic_x = float(np.sum(gx * dx))
        assert abs(numeric_x - analytic_x) <= FD_TOL * max(abs(analytic_x), 1.0)


# ------------------------------------------------------------------------------ float32
@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_agrees_with_float64(case):
    # The same parameters (float32 values, exact in float64) and the same float32 input. Each
    # float32 op is within a few eps32 of its float64 twin; these models have <= 6 layers,
    # inner dimensions <= 16 and condition numbers of order 10, so a normwise bound of
    # 6 * 16 * 10 * eps32 ~ 1.1e-4 holds; we assert 2e-4.
    tol = 2e-4
    build, make_x = CASES[case]
    rng = np.random.default_rng(5)
    m32, m64 = build(np.float32), build(F64)
    randomize(m32, rng)
    m64.load_parameters(m32.parameters())
    x = make_x(rng, 3, 3)
    if not m32.takes_indices:
        x = x.astype(np.float32)
    out32, out64 = m32(x), m64(x.astype(F64) if x.dtype.kind == "f" else x)
    assert out32.dtype == np.float32
    assert normwise(out32, out64) <= tol
    cot = rng.standard_normal(out64.shape)
    g32, grads32 = m32.backward(cot.astype(np.float32))
    g64, grads64 = m64.backward(cot)
    assert all(v.dtype == np.float32 for v in grads32.values())
    assert_grads_close(grads32, grads64, tol)
    if g64 is not None:
        assert g32.dtype == np.float32 and normwise(g32, g64) <= tol


# ------------------------------------------------------------------------------ attention
def naive_attention(x, p, heads, causal):
    """Multi-head attention written plainly: -inf mask, full softmax, per-head loops."""
    b, t, d = x.shape
    dh = d // heads
    q, k, v = (x @ p[f"w_{n}"] + p[f"b_{n}"] for n in "qkv")
    out = np.zeros_like(q)
    for h in range(heads):
        sl = slice(h * dh, (h + 1) * dh)
        s = q[:, :, sl] @ k[:, :, sl].transpose(0, 2, 1) / np.sqrt(dh)
        if causal:
            s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        out[:, :, sl] = w @ v[:, :, sl]
    return out @ p["w_o"] + p["b_o"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_attention_matches_naive_implementation(causal, heads):
    rng = np.random.default_rng(heads)
    layer = MultiHeadAttention(8, heads, causal=causal, dtype=F64, seed=rng)
    x = rng.standard_normal((2, 6, 8))
    # float64, the same math in a different order: 1e-13 relative
    np.testing.assert_allclose(layer(x), naive_attention(x, layer.parameters(), heads, causal),
                               rtol=1e-13, atol=1e-13)


def test_causal_attention_ignores_the_future():
    rng = np.random.default_rng(0)
    layer = MultiHeadAttention(6, 2, causal=True, dtype=F64, seed=1)
    x = rng.standard_normal((2, 5, 6))
    y = layer(x)
    for t in range(5):
        x2 = x.copy()
        x2[:, t + 1:] = rng.standard_normal(x2[:, t + 1:].shape) * 10
        # the rows <= t see the same keys; BLAS may block the bigger products differently, so
        # allow float64 rounding (1e-14 of values of order 1)
        np.testing.assert_allclose(layer(x2)[:, :t + 1], y[:, :t + 1], rtol=0, atol=1e-14)
    # and the gradient of an early output never reaches later inputs
    cot = np.zeros_like(y)
    cot[:, 1] = 1.0
    layer(x)
    gx, _ = layer.backward(cot)
    assert np.all(gx[:, 2:] == 0.0) and np.any(gx[:, :2] != 0.0)
    non_causal = MultiHeadAttention(6, 2, causal=False, dtype=F64, seed=1)
    non_causal(x)
    assert np.any(non_causal.backward(cot)[0][:, 2:] != 0.0)


def test_attention_is_finite_for_large_scores():
    layer = MultiHeadAttention(4, 2, dtype=np.float32, seed=0)
    x = np.full((1, 3, 4), 1e3, dtype=np.float32)
    x[0, 1] *= -1
    y = layer(x)
    gx, grads = layer.backward(np.ones_like(y))
    assert np.isfinite(y).all() and np.isfinite(gx).all()
    assert all(np.isfinite(g).all() for g in grads.values())


# ------------------------------------------------------------------------------ parameters
def test_parameter_names_and_layouts():
    model = Sequential([Dense(4, 3), Sequential([LSTM(3, 2), Dense(2, 4)]),
                        Parallel([MultiHeadAttention(4, 2), SwiGLU(4, 5, 6)])], seed=0)
    shapes = {k: v.shape for k, v in model.parameters().items()}
    assert shapes == {
        "0.weight": (4, 3), "0.bias": (3,),
        "1.0.w_ih": (3, 8), "1.0.w_hh": (2, 8), "1.0.b": (8,),
        "1.1.weight": (2, 4), "1.1.bias": (4,),
        "2.0.w_q": (4, 4), "2.0.w_k": (4, 4), "2.0.w_v": (4, 4), "2.0.w_o": (4, 4),
        "2.0.b_q": (4,), "2.0.b_k": (4,), "2.0.b_v": (4,), "2.0.b_o": (4,),
        "2.1.w_gate": (4, 5), "2.1.w_up": (4, 5), "2.1.w_down": (5, 6)}
    assert {k: v.shape for k, v in RNN(3, 5).parameters().items()} == \
        {"w_ih": (3, 5), "w_hh": (5, 5), "b": (5,)}
    assert {k: v.shape for k, v in LayerNorm(3).parameters().items()} == \
        {"weight": (3,), "bias": (3,)}
    assert list(RMSNorm(3).parameters()) == ["weight"]
    assert Embedding(5, 2).parameters()["weight"].shape == (5, 2)


def test_parameters_are_writable_views():
    model = Sequential([Dense(3, 2), Dense(2, 1)], dtype=F64)
    x = np.ones((1, 3))
    params = model.parameters()
    params["1.bias"][...] = 5.0
    params["0.weight"][...] = 0.0
    np.testing.assert_array_equal(model(x), [[5.0]])  # 0 @ ... + 0, then @ W + 5
    model.load_parameters({"1.bias": np.array([2.0])}, strict=False)
    assert params["1.bias"][0] == 2.0                 # load writes in place: views stay valid
    model.reset_parameters(seed=3)
    assert model.parameters()["0.weight"] is params["0.weight"]
    assert np.any(params["0.weight"] != 0.0)


def test_value_and_grad_keys_and_dtype():
    model = Sequential([Dense(3, 4, "relu"), Parallel([Dense(4, 2), Dense(4, 3)]), Dense(5, 3)])
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    loss, grads = fastlib.value_and_grad(model, x, np.array([[0], [1], [2], [0], [1], [2]]),
                                         "cross_entropy")
    assert list(grads) == list(model.parameters())
    assert all(g.dtype == np.float32 and g.shape == model.parameters()[k].shape
               for k, g in grads.items())
    assert isinstance(loss, float) and np.isfinite(loss)


# ------------------------------------------------------------------------------ init, config
def test_initial_draws_equal_reference_and_hand_formulas():
    cfg = CASES["transformer_block"][0](F64).get_config()
    for seed in (0, 5):
        fast = from_config(cfg, dtype=F64, seed=seed)
        ref = reflib.models.from_config(cfg, seed=seed)
        for k, v in ref.parameters().items():
            np.testing.assert_array_equal(fast.parameters()[k], v)
    # He normal for relu-family, Xavier uniform otherwise, zero bias, children in order
    model = Sequential([Dense(6, 4, "relu"), Dense(4, 3, "tanh")], dtype=F64, seed=9)
    rng = np.random.default_rng(9)
    he = rng.standard_normal((6, 4)) * np.sqrt(2.0 / 6)
    limit = np.sqrt(6.0 / (4 + 3))
    xavier = rng.uniform(-limit, limit, size=(4, 3))
    p = model.parameters()
    np.testing.assert_array_equal(p["0.weight"], he)
    np.testing.assert_array_equal(p["1.weight"], xavier)
    assert not p["0.bias"].any() and not p["1.bias"].any()
    f32 = Sequential([Dense(6, 4, "relu"), Dense(4, 3, "tanh")], seed=9)
    np.testing.assert_array_equal(f32.parameters()["0.weight"], he.astype(np.float32))


def test_seed_and_generator_are_reproducible():
    a = Sequential([Dense(3, 3), LSTM(3, 2)], seed=np.random.default_rng(4))
    b = Sequential([Dense(3, 3), LSTM(3, 2)], rng=np.random.default_rng(4))
    c = Sequential([Dense(3, 3), LSTM(3, 2)], seed=4)
    for k in a.parameters():
        np.testing.assert_array_equal(a.parameters()[k], b.parameters()[k])
        np.testing.assert_array_equal(a.parameters()[k], c.parameters()[k])
    d = Sequential([Dense(3, 3), LSTM(3, 2)], seed=5)
    assert np.any(d.parameters()["0.weight"] != a.parameters()["0.weight"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_round_trip(case):
    model = CASES[case][0](np.float32)
    cfg = model.get_config()
    assert cfg["type"] == "Sequential"
    rebuilt = from_config(cfg)
    assert rebuilt.get_config() == cfg and rebuilt.dtype == np.float32
    rebuilt.load_parameters(model.parameters())
    rng = np.random.default_rng(0)
    x = CASES[case][1](rng, 2, 3)
    if not model.takes_indices:
        x = x.astype(np.float32)
    np.testing.assert_array_equal(rebuilt(x), model(x))
    assert reflib.models.from_config(cfg).get_config() == cfg  # the same dicts as reflib


def test_save_delegates_to_io(tmp_path):
    model = Sequential([Dense(3, 2, "relu"), Dense(2, 1)], seed=2)
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = fastlib.load(path)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(loaded(x), model(x))


# ------------------------------------------------------------------------------ shapes, errors
def test_sequences_and_need_input_grad():
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    assert RNN(3, 4)(x).shape == (2, 4)
    assert LSTM(3, 4, return_sequences=True)(x).shape == (2, 5, 4)
    layer = Dense(3, 2)
    y = layer(x)
    assert y.shape == (2, 5, 2)
    gx, grads = layer.backward(np.ones_like(y), need_input_grad=False)
    assert gx is None and set(grads) == {"weight", "bias"}
    # the bias gradient sums over every leading axis: 2 * 5 rows of ones
    np.testing.assert_array_equal(grads["bias"], [10.0, 10.0])


def test_history_is_captured():
    model = Sequential([Dense(3, 4, "relu"), Dense(4, 2)], dtype=F64)
    x = np.random.default_rng(0).standard_normal((5, 3))
    model(x)
    (in0, pre0), (in1, pre1) = model.history()
    assert in0 is x or np.array_equal(in0, x)
    np.testing.assert_allclose(pre0, x @ model.parameters()["0.weight"], rtol=1e-15, atol=1e-15)
    np.testing.assert_array_equal(in1, np.maximum(pre0, 0.0))


def _after_forward(layer, shape):
    layer(np.ones(shape, np.float32))
    return layer


ERRORS = [
    (lambda: Dense(3, 2)(np.ones((4, 5), np.float32)), ValueError,
     r"Dense\(3, 2\): input's last axis must have 3 features, got shape \(4, 5\)"),
    (lambda: Sequential([Dense(3, 4), Dense(4, 2)])(np.ones((4, 5), np.float32)), ValueError,
     r"Sequential layer 0: Dense\(3, 4\).*\(4, 5\)"),
    (lambda: Sequential([Dense(3, 4), Sequential([Dense(4, 2), LSTM(2, 2)])])(
        np.ones((4, 3), np.float32)), ValueError,
     r"Sequential layer 1: Sequential layer 1: LSTM\(2, 2\): expected input \(batch, seq, "
     r"features\) = \(batch, seq, 2\), got shape \(4, 2\)"),
    (lambda: RNN(3, 2)(np.ones((4, 3), np.float32)), ValueError, r"got shape \(4, 3\)"),
    (lambda: MultiHeadAttention(4, 2)(np.ones((2, 3, 5), np.float32)), ValueError,
     r"\(batch, seq, 4\), got shape \(2, 3, 5\)"),
    (lambda: Dense(3, 2)(np.ones((4, 3), np.int64)), TypeError, r"floating-point.*astype"),
    (lambda: Dense(3, 2)(np.array([[1.0, np.nan, 0.0]])), ValueError, r"NaN or Inf.*\(0, 1\)"),
    (lambda: Dense(3, 2, "relu6"), ValueError, r"unknown activation 'relu6'; did you mean"),
    (lambda: Dense(3, 2, "Sigmod"), ValueError, r"did you mean 'sigmoid'"),
    (lambda: Dense(3, 0), ValueError, r"out_features must be >= 1"),
    (lambda: Dense(3.5, 2), TypeError, r"in_features must be a positive int"),
    (lambda: Dense(3, 2, dtype=np.int32), TypeError, r"float32 or float64"),
    (lambda: MultiHeadAttention(6, 4), ValueError, r"heads \(4\) must divide d_model \(6\)"),
    (lambda: Sequential([Dense(3, 4), Dense(5, 2)]), ValueError,
     r"layer 1 Dense\(.*\) expects 5 input features but layer 0 .* produces 4"),
    (lambda: Sequential([Dense(3, 4), Embedding(5, 2)]), ValueError, r"must be the first"),
    (lambda: Sequential([]), ValueError, r"at least one layer"),
    (lambda: Sequential(Dense(2, 2)), TypeError, r"list of layers"),
    (lambda: Sequential([Dense(2, 2), "relu"]), TypeError, r"item 1 is str"),
    (lambda: Parallel([Dense(2, 3)], combine="mul"), ValueError, r"'concat' or 'add'"),
    (lambda: Parallel([Dense(2, 3), Dense(2, 4)], combine="add"), ValueError,
     r"widths \[3, 4\]"),
    (lambda: Parallel([Dense(2, 3), Dense(3, 3)]), ValueError, r"different input widths"),
    (lambda: Parallel([RNN(2, 3), RNN(2, 3, return_sequences=True)])(
        np.ones((1, 2, 2), np.float32)), ValueError, r"branch 1 gives shape \(1, 2, 3\)"),
    (lambda: Embedding(5, 2)(np.array([1, 5])), ValueError, r"index 5 out of range \[0, 5\)"),
    (lambda: Embedding(5, 2)(np.array([-1, 2])), ValueError, r"index -1 out of range"),
    (lambda: Embedding(5, 2)(np.array([1.5])), ValueError, r"whole numbers"),
    (lambda: Embedding(5, 2)(np.array(["a"])), TypeError, r"integer"),
    (lambda: Dense(3, 2).backward(np.ones((1, 2))), RuntimeError, r"before forward"),
    (lambda: Sequential([Dense(3, 2)]).backward(np.ones((1, 2))), RuntimeError,
     r"before forward"),
    (lambda: _after_forward(Dense(3, 2), (4, 3)).backward(np.ones((4, 3))), ValueError,
     r"grad_out has shape \(4, 3\) but the last forward's output has shape \(4, 2\)"),
    (lambda: _after_forward(Sequential([LSTM(3, 2)]), (1, 5, 3)).backward(np.ones((1, 5, 2))),
     ValueError, r"output has shape \(1, 2\)"),
    (lambda: Softmax(axis=2)(np.ones((2, 2), np.float32)), ValueError, r"axis 2 out of range"),
    (lambda: from_config({"type": "Dence", "in_features": 2, "out_features": 2}), ValueError,
     r"unknown layer type 'Dence'; did you mean 'Dense'"),
    (lambda: from_config({"type": "Dense", "in_features": 2}), ValueError,
     r"missing \['out_features'\]"),
    (lambda: from_config({"type": "Dense", "in_features": 2, "out_features": 2, "act": "relu"}),
     ValueError, r"unknown key 'act'"),
    (lambda: Sequential([Dense(2, 2)]).load_parameters({"0.wieght": np.ones((2, 2))}),
     ValueError, r"unknown parameter name '0.wieght'; did you mean '0.weight'"),
    (lambda: Sequential([Dense(2, 2)]).load_parameters({"0.weight": np.ones((3, 2)),
                                                        "0.bias": np.ones(2)}),
     ValueError, r"shape \(3, 2\), expected \(2, 2\)"),
]


@pytest.mark.parametrize("index", range(len(ERRORS)))
def test_clear_errors(index):
    call, kind, pattern = ERRORS[index]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(kind, match=pattern):
            call()


def test_load_parameters_refuses_values_beyond_the_model_dtype_and_changes_nothing():
    # 1e39 is finite as given (float64) but has no float32 value: it would load as inf
    model = Sequential([Dense(2, 2)], seed=0)
    before = {k: v.copy() for k, v in model.parameters().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no NumPy overflow warning either: one clear error
        with pytest.raises(ValueError, match=r"'0.weight' holds 1e\+39, beyond float32's range"):
            model.load_parameters({"0.weight": np.full((2, 2), 1e39), "0.bias": np.zeros(2)})
    for name, value in model.parameters().items():
        np.testing.assert_array_equal(value, before[name])
    wide = Sequential([Dense(2, 2)], seed=0, dtype=np.float64)
    wide.load_parameters({"0.weight": np.full((2, 2), 1e39), "0.bias": np.zeros(2)})
    assert wide.parameters()["0.weight"][0, 0] == 1e39


def test_a_container_warns_before_redrawing_loaded_or_shared_weights():
    # PyTorch's and Keras's containers keep their children's weights; fastlib's draws them
    # from its seed (reflib's draws), so losing loaded weights, or changing another model
    # that holds the same layer, is said out loud
    loaded = Dense(3, 2)
    loaded.load_parameters({"weight": np.ones((3, 2)), "bias": np.zeros(2)})
    with pytest.warns(UserWarning, match=r"layer 0 \(Dense\) holds weights set by "
                                         r"load_parameters"):
        Sequential([loaded], seed=0)
    shared = Dense(3, 2)
    first = Sequential([shared], seed=0)
    before = first(np.ones((1, 3), np.float32))
    with pytest.warns(UserWarning, match=r"layer 1 \(Dense\) already belongs to another model"):
        Parallel([Dense(3, 2), shared], "add", seed=5)
    assert not np.array_equal(first(np.ones((1, 3), np.float32)), before)   # as warned
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # fresh layers, nesting, a load after building: quiet
        model = Sequential([Sequential([Dense(2, 2)]), Dense(2, 2)], seed=1)
        model.load_parameters(model.parameters())
        Sequential([Dense(2, 2)], seed=0).reset_parameters(3)


def test_float64_input_to_float32_model_is_converted():
    layer = Dense(3, 2, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 3))
    y = layer(x)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, layer(x.astype(np.float32)))


def test_layers_tape_losses_import_neither_reflib_nor_spec_nor_sympy():
    code = ("import sys, fastlib.layers, fastlib.tape, fastlib.losses, fastlib.grad; "
            "bad = [m for m in ('sympy', 'spec', 'reflib', 'mpmath') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(pathlib.Path(__file__).parents[1]))
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("activation, slope", [("relu", 0.0), ("leaky_relu", 0.01)])
def test_dense_kink_conventions(activation, slope):
    # pre-activation exactly 0: relu'(0) = 0 and leaky_relu'(0) = slope (docs/CONTRACTS.md)
    layer = Dense(2, 3, activation, dtype=F64)
    layer.parameters()["weight"][...] = 0.0
    x = np.array([[1.0, 2.0]])
    assert np.all(layer(x) == 0.0)
    gx, grads = layer.backward(np.ones((1, 3)))
    np.testing.assert_array_equal(grads["bias"], [slope] * 3)
    np.testing.assert_array_equal(grads["weight"], slope * np.array([[1.0] * 3, [2.0] * 3]))
    np.testing.assert_array_equal(gx, [[0.0, 0.0]])  # the weights are 0


@pytest.mark.parametrize("dtype", [np.float32, F64])
def test_dense_softmax_is_finite_for_huge_logits(dtype):
    layer = Dense(2, 3, "softmax", dtype=dtype)
    layer.parameters()["weight"][...] = [[1e4, -1e4, 0.0], [0.0, 0.0, 0.0]]
    y = layer(np.array([[1.0, 0.0], [-1.0, 0.0]], dtype=dtype))
    np.testing.assert_array_equal(y, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    gx, grads = layer.backward(np.ones_like(y))
    assert np.isfinite(gx).all() and all(np.isfinite(g).all() for g in grads.values())
