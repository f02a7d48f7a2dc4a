"""fastlib.optim: the seven optimizers against exact arithmetic, spec, reflib and PyTorch.

Oracles, all independent of the code under test:

- ``exact_step`` below: DataCode's documented optimizer table transcribed by hand into mpmath at
  50 digits, element by element;
- ``spec.step`` / ``spec.engine_step`` (the registry's equations, mpmath);
- ``reflib.train.train_step`` (reference gradients on the exact tape, then spec's update);
- PyTorch's optimizers where the formulas coincide (a peer check, float64).

Tolerances (float64): one step evaluates each element with at most ~10 roundings, each of
relative size 2**-53 ≈ 1.1e-16, on quantities that do not cancel catastrophically except in
``w - step`` (bounded relative to max(|w|, |step|)); five steps compound to ~1e-14 normwise, so
the 1e-12 normwise relative bound holds with two orders of margin.
"""
from __future__ import annotations

import dataclasses

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings

import fastlib.optim as optim
from fastlib import config
from fastlib.kernels import optim as kopt
from reports.conformance.strategies import optimizer_cases

NAMES = ["SGD", "Momentum", "NAG", "Adagrad", "RMSprop", "Adam", "AdamW"]
DEFAULTS = {  # docs/CONTRACTS.md, typed in by hand
    "SGD": {"lr": 0.01},
    "Momentum": {"lr": 0.01, "beta": 0.9},
    "NAG": {"lr": 0.01, "beta": 0.9},
    "Adagrad": {"lr": 0.01, "eps": 1e-8},
    "RMSprop": {"lr": 0.001, "gamma": 0.9, "eps": 1e-8},
    "Adam": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
    "AdamW": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
}
STATE_NAMES = {"SGD": (), "Momentum": ("v",), "NAG": ("v",), "Adagrad": ("G",),
               "RMSprop": ("E",), "Adam": ("m", "v"), "AdamW": ("m", "v")}
# Non-default hyperparameters, so a kernel that ignored one would be caught.
CUSTOM = {
    "SGD": {"lr": 0.3},
    "Momentum": {"lr": 0.2, "beta": 0.7},
    "NAG": {"lr": 0.05, "beta": 0.8},
    "Adagrad": {"lr": 0.1, "eps": 1e-3},
    "RMSprop": {"lr": 0.01, "gamma": 0.8, "eps": 1e-4},
    "Adam": {"lr": 0.01, "beta1": 0.8, "beta2": 0.95, "eps": 1e-3},
    "AdamW": {"lr": 0.01, "beta1": 0.85, "beta2": 0.99, "eps": 1e-4, "weight_decay": 0.1},
}
K_STEPS = 5
F64_RTOL = 1e-12  # the engine's promised bound; see the module docstring for the margin


# ---------------------------------------------------------------------------------------------
# the hand-written exact oracle (the table form, NAG included)

def exact_step(name, w, g, state, t, h):
    """One step of DataCode's table on mpf scalars; returns (w, state)."""
    s = dict(state)
    lr = h["lr"]
    if name == "SGD":
        return w - lr * g, s
    if name == "Momentum":
        s["v"] = h["beta"] * s["v"] + (1 - h["beta"]) * g
        return w - lr * s["v"], s
    if name == "NAG":  # g is the gradient at w - beta v (the state before the step)
        s["v"] = h["beta"] * s["v"] + lr * g
        return w - s["v"], s
    if name == "Adagrad":
        s["G"] = s["G"] + g * g
        return w - lr / mpmath.sqrt(s["G"] + h["eps"]) * g, s
    if name == "RMSprop":
        s["E"] = h["gamma"] * s["E"] + (1 - h["gamma"]) * g * g
        return w - lr / mpmath.sqrt(s["E"] + h["eps"]) * g, s
    s["m"] = h["beta1"] * s["m"] + (1 - h["beta1"]) * g
    s["v"] = h["beta2"] * s["v"] + (1 - h["beta2"]) * g * g
    m_hat = s["m"] / (1 - h["beta1"] ** t)
    v_hat = s["v"] / (1 - h["beta2"] ** t)
    if name == "Adam":
        return w - lr * m_hat / (mpmath.sqrt(v_hat) + h["eps"]), s
    return w - lr * (m_hat / (mpmath.sqrt(v_hat) + h["eps"]) + h["weight_decay"] * w), s


def exact_trajectory(name, w0, grads, hyper):
    """Exact parameters (and state) after each step, for gradient arrays ``grads``.

    For NAG the returned parameters are the engine's shifted variable w - beta v, the
    quantity fastlib stores (spec.optimizers' NOTE).
    """
    h = {k: mpmath.mpf(v) for k, v in {**DEFAULTS[name], **hyper}.items()}
    flat_w = [mpmath.mpf(float(v)) for v in np.ravel(w0)]
    states = [{s: mpmath.mpf(0) for s in STATE_NAMES[name]} for _ in flat_w]
    out = []
    for t, g in enumerate(grads, start=1):
        for i, gi in enumerate(np.ravel(g)):
            flat_w[i], states[i] = exact_step(name, flat_w[i], mpmath.mpf(float(gi)), states[i],
                                              t, h)
        shown = [wi - h["beta"] * st_["v"] if name == "NAG" else wi
                 for wi, st_ in zip(flat_w, states)]
        out.append((shown, [dict(s) for s in states]))
    return out


def rel_err(fast, exact):
    """Normwise relative error ||fast - exact||_inf / ||exact||_inf, computed in mpmath."""
    fast = [mpmath.mpf(float(v)) for v in np.ravel(fast)]
    exact = [mpmath.mpf(v) for v in np.ravel(exact)]
    num = max(abs(a - b) for a, b in zip(fast, exact))
    den = max(abs(b) for b in exact)
    return float(num / den) if den else float(num)


def run_fast(name, w0, grads, hyper, dtype=np.float64):
    opt = optim.get(name, **hyper)
    params = {"p": np.array(w0, dtype=dtype)}
    state = opt.init(params)
    history = []
    for g in grads:
        state = opt.update(params, {"p": np.asarray(g, dtype=dtype)}, state)
        history.append((params["p"].copy(), state.copy()))
    return history, state


def _draws(seed, shape=(3, 4), k=K_STEPS):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), [rng.standard_normal(shape) for _ in range(k)]


# ---------------------------------------------------------------------------------------------
# names, defaults, configuration

def test_names_and_defaults_are_the_contract():
    for name in NAMES:
        opt = optim.get(name)
        assert opt.name == name
        assert opt.hyperparameters() == DEFAULTS[name]
        assert opt.state_names == STATE_NAMES[name]
        for spelling in (name.lower(), name.upper(), name.swapcase()):
            assert type(optim.get(spelling)) is type(opt)


def test_names_match_spec_registry():
    import spec

    assert {n.lower() for n in spec.OPTIMIZERS} == {n.lower() for n in NAMES}
    for name in NAMES:
        entry = spec.OPTIMIZERS[[k for k in spec.OPTIMIZERS if k.lower() == name.lower()][0]]
        assert dict(entry.hyper) == DEFAULTS[name]
        assert tuple(entry.state) == STATE_NAMES[name]


def test_objects_with_hyperparameters_and_config_round_trip():
    opt = optim.Adam(lr=1e-2, beta1=0.8)
    assert (opt.lr, opt.beta1, opt.beta2) == (1e-2, 0.8, 0.999)
    again = optim.from_config(opt.get_config())
    assert again == opt and again is not opt
    assert optim.get(opt) is opt
    assert optim.get(opt, lr=0.5).lr == 0.5 and opt.lr == 1e-2  # frozen: a copy
    assert opt.with_lr(0.25).lr == 0.25


@pytest.mark.parametrize("bad, err, words", [
    (lambda: optim.get("adamm"), ValueError, ["unknown optimizer", "Adam"]),
    (lambda: optim.get("rmsprob"), ValueError, ["RMSprop"]),
    (lambda: optim.get("adam", betta1=0.5), TypeError, ["beta1", "no hyperparameter"]),
    (lambda: optim.get(3), TypeError, ["optimizer must be a name"]),
    (lambda: optim.SGD(lr=0.0), ValueError, ["lr must be > 0"]),
    (lambda: optim.SGD(lr=float("nan")), ValueError, ["finite"]),
    (lambda: optim.Momentum(beta=1.0), ValueError, ["beta", "[0, 1)"]),
    (lambda: optim.Adam(beta2=-0.1), ValueError, ["beta2"]),
    (lambda: optim.Adagrad(eps=-1.0), ValueError, ["eps"]),
    (lambda: optim.AdamW(weight_decay=-1.0), ValueError, ["weight_decay"]),
    (lambda: optim.Adam(lr="0.1"), TypeError, ["real number"]),
    (lambda: optim.from_config({"lr": 0.1}), ValueError, ["name"]),
])
def test_bad_construction_is_a_clear_error(bad, err, words):
    with pytest.raises(err) as info:
        bad()
    for w in words:
        assert w in str(info.value)


def test_bad_update_inputs_are_clear_errors():
    opt = optim.Adam()
    params = {"a": np.zeros((2, 3)), "b": np.zeros(3)}
    state = opt.init(params)
    good = {"a": np.ones((2, 3)), "b": np.ones(3)}
    cases = [
        ({"a": np.ones((2, 3))}, ValueError, "missing gradients: ['b']"),
        ({**good, "c": np.ones(1)}, ValueError, "unknown gradients: ['c']"),
        ({**good, "b": np.ones(4)}, ValueError, "shape (4,)"),
        ({**good, "b": np.ones(3, np.float32)}, TypeError, "cast the gradient"),
    ]
    for grads, err, words in cases:
        with pytest.raises(err, match=None) as info:
            opt.update(params, grads, state)
        assert words in str(info.value)
    with pytest.raises(TypeError, match="OptState"):
        opt.update(params, good, {"m": {}})
    with pytest.raises(ValueError, match="init"):
        opt.update(params, good, optim.SGD().init(params))
    with pytest.raises(TypeError, match="float32 or float64"):
        opt.init({"a": np.zeros(3, np.int64)})
    with pytest.raises(TypeError, match="dict"):
        opt.init([np.zeros(3)])
    # nothing was changed by the failed calls
    assert state.t == 0 and not params["a"].any()


# ---------------------------------------------------------------------------------------------
# k = 5 steps against the oracles

@pytest.mark.parametrize("hyper_set", ["default", "custom"])
@pytest.mark.parametrize("name", NAMES)
def test_five_steps_equal_exact_table(name, hyper_set):
    hyper = {} if hyper_set == "default" else CUSTOM[name]
    w0, grads = _draws(NAMES.index(name) + 10 * (hyper_set == "custom"))
    history, state = run_fast(name, w0, grads, hyper)
    exact = exact_trajectory(name, w0, grads, hyper)
    assert state.t == K_STEPS
    for k, ((w_fast, st_fast), (w_exact, st_exact)) in enumerate(zip(history, exact), 1):
        assert rel_err(w_fast, w_exact) <= F64_RTOL, f"{name} step {k}"
        for s in STATE_NAMES[name]:
            assert rel_err(st_fast[s]["p"], [d[s] for d in st_exact]) <= F64_RTOL, (name, s, k)


@pytest.mark.parametrize("name", NAMES)
def test_five_steps_equal_spec_engine_step(name):
    import spec

    hyper = CUSTOM[name]
    w0, grads = _draws(100 + NAMES.index(name), shape=(4, 2))
    history, _ = run_fast(name, w0, grads, hyper)
    w, state = w0, {}
    for t, (g, (w_fast, st_fast)) in enumerate(zip(grads, history), start=1):
        w, state = spec.engine_step(name, w, g, state, t, dps=50, **hyper)
        assert rel_err(w_fast, w) <= F64_RTOL, f"{name} step {t}"
        for s in STATE_NAMES[name]:
            assert rel_err(st_fast[s]["p"], state[s]) <= F64_RTOL
        state = {k: np.array([float(v) for v in a.ravel()]).reshape(a.shape)
                 for k, a in state.items()}
        w = np.array([float(v) for v in w.ravel()]).reshape(w.shape)


def test_nag_equals_spec_table_form_on_the_shifted_variable():
    """NAG: fastlib stores w - beta v; spec.step runs DataCode's table on w (issue's NOTE)."""
    import spec

    hyper = CUSTOM["NAG"]
    beta = hyper["beta"]
    w0, grads = _draws(7)
    history, _ = run_fast("NAG", w0, grads, hyper)
    w, state = w0, {}
    for t, (g, (w_fast, st_fast)) in enumerate(zip(grads, history), start=1):
        w, state = spec.step("NAG", w, g, state, t, dps=50, **hyper)
        shifted = w - mpmath.mpf(beta) * state["v"]
        assert rel_err(w_fast, shifted) <= F64_RTOL
        assert rel_err(st_fast["v"]["p"], state["v"]) <= F64_RTOL


@pytest.mark.parametrize("name", NAMES)
def test_five_training_steps_equal_reflib_train_step(name):
    """Gradients from each engine's own model code, updates from each engine's optimizer."""
    import reflib.models
    from reflib.train import train_step

    import fastlib
    from fastlib.layers import from_config

    cfg = {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 3, "out_features": 4, "activation": "tanh"},
        {"type": "Dense", "in_features": 4, "out_features": 2, "activation": "linear"}]}
    fast = from_config(cfg, dtype=np.float64, seed=3)
    ref = reflib.models.from_config(cfg, seed=3)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 3))
    y = rng.standard_normal((6, 2))
    hyper = CUSTOM[name]
    opt = optim.get(name, **hyper)
    params = fast.parameters()
    state = opt.init(params)
    ref_state = None
    for t in range(1, K_STEPS + 1):
        _, grads = fastlib.value_and_grad(fast, x, y, "mse")
        state = opt.update(params, grads, state)
        _, _, new_params, ref_state = train_step(ref, x, y, "mse", name, ref_state, **hyper)
        ref.load_parameters(new_params)
        for key, value in new_params.items():
            # float64 gradients from two engines differ by summation order (~1e-16 relative),
            # which the steps carry along; 1e-12 is the promised bound.
            assert rel_err(params[key], value) <= F64_RTOL, (name, key, t)


# ---------------------------------------------------------------------------------------------
# PyTorch as a peer where the formulas coincide

def _torch_optimizer(torch, name, p, hyper):
    h = {**DEFAULTS[name], **hyper}
    if name == "SGD":
        return torch.optim.SGD([p], lr=h["lr"])
    if name == "Momentum":
        # DataCode's v = beta v + (1-beta) g is torch's dampening = beta; torch starts its buffer
        # at g (not 0) unless a buffer is already there, so a zero buffer is put in place.
        opt = torch.optim.SGD([p], lr=h["lr"], momentum=h["beta"], dampening=h["beta"])
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        return opt
    if name == "NAG":
        # torch's nesterov on stored weights is spec's engine form with buf = v / lr (constant lr)
        return torch.optim.SGD([p], lr=h["lr"], momentum=h["beta"], nesterov=True)
    if name == "Adagrad":
        # torch: w -= lr g / (sqrt(G) + eps); DataCode: w -= lr g / sqrt(G + eps): equal at eps=0
        return torch.optim.Adagrad([p], lr=h["lr"], eps=0.0)
    if name == "RMSprop":
        return torch.optim.RMSprop([p], lr=h["lr"], alpha=h["gamma"], eps=0.0)
    if name == "Adam":
        return torch.optim.Adam([p], lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"])
    return torch.optim.AdamW([p], lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                             weight_decay=h["weight_decay"])


@pytest.mark.parametrize("name", NAMES)
def test_five_steps_equal_pytorch_where_formulas_coincide(name):
    torch = pytest.importorskip("torch")
    hyper = dict(CUSTOM[name])
    if name in ("Adagrad", "RMSprop"):
        hyper["eps"] = 0.0  # where ε sits differs (inside vs outside the root): compare at 0
    w0, grads = _draws(200 + NAMES.index(name))
    history, _ = run_fast(name, w0, grads, hyper)
    p = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    topt = _torch_optimizer(torch, name, p, hyper)
    for k, (g, (w_fast, _)) in enumerate(zip(grads, history), 1):
        p.grad = torch.tensor(g, dtype=torch.float64)
        topt.step()
        ref = p.detach().numpy()
        # different but equally valid float64 operation orders: a few ulps per step
        assert np.max(np.abs(w_fast - ref)) <= F64_RTOL * np.max(np.abs(ref)), (name, k)


# ---------------------------------------------------------------------------------------------
# float32, properties, kernel paths

@pytest.mark.parametrize("name", NAMES)
def test_float32_steps_stay_within_float32_rounding_of_exact(name):
    hyper = CUSTOM[name]
    w0, grads = _draws(300 + NAMES.index(name))
    w0 = w0.astype(np.float32).astype(np.float64)  # exactly representable start
    grads = [g.astype(np.float32).astype(np.float64) for g in grads]
    history, _ = run_fast(name, w0, grads, hyper, dtype=np.float32)
    exact = exact_trajectory(name, w0, grads, hyper)
    assert history[-1][0].dtype == np.float32
    # Each step rounds ~10 float32 operations (2**-24 ≈ 6e-8 each) and the coefficients once;
    # over 5 steps the normwise error stays below ~60 eps32 ≈ 3.6e-6; 1e-5 leaves margin and
    # still fails for any error in the formula (those are O(1) relative).
    for (w_fast, _), (w_exact, _) in zip(history, exact):
        assert rel_err(w_fast, w_exact) <= 1e-5


@settings(deadline=None)
@given(optimizer_cases())
def test_property_three_steps_equal_exact(case):
    name, shape, seed, hyper = case
    w0, grads = _draws(seed, shape=shape, k=3)
    history, _ = run_fast(name, w0, grads, hyper)
    exact = exact_trajectory(name, w0, grads, hyper)
    for (w_fast, _), (w_exact, _) in zip(history, exact):
        assert rel_err(w_fast, w_exact) <= F64_RTOL


@pytest.mark.parametrize("name", NAMES)
def test_parallel_kernel_equals_serial_bit_for_bit(name):
    n = 3 * config.PARALLEL_MIN_SIZE + 7  # several chunks plus a ragged tail
    rng = np.random.default_rng(1)
    opt = optim.get(name)
    w, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    c = opt.coefficients(3, dtype=np.float32)
    state = [rng.random(n).astype(np.float32) for _ in range(2)]
    w1, s1 = w.copy(), [s.copy() for s in state]
    w2, s2 = w.copy(), [s.copy() for s in state]
    kopt._update_serial(opt.kind, w1, g, s1[0], s1[1], c)
    kopt._update_parallel(opt.kind, w2, g, s2[0], s2[1], c, 3)
    assert np.array_equal(w1, w2) and np.array_equal(s1[0], s2[0]) and np.array_equal(s1[1], s2[1])
    assert not np.array_equal(w1, w)  # the step did something


def test_non_contiguous_parameter_is_updated_in_place():
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    view = base[:, ::2]  # a non-contiguous view, as a model might expose
    params = {"p": view}
    opt = optim.SGD(lr=0.5)
    state = opt.init(params)
    opt.update(params, {"p": np.ones_like(view)}, state)
    # hand computation: w - 0.5 * 1 on the viewed columns only
    expected = np.arange(12, dtype=np.float64).reshape(3, 4)
    expected[:, ::2] -= 0.5
    assert np.array_equal(base, expected)


def test_state_copy_is_independent_and_lr_override_is_used():
    opt = optim.Momentum(lr=0.1, beta=0.5)
    params = {"p": np.zeros(2)}
    state = opt.init(params)
    snap = state.copy()
    opt.update(params, {"p": np.ones(2)}, state, lr=1.0)
    # v = 0.5 * 0 + 0.5 * 1 = 0.5; w = 0 - 1.0 * 0.5 (the override, not lr=0.1)
    assert np.array_equal(params["p"], [-0.5, -0.5])
    assert np.array_equal(state["v"]["p"], [0.5, 0.5]) and not snap["v"]["p"].any()
    assert snap.t == 0 and state.t == 1


def test_optimizer_objects_are_frozen_dataclasses():
    with pytest.raises(dataclasses.FrozenInstanceError):
        optim.SGD().lr = 1.0


def test_kernels_flush_subnormals_and_restore_the_callers_mode():
    """NOTE of fastlib.kernels.optim: FTZ/DAZ inside the kernels, the caller's mode after."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("flush-to-zero is switched on only on x86-64 (elsewhere a no-op)")
    tiny = np.finfo(np.float32).tiny
    params = {"p": np.array([2 * tiny, 1.0], np.float32)}
    opt = optim.SGD(lr=1.0)
    opt.update(params, {"p": np.array([tiny, 0.5], np.float32)}, opt.init(params))
    # exact results: 2 tiny - tiny = tiny (normal, kept) and 0.5
    assert params["p"][0] == tiny and params["p"][1] == 0.5
    params = {"p": np.array([1.5 * tiny], np.float32)}
    opt.update(params, {"p": np.array([tiny], np.float32)}, opt.init(params))
    # 0.5 tiny is subnormal: flushed to 0 inside the kernel
    assert params["p"][0] == 0.0
    # and NumPy, outside the kernel, still produces subnormals (the mode was restored)
    assert np.float32(tiny) * np.float32(0.5) > 0
