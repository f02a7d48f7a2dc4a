"""spec.evaluate against independent mpmath: hand-written forwards, hand-written derivatives,
and high-precision directional finite differences of the hand-written forwards.

Nothing here calls the registry's formulas to compute an expected value: the references below
are written from the math (docs/CONTRACTS.md), loop by loop, with mpmath.
"""
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import spec

DPS = 50
mp = mpmath.mp


# ---------------------------------------------------------------------------------------------
# Independent references (mpmath, elementwise loops; NumPy only for indexing/broadcasting)


def _elementwise(f):
    def apply(x):
        x = np.asarray(x, dtype=object)
        out = np.empty(x.shape, dtype=object)
        for idx in np.ndindex(*x.shape):
            out[idx] = f(x[idx])
        return out
    return apply


def _sig(v):
    return 1 / (1 + mpmath.exp(-v))


def _gelu_tanh(v):
    c = mpmath.sqrt(2 / mpmath.pi)
    return v / 2 * (1 + mpmath.tanh(c * (v + mpmath.mpf("0.044715") * v**3)))


def _gelu_tanh_prime(v):
    c = mpmath.sqrt(2 / mpmath.pi)
    u = c * (v + mpmath.mpf("0.044715") * v**3)
    du = c * (1 + 3 * mpmath.mpf("0.044715") * v**2)
    return (1 + mpmath.tanh(u)) / 2 + v / 2 * mpmath.sech(u)**2 * du


# name -> (f, f') written from the math; f' is the Loom table / calculus, not the registry.
UNARY = {
    "neg": (lambda v: -v, lambda v: mpmath.mpf(-1)),
    "exp": (mpmath.exp, mpmath.exp),
    "log": (mpmath.log, lambda v: 1 / v),
    "sqrt": (mpmath.sqrt, lambda v: 1 / (2 * mpmath.sqrt(v))),
    "square": (lambda v: v * v, lambda v: 2 * v),
    "abs": (mpmath.fabs, lambda v: mpmath.sign(v)),
    "relu": (lambda v: v if v > 0 else mpmath.mpf(0), lambda v: mpmath.mpf(v > 0)),
    "leaky_relu": (lambda v: v if v > 0 else mpmath.mpf(0.01) * v,
                   lambda v: mpmath.mpf(1) if v > 0 else mpmath.mpf(0.01)),
    "silu": (lambda v: v * _sig(v), lambda v: _sig(v) * (1 + v * (1 - _sig(v)))),
    "gelu": (lambda v: v * mpmath.ncdf(v), lambda v: mpmath.ncdf(v) + v * mpmath.npdf(v)),
    "gelu_tanh": (_gelu_tanh, _gelu_tanh_prime),
    "tanh": (mpmath.tanh, lambda v: mpmath.sech(v)**2),
    "sigmoid": (_sig, lambda v: _sig(v) * (1 - _sig(v))),
    "softplus": (lambda v: mpmath.log1p(mpmath.exp(v)), _sig),
    "identity": (lambda v: +v, lambda v: mpmath.mpf(1)),
}


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % ndim for a in axis))


def _reduce(x, axis, keepdims, combine):
    """Apply ``combine(list of entries)`` over ``axis`` with explicit index loops."""
    axes = _axes(axis, x.ndim)
    kept = [i for i in range(x.ndim) if i not in axes]
    out_shape = tuple(x.shape[i] for i in kept)
    out = np.empty(out_shape, dtype=object)
    for idx in np.ndindex(*out_shape):
        entries = []
        for full in np.ndindex(*x.shape):
            if all(full[k] == idx[j] for j, k in enumerate(kept)):
                entries.append(x[full])
        out[idx] = combine(entries)
    if keepdims:
        out = out.reshape(tuple(1 if i in axes else n for i, n in enumerate(x.shape)))
    return out


def _lse(vals):
    return mpmath.log(mpmath.fsum(mpmath.exp(v) for v in vals))


def _rows(x, axis, f):
    """Apply ``f(list) -> list`` to every 1-D fibre of ``x`` along ``axis``."""
    moved = np.moveaxis(np.asarray(x, dtype=object), axis, -1)
    out = np.empty(moved.shape, dtype=object)
    for idx in np.ndindex(*moved.shape[:-1]):
        for j, value in enumerate(f(list(moved[idx]))):
            out[idx + (j,)] = value
    return np.moveaxis(out, -1, axis)


def _softmax_row(r):
    s = _lse(r)
    return [mpmath.exp(v - s) for v in r]


def _layer_norm_row(r, eps):
    n = len(r)
    mu = mpmath.fsum(r) / n
    var = mpmath.fsum((v - mu)**2 for v in r) / n
    return [(v - mu) / mpmath.sqrt(var + eps) for v in r]


def _rms_row(r, eps):
    ms = mpmath.fsum(v * v for v in r) / len(r)
    return [v / mpmath.sqrt(ms + eps) for v in r]


def _matmul(a, b):
    a = np.asarray(a, dtype=object)
    b = np.asarray(b, dtype=object)
    batch = a.shape[:-2]
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out = np.empty(batch + (m, n), dtype=object)
    for bi in np.ndindex(*batch):
        bb = b[bi] if b.ndim > 2 else b
        for i in range(m):
            for j in range(n):
                out[bi + (i, j)] = mpmath.fsum(a[bi + (i, q)] * bb[q, j] for q in range(k))
    return out


def reference_forward(name, xs, params):
    """The op's forward written independently of the registry."""
    p = dict(params)
    if name in UNARY:
        if name == "leaky_relu":
            s = mpmath.mpf(p.get("negative_slope", 0.01))
            return _elementwise(lambda v: v if v > 0 else s * v)(xs[0])
        return _elementwise(UNARY[name][0])(xs[0])
    if name in ("add", "sub", "mul", "div", "maximum"):
        a, b = np.broadcast_arrays(np.asarray(xs[0], dtype=object), np.asarray(xs[1], dtype=object))
        f = {"add": lambda u, v: u + v, "sub": lambda u, v: u - v, "mul": lambda u, v: u * v,
             "div": lambda u, v: u / v, "maximum": lambda u, v: max(u, v)}[name]
        out = np.empty(a.shape, dtype=object)
        for idx in np.ndindex(*a.shape):
            out[idx] = f(a[idx], b[idx])
        return out
    if name in ("sum", "mean", "logsumexp"):
        comb = {"sum": mpmath.fsum, "mean": lambda v: mpmath.fsum(v) / len(v), "logsumexp": _lse}
        return _reduce(np.asarray(xs[0], dtype=object), p.get("axis"), p.get("keepdims", False),
                       comb[name])
    if name == "matmul":
        return _matmul(*xs)
    x = np.asarray(xs[0], dtype=object)
    if name == "transpose":
        return np.transpose(x, p.get("axes"))
    if name == "reshape":
        return x.reshape(p["shape"])
    if name == "concat":
        return np.concatenate([x, np.asarray(xs[1], dtype=object)], axis=p.get("axis", -1))
    if name == "slice":
        index = [slice(None)] * x.ndim
        index[p.get("axis", 0)] = slice(p.get("start", 0), p.get("stop"), p.get("step", 1))
        return x[tuple(index)]
    if name == "softmax":
        return _rows(x, p.get("axis", -1), _softmax_row)
    if name == "log_softmax":
        return _rows(x, p.get("axis", -1), lambda r: [v - _lse(r) for v in r])
    if name == "layer_norm":
        eps = mpmath.mpf(p.get("eps", 1e-5))
        return _rows(x, -1, lambda r: _layer_norm_row(r, eps))
    if name == "rms_norm":
        eps = mpmath.mpf(p.get("eps", 1e-6))
        return _rows(x, -1, lambda r: _rms_row(r, eps))
    t = np.asarray(xs[1], dtype=object)
    flat_x, flat_t = list(x.reshape(-1)), list(t.reshape(-1))
    if name == "mse":
        return mpmath.fsum((u - v)**2 for u, v in zip(flat_x, flat_t)) / len(flat_x)
    if name == "cross_entropy":
        n = x.shape[0]
        return mpmath.fsum(_lse(list(x[i])) - x[i, int(flat_t[i])] for i in range(n)) / n
    if name == "categorical_cross_entropy":
        n = x.shape[0]
        return -mpmath.fsum(t[i, c] * (x[i, c] - _lse(list(x[i])))
                            for i in range(n) for c in range(x.shape[1])) / n
    if name == "binary_cross_entropy":
        return -mpmath.fsum(v * mpmath.log(u) + (1 - v) * mpmath.log(1 - u)
                            for u, v in zip(flat_x, flat_t)) / len(flat_x)
    if name == "binary_cross_entropy_with_logits":
        # softplus(z) - z t: the same function as the contract's stable form, written differently
        return mpmath.fsum(mpmath.log1p(mpmath.exp(u)) - u * v
                           for u, v in zip(flat_x, flat_t)) / len(flat_x)
    raise AssertionError(f"no reference for {name}")


def _mp(x):
    """float array -> object array of exact mpf."""
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=object)
    for idx in np.ndindex(*x.shape):
        out[idx] = mpmath.mpf(x[idx].item()) if x.dtype.kind == "f" else x[idx].item()
    return out


def _assert_close(actual, expected, rel, what):
    actual = np.asarray(actual, dtype=object)
    expected = np.asarray(expected, dtype=object)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    for idx in np.ndindex(*actual.shape):
        a, e = mpmath.mpf(actual[idx]), mpmath.mpf(expected[idx])
        assert abs(a - e) <= rel * max(1, abs(e)), f"{what}{idx}: {a} != {e}"


# ---------------------------------------------------------------------------------------------
# Cases over shapes the ops accept (not only the registry's examples)

small = st.integers(1, 3)


@st.composite
def cases(draw, name):
    """(inputs, params) for op ``name`` over random shapes it accepts."""
    op = spec.OPS[name]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cat, params = op.category, {}
    if cat == "unary" or name in ("layer_norm", "rms_norm"):
        shapes = [draw(hnp.array_shapes(min_dims=0 if cat == "unary" else 1, max_dims=3,
                                        min_side=1, max_side=3))]
        if name == "leaky_relu" and draw(st.booleans()):
            params["negative_slope"] = draw(st.sampled_from([0.2, 0.5, 1.5]))
        if name in ("layer_norm", "rms_norm") and draw(st.booleans()):
            params["eps"] = draw(st.sampled_from([1e-3, 0.5]))
    elif cat == "binary":
        shapes = list(draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3,
                                                             max_side=3)).input_shapes)
    elif cat == "reduction":
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3))
        shapes = [shape]
        axes = draw(st.lists(st.integers(-len(shape), len(shape) - 1), unique_by=lambda a: a
                             % max(len(shape), 1), max_size=len(shape))) if shape else []
        choice = draw(st.sampled_from(["none", "int", "tuple"])) if axes else "none"
        params["axis"] = None if choice == "none" else axes[0] if choice == "int" else tuple(axes)
        params["keepdims"] = draw(st.booleans())
    elif name == "matmul":
        batch = tuple(draw(st.lists(small, max_size=2)))
        m, k, n = draw(small), draw(small), draw(small)
        shared = bool(batch) and draw(st.booleans())
        shapes = [batch + (m, k), (k, n) if shared else batch + (k, n)]
    elif name == "transpose":
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
        shapes = [shape]
        params["axes"] = None if draw(st.booleans()) else tuple(draw(st.permutations(range(len(shape)))))
    elif name == "reshape":
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
        shapes = [shape]
        size = math.prod(shape)
        first = draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
        params["shape"] = draw(st.sampled_from([(first, size // first), (-1,), (first, -1),
                                                 (size // first, 1, first)]))
    elif name == "concat":
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        other = list(shape)
        other[axis] = draw(small)
        shapes = [shape, tuple(other)]
        params["axis"] = axis
    elif name == "slice":
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
        shapes = [shape]
        params = {"axis": draw(st.integers(-len(shape), len(shape) - 1)),
                  "start": draw(st.one_of(st.none(), st.integers(-4, 4))),
                  "stop": draw(st.one_of(st.none(), st.integers(-4, 5))),
                  "step": draw(st.integers(1, 3))}
    elif name in ("softmax", "log_softmax"):
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
        shapes = [shape]
        params["axis"] = draw(st.integers(-len(shape), len(shape) - 1))
    elif name in ("mse", "binary_cross_entropy", "binary_cross_entropy_with_logits"):
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
        shapes = [shape, shape]
    elif name == "cross_entropy":
        n, c = draw(small), draw(small)
        shapes = [(n, c), draw(st.sampled_from([(n,), (n, 1)]))]
    elif name == "categorical_cross_entropy":
        n, c = draw(small), draw(small)
        shapes = [(n, c), (n, c)]
    else:
        raise AssertionError(name)
    inputs = spec.sample_inputs(name, rng, shapes, params)
    return inputs, params, rng


def _directional_check(name, inputs, params, grad, grads, rng):
    """<vjp, u> == d/de Σ grad·f(x + e·u) at e = 0 (mpmath.diff of the hand-written forward)."""
    op = spec.OPS[name]
    xs = [_mp(x) for x in inputs]
    us = [None if gi is None else _mp(rng.uniform(-1, 1, size=np.shape(x)))
          for x, gi in zip(inputs, grads)]
    g = _mp(grad)

    def phi(e):
        moved = [x if u is None else x + e * u for x, u in zip(xs, us)]
        out = np.asarray(reference_forward(name, moved, params), dtype=object)
        return mpmath.fsum(a * b for a, b in zip(out.reshape(-1), g.reshape(-1)))

    lhs = mpmath.fsum(mpmath.fsum(a * b for a, b in zip(gi.reshape(-1), u.reshape(-1)))
                      for gi, u in zip(grads, us) if gi is not None)
    rhs = mpmath.diff(phi, 0)
    # NOTE: mpmath.diff works at raised precision, so at 50 digits the derivative is good to
    # ~1e-40; the ops sampled here are well conditioned (inputs away from kinks and poles).
    assert abs(lhs - rhs) <= mpmath.mpf(10)**-35 * max(1, abs(rhs)), (name, lhs, rhs)
    assert op.differentiable == tuple(n for n, gi in zip(op.inputs, grads) if gi is not None)


ALL_OPS = list(spec.OPS)


@pytest.mark.parametrize("name", ALL_OPS)
@settings(max_examples=min(10, settings.default.max_examples))
@given(data=st.data())
def test_forward_and_vjp_match_independent_mpmath(name, data):
    inputs, params, rng = data.draw(cases(name))
    op = spec.OPS[name]
    out_shape = op.check_shapes([np.shape(x) for x in inputs], params)
    grad = rng.uniform(-2, 2, size=out_shape)
    with mpmath.workdps(DPS):
        out, grads = spec.evaluate(name, inputs, grad, params, dps=DPS)
        expected = reference_forward(name, [_mp(x) for x in inputs], params)
        # Both sides are exact up to ~50-digit rounding of well-conditioned expressions.
        _assert_close(out, expected, mpmath.mpf(10)**-40, f"{name} forward")
        for x, gi in zip(inputs, grads):
            assert gi is None or gi.shape == np.shape(x)
        _directional_check(name, inputs, params, grad, grads, rng)


@pytest.mark.parametrize("name", sorted(UNARY))
@settings(max_examples=min(10, settings.default.max_examples))
@given(seed=st.integers(0, 2**32 - 1))
def test_unary_vjp_is_grad_times_handwritten_derivative(name, seed):
    rng = np.random.default_rng(seed)
    (x,) = spec.sample_inputs(name, rng, [(2, 3)])
    grad = rng.uniform(-2, 2, size=(2, 3))
    with mpmath.workdps(DPS):
        _, (gx,) = spec.evaluate(name, [x], grad, dps=DPS)
        expected = _elementwise(lambda v: v)(_mp(grad)) * _elementwise(UNARY[name][1])(_mp(x))
        # Same function on both sides, each rounded at 50 digits: 1e-40 leaves 10 digits spare.
        _assert_close(gx, expected, mpmath.mpf(10)**-40, f"{name}'")


def test_precision_follows_dps():
    # e and e^1 = e at 80 digits, to 1e-78 (one ulp at 80 digits is ~1e-80).
    with mpmath.workdps(90):
        out, (gx,) = spec.evaluate("exp", [np.array(1.0)], np.array(1.0), dps=80)
        assert out.shape == () and gx.shape == ()
        assert abs(out[()] - mpmath.e) < mpmath.mpf(10)**-78
        assert abs(gx[()] - mpmath.e) < mpmath.mpf(10)**-78
        # At 20 digits the result is rounded to 20 digits: its error is above 1e-30.
        low, _ = spec.evaluate("exp", [np.array(1.0)], np.array(1.0), dps=20)
        assert mpmath.mpf(10)**-30 < abs(low[()] - mpmath.e) < mpmath.mpf(10)**-18


def test_inputs_are_converted_exactly():
    # 0.1 as a float64 is 3602879701896397 / 2^55; evaluate must see that value, not 1/10.
    out, _ = spec.evaluate("identity", [np.array([0.1])], np.array([1.0]), dps=40)
    with mpmath.workdps(40):
        assert out[0] == mpmath.mpf(3602879701896397) / 2**55
    out32, _ = spec.evaluate("identity", [np.array([0.1], dtype=np.float32)],
                             np.array([1.0]), dps=40)
    with mpmath.workdps(40):
        assert out32[0] == mpmath.mpf(float(np.float32(0.1)))


def test_mpf_inputs_and_integer_inputs_are_accepted():
    with mpmath.workdps(60):
        third = mpmath.mpf(1) / 3
    out, (ga, gb) = spec.evaluate("mul", [np.array([third], dtype=object), np.array([3])],
                                  np.array([1.0]), dps=50)
    with mpmath.workdps(50):
        assert abs(out[0] - 1) < mpmath.mpf(10)**-49
        assert ga[0] == 3 and abs(gb[0] - mpmath.mpf(1) / 3) < mpmath.mpf(10)**-49


def test_loss_outputs_are_0d_and_class_indices_have_no_grad():
    logits = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 1.0]])
    out, (gz, gt) = spec.evaluate("cross_entropy", [logits, np.array([[2], [0]])], np.array(1.0))
    assert out.shape == () and gz.shape == (2, 3) and gt is None
    # Hand value: mean of lse(row) - row[target].
    with mpmath.workdps(50):
        expected = (_lse([mpmath.mpf(1), 2, mpmath.mpf(0.5)]) - mpmath.mpf(0.5)
                    + _lse([mpmath.mpf(0), -1, 1]) - 0) / 2
        assert abs(out[()] - expected) < mpmath.mpf(10)**-45
        # Rows of the logits' gradient sum to 0 (softmax sums to 1, one-hot sums to 1).
        for row in gz:
            assert abs(mpmath.fsum(row)) < mpmath.mpf(10)**-45
    # Float targets holding integers are accepted and give the same result.
    out2, _ = spec.evaluate("cross_entropy", [logits, np.array([2.0, 0.0])], np.array(1.0))
    assert out2[()] == out[()]


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors


def test_unknown_op_lists_close_names():
    with pytest.raises(spec.UnknownOpError, match="did you mean 'tanh'"):
        spec.evaluate("tahn", [np.zeros(2)], np.zeros(2))
    assert issubclass(spec.UnknownOpError, KeyError)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: spec.evaluate("add", [np.zeros(2)], np.zeros(2)), ValueError, "takes 2 input"),
    (lambda: spec.evaluate("tanh", np.zeros(2), np.zeros(2)), TypeError, r"wrap a single array"),
    (lambda: spec.evaluate("add", [np.zeros((2, 3)), np.zeros(4)], np.zeros((2, 3))),
     ValueError, r"\(2, 3\) and \(4,\) do not broadcast"),
    (lambda: spec.evaluate("tanh", [np.array([1.0, np.nan])], np.zeros(2)), ValueError,
     r"index \(1,\).*finite"),
    (lambda: spec.evaluate("log", [np.array([1.0, -2.0])], np.zeros(2)), ValueError,
     r"domain 'positive'.*-2.0"),
    (lambda: spec.evaluate("div", [np.ones(2), np.array([1.0, 0.0])], np.zeros(2)), ValueError,
     r"nonzero"),
    (lambda: spec.evaluate("binary_cross_entropy", [np.array([0.0]), np.array([1.0])],
                           np.array(1.0)), ValueError, r"unit_open"),
    (lambda: spec.evaluate("tanh", [np.array(["a"])], np.zeros(1)), TypeError, "dtype"),
    (lambda: spec.evaluate("tanh", [np.array([True])], np.zeros(1)), TypeError, "boolean"),
    (lambda: spec.evaluate("tanh", [np.zeros(3)], np.zeros(2)), ValueError,
     r"grad has shape \(2,\).*\(3,\)"),
    (lambda: spec.evaluate("tanh", [np.zeros(3)], np.array([np.inf, 0, 0])), ValueError, "finite"),
    (lambda: spec.evaluate("sum", [np.zeros(3)], np.zeros(()), {"axsi": 0}), ValueError,
     r"unknown param 'axsi'; did you mean 'axis'"),
    (lambda: spec.evaluate("sum", [np.zeros(3)], np.zeros(()), {"axis": 2}), ValueError,
     "out of range"),
    (lambda: spec.evaluate("reshape", [np.zeros(6)], np.zeros(6)), ValueError,
     "'shape' is required"),
    (lambda: spec.evaluate("reshape", [np.zeros(6)], np.zeros(6), {"shape": (4, 2)}), ValueError,
     "element count"),
    (lambda: spec.evaluate("matmul", [np.zeros((2, 3)), np.zeros((2, 3))], np.zeros((2, 3))),
     ValueError, "inner dimensions"),
    (lambda: spec.evaluate("cross_entropy", [np.zeros((2, 3)), np.array([0, 3])],
                           np.array(1.0)), ValueError, r"\[0, 3\)"),
    (lambda: spec.evaluate("cross_entropy", [np.zeros((2, 3)), np.array([0.5, 1])],
                           np.array(1.0)), ValueError, "class indices"),
    (lambda: spec.evaluate("cross_entropy", [np.zeros((2, 3)), np.eye(3)[[0, 1]]],
                           np.array(1.0)), ValueError, "categorical_cross_entropy"),
    (lambda: spec.evaluate("categorical_cross_entropy", [np.zeros((2, 3)), np.array([[0], [1]])],
                           np.array(1.0)), ValueError, "use cross_entropy"),
    (lambda: spec.evaluate("mse", [np.zeros(3), np.zeros((3, 1))], np.array(1.0)), ValueError,
     "same shape"),
    (lambda: spec.evaluate("tanh", [np.zeros(2)], np.zeros(2), dps=5), ValueError, "dps"),
    (lambda: spec.evaluate("tanh", [np.zeros(2)], None), ValueError, "grad is required"),
])
def test_bad_input_raises_a_clear_error(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_evaluate_forward_matches_evaluate():
    x = np.array([[0.5, -1.0], [2.0, 0.25]])
    out, _ = spec.evaluate("softmax", [x], np.ones((2, 2)))
    assert all(a == b for a, b in zip(out.reshape(-1), spec.evaluate_forward("softmax", [x])
                                       .reshape(-1)))


def test_zero_dimensional_mpf_inputs_are_accepted():
    """A 0-d object array of mpf (a loss value fed back in) evaluates like a float would."""
    import mpmath
    x = np.empty((), dtype=object)
    x[()] = mpmath.mpf("0.25")
    out, (g,) = spec.evaluate("square", [x], np.array(2.0))
    assert out.shape == () and out[()] == mpmath.mpf("0.0625")
    assert g[()] == 1  # 2 * x * grad = 2 * 0.25 * 2
