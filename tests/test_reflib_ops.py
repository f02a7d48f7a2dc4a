"""reflib.forward / reflib.vjp: every op against independent oracles.

Oracles, none of them the code under test:
- spec.evaluate (SymPy-declared forward and VJPs, evaluated in mpmath at 50 digits);
- PyTorch's float64 autograd (its own kernels and derivative formulas);
- central finite differences of the forward in mpmath at 100 digits (for each input separately,
  along a random direction), against the VJP at 50 digits;
- hand derivations for kinks, saturation and the class-index target forms.
Inputs are drawn away from kinks (|x| >= 0.05 where a derivative jumps) and singularities.
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import optable
import reflib
from reflib.ops import OPS, UnknownOpError

ALL_OPS = sorted(OPS)

# ---------------------------------------------------------------------------------------------
# Sample inputs: shapes drawn by Hypothesis, values from a NumPy generator seeded by Hypothesis.
# ---------------------------------------------------------------------------------------------

UNARY_SHAPES = [(), (3,), (2, 3), (2, 1, 2)]
BROADCAST_PAIRS = [((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((), (2,)), ((3,), ())]
# derivative jumps at 0 (the op table's "zero" kinks of unary ops)
KINKED = {n for n in optable.names(category="unary") if "zero" in optable.OPS[n].kinks}


def _away_from_zero(rng, shape, lo=0.05, hi=2.0):
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(lo, hi, size=shape)


def _case(name, rng, variant):
    """(inputs, params) for op ``name``; ``variant`` picks among a few shapes / params."""
    pick = lambda options: options[variant % len(options)]  # noqa: E731
    if optable.OPS[name].domains.get("x") == "positive":
        return [rng.uniform(0.1, 3.0, size=pick(UNARY_SHAPES))], {}
    if name in KINKED:
        params = {"negative_slope": pick([0.01, 0.2, 1.5])} if name == "leaky_relu" else {}
        return [_away_from_zero(rng, pick(UNARY_SHAPES))], params
    if optable.OPS[name].category == "unary":           # the smooth ones, on the real line
        return [rng.normal(0.0, 1.5, size=pick(UNARY_SHAPES))], {}
    if optable.OPS[name].category == "binary":
        sa, sb = pick(BROADCAST_PAIRS)
        a = rng.normal(0.0, 1.5, size=sa)
        if name == "div":
            return [a, _away_from_zero(rng, sb, 0.5, 2.0)], {}
        b = rng.normal(0.0, 1.5, size=sb)
        if name == "maximum":  # keep every pair at least 0.05 apart (away from the tie)
            diff = np.broadcast_to(a, np.broadcast_shapes(sa, sb)) - b
            b = b + 0.0
            while np.min(np.abs(diff)) < 0.05:
                b = rng.normal(0.0, 1.5, size=sb)
                diff = np.broadcast_to(a, np.broadcast_shapes(sa, sb)) - b
        return [a, b], {}
    if optable.OPS[name].category == "reduction":
        shape, axis, keepdims = pick([((2, 3, 2), None, False), ((2, 3, 2), 1, True),
                                      ((2, 3, 2), (0, 2), False), ((3,), -1, False),
                                      ((2, 3), (-1, 0), True)])
        return [rng.normal(0.0, 1.5, size=shape)], {"axis": axis, "keepdims": keepdims}
    if name == "matmul":
        sa, sb = pick([((2, 3), (3, 4)), ((2, 2, 3), (2, 3, 4)), ((2, 2, 3), (3, 2)),
                       ((1, 1), (1, 2))])
        return [rng.normal(size=sa), rng.normal(size=sb)], {}
    if name == "transpose":
        shape, axes = pick([((2, 3, 4), None), ((2, 3, 4), (1, 0, 2)), ((2, 3, 4), (2, 0, -2)),
                            ((2, 3), None)])
        return [rng.normal(size=shape)], {"axes": axes}
    if name == "reshape":
        shape, target = pick([((2, 3), (3, 2)), ((2, 3), (6,)), ((2, 3, 2), (4, -1)), ((1,), ())])
        return [rng.normal(size=shape)], {"shape": target}
    if name == "concat":
        sa, sb, axis = pick([((2, 3), (2, 2), -1), ((1, 3), (2, 3), 0), ((2, 1, 2), (2, 2, 2), 1)])
        return [rng.normal(size=sa), rng.normal(size=sb)], {"axis": axis}
    if name == "slice":
        shape, params = pick([((5, 3), dict(axis=0, start=1, stop=4, step=2)),
                              ((5, 3), dict(axis=-1)), ((4, 3), dict(axis=0, start=-3, step=1)),
                              ((2, 6), dict(axis=1, start=0, stop=None, step=3))])
        return [rng.normal(size=shape)], params
    if name in ("softmax", "log_softmax"):
        shape, axis = pick([((2, 4), -1), ((2, 4), 0), ((3,), -1), ((2, 2, 3), 1)])
        return [rng.normal(0.0, 2.0, size=shape)], {"axis": axis}
    if name in ("layer_norm", "rms_norm"):
        shape, eps = pick([((2, 4), None), ((3,), 1e-3), ((2, 2, 3), None), ((1, 5), 0.5)])
        return [rng.normal(0.0, 1.5, size=shape)], ({} if eps is None else {"eps": eps})
    if name == "mse":
        shape = pick([(2, 3), (4,), ()])
        return [rng.normal(size=shape), rng.normal(size=shape)], {}
    if name == "cross_entropy":
        n, c = pick([(3, 4), (1, 2), (4, 3)])
        t = rng.integers(0, c, size=n)
        t = pick([t, t.reshape(n, 1), t.astype(float), t.reshape(n, 1).astype(np.int32)])
        return [rng.normal(0.0, 2.0, size=(n, c)), t], {}
    if name == "categorical_cross_entropy":
        n, c = pick([(3, 4), (1, 2), (4, 3)])
        return [rng.normal(0.0, 2.0, size=(n, c)), rng.dirichlet(np.ones(c), size=n)], {}
    if name == "binary_cross_entropy":
        shape = pick([(2, 3), (4,), ()])
        return [rng.uniform(0.05, 0.95, size=shape), rng.uniform(0.0, 1.0, size=shape)], {}
    if name == "binary_cross_entropy_with_logits":
        shape = pick([(2, 3), (4,), ()])
        return [rng.normal(0.0, 2.0, size=shape), rng.uniform(0.0, 1.0, size=shape)], {}
    raise AssertionError(f"no sample inputs for op {name!r}: add a case to _case")


@st.composite
def cases(draw, name):
    """Shape-then-array: Hypothesis picks the variant (shapes, params) and the value seed."""
    variant = draw(st.integers(0, 11))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs, params = _case(name, rng, variant)
    return inputs, params, rng


def test_every_op_has_sample_inputs():
    for name in ALL_OPS:
        _case(name, np.random.default_rng(0), 0)


def test_op_table_is_the_contract():
    assert set(ALL_OPS) == set(optable.OPS)      # every op of the table, no other
    assert OPS["cross_entropy"].class_index == {"target"}
    assert OPS["reshape"].inputs == ("x",) and OPS["concat"].inputs == ("a", "b")
    assert OPS["leaky_relu"].params == {"negative_slope": 0.01}
    assert OPS["layer_norm"].params == {"eps": 1e-5} and OPS["rms_norm"].params == {"eps": 1e-6}
    assert OPS["slice"].params == {"axis": 0, "start": 0, "stop": None, "step": 1}


# ---------------------------------------------------------------------------------------------
# Error norms
# ---------------------------------------------------------------------------------------------

def _mp_norm(a):
    return mpmath.sqrt(mpmath.fsum(mpmath.mpf(v) ** 2 for v in np.asarray(a).flat))


def rel_err(got, want):
    """Normwise relative error ||got - want|| / ||want|| in mpmath; absolute when want == 0."""
    with mpmath.workdps(80):
        got = np.asarray(got, dtype=object)
        want = np.asarray(want, dtype=object)
        assert got.shape == want.shape, (got.shape, want.shape)
        diff = _mp_norm([mpmath.mpf(x) - mpmath.mpf(y) for x, y in zip(got.flat, want.flat)])
        ref = _mp_norm(want)
        return float(diff / ref) if ref != 0 else float(diff)


def _all_mpf(a):
    return a.dtype == object and all(isinstance(v, mpmath.mpf) for v in a.flat)


# ---------------------------------------------------------------------------------------------
# Against PyTorch (float64): forward and every VJP
# ---------------------------------------------------------------------------------------------

import torch  # noqa: E402  (an oracle; installed with the project's test extras)

# The op table over torch lives in the PyTorch adapter of the conformance suite (one copy).
from reports.conformance.adapters.torch import TORCH_OPS as TORCH  # noqa: E402


def _torch_forward_vjp(name, inputs, grad, params):
    differentiable = [i not in OPS[name].class_index for i in OPS[name].inputs]
    ts = [torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=d)
          for x, d in zip(inputs, differentiable)]
    out = TORCH[name](*ts, **params)
    wanted = [t for t, d in zip(ts, differentiable) if d]
    gs = iter(torch.autograd.grad(out, wanted, torch.tensor(grad), allow_unused=True))
    grads = [next(gs).numpy() if d else None for d in differentiable]
    return out.detach().numpy(), grads


def test_torch_table_covers_every_op():
    assert sorted(TORCH) == ALL_OPS


# float64 bound: every op here is evaluated away from kinks and singularities on O(1) values,
# where its forward and VJP have condition numbers of a few units; with at most a few dozen
# roundings per element both engines sit within ~1e-15 of the truth, so 1e-12 (the bound)
# leaves a margin of ~1000 without hiding an error in a formula (those show up as O(1)).
F64_TOL = 1e-12


@pytest.mark.parametrize("name", ALL_OPS)
@given(data=st.data())
def test_float64_matches_torch(name, data):
    inputs, params, rng = data.draw(cases(name))
    out = reflib.forward(name, inputs, **params)
    grad = rng.normal(size=out.shape)
    grads = reflib.vjp(name, inputs, grad, **params)
    t_out, t_grads = _torch_forward_vjp(name, inputs, grad, params)
    assert out.dtype == np.float64 and out.shape == t_out.shape
    assert rel_err(out, t_out) <= F64_TOL
    for g, tg, x in zip(grads, t_grads, inputs):
        if tg is None:
            assert g is None
            continue
        assert g.dtype == np.float64 and g.shape == np.shape(x)
        assert rel_err(g, tg) <= F64_TOL, (name, params)


# ---------------------------------------------------------------------------------------------
# Against finite differences in mpmath (exact path)
# ---------------------------------------------------------------------------------------------

FD_DPS, FD_STEP = 100, mpmath.mpf("1e-30")
# dps=50 bound: a central difference at step h has truncation error ~h^2 |f'''| ~ 1e-60 and
# rounding error ~10^-100 / h ~ 1e-70 at 100 digits, so the oracle is good to ~1e-55; the VJP at
# 50 digits carries a few dozen roundings of 1e-50 each. 1e-40 (the bound) leaves a wide
# margin and is still 10^24 times tighter than float64.
EXACT_TOL = 1e-40


def _directional_fd(name, inputs, grad, params, k, direction):
    """d/dh <grad, forward(inputs with input k + h * direction)> at h = 0, central, 100 digits."""
    def phi(h):
        with mpmath.workdps(FD_DPS):
            moved = list(inputs)
            moved[k] = np.asarray(inputs[k], dtype=object) + h * direction
            out = reflib.forward(name, moved, dps=FD_DPS, **params)
            return mpmath.fsum(a * b for a, b in zip(np.asarray(grad, dtype=object).flat, out.flat))

    with mpmath.workdps(FD_DPS):
        return (phi(FD_STEP) - phi(-FD_STEP)) / (2 * FD_STEP)


@pytest.mark.parametrize("name", ALL_OPS)
@given(data=st.data())
def test_exact_vjp_matches_finite_differences(name, data):
    inputs, params, rng = data.draw(cases(name))
    out = reflib.forward(name, inputs, dps=50, **params)
    assert _all_mpf(out)
    grad = rng.normal(size=out.shape)
    grads = reflib.vjp(name, inputs, grad, dps=50, **params)
    for k, (x, g) in enumerate(zip(inputs, grads)):
        if OPS[name].inputs[k] in OPS[name].class_index:
            assert g is None
            continue
        assert _all_mpf(g) and g.shape == np.shape(x)
        direction = rng.normal(size=np.shape(x))
        fd = _directional_fd(name, inputs, grad, params, k, direction)
        with mpmath.workdps(60):
            claimed = mpmath.fsum(a * b for a, b in zip(g.flat, direction.flat))
            # normalise by the Cauchy-Schwarz bound ||g|| ||v|| so that a directional
            # derivative that cancels to nearly 0 is not compared relative to itself
            scale = _mp_norm(g) * _mp_norm(direction)
            err = abs(fd - claimed) / scale if scale != 0 else abs(fd)
        assert err <= EXACT_TOL, (name, params, k, float(err))


# ---------------------------------------------------------------------------------------------
# Against the registry: spec.evaluate
# ---------------------------------------------------------------------------------------------

def _spec_evaluate():
    import spec

    if not hasattr(spec, "evaluate"):
        pytest.fail("spec.evaluate is missing: reflib is checked against it for every op")
    return spec.evaluate


@pytest.mark.parametrize("dps, tol", [(None, F64_TOL), (50, EXACT_TOL)])
@pytest.mark.parametrize("name", ALL_OPS)
@given(data=st.data())
def test_matches_spec_evaluate(name, dps, tol, data):
    evaluate = _spec_evaluate()
    inputs, params, rng = data.draw(cases(name))
    out = reflib.forward(name, inputs, dps=dps, **params)
    grad = rng.normal(size=out.shape)
    grads = reflib.vjp(name, inputs, grad, dps=dps, **params)
    s_out, s_grads = evaluate(name, inputs, grad, params=params, dps=50)
    assert rel_err(out, s_out) <= tol, (name, params)
    assert len(grads) == len(s_grads)
    for g, sg in zip(grads, s_grads):
        if sg is None:
            assert g is None
            continue
        assert rel_err(g, sg) <= tol, (name, params)


# ---------------------------------------------------------------------------------------------
# Kink conventions, saturation and hand-derived values
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dps", [None, 50])
def test_kink_conventions(dps):
    x = np.array([-1.0, 0.0, 2.0])
    g = np.array([3.0, 5.0, 7.0])
    f = lambda a: [float(v) for v in np.asarray(a).flat]  # noqa: E731
    # relu'(0) = 0, abs'(0) = 0, leaky_relu'(0) = slope (contracts: "1 if x > 0 else slope")
    assert f(reflib.vjp("relu", [x], g, dps=dps)[0]) == [0.0, 0.0, 7.0]
    assert f(reflib.vjp("abs", [x], g, dps=dps)[0]) == [-3.0, 0.0, 7.0]
    assert f(reflib.vjp("leaky_relu", [x], g, dps=dps, negative_slope=0.25)[0]) == [0.75, 1.25, 7.0]
    assert f(reflib.forward("leaky_relu", [x], dps=dps)) == [-0.01, 0.0, 2.0]
    # maximum: ties send the whole gradient to the first argument
    a, b = np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 0.0])
    ga, gb = reflib.vjp("maximum", [a, b], g, dps=dps)
    assert f(ga) == [3.0, 0.0, 7.0] and f(gb) == [0.0, 5.0, 0.0]
    # broadcast tie: b broadcast against a; the tied slot's gradient is summed into a only
    ga, gb = reflib.vjp("maximum", [np.array([[2.0, 2.0]]), np.array(2.0)], np.ones((1, 2)), dps=dps)
    assert f(ga) == [1.0, 1.0] and f(gb) == [0.0]


def test_softmax_and_losses_saturate_without_overflow():
    # softmax([1000, 1001]) = [1/(1+e), e/(1+e)] by hand; naive exp would overflow. The shift
    # by the max makes x - m exact, leaving a handful of roundings: 8 eps bounds them.
    y = reflib.forward("softmax", [np.array([1000.0, 1001.0])])
    with mpmath.workdps(30):
        e = mpmath.e
        want = [1 / (1 + e), e / (1 + e)]
    assert rel_err(y, want) <= 8 * np.finfo(float).eps
    # softplus(-800) = log1p(e^-800) = e^-800 underflows to 0 in float64 but is exact at 50 digits;
    # softplus(800) = 800 + log1p(e^-800) = 800.
    with mpmath.workdps(50):
        assert reflib.forward("softplus", [np.array(-800.0)], dps=50)[()] == mpmath.log1p(mpmath.exp(-800))
    assert reflib.forward("softplus", [np.array(800.0)])[()] == 800.0
    # sigmoid at -800 and 800 is ~0 and 1 without overflow
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is right
        s = reflib.forward("sigmoid", [np.array([-800.0, 800.0])])
    assert s[0] >= 0.0 and s[1] == 1.0
    # cross-entropy with huge logits: -log_softmax at the true class; by hand 1000 - 0 = 1000... for
    # logits [0, 1000] and class 0: loss = log(1 + e^1000) - 0 = 1000 + log1p(e^-1000) = 1000
    assert reflib.forward("cross_entropy", [np.array([[0.0, 1000.0]]), np.array([0])])[()] == 1000.0
    # binary_cross_entropy_with_logits at z = 800, t = 1: max(z,0) - z + log1p(e^-800) = 0
    assert reflib.forward("binary_cross_entropy_with_logits", [np.array([800.0]), np.array([1.0])])[()] == 0.0


def test_hand_derived_values_exact():
    with mpmath.workdps(50):
        third = mpmath.mpf(1) / 3
        out = reflib.forward("div", [np.array([1.0]), np.array([3.0])], dps=50)
        assert out[0] == third
        # layer_norm([1, 2, 3]) = [-1, 0, 1] / sqrt(2/3 + eps)
        ln = reflib.forward("layer_norm", [np.array([1.0, 2.0, 3.0])], dps=50, eps=0.5)
        s = mpmath.sqrt(mpmath.mpf(2) / 3 + mpmath.mpf(0.5))
        assert [v for v in ln] == [-1 / s, 0, 1 / s]
        # gelu'(0) = Phi(0) = 1/2; gelu_tanh'(0) = 1/2; silu'(0) = 1/2
        for name in ("gelu", "gelu_tanh", "silu"):
            assert reflib.vjp(name, [np.array(0.0)], np.array(1.0), dps=50)[0][()] == mpmath.mpf(0.5)
        # mean over (2, 3) of ones-cotangent: 1/6 each
        g = reflib.vjp("mean", [np.zeros((2, 3))], np.array(1.0), dps=50)[0]
        assert all(v == mpmath.mpf(1) / 6 for v in g.flat)
        # gelu_tanh uses the decimal coefficient 0.044715: at x = 1,
        # 0.5 (1 + tanh(sqrt(2/pi) (1 + 0.044715)))
        want = (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * mpmath.mpf("1.044715"))) / 2
        assert abs(reflib.forward("gelu_tanh", [np.array(1.0)], dps=50)[()] - want) < mpmath.mpf(10) ** -48


def test_cross_entropy_target_forms_agree():
    logits = np.array([[1.0, 2.0, 0.5], [0.1, -1.0, 3.0]])
    forms = [np.array([2, 0]), np.array([[2], [0]]), np.array([2.0, 0.0]),
             np.array([[2.0], [0.0]]), np.array([2, 0], dtype=np.uint8)]
    # hand: mean of lse(row) - row[target]
    lse = np.log(np.exp(logits).sum(axis=1))
    want = ((lse[0] - logits[0, 2]) + (lse[1] - logits[1, 0])) / 2
    for t in forms:
        assert abs(reflib.forward("cross_entropy", [logits, t]) - want) <= 1e-15 * abs(want)
        gz, gt = reflib.vjp("cross_entropy", [logits, t], np.array(1.0))
        assert gt is None and gz.shape == (2, 3)
    gz, gt = reflib.vjp("cross_entropy", [logits, forms[0]], np.array(1.0), dps=30)
    assert gt is None and _all_mpf(gz)


@pytest.mark.parametrize("dps", [None, 50])
def test_outputs_are_fresh_arrays_of_the_engine_dtype(dps):
    x = np.array([1.0, -2.0])
    for name in ("identity", "reshape", "transpose", "slice"):
        params = {"shape": (2,)} if name == "reshape" else {}
        y = reflib.forward(name, [x], dps=dps, **params)
        y[0] = 99.0
        assert x[0] == 1.0, f"{name} returned a view of its input"
    g = np.array([1.0, 1.0])
    (gx,) = reflib.vjp("identity", [x], g, dps=dps)
    gx[0] = 7.0
    assert g[0] == 1.0
    y = reflib.forward("add", [np.array([1, 2]), np.array([1.0, 0.5], dtype=np.float32)], dps=dps)
    assert (y.dtype == np.float64) if dps is None else _all_mpf(y)
    assert [float(v) for v in y] == [2.0, 2.5]


def test_inputs_given_as_mpf_are_used_at_full_precision():
    with mpmath.workdps(50):
        third = mpmath.mpf(1) / 3
        out = reflib.forward("mul", [np.array([third], dtype=object), np.array([3.0])], dps=50)
        assert abs(out[0] - 1) < mpmath.mpf(10) ** -49
    # float64 path rounds mpf inputs to double
    assert reflib.forward("identity", [np.array([third], dtype=object)])[0] == 1 / 3


# ---------------------------------------------------------------------------------------------
# Bad input: every message says what is wrong and how to fix it
# ---------------------------------------------------------------------------------------------

def test_unknown_op_lists_close_names():
    with pytest.raises(UnknownOpError, match=r"unknown op 'tanhh'.*did you mean 'tanh'") as info:
        reflib.forward("tanhh", [np.zeros(2)])
    assert isinstance(info.value, KeyError)
    assert "unknown op" in str(info.value) and not str(info.value).startswith("\"")
    with pytest.raises(UnknownOpError, match="log_softmax"):
        reflib.vjp("logsoftmax", [np.zeros(2)], np.zeros(2))
    with pytest.raises(UnknownOpError, match="known ops"):
        reflib.forward(42, [np.zeros(2)])


BAD_CALLS = [
    # (name, inputs, params, grad or None, exception, message pattern)
    ("add", [np.zeros(2)], {}, None, ValueError, r"add: takes 2 input\(s\) \('a', 'b'\); got 1"),
    ("add", [np.zeros((2, 3)), np.zeros(4)], {}, None, ValueError, r"do not broadcast"),
    ("matmul", [np.zeros((2, 3)), np.zeros((4, 2))], {}, None, ValueError, r"inner dimensions differ"),
    ("matmul", [np.zeros(3), np.zeros((3, 2))], {}, None, ValueError, r"2-D or batched"),
    ("matmul", [np.zeros((2, 2, 3)), np.zeros((3, 3, 2))], {}, None, ValueError, r"batch shapes differ"),
    ("sum", [np.zeros((2, 3))], {"axis": 2}, None, ValueError, r"axis=2 is out of range"),
    ("sum", [np.zeros((2, 3))], {"axis": (0, -2)}, None, ValueError, r"repeats an axis"),
    ("sum", [np.zeros((2, 3))], {"keepdims": "yes"}, None, ValueError, r"keepdims must be True or False"),
    ("mean", [np.zeros((0, 3))], {"axis": 0}, None, ValueError, r"cannot reduce over zero elements"),
    ("sum", [np.zeros(3)], {"axs": 0}, None, ValueError, r"unknown param 'axs'; did you mean 'axis'"),
    ("tanh", [np.zeros(3)], {"axis": 0}, None, ValueError, r"unknown param 'axis'.*params are: none"),
    ("reshape", [np.zeros(6)], {}, None, ValueError, r"param 'shape' is required"),
    ("reshape", [np.zeros(6)], {"shape": (4, -1)}, None, ValueError, r"cannot reshape .*\(6,\).* to \(4, -1\)"),
    ("reshape", [np.zeros(6)], {"shape": (-1, -1)}, None, ValueError, r"more than one -1"),
    ("transpose", [np.zeros((2, 3))], {"axes": (0, 0)}, None, ValueError, r"not a permutation"),
    ("concat", [np.zeros((2, 3)), np.zeros((3, 3))], {"axis": 1}, None, ValueError, r"differ off axis"),
    ("concat", [np.zeros((2, 3)), np.zeros(3)], {}, None, ValueError, r"same number"),
    ("slice", [np.zeros(4)], {"step": 0}, None, ValueError, r"step must be >= 1"),
    ("slice", [np.zeros(4)], {"start": 1.5}, None, ValueError, r"start must be an int"),
    ("softmax", [np.zeros((2, 3))], {"axis": 5}, None, ValueError, r"axis=5 is out of range"),
    ("layer_norm", [np.zeros(3)], {"eps": -1.0}, None, ValueError, r"eps must be > 0"),
    ("rms_norm", [np.zeros(3)], {"eps": 0.0}, None, ValueError, r"eps must be > 0"),
    ("leaky_relu", [np.zeros(3)], {"negative_slope": float("nan")}, None, ValueError, r"negative_slope must be a finite"),
    ("log", [np.array([1.0, -2.0])], {}, None, ValueError, r"x must be > 0.*x\[\(1,\)\] = -2"),
    ("sqrt", [np.array([-1.0])], {}, None, ValueError, r"sqrt: x must be >= 0"),
    ("sqrt", [np.array([0.0])], {}, np.array([1.0]), ValueError, r"derivative .* infinite at 0"),
    ("div", [np.ones(2), np.array([1.0, 0.0])], {}, None, ValueError, r"b must be nonzero"),
    ("exp", [np.array([1.0, np.inf])], {}, None, ValueError, r"non-finite value \+?inf at index \(1,\)"),
    ("exp", [np.array([np.nan])], {}, None, ValueError, r"non-finite"),
    ("exp", [np.array([1 + 2j])], {}, None, TypeError, r"dtype complex128; pass a real array"),
    ("exp", [np.array(["a"])], {}, None, TypeError, r"pass a real array"),
    ("exp", [np.array([None], dtype=object)], {}, None, TypeError, r"holds NoneType"),
    ("exp", np.zeros(3), {}, None, TypeError, r"inputs must be a sequence of arrays"),
    ("tanh", [np.zeros((2, 3))], {}, np.zeros(3), ValueError, r"grad has shape \(3,\) but the output has shape \(2, 3\)"),
    ("mse", [np.zeros((2, 3)), np.zeros((3, 2))], {}, None, ValueError, r"same shape; got \(2, 3\) and \(3, 2\)"),
    ("mse", [np.zeros(2), np.zeros(2)], {}, np.zeros(1), ValueError, r"grad has shape \(1,\) but the output has shape \(\)"),
    ("cross_entropy", [np.zeros((2, 3)), np.array([0, 3])], {}, None, ValueError, r"index 3 is out of range for 3 classes"),
    ("cross_entropy", [np.zeros((2, 3)), np.array([0, -1])], {}, None, ValueError, r"out of range"),
    ("cross_entropy", [np.zeros((2, 3)), np.array([0.0, 1.5])], {}, None, ValueError, r"whole-number class indices"),
    ("cross_entropy", [np.zeros((2, 3)), np.zeros((2, 3))], {}, None, ValueError, r"categorical_cross_entropy"),
    ("cross_entropy", [np.zeros(3), np.array([0])], {}, None, ValueError, r"non-empty 2-D array \(N, C\)"),
    ("cross_entropy", [np.zeros((2, 3)), np.array([True, False])], {}, None, TypeError, r"dtype bool; pass integer class indices"),
    ("add", [np.zeros(2), np.array([True, False])], {}, None, TypeError, r"input b is a boolean array"),
    ("binary_cross_entropy", [np.array([0.5, 1.0]), np.zeros(2)], {}, None, ValueError, r"strictly inside \(0, 1\)"),
    ("categorical_cross_entropy", [np.zeros((2, 3)), np.zeros((2, 2))], {}, None, ValueError, r"same shape"),
]


@pytest.mark.parametrize("dps", [None, 30])
@pytest.mark.parametrize("name, inputs, params, grad, exc, pattern", BAD_CALLS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_input_raises_a_clear_error(name, inputs, params, grad, exc, pattern, dps):
    with pytest.raises(exc, match=pattern):
        if grad is None:
            reflib.forward(name, inputs, dps=dps, **params)
        else:
            reflib.vjp(name, inputs, grad, dps=dps, **params)
    if grad is None:  # vjp checks the same things before it differentiates
        with pytest.raises(exc, match=pattern):
            reflib.vjp(name, inputs, np.zeros(()), dps=dps, **params)


@pytest.mark.parametrize("dps", [0, -3, 2.5, True, "50"])
def test_bad_dps(dps):
    with pytest.raises(ValueError, match="dps must be None"):
        reflib.forward("exp", [np.zeros(2)], dps=dps)


@pytest.mark.parametrize("dps", [None, 50])
def test_kink_conventions_match_spec(dps):
    # at the kinks themselves (x = 0, a == b) the derivative is a convention: reflib and the
    # registry must state the same one, value for value (they are exact small numbers)
    evaluate = _spec_evaluate()
    x, g = np.array([-1.0, 0.0, 2.0]), np.array([3.0, 5.0, 7.0])
    calls = [("relu", [x], {}), ("abs", [x], {}), ("leaky_relu", [x], {"negative_slope": 0.25}),
             ("maximum", [np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 3.0])], {})]
    for name, inputs, params in calls:
        got = reflib.vjp(name, inputs, g, dps=dps, **params)
        _, want = evaluate(name, inputs, g, params=params, dps=50)
        for a, b in zip(got, want):
            assert [float(v) for v in a.flat] == [float(v) for v in b.flat], name


@pytest.mark.parametrize("dps", [None, 40])
def test_vjp_from_output_equals_vjp(dps):
    rng = np.random.default_rng(5)
    for name in ("tanh", "softmax", "matmul", "layer_norm", "cross_entropy"):
        inputs, params = _case(name, rng, 0)
        out = reflib.forward(name, inputs, dps=dps, **params)
        grad = rng.normal(size=out.shape)
        a = reflib.vjp(name, inputs, grad, dps=dps, **params)
        b = reflib.ops.vjp_from_output(name, inputs, out, grad, dps=dps, **params)
        for ga, gb in zip(a, b):
            assert (ga is None and gb is None) or np.array_equal(ga, gb)
