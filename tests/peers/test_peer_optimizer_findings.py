"""The optimizer findings of the README's peer table (and Paddle's float64 layer_norm), each
explained and pinned.

The suite's ``optimizer`` rows fail for some peers in float64 (or on the dtype contract).
Each test runs one step through the adapter (the engine's own optimizer) and shows the cause
with a hand computation in mpmath: the step equals the registry's formula with one
hyperparameter rounded to float32, and is far (more than 1e3 eps) from the exact step.
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest

from reports.conformance import engines as registry

pytestmark = pytest.mark.peers
EPS64 = float(np.finfo(np.float64).eps)


def _engine(name):
    status = registry.engine_status(name)
    if not status.available:
        pytest.skip(f"{name} is not available here: {status.reason}")
    return registry.get_engine(name)


def _f32(v):
    return mpmath.mpf(float(np.float32(v)))


def _assert_step(got, exact, rounded, scale=1.0):
    """``got`` is ``rounded`` to a few eps of ``scale`` (w0 = 1: the update is 1 - x, rounded
    on the scale of 1) and more than 1e3 eps of ``scale`` from ``exact``."""
    got = mpmath.mpf(float(got))
    assert abs(got - rounded) <= scale * 4 * EPS64             # what the engine computes
    assert abs(got - exact) > scale * 1e3 * EPS64               # and how far that is


def test_paddle_rmsprop_float64_rounds_epsilon_to_float32():
    engine = _engine("paddle")
    w, state = engine.optimizer_step("RMSprop", np.array([1.0]), np.array([1.0]), {}, 1,
                                     lr=1.0, gamma=0.0, eps=0.01)
    with mpmath.workdps(40):   # E = g² = 1; w = 1 - lr g / sqrt(E + eps)
        exact = 1 - 1 / mpmath.sqrt(1 + mpmath.mpf(0.01))
        rounded = 1 - 1 / mpmath.sqrt(1 + _f32(0.01))
        _assert_step(w[0], exact, rounded)


def test_paddle_adamw_float64_rounds_weight_decay_to_float32():
    engine = _engine("paddle")
    w, _ = engine.optimizer_step("AdamW", np.array([1.0]), np.array([1.0]), {}, 1, lr=1.0,
                                 beta1=0.0, beta2=0.5, eps=0.0078125, weight_decay=0.03)
    with mpmath.workdps(40):   # m̂ = v̂ = 1; w = 1 - lr (1/(1 + eps) + λ w)
        step = 1 / (1 + mpmath.mpf(0.0078125))
        _assert_step(w[0], 1 - step - mpmath.mpf(0.03), 1 - step - _f32(0.03))


def test_tinygrad_sgd_float64_rounds_the_learning_rate_to_float32():
    engine = _engine("tinygrad")
    w, _ = engine.optimizer_step("SGD", np.array([1.0]), np.array([1.0]), {}, 1, lr=0.1)
    with mpmath.workdps(40):
        _assert_step(w[0], 1 - mpmath.mpf(0.1), 1 - _f32(0.1))


def test_tinygrad_adam_float64_keeps_its_moments_in_float32():
    engine = _engine("tinygrad")
    g = np.array([0.1])
    _, state = engine.optimizer_step("Adam", np.array([1.0]), g, {}, 1, lr=0.001, beta1=0.9,
                                     beta2=0.999, eps=1e-8)
    with mpmath.workdps(40):   # m = (1 - β1) g after one step
        exact = (1 - mpmath.mpf(0.9)) * mpmath.mpf(0.1)
        _assert_step(state["m"][0], exact, _f32(float(np.float32(exact))), scale=exact)


def test_autograd_sgd_returns_float64_for_float32_parameters():
    engine = _engine("autograd")
    w, _ = engine.optimizer_step("SGD", np.ones(3, np.float32), np.ones(3, np.float32), {}, 1,
                                 lr=0.5)
    assert w.dtype == np.float64            # the suite's contract asks for float32 back
    assert np.array_equal(w, np.full(3, 0.5))


def test_paddle_layer_norm_float64_rounds_epsilon_to_float32():
    # not an optimizer, the same cause: the 469-eps layer_norm row of the findings table
    engine = _engine("paddle")
    x = np.array([0.8217701239287258, -1.3812797174167781])
    got = engine.forward("layer_norm", [x], eps=1e-5)[0]
    with mpmath.workdps(40):
        a, b = (mpmath.mpf(v) for v in x)
        mu = (a + b) / 2
        var = ((a - mu) ** 2 + (b - mu) ** 2) / 2
        exact = (a - mu) / mpmath.sqrt(var + mpmath.mpf(1e-5))
        rounded = (a - mu) / mpmath.sqrt(var + _f32(1e-5))
        # within 0.4 eps of the rounded-eps formula, more than 100 eps from the exact value
        _assert_step(got, exact, rounded, scale=abs(exact) / 10)
