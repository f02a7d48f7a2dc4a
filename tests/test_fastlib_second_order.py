"""fastlib's forward mode and second order: ``fastlib.jvp``, ``fastlib.hvp`` per op and for a
model's loss, ``fastlib.gnvp``. Held to spec's exact values (``spec.jvp``/``spec.hvp``), to
central differences of ``fastlib.value_and_grad`` in float64, and to ``torch.func``.
"""
import numpy as np
import pytest

import fastlib
import spec
from fastlib import Dense, Sequential
from spec.samples import sample_inputs

EPS = {np.float32: np.finfo(np.float32).eps, np.float64: np.finfo(np.float64).eps}


def _condition(name, xs, params):
    """How much the inputs amplify a relative rounding: 1, except for the centred norms.

    layer_norm divides by σ, computed from a variance that cancels: its relative error is
    about eps·mean(x²)/var(x), and the second derivative carries 1/σ².
    """
    if name != "layer_norm":
        return 1.0
    x = xs[0].astype(np.float64)
    var = x.var(axis=-1) + params.get("eps", 1e-5)
    return float(np.max(1 + (x * x).mean(axis=-1) / var))


def _draw(name, dtype, seed):
    op = spec.OPS[name]
    rng = np.random.default_rng(seed)
    example = op.examples[seed % len(op.examples)]
    params = dict(example.params)
    raw = sample_inputs(op, rng, example.shapes, params)
    xs = [np.asarray(x) if op.domains[n] == "class_index" else np.asarray(x, dtype=dtype)
          for n, x in zip(op.inputs, raw)]
    ts = [None if op.vjp.get(n) is None else rng.standard_normal(np.shape(x)).astype(dtype)
          for n, x in zip(op.inputs, xs)]
    return xs, ts, params, rng


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(spec.OPS))
def test_op_jvp_and_hvp_match_spec(name, dtype):
    _hold_to_spec(name, dtype, seeds=(0,))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(spec.OPS))
def test_op_jvp_and_hvp_match_spec_on_every_example(name, dtype):
    _hold_to_spec(name, dtype, seeds=range(2 * len(spec.OPS[name].examples)))


def _hold_to_spec(name, dtype, seeds):
    for seed in seeds:
        xs, ts, params, rng = _draw(name, dtype, seed)
        out, j = fastlib.jvp(name, xs, ts, params)
        assert out.dtype == j.dtype == dtype and j.shape == out.shape
        g = rng.standard_normal(out.shape).astype(dtype)
        hs = fastlib.hvp(name, xs, g, ts, params)
        _, exact_j = spec.jvp(name, xs, ts, params, dps=30)
        exact_h = spec.hvp(name, xs, g, ts, params, dps=30)
        # O(1) draws, at most 6 entries per reduction, each rule a few dozen roundings: 64 ulp
        # of the largest magnitude, times the conditioning of a centred norm
        tol = 64 * EPS[dtype] * _condition(name, xs, params)
        exact_j = exact_j.astype(np.float64)
        assert np.all(np.abs(j - exact_j) <= tol * (1 + np.max(np.abs(exact_j), initial=0)))
        for h, e, x in zip(hs, exact_h, xs):
            if e is None:
                assert h is None
                continue
            e = e.astype(np.float64)
            assert h.dtype == dtype and h.shape == x.shape
            assert np.all(np.abs(h - e) <= tol * (1 + np.max(np.abs(e), initial=0))), (h, e)


def test_bad_tangents_say_what_to_fix():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="shaped and typed like the input"):
        fastlib.jvp("tanh", [x], [np.zeros((2, 3), np.float32)])
    with pytest.raises(ValueError, match="class indices"):
        fastlib.jvp("cross_entropy", [x, np.array([0, 1])], [x, np.zeros(2)])
    with pytest.raises(TypeError, match="one array per input"):
        fastlib.hvp("tanh", [x], x, x)


def _mlp(dtype=np.float64, seed=1):
    return Sequential([Dense(5, 4, "tanh", dtype=dtype), Dense(4, 3, "linear", dtype=dtype)],
                      dtype=dtype, seed=seed)


def _direction(model, rng):
    return {k: rng.standard_normal(w.shape).astype(w.dtype)
            for k, w in model.parameters().items()}


@pytest.mark.parametrize("loss,targets", [
    ("cross_entropy", lambda rng: rng.integers(0, 3, 6)),
    ("mse", lambda rng: rng.standard_normal((6, 3)))])
def test_model_hvp_matches_differences_of_value_and_grad(loss, targets):
    rng = np.random.default_rng(0)
    model = _mlp()
    x, y = rng.standard_normal((6, 5)), targets(rng)
    v = _direction(model, rng)
    hv = fastlib.hvp(model, x, y, loss, v)
    params = model.parameters()
    step = 1e-5

    def grad_at(s):
        saved = {k: w.copy() for k, w in params.items()}
        for k, w in params.items():
            w += s * v[k]
        _, g = fastlib.value_and_grad(model, x, y, loss)
        for k, w in params.items():
            w[...] = saved[k]
        return g

    plus, minus = grad_at(step), grad_at(-step)
    for k in params:
        fd = (plus[k] - minus[k]) / (2 * step)
        # central differences: h² · |g'''| ~ 1e-10 truncation, eps / h ~ 1e-11 rounding
        np.testing.assert_allclose(hv[k], fd, atol=1e-8, rtol=1e-7)


def test_model_hvp_and_gnvp_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    model = _mlp()
    x, y = rng.standard_normal((6, 5)), rng.integers(0, 3, 6)
    v = _direction(model, rng)
    keys = list(model.parameters())
    w0 = [torch.tensor(model.parameters()[k]) for k in keys]
    tx, ty = torch.tensor(x), torch.tensor(y)

    def logits(*ws):
        h = torch.tanh(tx @ ws[0] + ws[1])
        return h @ ws[2] + ws[3]

    def loss(*ws):
        return torch.nn.functional.cross_entropy(logits(*ws), ty)

    tv = tuple(torch.tensor(v[k]) for k in keys)
    _, expected = torch.autograd.functional.hvp(loss, tuple(w0), tv)
    got = fastlib.hvp(model, x, y, "cross_entropy", v)
    for k, e in zip(keys, expected):
        np.testing.assert_allclose(got[k], e.numpy(), rtol=1e-10, atol=1e-12)
    # Gauss-Newton: Jᵀ H_loss J v with J the logits' Jacobian
    out, jv = torch.func.jvp(logits, tuple(w0), tv)
    _, h_loss_jv = torch.autograd.functional.hvp(
        lambda z: torch.nn.functional.cross_entropy(z, ty), out, jv)
    _, pullback = torch.func.vjp(logits, *w0)
    expected_gn = pullback(h_loss_jv)
    got_gn = fastlib.gnvp(model, x, y, "cross_entropy", v)
    for k, e in zip(keys, expected_gn):
        np.testing.assert_allclose(got_gn[k], e.numpy(), rtol=1e-10, atol=1e-12)


def test_model_hvp_rejects_what_it_does_not_support():
    rng = np.random.default_rng(0)
    model = _mlp()
    v = _direction(model, rng)
    with pytest.raises(ValueError, match="keyed like model.parameters"):
        fastlib.hvp(model, np.zeros((2, 5)), np.zeros(2, int), "cross_entropy", {"0.weight": 1})
    # a layer class the product does not know (every fastlib kind is covered:
    # tests/test_fastlib_model_hvp.py) is named in the error
    class Doubler(fastlib.layers.Layer):
        def forward(self, x):
            return 2 * x

    other = Sequential([Dense(5, 3), Doubler(np.float32)], dtype=np.float32)
    zeros = {k: np.zeros_like(w) for k, w in other.parameters().items()}
    with pytest.raises(ValueError, match="Doubler is not a layer"):
        fastlib.hvp(other, np.zeros((2, 5), np.float32), np.zeros(2, int), "cross_entropy", zeros)


# float32's kernels compile on first use (a minute on a loaded machine): the deep run only
@pytest.mark.parametrize("dtype", [np.float64, pytest.param(np.float32, marks=pytest.mark.slow)])
def test_three_newton_cg_steps_on_digits_reduce_the_loss(dtype):
    from fastlib.datasets import load_digits
    from scipy.optimize import minimize

    split = load_digits("train", dtype=dtype)
    x, y = split.x[:512], split.y[:512]
    model = Sequential([Dense(64, 32, "tanh", dtype=dtype), Dense(32, 10, dtype=dtype)],
                       dtype=dtype, seed=0)
    params = model.parameters()
    keys, shapes = list(params), [params[k].shape for k in params]
    sizes = [int(np.prod(s)) for s in shapes]

    def unpack(flat):
        parts = np.split(flat.astype(dtype), np.cumsum(sizes)[:-1])
        return {k: p.reshape(s) for k, p, s in zip(keys, parts, shapes)}

    def load(flat):
        for k, p in unpack(flat).items():
            params[k][...] = p

    def fun(flat):
        load(flat)
        value, grads = fastlib.value_and_grad(model, x, y, "cross_entropy")
        return float(value), np.concatenate([grads[k].ravel() for k in keys]).astype(np.float64)

    def hessp(flat, direction):
        load(flat)
        hv = fastlib.hvp(model, x, y, "cross_entropy", unpack(direction))
        return np.concatenate([hv[k].ravel() for k in keys]).astype(np.float64)

    start = np.concatenate([params[k].ravel() for k in keys]).astype(np.float64)
    before = fun(start)[0]
    result = minimize(fun, start, jac=True, hessp=hessp, method="Newton-CG",
                      options={"maxiter": 3})
    after = fun(result.x)[0]
    assert result.nit == 3
    assert after < 0.5 * before, (before, after)
