"""spec's forward mode and second order: ``spec.jvp``/``spec.hvp`` and their proofs.

Expected values come from routes independent of the dual numbers: central differences of the
declared forward and of the proven VJP at 60 digits, and hand derivations.
"""
import mpmath
import numpy as np
import pytest

import spec
import spec.prove_second_order as prove_second_module
from spec.backends import MPMATH
from spec.dual import DualBackend, _unary
from spec.samples import sample_inputs

STEP = mpmath.mpf("1e-25")
TOL = 1e-30          # central differences at h = 1e-25: error ~ h² · f''' ≈ 1e-50, far below


def _shifted(op, values, tangents, sign):
    out = []
    for name, v, t in zip(op.inputs, values, tangents):
        if t is None:
            out.append(v)
            continue
        shifted = np.empty(np.shape(v), dtype=object)
        for idx in np.ndindex(*np.shape(v)):
            shifted[idx] = mpmath.mpf(float(np.asarray(v)[idx])) + sign * STEP * mpmath.mpf(
                float(np.asarray(t)[idx]))
        out.append(shifted)
    return out


def _case(name, seed):
    op = spec.OPS[name]
    rng = np.random.default_rng(seed)
    example = op.examples[seed % len(op.examples)]
    params = dict(example.params)
    values = sample_inputs(op, rng, example.shapes, params)
    tangents = [None if op.vjp.get(n) is None else rng.standard_normal(np.shape(v))
                for n, v in zip(op.inputs, values)]
    return op, params, list(values), tangents, rng


@pytest.mark.parametrize("name", list(spec.OPS))
def test_jvp_and_hvp_match_central_differences_at_60_digits(name):
    op, params, values, tangents, rng = _case(name, 1)
    out, jvp = spec.jvp(name, values, tangents, params, dps=40)
    cotangent = rng.standard_normal(out.shape)
    hvps = spec.hvp(name, values, cotangent, tangents, params, dps=40)
    resolved = op.resolve_params(params)
    with mpmath.workdps(80):
        # the registry's formulas run directly: a shifted target may leave its domain by 1e-25
        plus, minus = _shifted(op, values, tangents, 1), _shifted(op, values, tangents, -1)
        f_plus = np.asarray(op.run_forward(MPMATH, plus, resolved), dtype=object)
        f_minus = np.asarray(op.run_forward(MPMATH, minus, resolved), dtype=object)
        g = np.asarray([mpmath.mpf(float(c)) for c in cotangent.reshape(-1)],
                       dtype=object).reshape(cotangent.shape)
        v_plus = op.run_vjp(MPMATH, plus, resolved, f_plus, g)
        v_minus = op.run_vjp(MPMATH, minus, resolved, f_minus, g)
        for idx in np.ndindex(*out.shape):
            fd = (f_plus[idx] - f_minus[idx]) / (2 * STEP)
            assert abs(fd - jvp[idx]) < TOL * max(1, abs(fd)), (name, idx, fd, jvp[idx])
        for h, vp, vm in zip(hvps, v_plus, v_minus):
            if h is None:
                continue
            vp, vm = np.asarray(vp, dtype=object), np.asarray(vm, dtype=object)
            for idx in np.ndindex(*h.shape):
                fd = (vp[idx] - vm[idx]) / (2 * STEP)
                assert abs(fd - h[idx]) < TOL * max(1, abs(fd)), (name, idx, fd, h[idx])


def test_hand_derived_values():
    x, t, g = 0.5, 0.75, -1.25
    (h,) = spec.hvp("tanh", [np.array([x])], np.array([g]), [np.array([t])], dps=40)
    with mpmath.workdps(40):
        th = mpmath.tanh(x)
        assert abs(h[0] - g * (-2 * th * (1 - th**2)) * t) < mpmath.mpf("1e-38")
    # mul's Hessian is all cross terms: d²(ab)/da db = 1
    ha, hb = spec.hvp("mul", [np.array([2.0]), np.array([3.0])], np.array([5.0]),
                      [np.array([7.0]), np.array([11.0])])
    assert (ha[0], hb[0]) == (5 * 11, 5 * 7)
    # softmax of two entries: s0 = σ(x0 - x1); its JVP is s0(1 - s0)(t0 - t1)
    out, j = spec.jvp("softmax", [np.array([0.25, -0.5])], [np.array([1.0, -2.0])], dps=40)
    with mpmath.workdps(40):
        s0 = 1 / (1 + mpmath.exp(-0.75))
        assert abs(j[0] - s0 * (1 - s0) * 3) < mpmath.mpf("1e-38")
        assert abs(j[0] + j[1]) < mpmath.mpf("1e-38")


def test_kink_conventions_of_the_second_order():
    zero, one = np.array([0.0]), np.array([1.0])
    # first order at the kink follows the registry's convention, second order the chosen piece
    assert spec.jvp("relu", [zero], [one])[1][0] == 0
    assert spec.jvp("abs", [zero], [one])[1][0] == 0
    slope = 0.125
    assert spec.jvp("leaky_relu", [zero], [one], {"negative_slope": slope})[1][0] == slope
    assert spec.hvp("relu", [zero], one, [one])[0][0] == 0
    assert spec.hvp("abs", [zero], one, [one])[0][0] == 0
    # a tie of maximum goes to the first argument
    _, j = spec.jvp("maximum", [one, one], [np.array([2.0]), np.array([3.0])])
    assert j[0] == 2


def test_bad_tangents_and_cotangents_say_what_to_fix():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="shaped like the input"):
        spec.jvp("tanh", [x], [np.zeros(3)])
    with pytest.raises(ValueError, match="not differentiable"):
        spec.jvp("cross_entropy", [x, np.array([0, 1])], [x, np.zeros(2)])
    with pytest.raises(ValueError, match="must be finite"):
        spec.jvp("tanh", [x], [np.full((2, 3), np.nan)])
    with pytest.raises(ValueError, match="shaped like the output"):
        spec.hvp("tanh", [x], np.zeros(3), [x])
    with pytest.raises(TypeError, match="one array per input"):
        spec.jvp("tanh", [x], x)


@pytest.mark.parametrize("name,method", [("tanh", "symbolic"), ("mul", "symbolic"),
                                         ("relu", "piecewise"), ("maximum", "piecewise"),
                                         ("cross_entropy", "symbolic")])
def test_jvp_and_hvp_proven(name, method):
    for result in spec.prove_second(name):
        assert result.ok and result.method == method, result.detail


def test_a_wrong_derivative_rule_fails_the_proof(monkeypatch):
    class Broken(DualBackend):
        def __init__(self, base):
            super().__init__(base)
            # tanh' stated as 1 - tanh (a planted slip: the square is dropped)
            self.tanh = np.frompyfunc(_unary(base.tanh, lambda x, v: 1 - v), 1, 1)

    monkeypatch.setattr(prove_second_module, "DualBackend", Broken)
    for result in spec.prove_second("tanh"):
        assert not result.ok and "differs from SymPy's derivative" in result.detail


def test_a_wrong_vjp_fails_the_hvp_proof():
    import dataclasses

    op = spec.OPS["square"]
    # 2·grad·|x|: right for x > 0, so only a proof over the whole domain rejects it
    broken = dataclasses.replace(op, vjp={"x": lambda M, grad, x: 2 * grad * M.abs(x)})
    result = prove_second_module.prove_order(broken, "hvp")
    assert not result.ok


@pytest.mark.parametrize("name,inputs", [("relu", [np.array([0.0, 1.0, -1.0])]),
                                         ("abs", [np.array([0.0, 2.0])]),
                                         ("leaky_relu", [np.array([0.0, -3.0])]),
                                         ("maximum", [np.array([1.0, 2.0]), np.array([1.0, 0.5])])])
def test_the_jvp_is_the_transpose_of_the_vjp_at_kinks(name, inputs):
    rng = np.random.default_rng(3)
    tangents = [rng.standard_normal(x.shape) for x in inputs]
    out, j = spec.jvp(name, inputs, tangents)
    g = rng.standard_normal(out.shape)
    _, vjps = spec.evaluate(name, inputs, g)
    with mpmath.workdps(50):
        lhs = sum(mpmath.mpf(gi) * ji for gi, ji in zip(g.reshape(-1), j.reshape(-1)))
        rhs = sum(vi * mpmath.mpf(ti) for v, t in zip(vjps, tangents)
                  for vi, ti in zip(v.reshape(-1), t.reshape(-1)))
        assert abs(lhs - rhs) < mpmath.mpf("1e-45")
