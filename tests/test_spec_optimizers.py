"""spec.step / spec.engine_step against the DataCode table written out by hand in mpmath, the
NAG equivalence on a real objective, and prove_optimizers rejecting planted mistakes."""
import dataclasses

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import spec

DPS = 50
# Both sides evaluate the same arithmetic at >= 50 digits; 1e-44 leaves room for the few
# roundings of a well-conditioned scalar update (|w|, |g|, |state| <= 2, eps >= 1e-8).
TOL = mpmath.mpf(10)**-44

DEFAULTS = {  # docs/CONTRACTS.md
    "SGD": {"lr": 0.01},
    "Momentum": {"lr": 0.01, "beta": 0.9},
    "NAG": {"lr": 0.01, "beta": 0.9},
    "Adagrad": {"lr": 0.01, "eps": 1e-8},
    "RMSprop": {"lr": 0.001, "gamma": 0.9, "eps": 1e-8},
    "Adam": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
    "AdamW": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
}
STATE = {"SGD": (), "Momentum": ("v",), "NAG": ("v",), "Adagrad": ("G",), "RMSprop": ("E",),
         "Adam": ("m", "v"), "AdamW": ("m", "v")}


def reference(name, w, g, s, t, h):
    """One scalar step from the table (DataCode's), written independently."""
    f = mpmath.mpf
    lr = f(h["lr"])
    if name == "SGD":
        return w - lr * g, {}
    if name == "Momentum":
        v = f(h["beta"]) * s["v"] + (1 - f(h["beta"])) * g
        return w - lr * v, {"v": v}
    if name == "NAG":
        v = f(h["beta"]) * s["v"] + lr * g
        return w - v, {"v": v}
    if name == "Adagrad":
        G = s["G"] + g * g
        return w - lr / mpmath.sqrt(G + f(h["eps"])) * g, {"G": G}
    if name == "RMSprop":
        E = f(h["gamma"]) * s["E"] + (1 - f(h["gamma"])) * g * g
        return w - lr / mpmath.sqrt(E + f(h["eps"])) * g, {"E": E}
    b1, b2, eps = f(h["beta1"]), f(h["beta2"]), f(h["eps"])
    m = b1 * s["m"] + (1 - b1) * g
    v = b2 * s["v"] + (1 - b2) * g * g
    mh, vh = m / (1 - b1**t), v / (1 - b2**t)
    upd = mh / (mpmath.sqrt(vh) + eps)
    if name == "AdamW":
        upd = upd + f(h["weight_decay"]) * w
    return w - lr * upd, {"m": m, "v": v}


@st.composite
def steps(draw):
    name = draw(st.sampled_from(list(DEFAULTS)))
    shape = draw(st.sampled_from([(), (3,), (2, 2)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w, g = rng.uniform(-2, 2, shape), rng.uniform(-2, 2, shape)
    state = {k: (rng.uniform(0, 2, shape) if k in ("G", "E") or (k == "v" and "Adam" in name)
                 else rng.uniform(-2, 2, shape)) for k in STATE[name]}
    hyper = {}
    for key in DEFAULTS[name]:
        if draw(st.booleans()):
            hyper[key] = {"lr": 0.1, "beta": 0.5, "gamma": 0.75, "beta1": 0.8, "beta2": 0.99,
                          "eps": 1e-6, "weight_decay": 0.1}[key]
    return name, w, g, state, draw(st.integers(1, 50)), hyper


@given(steps())
def test_step_matches_the_table(case):
    name, w, g, state, t, hyper = case
    new_w, new_state = spec.step(name, w, g, state, t, dps=DPS, **hyper)
    h = {**DEFAULTS[name], **hyper}
    with mpmath.workdps(DPS + 10):
        for idx in np.ndindex(*np.shape(w)):
            s = {k: mpmath.mpf(float(a[idx])) for k, a in state.items()}
            ew, es = reference(name, mpmath.mpf(float(w[idx])), mpmath.mpf(float(g[idx])), s, t, h)
            assert abs(new_w[idx] - ew) <= TOL
            for k in STATE[name]:
                assert abs(new_state[k][idx] - es[k]) <= TOL
    assert set(new_state) == set(STATE[name])


def test_defaults_state_names_and_case_insensitive_names():
    for name, defaults in DEFAULTS.items():
        opt = spec.OPTIMIZERS[name]
        assert dict(opt.hyper) == defaults and opt.state == STATE[name]
    a = spec.step("adamw", [1.0], [0.5], None, 1)
    b = spec.step("ADAMW", [1.0], [0.5], {"m": [0.0], "v": [0.0]}, 1)
    assert a[0][0] == b[0][0]


def test_missing_state_is_zeros_and_first_adam_step_is_lr_sign_g():
    # With zero state and t = 1, m̂ = g and v̂ = g², so w moves by lr·g/(|g| + eps).
    w, s = spec.step("Adam", [1.0, -1.0], [0.5, -0.25], None, 1, lr=0.1, eps=0.0)
    assert [float(v) for v in w] == [0.9, -0.9]
    assert float(s["m"][0]) == pytest.approx(0.05, rel=1e-15)


def test_adam_bias_correction_gives_the_closed_form_on_constant_gradients():
    w, state = np.array([0.3]), None
    g, lr, eps = 0.7, 0.05, 1e-8
    for t in range(1, 8):
        w, state = spec.step("Adam", w, [g], state, t, lr=lr, eps=eps)
    with mpmath.workdps(50):
        expected = mpmath.mpf(0.3) - 7 * mpmath.mpf(lr) * mpmath.mpf(g) / (mpmath.mpf(g)
                                                                          + mpmath.mpf(eps))
        # Seven steps, each a few 50-digit roundings: 1e-45.
        assert abs(w[0] - expected) < mpmath.mpf(10)**-45


def _quadratic_grad(w):
    """∇f for f(w) = Σ (w - c)² ⋅ (1 + i) / 2 + 0.1·Σ w⁴ (an arbitrary smooth objective)."""
    c = np.array([0.5, -1.0, 2.0], dtype=object)
    k = np.array([1, 2, 3], dtype=object)
    return k * (w - c) + np.array([mpmath.mpf("0.4")] * 3, dtype=object) * w**3


def test_nag_engine_form_follows_the_table_trajectory():
    """Run NAG literally (gradient at w − βv) and in the engine form (gradient at the stored
    w̃): after every step v agrees and w̃ = w − βv, to 50 digits."""
    lr, beta = 0.05, 0.9
    with mpmath.workdps(60):
        w = np.array([mpmath.mpf(x) for x in (1.0, 0.5, -0.25)], dtype=object)
        v = np.array([mpmath.mpf(0)] * 3, dtype=object)
        ws, vs = w.copy(), v.copy()
        b = mpmath.mpf(beta)
        for t in range(1, 11):
            w, st_ = spec.step("NAG", w, _quadratic_grad(w - b * v), {"v": v}, t, lr=lr, beta=beta)
            ws, sts = spec.engine_step("NAG", ws, _quadratic_grad(ws), {"v": vs}, t, lr=lr,
                                       beta=beta)
            v, vs = st_["v"], sts["v"]
            for i in range(3):
                # Ten steps of the same arithmetic in two arrangements: 1e-40.
                assert abs(vs[i] - v[i]) < mpmath.mpf(10)**-40
                assert abs(ws[i] - (w[i] - b * v[i])) < mpmath.mpf(10)**-40


def test_engine_step_is_step_for_the_other_optimizers():
    for name in DEFAULTS:
        if name == "NAG":
            continue
        a = spec.step(name, [0.5, -1.0], [0.25, 2.0], None, 3)
        b = spec.engine_step(name, [0.5, -1.0], [0.25, 2.0], None, 3)
        assert list(a[0]) == list(b[0])


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: spec.step("Adma", [1.0], [1.0], None, 1), spec.UnknownOptimizerError,
     "did you mean 'Adam'"),
    (lambda: spec.step("SGD", [1.0], [1.0], None, 1, learning_rate=0.1), ValueError,
     "unknown hyperparameter 'learning_rate'"),
    (lambda: spec.step("Momentum", [1.0], [1.0], None, 1, momentum=0.9), ValueError,
     "it takes lr, beta"),
    (lambda: spec.step("SGD", [1.0], [1.0, 2.0], None, 1), ValueError, "shaped like the param"),
    (lambda: spec.step("Adam", [1.0], [1.0], {"m": [0.0, 0.0]}, 1), ValueError, "state 'm'"),
    (lambda: spec.step("Adam", [1.0], [1.0], {"s": [0.0]}, 1), ValueError,
     "unknown state variable 's'"),
    (lambda: spec.step("Adam", [1.0], [1.0], None, 0), ValueError, "t is the step count"),
    (lambda: spec.step("Adam", [1.0], [1.0], None, 1.5), ValueError, "t is the step count"),
    (lambda: spec.step("Adam", [1.0], [1.0], None, 1, beta1=1.0), ValueError, "beta1"),
    (lambda: spec.step("SGD", [1.0], [1.0], None, 1, lr=float("nan")), ValueError, "finite"),
    (lambda: spec.step("SGD", [1.0], [np.inf], None, 1), ValueError, "NaN or Inf"),
    (lambda: spec.step("SGD", ["a"], [1.0], None, 1), TypeError, "dtype"),
    (lambda: spec.step("Adagrad", [1.0], [0.0], None, 1, eps=0.0), ValueError,
     "division by zero"),
])
def test_step_errors(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_unknown_optimizer_error_is_a_key_error_with_a_plain_message():
    with pytest.raises(KeyError) as info:
        spec.step("nesterov", [1.0], [1.0], None, 1)
    assert str(info.value).startswith("unknown optimizer 'nesterov'")


def test_prove_optimizers_proves_all():
    results = spec.prove_optimizers()
    assert [r.op for r in results] == list(spec.OPTIMIZERS)
    assert all(r.ok for r in results), [(r.op, r.detail) for r in results if not r.ok]
    # a general step, decided by SymPy (not only at sampled points)
    assert all(r.method == "symbolic" and r.verdict == "proven" for r in results)
    assert all("one general step" in r.shapes[0] for r in results)


def _replace(name, **kw):
    return dataclasses.replace(spec.OPTIMIZERS[name], **kw)


def _adam_like(m_rule, v_rule, m_hat, v_hat, step=None, decay=None):
    """An Adam / AdamW update assembled from the given pieces (each a small lambda)."""
    def update(M, w, g, t, m, v, lr, beta1, beta2, eps, weight_decay=None):
        m_new, v_new = m_rule(g, m, beta1, beta2), v_rule(g, v, beta1, beta2)
        mh, vh = m_hat(m_new, t, beta1, beta2), v_hat(v_new, t, beta1, beta2)
        adam = (step or (lambda M, mh, vh, eps: mh / (M.sqrt(vh) + eps)))(M, mh, vh, eps)
        w_new = w - lr * adam if decay is None else decay(w, lr, adam, weight_decay)
        return w_new, {"m": m_new, "v": v_new}
    return update


M1 = lambda g, m, b1, b2: b1 * m + (1 - b1) * g                 # noqa: E731 (the right pieces)
V2 = lambda g, v, b1, b2: b2 * v + (1 - b2) * g**2               # noqa: E731
MH = lambda m, t, b1, b2: m / (1 - b1**t)                        # noqa: E731
VH = lambda v, t, b1, b2: v / (1 - b2**t)                        # noqa: E731
RIGHT_DECAY = lambda w, lr, adam, wd: w - lr * (adam + wd * w)   # noqa: E731


def _adamw(**pieces):
    parts = dict(m_rule=M1, v_rule=V2, m_hat=MH, v_hat=VH, decay=RIGHT_DECAY)
    parts.update(pieces)
    return _replace("AdamW", update=_adam_like(**parts))


def _adam(**pieces):
    parts = dict(m_rule=M1, v_rule=V2, m_hat=MH, v_hat=VH)
    parts.update(pieces)
    update = _adam_like(**parts)
    return _replace("Adam", update=lambda M, w, g, t, m, v, lr, beta1, beta2, eps: update(
        M, w, g, t, m, v, lr, beta1, beta2, eps))


# Each a plausible slip in the stated update. Three of them (betas swapped, no moving averages,
# no first-moment average) agree with the right Adam on three steps of a constant gradient from
# zero state, the check this proof replaced, which passed them: only a general step (any state,
# any t) tells them apart.
PLANTED = {
    "Adam, beta1 and beta2 swapped": _adam(
        m_rule=lambda g, m, b1, b2: b2 * m + (1 - b2) * g,
        v_rule=lambda g, v, b1, b2: b1 * v + (1 - b1) * g**2,
        m_hat=lambda m, t, b1, b2: m / (1 - b2**t), v_hat=lambda v, t, b1, b2: v / (1 - b1**t)),
    "Adam without moving averages": _adam(
        m_rule=lambda g, m, b1, b2: g, v_rule=lambda g, v, b1, b2: g**2,
        m_hat=lambda m, t, b1, b2: m, v_hat=lambda v, t, b1, b2: v),
    "Adam without the first moment's average": _adam(m_rule=lambda g, m, b1, b2: g,
                                                     m_hat=lambda m, t, b1, b2: m),
    "Adam, bias correction with power t + 1": _adam(
        m_hat=lambda m, t, b1, b2: m / (1 - b1**(t + 1))),
    "Adam, v corrected with beta1": _adam(v_hat=lambda v, t, b1, b2: v / (1 - b1**t)),
    "Adam without v's bias correction": _adam(v_hat=lambda v, t, b1, b2: v),
    "Adam without any bias correction": _adam(m_hat=lambda m, t, b1, b2: m,
                                             v_hat=lambda v, t, b1, b2: v),
    "Adam with eps inside the root": _adam(step=lambda M, mh, vh, eps: mh / M.sqrt(vh + eps)),
    "AdamW without weight decay": _adamw(decay=lambda w, lr, adam, wd: w - lr * adam),
    "AdamW decay without the rate": _adamw(decay=lambda w, lr, adam, wd: w - lr * adam - wd * w),
    "AdamW decay of the updated weights": _adamw(
        decay=lambda w, lr, adam, wd: (w - lr * adam) * (1 - lr * wd)),
    "AdamW decay coupled (added to the gradient)": _replace(
        "AdamW", update=lambda M, w, g, t, m, v, lr, beta1, beta2, eps, weight_decay:
        spec.OPTIMIZERS["Adam"].update(M, w, g + weight_decay * w, t, m, v, lr, beta1, beta2,
                                       eps)),
    "SGD ascending": _replace("SGD", update=lambda M, w, g, lr: (w + lr * g, {})),
    "Momentum without (1 - beta)": _replace(
        "Momentum", update=lambda M, w, g, v, lr, beta: (w - lr * (beta * v + g),
                                                         {"v": beta * v + g})),
    "Momentum without the moving average": _replace(
        "Momentum", update=lambda M, w, g, v, lr, beta: (w - lr * (1 - beta) * g,
                                                         {"v": (1 - beta) * g})),
    "Momentum stepping with the old velocity": _replace(
        "Momentum", update=lambda M, w, g, v, lr, beta: (w - lr * v,
                                                         {"v": beta * v + (1 - beta) * g})),
    "NAG velocity sign": _replace(
        "NAG", update=lambda M, w, g, v, lr, beta: (w - (beta * v - lr * g),
                                                    {"v": beta * v - lr * g})),
    "NAG engine form without the look-ahead correction": _replace(
        "NAG", engine_update=lambda M, w, g, v, lr, beta: (w - (beta * v + lr * g),
                                                           {"v": beta * v + lr * g})),
    "Adagrad without accumulation": _replace(
        "Adagrad", update=lambda M, w, g, G, lr, eps: (w - lr / M.sqrt(g**2 + eps) * g,
                                                       {"G": g**2})),
    "Adagrad with eps outside the root": _replace(
        "Adagrad", update=lambda M, w, g, G, lr, eps: (w - lr / (M.sqrt(G + g**2) + eps) * g,
                                                       {"G": G + g**2})),
    "RMSprop, gamma and 1 - gamma swapped": _replace(
        "RMSprop", update=lambda M, w, g, E, lr, gamma, eps: (
            w - lr / M.sqrt((1 - gamma) * E + gamma * g**2 + eps) * g,
            {"E": (1 - gamma) * E + gamma * g**2})),
    "RMSprop stepping with the old average": _replace(
        "RMSprop", update=lambda M, w, g, E, lr, gamma, eps: (
            w - lr / M.sqrt(E + eps) * g, {"E": gamma * E + (1 - gamma) * g**2})),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_prove_optimizers_rejects_planted_mistakes(case):
    (result,) = spec.prove_optimizers([PLANTED[case]])
    assert not result.ok, result
    assert "NOT equal to" in result.detail and "differs by" in result.detail, result.detail
    assert result.verdict.startswith("FAILED")


def test_the_proof_is_of_the_update_spec_step_runs(monkeypatch):
    """Swap beta1 and beta2 in the registry itself: spec.step now runs the broken formula (its
    numbers change), and the proof of "Adam" by name fails."""
    import spec.optimizers as so

    broken = PLANTED["Adam, beta1 and beta2 swapped"]
    before = spec.step("Adam", [0.5], [0.25], {"m": [0.1], "v": [0.2]}, 3, lr=0.1, beta1=0.5,
                       beta2=0.9)
    monkeypatch.setattr(so, "OPTIMIZERS", {**so.OPTIMIZERS, "Adam": broken})
    after = spec.step("Adam", [0.5], [0.25], {"m": [0.1], "v": [0.2]}, 3, lr=0.1, beta1=0.5,
                      beta2=0.9)
    assert abs(after[0][0] - before[0][0]) > 1e-3
    (result,) = spec.prove_optimizers(["Adam"])
    assert not result.ok and "NOT equal to Kingma & Ba" in result.detail


def test_symbolic_equations_are_available():
    eqs = spec.OPTIMIZERS["Adam"].symbolic()
    assert [str(e.lhs) for e in eqs] == ["m_new", "v_new", "w_new"]
    assert "beta1**t" in str(eqs[-1].rhs)
