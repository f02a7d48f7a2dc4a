"""reflib's losses, value_and_grad and train_step.

Independent sources: PyTorch float64 autograd for losses and gradients; 50-digit central finite
differences for the exact path; hand-written update equations (DataCode's table, and the NAG
look-ahead rewrite derived by hand) for the optimizers.
"""
from __future__ import annotations

import warnings

import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import reflib
from reflib import optim
from reflib.losses import loss_and_grad
from reflib.models import LSTM, Dense, Sequential, from_config

DPS = 50
# NOTE: float64 losses and gradients of a two-layer tanh MLP (a few dozen well-conditioned
# flops per entry, log-sum-exp for the cross-entropies) agree with PyTorch's float64 to a few
# ulps; 1e-12 normwise leaves ~1e4 ulps of room and catches any wrong formula or scaling.
RTOL = 1e-12


def close(a, b, rtol=RTOL):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape
    err = float(np.max(np.abs(a - b))) / max(1.0, float(np.max(np.abs(b))))
    assert err <= rtol, f"normwise error {err:.3e} > {rtol:.0e}"


def mlp(n_out, last="linear", seed=0):
    model = Sequential([Dense(3, 4, "tanh"), Dense(4, n_out, last)])
    rng = np.random.default_rng(seed)
    model.load_parameters({k: rng.standard_normal(v.shape) for k, v in model.parameters().items()})
    return model


def torch_mlp_loss(model, x, y, loss_type):
    """The same MLP and loss in PyTorch float64; returns (loss, {name: grad})."""
    p = {k: torch.tensor(v, requires_grad=True) for k, v in model.parameters().items()}
    h = torch.tanh(torch.tensor(x) @ p["0.weight"] + p["0.bias"])
    z = h @ p["1.weight"] + p["1.bias"]
    yt = torch.tensor(np.asarray(y, dtype=np.float64))
    if model.layers[1].activation == "sigmoid":
        z = torch.sigmoid(z)
    if loss_type == "mse":
        loss = F.mse_loss(z, yt)
    elif loss_type == "cross_entropy":
        loss = F.cross_entropy(z, yt.reshape(-1).long())
    elif loss_type == "categorical_cross_entropy":
        loss = F.cross_entropy(z, yt)  # probability targets
    elif loss_type == "binary_cross_entropy":
        loss = F.binary_cross_entropy(z, yt)
    else:
        loss = F.binary_cross_entropy_with_logits(z, yt)
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in p.items()}


def cases():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 3))
    labels = np.array([[0], [2], [1], [2], [0]])
    soft = rng.random((5, 3))
    return x, {
        "mse": (mlp(2), rng.standard_normal((5, 2))),
        "cross_entropy": (mlp(3), labels),
        "categorical_cross_entropy": (mlp(3), soft / soft.sum(axis=1, keepdims=True)),
        "binary_cross_entropy": (mlp(2, "sigmoid"), rng.random((5, 2))),
        "binary_cross_entropy_with_logits": (mlp(2), (rng.random((5, 2)) > 0.5) * 1.0),
    }


LOSSES = list(cases()[1])


@pytest.mark.parametrize("loss_type", LOSSES)
def test_value_and_grad_matches_pytorch(loss_type):
    x, table = cases()
    model, y = table[loss_type]
    loss, grads = reflib.value_and_grad(model, x, y, loss_type)
    want_loss, want = torch_mlp_loss(model, x, y, loss_type)
    assert isinstance(loss, float)
    close(loss, want_loss)
    assert list(grads) == list(model.parameters())
    for k in want:
        close(grads[k], want[k])


@pytest.mark.parametrize("loss_type", LOSSES)
def test_exact_value_and_grad_matches_finite_differences(loss_type):
    # NOTE: h = 1e-15 at 50 digits: truncation ~1e-31, rounding ~1e-35; 1e-25 is a wide margin.
    x, table = cases()
    model, y = table[loss_type]
    with mpmath.workdps(DPS):
        loss, grads = reflib.value_and_grad(model, x, y, loss_type, dps=DPS)
        assert isinstance(loss, mpmath.mpf)
        h = mpmath.mpf("1e-15")
        rng = np.random.default_rng(1)
        base = {k: np.array([mpmath.mpf(v) for v in a.flat], dtype=object).reshape(a.shape)
                for k, a in model.parameters().items()}
        for name, arr in base.items():
            for flat in rng.choice(arr.size, size=min(arr.size, 3), replace=False):
                idx = np.unravel_index(flat, arr.shape)
                vals = []
                for sign in (1, -1):
                    p = arr.copy()
                    p[idx] += sign * h
                    clone = from_config(model.get_config())
                    clone.load_parameters({**base, name: p})
                    vals.append(reflib.value_and_grad(clone, x, y, loss_type, dps=DPS)[0])
                fd = (vals[0] - vals[1]) / (2 * h)
                assert abs(grads[name][idx] - fd) <= mpmath.mpf("1e-25") * max(1, abs(fd)), name


@pytest.mark.parametrize("loss_type", LOSSES)
def test_loss_and_grad_matches_pytorch(loss_type):
    rng = np.random.default_rng(3)
    pred = rng.standard_normal((4, 3))
    if loss_type == "binary_cross_entropy":
        pred = 1 / (1 + np.exp(-pred))
    target = {"mse": rng.standard_normal((4, 3)), "cross_entropy": np.array([2, 0, 1, 1]),
              "categorical_cross_entropy": np.eye(3)[[1, 0, 2, 2]],
              "binary_cross_entropy": rng.random((4, 3)),
              "binary_cross_entropy_with_logits": rng.random((4, 3))}[loss_type]
    loss, grad = loss_and_grad(loss_type, pred, target)
    p = torch.tensor(pred, requires_grad=True)
    t = torch.tensor(target)
    fn = {"mse": F.mse_loss, "cross_entropy": lambda a, b: F.cross_entropy(a, b.long()),
          "categorical_cross_entropy": F.cross_entropy,
          "binary_cross_entropy": F.binary_cross_entropy,
          "binary_cross_entropy_with_logits": F.binary_cross_entropy_with_logits}[loss_type]
    want = fn(p, t)
    want.backward()
    close(loss, want.item())
    close(grad, p.grad.numpy())


def test_value_and_grad_on_a_recurrent_model_matches_pytorch():
    model = Sequential([LSTM(2, 3), Dense(3, 2)])
    rng = np.random.default_rng(5)
    model.load_parameters({k: rng.standard_normal(v.shape) for k, v in model.parameters().items()})
    x, y = rng.standard_normal((2, 4, 2)), rng.standard_normal((2, 2))
    loss, grads = reflib.value_and_grad(model, x, y, "mse")
    p = {k: torch.tensor(v, requires_grad=True) for k, v in model.parameters().items()}
    h = c = torch.zeros(2, 3, dtype=torch.float64)
    xt = torch.tensor(x)
    for t in range(4):  # the LSTM written out (gate order i, f, g, o), layouts as documented
        gates = xt[:, t] @ p["0.w_ih"] + h @ p["0.w_hh"] + p["0.b"]
        i, f, g, o = gates.split(3, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
    want = F.mse_loss(h @ p["1.weight"] + p["1.bias"], torch.tensor(y))
    want.backward()
    close(loss, want.item())
    for k in p:
        close(grads[k], p[k].grad.numpy())


def test_unreached_parameters_get_exact_zeros():
    from reflib.models import RNN
    model = Sequential([RNN(2, 2), Dense(2, 1)])
    _, grads = reflib.value_and_grad(model, np.ones((3, 1, 2)), np.ones((3, 1)), "mse")
    assert np.array_equal(grads["0.w_hh"], np.zeros((2, 2)))
    _, grads = reflib.value_and_grad(model, np.ones((3, 1, 2)), np.ones((3, 1)), "mse", dps=30)
    assert all(v == 0 and isinstance(v, mpmath.mpf) for v in grads["0.w_hh"].flat)


# -- optimizers ----------------------------------------------------------------------------------

def hand_update(name, w, g, s, t, hp):
    """DataCode's documented optimizer table written out in float64, NAG in its look-ahead form."""
    lr = hp["lr"]
    if name == "SGD":
        return w - lr * g, {}
    if name == "Momentum":
        v = hp["beta"] * s["v"] + (1 - hp["beta"]) * g
        return w - lr * v, {"v": v}
    if name == "NAG":
        # with w~ = w - beta v: v' = beta v + lr g(w~), w' = w - v'
        # => w~' = w' - beta v' = w~ + beta v - (1 + beta) v'
        v = hp["beta"] * s["v"] + lr * g
        return w + hp["beta"] * s["v"] - (1 + hp["beta"]) * v, {"v": v}
    if name == "Adagrad":
        G = s["G"] + g * g
        return w - lr / np.sqrt(G + hp["eps"]) * g, {"G": G}
    if name == "RMSprop":
        E = hp["gamma"] * s["E"] + (1 - hp["gamma"]) * g * g
        return w - lr / np.sqrt(E + hp["eps"]) * g, {"E": E}
    m = hp["beta1"] * s["m"] + (1 - hp["beta1"]) * g
    v = hp["beta2"] * s["v"] + (1 - hp["beta2"]) * g * g
    mh, vh = m / (1 - hp["beta1"] ** t), v / (1 - hp["beta2"] ** t)
    step = mh / (np.sqrt(vh) + hp["eps"])
    if name == "AdamW":
        step = step + hp["weight_decay"] * w
    return w - lr * step, {"m": m, "v": v}


OPTIMIZERS = ["SGD", "Momentum", "NAG", "Adagrad", "RMSprop", "Adam", "AdamW"]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_train_step_is_value_and_grad_then_the_table_update(name):
    # NOTE: three steps of each rule in float64 against the table written out by hand: each
    # update is a handful of flops (Adagrad/RMSprop/Adam divide by sqrt of a sum of squares,
    # well conditioned here), so 1e-12 normwise is ~1e4 ulps of room.
    x, table = cases()
    model, y = table["cross_entropy"]
    before = {k: v.copy() for k, v in model.parameters().items()}
    hp = optim.hyperparameters(name, lr=0.05)
    state, params = None, dict(model.parameters())
    hand_state = {k: {var: np.zeros_like(v) for var in optim.state_variables(name)}
                  for k, v in params.items()}
    hand = dict(params)
    for t in (1, 2, 3):
        work = from_config(model.get_config())
        work.load_parameters(params)
        loss, grads, params, state = reflib.train_step(work, x, y, "cross_entropy", name, state,
                                                       lr=0.05)
        assert state["t"] == t
        _, hand_grads = torch_mlp_loss(from_twin(model, hand), x, y, "cross_entropy")
        for k in hand:
            hand[k], hand_state[k] = hand_update(name, hand[k], hand_grads[k], hand_state[k], t, hp)
            close(params[k], hand[k])
            for var in optim.state_variables(name):
                close(state["slots"][var][k], hand_state[k][var])
    # pure: the model it was given is unchanged
    assert all(np.array_equal(before[k], v) for k, v in model.parameters().items())


def from_twin(model, params):
    clone = from_config(model.get_config())
    clone.load_parameters(params)
    return clone


def test_nag_look_ahead_equals_datacode_form():
    # DataCode: v' = beta v + lr grad(w - beta v); w' = w - v'. Run it directly (gradients from
    # PyTorch at w - beta v) and check that train_step's parameters are always w - beta v.
    x, table = cases()
    model, y = table["mse"]
    beta, lr = 0.9, 0.1
    w = {k: v.copy() for k, v in model.parameters().items()}
    v = {k: np.zeros_like(a) for k, a in w.items()}
    state, shifted = None, dict(w)  # v = 0 at the start, so w~ = w
    for _ in range(3):
        look = {k: w[k] - beta * v[k] for k in w}
        _, g = torch_mlp_loss(from_twin(model, look), x, y, "mse")
        v = {k: beta * v[k] + lr * g[k] for k in w}
        w = {k: w[k] - v[k] for k in w}
        _, _, shifted, state = reflib.train_step(from_twin(model, shifted), x, y, "mse", "nag",
                                                 state, lr=lr, beta=beta)
        for k in w:
            close(shifted[k], w[k] - beta * v[k])


def test_train_step_equals_spec_engine_step_on_value_and_grad_exactly():
    import spec
    x, table = cases()
    model, y = table["mse"]
    loss, grads = reflib.value_and_grad(model, x, y, "mse", dps=DPS)
    state = optim.init_state("Adam", model.parameters(), dps=DPS)
    state["t"] = 4
    for k, a in model.parameters().items():
        state["slots"]["m"][k] = np.full(a.shape, mpmath.mpf("0.25"), dtype=object)
    loss2, grads2, new, new_state = reflib.train_step(model, x, y, "mse", "ADAM", state, dps=DPS,
                                                     beta1=0.8)
    assert loss2 == loss and new_state["t"] == 5
    for k, w in model.parameters().items():
        want_w, want_s = spec.engine_step("Adam", w, grads[k], {"m": state["slots"]["m"][k],
                                                         "v": state["slots"]["v"][k]}, 5,
                                   dps=DPS, lr=0.001, beta1=0.8, beta2=0.999, eps=1e-8)
        assert all(a == b for a, b in zip(new[k].flat, np.asarray(want_w).flat))
        assert all(a == b for a, b in zip(new_state["slots"]["m"][k].flat,
                                          np.asarray(want_s["m"]).flat))


def test_apply_updates_the_model_and_explicit_t_is_used():
    x, table = cases()
    model, y = table["mse"]
    _, _, new, state = reflib.train_step(model, x, y, "mse", "Adam", None, t=7, apply=True)
    assert state["t"] == 7
    assert all(np.array_equal(new[k], v) for k, v in model.parameters().items())


# -- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("loss_type,y,words", [
    ("cross_entropy", np.eye(3)[[0, 1, 2, 0, 1]], "categorical_cross_entropy"),
    ("cross_entropy", np.array([[0], [3], [1], [0], [0]]), "out of range"),
    ("cross_entropy", np.array([[0.5], [1], [1], [0], [0]]), "whole-number"),
    ("categorical_cross_entropy", np.array([[0], [2], [1], [2], [0]]), "use cross_entropy"),
    ("categorical_cross_entropy", np.ones((5, 3)), "summing to 1"),
    ("mse", np.zeros((5,)), "reshape"),
    ("mse", np.full((5, 3), np.nan), "NaN"),
    ("crossentropy", np.zeros((5, 1)), "did you mean 'cross_entropy'"),
    ("binary_cross_entropy_with_logits", np.full((5, 3), 2.0), r"\[0, 1\]"),
    ("binary_cross_entropy", np.full((5, 3), 0.5), "sigmoid"),
])
def test_bad_targets_are_explained(loss_type, y, words):
    x, table = cases()
    with pytest.raises(ValueError, match=words):
        reflib.value_and_grad(table["cross_entropy"][0], x, y, loss_type)


def test_sparse_cross_entropy_warns_and_is_cross_entropy():
    x, table = cases()
    model, y = table["cross_entropy"]
    with pytest.warns(DeprecationWarning, match="cross_entropy"):
        old = reflib.value_and_grad(model, x, y, "sparse_cross_entropy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = reflib.value_and_grad(model, x, y, "cross_entropy")
    assert old[0] == new[0]


@pytest.mark.parametrize("kwargs,exc,words", [
    ({"optimizer": "Adamw2"}, KeyError, "AdamW"),  # spec.UnknownOptimizerError
    ({"optimizer": "SGD", "beta": 0.9}, ValueError, "no hyperparameter 'beta'"),
    ({"optimizer": "Adam", "lr": -1.0}, ValueError, "lr must be"),
    ({"optimizer": "Adam", "beta1": float("nan")}, ValueError, "finite"),
    ({"optimizer": "Adam", "t": 0}, ValueError, ">= 1"),
    ({"optimizer": "SGD", "state": {"t": 0, "slots": {"m": {}}}}, ValueError, "state"),
    ({"optimizer": "SGD", "state": [1]}, TypeError, "state"),
])
def test_bad_optimizer_arguments_are_explained(kwargs, exc, words):
    x, table = cases()
    model, y = table["mse"]
    kwargs = dict(kwargs)
    opt, state = kwargs.pop("optimizer"), kwargs.pop("state", None)
    with pytest.raises(exc, match=words):
        reflib.train_step(model, x, y, "mse", opt, state, **kwargs)


def test_step_checks_gradient_names():
    params = {"w": np.ones(2)}
    with pytest.raises(ValueError, match="missing"):
        optim.step("SGD", params, {"v": np.ones(2)})
    with pytest.raises(ValueError, match="shape"):
        optim.step("SGD", params, {"w": np.ones(3)})


def test_foreign_model_is_evaluated_through_its_twin_and_apply_is_refused():
    x, table = cases()
    model, y = table["mse"]

    class Fake:
        def get_config(self):
            return model.get_config()

        def parameters(self):
            return {k: v.astype(np.float32) for k, v in model.parameters().items()}

    ref = from_twin(model, Fake().parameters())
    assert reflib.value_and_grad(Fake(), x, y, "mse")[0] == reflib.value_and_grad(ref, x, y,
                                                                                 "mse")[0]
    with pytest.raises(ValueError, match="apply=True"):
        reflib.train_step(Fake(), x, y, "mse", "SGD", None, apply=True)
    with pytest.raises(TypeError, match="get_config"):
        reflib.value_and_grad(object(), x, y, "mse")
