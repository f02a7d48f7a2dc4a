"""reflib's reference layers: names and layouts, forward semantics against PyTorch, gradients
against 50-digit central finite differences, causal masking, configs and initialisation.

Independent sources: PyTorch (float64) for every forward; mpmath finite differences at 50
digits for every gradient; hand-stated draw formulas for initialisation.
"""
from __future__ import annotations

import json

import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call
from hypothesis import given, settings
from hypothesis import strategies as st

from reflib.models import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention, Parallel,
                           RMSNorm, Sequential, Softmax, SwiGLU, from_config, twin)
from reflib.tape import Tape

DPS = 50
# NOTE: float64 forward of these tiny compositions (a few dozen flops per output, activations
# with bounded condition numbers) agrees with PyTorch's float64 to a few ulps; 1e-12 relative
# leaves four orders of magnitude of slack and still catches any wrong formula.
F64_RTOL = 1e-12


# -- helpers -----------------------------------------------------------------------------------

def randomise(model, seed):
    """Load standard-normal values into every parameter (non-zero biases expose bias bugs)."""
    rng = np.random.default_rng(seed)
    model.load_parameters({k: rng.standard_normal(v.shape) for k, v in model.parameters().items()})
    return model


def t64(a):
    return torch.tensor(np.asarray(a, dtype=np.float64))


def assert_close(actual, expected, rtol=F64_RTOL):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected))))
    err = float(np.max(np.abs(actual - expected))) / scale
    assert err <= rtol, f"normwise error {err:.3e} > {rtol:.0e}"


def to_mpf(a):
    out = np.empty(np.shape(a), dtype=object)
    for idx, v in np.ndenumerate(np.asarray(a)):
        out[idx] = mpmath.mpf(v) if not isinstance(v, mpmath.mpf) else v
    return out


# -- torch twins (the independent forward) -----------------------------------------------------

TORCH_ACT = {
    "linear": lambda z: z, "relu": torch.relu, "leaky_relu": lambda z: F.leaky_relu(z, 0.01),
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": F.silu, "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "softplus": F.softplus,
    "softmax": lambda z: torch.softmax(z, -1),
}


def torch_forward(model, x):
    """PyTorch float64 forward of a reflib model, parameters mapped by the documented layouts."""
    p = {k: t64(v) for k, v in model.parameters().items()}
    return _torch(model, x, p).detach().numpy()


def _sub(p, i):
    pre = f"{i}."
    return {k[len(pre):]: v for k, v in p.items() if k.startswith(pre)}


def _torch(m, x, p):
    if isinstance(m, Sequential):
        for i, c in enumerate(m.layers):
            x = _torch(c, x, _sub(p, i))
        return x
    if isinstance(m, Parallel):
        outs = [_torch(c, x, _sub(p, i)) for i, c in enumerate(m.layers)]
        return torch.cat(outs, -1) if m.combine == "concat" else sum(outs[1:], outs[0])
    if isinstance(m, Embedding):
        return F.embedding(torch.as_tensor(np.asarray(x, dtype=np.int64)), p["weight"])
    x = x if isinstance(x, torch.Tensor) else t64(x)
    if isinstance(m, Dense):
        return TORCH_ACT[m.activation](x @ p["weight"] + p["bias"])
    if isinstance(m, SwiGLU):
        return (F.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]
    if isinstance(m, LayerNorm):
        return F.layer_norm(x, (m.d,), p["weight"], p["bias"], m.eps)
    if isinstance(m, RMSNorm):
        return F.rms_norm(x, (m.d,), p["weight"], m.eps)
    if isinstance(m, Softmax):
        return torch.softmax(x, m.axis)
    if isinstance(m, (RNN, LSTM)):
        # torch's own modules, called functionally so gradients reach our layout's tensors
        cls = torch.nn.RNN if isinstance(m, RNN) else torch.nn.LSTM
        net = cls(m.input_size, m.hidden_size, batch_first=True, dtype=torch.float64)
        weights = {"weight_ih_l0": p["w_ih"].T, "weight_hh_l0": p["w_hh"].T,
                   "bias_ih_l0": p["b"], "bias_hh_l0": torch.zeros_like(p["b"])}
        seq, _ = functional_call(net, weights, (x,))
        return seq if m.return_sequences else seq[:, -1, :]
    if isinstance(m, MultiHeadAttention):
        net = torch.nn.MultiheadAttention(m.d_model, m.heads, batch_first=True,
                                          dtype=torch.float64)
        weights = {"in_proj_weight": torch.cat([p["w_q"].T, p["w_k"].T, p["w_v"].T]),
                   "in_proj_bias": torch.cat([p["b_q"], p["b_k"], p["b_v"]]),
                   "out_proj.weight": p["w_o"].T, "out_proj.bias": p["b_o"]}
        seq = x.shape[1]
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1) if m.causal else None
        return functional_call(net, weights, (x, x, x),
                               {"attn_mask": mask, "need_weights": False})[0]
    raise AssertionError(f"no torch twin for {type(m).__name__}")


# -- the zoo: one tiny case per layer type and container shape ----------------------------------

def _x(shape, seed=0):
    return np.random.default_rng(100 + seed).standard_normal(shape)


ZOO = {
    "dense_tanh": (lambda: Dense(3, 2, "tanh"), (2, 3)),
    "dense_3d_linear": (lambda: Dense(3, 2), (2, 2, 3)),
    "rnn_last": (lambda: RNN(2, 3), (2, 3, 2)),
    "rnn_seq": (lambda: RNN(2, 2, return_sequences=True), (1, 3, 2)),
    "lstm_last": (lambda: LSTM(2, 2), (2, 3, 2)),
    "lstm_seq": (lambda: LSTM(1, 2, return_sequences=True), (1, 3, 1)),
    "mha": (lambda: MultiHeadAttention(4, 2), (1, 3, 4)),
    "mha_causal": (lambda: MultiHeadAttention(4, 2, causal=True), (2, 3, 4)),
    "swiglu": (lambda: SwiGLU(3, 4, 2), (2, 3)),
    "layernorm": (lambda: LayerNorm(3), (2, 3)),
    "rmsnorm": (lambda: RMSNorm(3), (2, 3)),
    "embedding": (lambda: Embedding(4, 3), "indices"),
    "softmax_axis0": (lambda: Softmax(axis=0), (3, 2)),
    "nested": (lambda: Sequential([
        Dense(3, 4, "relu"),
        Parallel([Dense(4, 2, "sigmoid"),
                  Sequential([LayerNorm(4), Dense(4, 3, "gelu")])], combine="concat"),
        Sequential([RMSNorm(5), Dense(5, 2, "softplus")]),
        Softmax()]), (2, 3)),
    "parallel_add_recurrent": (lambda: Sequential([
        Parallel([LSTM(2, 3), Sequential([RNN(2, 3, return_sequences=True), RNN(3, 3)])],
                 combine="add"),
        Dense(3, 2, "silu")]), (2, 3, 2)),
    "embedding_attention": (lambda: Sequential([
        Embedding(5, 4), MultiHeadAttention(4, 1, causal=True), SwiGLU(4, 3, 2)]), "indices"),
}


def zoo_case(name, seed=0):
    build, shape = ZOO[name]
    model = randomise(build(), seed)
    if shape == "indices":
        x = np.array([[0, 3, 1], [2, 2, 0]])  # a repeated index: gradients must accumulate
    else:
        x = _x(shape, seed)
    return model, x


@pytest.mark.parametrize("name", sorted(ZOO))
def test_forward_matches_pytorch(name):
    model, x = zoo_case(name)
    assert_close(model(x), torch_forward(model, x))


@pytest.mark.parametrize("activation", sorted(TORCH_ACT))
def test_dense_activations_match_pytorch(activation):
    model = randomise(Dense(3, 4, activation), 1)
    x = _x((5, 3), 1)
    assert_close(model(x), torch_forward(model, x))


@pytest.mark.parametrize("name", ["mha_causal", "lstm_seq", "nested", "embedding_attention"])
def test_exact_forward_matches_pytorch(name):
    # the dps=50 path runs different arithmetic (mpf object arrays); rounded to float64 it must
    # agree with PyTorch's float64 result to float64 accuracy
    model, x = zoo_case(name)
    out = model(x, dps=DPS)
    assert out.dtype == object and isinstance(out.flat[0], mpmath.mpf)
    assert_close(out.astype(np.float64), torch_forward(model, x))


# -- gradients against 50-digit central finite differences -------------------------------------

def projection(model, x, c, dps, grad_x=False):
    """Scalar s = sum(model(x) * c) on a tape; returns (tape, s, param ids, x id)."""
    tape = Tape(dps=dps)
    ids = model.attach(tape, requires_grad=True)
    xi = tape.leaf(x, requires_grad=grad_x)
    out = model.trace(tape, xi, ids)
    s = tape.op("sum", tape.op("mul", out, tape.leaf(c, requires_grad=False)))
    return tape, s, ids, xi


def fd_entries(shape, rng, limit):
    """Every index of ``shape`` when it has at most ``limit`` entries, else a random subset."""
    idx = list(np.ndindex(*shape))
    if len(idx) <= limit:
        return idx
    return [idx[i] for i in rng.choice(len(idx), size=limit, replace=False)]


# NOTE: central differences with h = 1e-15 at 50 digits: truncation ~h^2 |f'''| / 6 ~ 1e-31 and
# rounding ~1e-50 / h = 1e-35, so a correct gradient agrees to ~1e-30; 1e-25 relative to the
# gradient's scale is a wide margin that any wrong VJP or wiring (errors >= 1e-3) cannot meet.
FD_H = mpmath.mpf("1e-15")
FD_TOL = mpmath.mpf("1e-25")
# Entries per tensor checked one by one (all of them for the tiny tensors used here).
FD_LIMIT = 12


def check_gradients_fd(model, x, seed=0, grad_x=True):
    rng = np.random.default_rng(seed)
    with mpmath.workdps(DPS):
        params = {k: to_mpf(v) for k, v in model.parameters().items()}
        exact = twin_model(model, params)
        out = np.asarray(model(x))
        c = rng.standard_normal(out.shape)
        xe = x if not grad_x else to_mpf(x)
        tape, s, ids, xi = projection(exact, xe, c, DPS, grad_x=grad_x)
        grads = tape.backward_scalar(s)

        def value(p, xv):
            t, sv, _, _ = projection(twin_model(model, p), xv, c, DPS)
            return t.value(sv)[()]

        checks = [(name, ids[name]) for name in params] + ([("x", xi)] if grad_x else [])
        for name, node in checks:
            base = xe if name == "x" else params[name]
            g = grads.get(node)
            scale = max(mpmath.mpf(1), max((abs(v) for v in g.flat), default=0)) \
                if g is not None else mpmath.mpf(1)
            for idx in fd_entries(base.shape, rng, FD_LIMIT):
                plus, minus = base.copy(), base.copy()
                plus[idx] += FD_H
                minus[idx] -= FD_H
                if name == "x":
                    fd = (value(params, plus) - value(params, minus)) / (2 * FD_H)
                else:
                    fd = (value({**params, name: plus}, xe) -
                          value({**params, name: minus}, xe)) / (2 * FD_H)
                got = g[idx] if g is not None else mpmath.mpf(0)
                assert abs(got - fd) <= FD_TOL * scale, (
                    f"{name}{idx}: tape {mpmath.nstr(got, 20)} vs finite difference "
                    f"{mpmath.nstr(fd, 20)}")
        return grads, ids, xi


def twin_model(model, params):
    clone = from_config(model.get_config())
    clone.load_parameters(params)
    return clone


@pytest.mark.parametrize("name", sorted(ZOO))
def test_gradients_match_50_digit_finite_differences(name):
    model, x = zoo_case(name, seed=3)
    grads, ids, _ = check_gradients_fd(model, x, seed=3, grad_x=not isinstance(
        model, Embedding) and "embedding" not in name)
    # every parameter of these models is reached (seq >= 2, every branch used)
    assert all(ids[k] in grads for k in ids)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_float64_gradients_match_pytorch(name):
    # NOTE: float64 backward through these tiny graphs vs PyTorch's float64 autograd: a few
    # dozen well-conditioned flops per entry, so 1e-11 normwise (~1e5 ulps) is generous yet
    # any wrong VJP, layout or routing is off by O(1).
    model, x = zoo_case(name, seed=2)
    c = np.random.default_rng(2).standard_normal(model(x).shape)
    grad_x = "embedding" not in name
    tape, s, ids, xi = projection(model, x, c, None, grad_x=grad_x)
    got = tape.backward_scalar(s)
    p = {k: t64(v).requires_grad_() for k, v in model.parameters().items()}
    xt = t64(x).requires_grad_() if grad_x else x
    (_torch(model, xt, p) * t64(c)).sum().backward()
    for k in p:
        assert_close(got[ids[k]], p[k].grad.numpy(), rtol=1e-11)
    if grad_x:
        assert_close(got[xi], xt.grad.numpy(), rtol=1e-11)


def test_float64_gradients_match_exact():
    # NOTE: float64 tape gradients of the nested model against the 50-digit ones: each is a few
    # dozen well-conditioned operations (no cancellation-prone inputs), so 1e-11 normwise is
    # about 1e5 ulps of room.
    model, x = zoo_case("parallel_add_recurrent", seed=4)
    c = np.random.default_rng(4).standard_normal(model(x).shape)
    tape64, s64, ids64, _ = projection(model, x, c, None)
    tape_ex, s_ex, ids_ex, _ = projection(model, x, c, DPS)
    g64, gex = tape64.backward_scalar(s64), tape_ex.backward_scalar(s_ex)
    for name in ids64:
        assert_close(g64[ids64[name]], gex[ids_ex[name]].astype(np.float64), rtol=1e-11)


def test_embedding_gradient_scatter_adds_repeated_indices():
    # hand derivation: d/dW sum(E[idx] * c) = sum over positions p with idx[p] = r of c[p]
    model = randomise(Embedding(4, 2), 0)
    idx = np.array([[1, 1], [3, 1]])
    c = np.arange(8.0).reshape(2, 2, 2)
    tape, s, ids, _ = projection(model, idx, c, None)
    g = tape.backward_scalar(s)[ids["weight"]]
    expected = np.zeros((4, 2))
    expected[1] = c[0, 0] + c[0, 1] + c[1, 1]
    expected[3] = c[1, 0]
    np.testing.assert_array_equal(g, expected)


def test_rnn_single_step_leaves_w_hh_unreached():
    model = randomise(RNN(2, 2), 0)
    tape, s, ids, _ = projection(model, _x((1, 1, 2)), np.ones((1, 2)), None)
    assert ids["w_hh"] not in tape.backward_scalar(s)


# -- causal masking ----------------------------------------------------------------------------

@pytest.mark.parametrize("dps", [None, DPS])
def test_causal_output_ignores_the_future(dps):
    model = randomise(MultiHeadAttention(4, 2, causal=True), 5)
    x = _x((2, 4, 4), 5)
    base = model(x, dps=dps)
    for t in range(3):
        changed = x.copy()
        changed[:, t + 1:, :] += 10.0 * _x((2, 3 - t, 4), 6 + t)
        out = model(changed, dps=dps)
        # exact equality: the masked keys are not in the computation at all
        assert np.array_equal(out[:, :t + 1], base[:, :t + 1])
        assert not np.array_equal(out[:, t + 1:], base[:, t + 1:])


def test_non_causal_output_sees_the_future():
    model = randomise(MultiHeadAttention(4, 2), 5)
    x = _x((1, 3, 4), 5)
    changed = x.copy()
    changed[:, 2] += 1.0
    assert not np.allclose(model(changed)[:, 0], model(x)[:, 0])


def test_causal_gradient_to_future_inputs_is_zero():
    model = randomise(MultiHeadAttention(2, 1, causal=True), 7)
    x = _x((1, 3, 2), 7)
    c = np.zeros((1, 3, 2))
    c[0, 0] = 1.0  # the output at t = 0 only
    tape, s, _, xi = projection(model, x, c, None, grad_x=True)
    gx = tape.backward_scalar(s)[xi]
    assert np.all(gx[0, 1:] == 0) and np.any(gx[0, 0] != 0)


# -- names, layouts, configs -------------------------------------------------------------------

LAYOUTS = [
    (Dense(3, 5, "relu"), {"weight": (3, 5), "bias": (5,)}),
    (RNN(3, 4), {"w_ih": (3, 4), "w_hh": (4, 4), "b": (4,)}),
    (LSTM(3, 4), {"w_ih": (3, 16), "w_hh": (4, 16), "b": (16,)}),
    (MultiHeadAttention(6, 3), {**{f"w_{n}": (6, 6) for n in "qkvo"},
                                **{f"b_{n}": (6,) for n in "qkvo"}}),
    (SwiGLU(3, 7, 2), {"w_gate": (3, 7), "w_up": (3, 7), "w_down": (7, 2)}),
    (LayerNorm(4), {"weight": (4,), "bias": (4,)}),
    (RMSNorm(4), {"weight": (4,)}),
    (Embedding(9, 3), {"weight": (9, 3)}),
    (Softmax(), {}),
]


@pytest.mark.parametrize("layer,layout", LAYOUTS, ids=lambda v: type(v).__name__)
def test_parameter_names_and_layouts(layer, layout):
    assert {k: v.shape for k, v in layer.parameters().items()} == layout
    assert list(layer.parameters()) == list(layout)  # declaration order is the draw order


def test_nested_names_join_with_dots():
    model = Sequential([Dense(2, 3), Sequential([LSTM(3, 2)]),
                        Parallel([Dense(2, 2), Sequential([RMSNorm(2), SwiGLU(2, 2, 1)])])])
    assert list(model.parameters()) == [
        "0.weight", "0.bias", "1.0.w_ih", "1.0.w_hh", "1.0.b",
        "2.0.weight", "2.0.bias", "2.1.0.weight", "2.1.1.w_gate", "2.1.1.w_up", "2.1.1.w_down"]


def test_parameters_are_the_models_arrays():
    model = Sequential([Dense(2, 2)])
    model.parameters()["0.bias"][:] = 7.0
    assert np.all(model(np.zeros((1, 2))) == 7.0)


def test_layernorm_and_rmsnorm_start_as_identity_affine():
    assert np.array_equal(LayerNorm(3).parameters()["weight"], np.ones(3))
    assert np.array_equal(LayerNorm(3).parameters()["bias"], np.zeros(3))
    assert np.array_equal(RMSNorm(3).parameters()["weight"], np.ones(3))


def width(layer, din):
    """Output width of ``layer`` on (batch, din) inputs (its last axis)."""
    return layer(np.zeros((1, din))).shape[-1]


@st.composite
def architectures(draw, din, depth=0):
    """A random layer or nested container mapping (batch, din) inputs."""
    kinds = ["dense", "norm", "swiglu"] + (["seq", "par"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "dense":
        return Dense(din, draw(st.integers(1, 3)), draw(st.sampled_from(sorted(TORCH_ACT))))
    if kind == "norm":
        return draw(st.sampled_from([LayerNorm, RMSNorm]))(din)
    if kind == "swiglu":
        return SwiGLU(din, draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    n = draw(st.integers(1, 3))
    if kind == "seq":
        layers = []
        for _ in range(n):
            layers.append(draw(architectures(din, depth + 1)))
            din = width(layers[-1], din)
        return Sequential(layers)
    branches = [draw(architectures(din, depth + 1)) for _ in range(n)]
    if draw(st.booleans()):
        return Parallel(branches, combine="concat")
    # add needs equal widths: end each branch with a Dense to a common width
    out = draw(st.integers(1, 3))
    return Parallel([Sequential([b, Dense(width(b, din), out)]) for b in branches], combine="add")


@st.composite
def models(draw):
    din = draw(st.integers(1, 3))
    model = draw(architectures(din))
    return randomise(model, draw(st.integers(0, 2**16))), din


@settings(max_examples=15)
@given(models())
def test_config_round_trip_rebuilds_the_same_model(case):
    model, din = case
    cfg = model.get_config()
    assert json.loads(json.dumps(cfg)) == cfg  # plain JSON-able data
    rebuilt = from_config(cfg)
    assert rebuilt.get_config() == cfg
    assert {k: v.shape for k, v in rebuilt.parameters().items()} == \
        {k: v.shape for k, v in model.parameters().items()}
    rebuilt.load_parameters(model.parameters())
    x = _x((2, din), 9)
    assert np.array_equal(rebuilt(x), model(x))
    assert_close(model(x), torch_forward(model, x))


def test_config_formats_are_documented_exactly():
    model = Sequential([Embedding(5, 4), MultiHeadAttention(4, 2, causal=True),
                        Parallel([LSTM(4, 3, return_sequences=True), RNN(4, 2, True)], "concat"),
                        LayerNorm(5, eps=1e-3), RMSNorm(5), SwiGLU(5, 6, 3),
                        Dense(3, 2, "gelu"), Softmax(axis=-1)])
    assert model.get_config() == {"type": "Sequential", "layers": [
        {"type": "Embedding", "num": 5, "dim": 4},
        {"type": "MultiHeadAttention", "d_model": 4, "heads": 2, "causal": True},
        {"type": "Parallel", "combine": "concat", "layers": [
            {"type": "LSTM", "input_size": 4, "hidden_size": 3, "return_sequences": True},
            {"type": "RNN", "input_size": 4, "hidden_size": 2, "return_sequences": True}]},
        {"type": "LayerNorm", "d": 5, "eps": 1e-3},
        {"type": "RMSNorm", "d": 5, "eps": 1e-6},
        {"type": "SwiGLU", "d": 5, "hidden": 6, "out": 3},
        {"type": "Dense", "in_features": 3, "out_features": 2, "activation": "gelu"},
        {"type": "Softmax", "axis": -1}]}


def test_from_config_accepts_defaults_and_ignores_dtype():
    model = from_config({"type": "Sequential", "dtype": "float32",
                         "layers": [{"type": "Dense", "in_features": 2, "out_features": 3}]})
    assert model.get_config()["layers"][0]["activation"] == "linear"


class _FakeFastModel:
    """Stands in for a fastlib model: config + float32 parameters, nothing else."""

    def __init__(self, ref):
        self._cfg = ref.get_config()
        self._p = {k: v.astype(np.float32) for k, v in ref.parameters().items()}

    def get_config(self):
        return self._cfg

    def parameters(self):
        return self._p


def test_twin_loads_a_foreign_model_exactly():
    ref, x = zoo_case("nested", 2)
    fake = _FakeFastModel(ref)
    clone = twin(fake)
    for k, v in fake.parameters().items():
        assert clone.parameters()[k].dtype == np.float64
        assert np.array_equal(clone.parameters()[k], v.astype(np.float64))  # float32 -> 64 exact


# -- initialisation ----------------------------------------------------------------------------

def test_initialisation_draws_are_the_documented_ones():
    # He normal for relu-family Dense, Xavier uniform otherwise; biases zero; one generator,
    # parameters drawn in declaration order, children in order.
    model = Sequential([Dense(3, 4, "relu"), LSTM(4, 2), Dense(2, 2, "tanh")], seed=11)
    rng = np.random.default_rng(11)
    w0 = rng.standard_normal((3, 4)) * np.sqrt(2 / 3)
    a = np.sqrt(6 / (4 + 8))
    w_ih = rng.uniform(-a, a, size=(4, 8))
    a = np.sqrt(6 / (2 + 8))
    w_hh = rng.uniform(-a, a, size=(2, 8))
    a = np.sqrt(6 / 4)
    w2 = rng.uniform(-a, a, size=(2, 2))
    p = model.parameters()
    for got, want in [(p["0.weight"], w0), (p["1.w_ih"], w_ih), (p["1.w_hh"], w_hh),
                      (p["2.weight"], w2)]:
        np.testing.assert_array_equal(got, want)
    assert not p["0.bias"].any() and not p["1.b"].any()


def test_containers_initialise_children_from_one_generator():
    # as fastlib's containers: default seed 0, one generator for all children, so two equal
    # layers get different draws and the whole model equals the seed-0 draw sequence
    model = Sequential([Dense(2, 2), Dense(2, 2)])
    p = model.parameters()
    assert not np.array_equal(p["0.weight"], p["1.weight"])
    rng = np.random.default_rng(0)
    a = np.sqrt(6 / 4)
    np.testing.assert_array_equal(p["0.weight"], rng.uniform(-a, a, size=(2, 2)))
    np.testing.assert_array_equal(p["1.weight"], rng.uniform(-a, a, size=(2, 2)))
    with pytest.raises(ValueError, match="not both"):
        Parallel([Dense(2, 2)], seed=3, rng=np.random.default_rng(3))


def test_seed_and_rng_are_reproducible():
    a = from_config(ZOO["nested"][0]().get_config(), seed=3)
    b = from_config(ZOO["nested"][0]().get_config(), rng=np.random.default_rng(3))
    c = from_config(ZOO["nested"][0]().get_config(), seed=4)
    for k in a.parameters():
        assert np.array_equal(a.parameters()[k], b.parameters()[k])
    assert any(not np.array_equal(a.parameters()[k], c.parameters()[k]) for k in a.parameters()
               if k.endswith("weight"))


def test_he_and_xavier_scales():
    # statistical sanity on a large draw: He std sqrt(2/fan_in); Xavier bounded by its limit
    w = Dense(200, 300, "relu", seed=0).parameters()["weight"]
    assert abs(w.std() - np.sqrt(2 / 200)) < 0.02 * np.sqrt(2 / 200)  # 60000 draws: ~0.3% sd
    w = Dense(200, 300, "tanh", seed=0).parameters()["weight"]
    limit = np.sqrt(6 / 500)
    assert np.all(np.abs(w) <= limit) and w.max() > 0.99 * limit


# -- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,exc,words", [
    (lambda: Dense(3, 2, "rleu"), ValueError, "relu"),
    (lambda: Dense(0, 2), ValueError, "in_features"),
    (lambda: Dense(2.5, 2), TypeError, "in_features"),
    (lambda: MultiHeadAttention(6, 4), ValueError, "divide"),
    (lambda: Parallel([Dense(2, 2)], combine="sum"), ValueError, "concat"),
    (lambda: Sequential([]), ValueError, "at least one"),
    (lambda: Sequential(Dense(2, 2)), TypeError, "list"),
    (lambda: LayerNorm(3, eps=0.0), ValueError, "eps"),
    (lambda: Dense(2, 2, seed=1, rng=np.random.default_rng()), ValueError, "not both"),
    (lambda: from_config({"type": "Dnse", "in_features": 2, "out_features": 2}), ValueError,
     "Dense"),
    (lambda: from_config({"type": "dense", "in_features": 2, "out_features": 2}), ValueError,
     "'Dense'"),
    (lambda: from_config({"type": "Dense", "in_feature": 2, "out_features": 2}), ValueError,
     "in_features"),
    (lambda: from_config({"type": "Dense", "out_features": 2}), ValueError, "missing"),
    (lambda: from_config({"in_features": 2}), ValueError, "'type'"),
])
def test_bad_construction_is_explained(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


@pytest.mark.parametrize("model,x,words", [
    (Dense(3, 2), np.zeros((2, 4)), "3 features"),
    (RNN(2, 2), np.zeros((2, 2)), "3 dimensions"),
    (LSTM(2, 2), np.zeros((1, 3, 3)), "2 features"),
    (MultiHeadAttention(4, 2), np.zeros((1, 2, 3)), "4 features"),
    (Embedding(3, 2), np.array([0, 3]), "out of range"),
    (Embedding(3, 2), np.array([0.5]), "whole numbers"),
    (Dense(2, 2), np.array([[np.nan, 0.0]]), "NaN"),
    (Parallel([Dense(2, 2), Dense(2, 3)], combine="add"), np.zeros((1, 2)), "equal shapes"),
    (Softmax(axis=2), np.zeros((2, 2)), "axis"),
])
def test_bad_inputs_are_explained(model, x, words):
    with pytest.raises(ValueError, match=words):
        model(x)


def test_load_parameters_checks_names_shapes_and_values():
    model = Sequential([Dense(2, 3), LSTM(3, 2)])
    good = {k: np.ones(v.shape) for k, v in model.parameters().items()}
    with pytest.raises(ValueError, match="did you mean '1.w_ih'"):
        model.load_parameters({**good, "1.w_ihh": np.ones((3, 8))})
    with pytest.raises(ValueError, match="missing"):
        model.load_parameters({k: v for k, v in good.items() if k != "0.bias"})
    with pytest.raises(ValueError, match=r"shape \(3, 2\), expected \(2, 3\)"):
        model.load_parameters({**good, "0.weight": np.ones((3, 2))})
    with pytest.raises(ValueError, match="not finite"):
        model.load_parameters({**good, "0.bias": np.array([0.0, np.inf, 0.0])})
    with pytest.raises(TypeError, match="dtype"):
        model.load_parameters({**good, "0.bias": np.array(["a", "b", "c"])})
    before = {k: v.copy() for k, v in model.parameters().items()}
    with pytest.raises(ValueError):  # a failed load changes nothing
        model.load_parameters({**good, "1.b": np.ones(3)})
    assert all(np.array_equal(before[k], v) for k, v in model.parameters().items())
    model.load_parameters({"0.bias": np.full(3, 2.0)}, strict=False)
    assert np.all(model.parameters()["0.bias"] == 2.0)
