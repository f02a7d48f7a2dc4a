"""fastlib.losses: DataCode's strict target formats and messages, accuracy per loss, values.

Expected loss values and gradients come from mpmath at 50 digits, written here from the
definitions (docs/CONTRACTS.md's loss rows); accuracies from hand-built cases.

Tolerances: float64 results to 1e-13 relative (a handful of roundings in a mean over <= 40
terms, well conditioned away from p in {0, 1}); float32 to 64 eps32 ~ 7.6e-6 relative (the
same roundings in float32 plus the exp/log kernels' few-ulp error).
"""
from __future__ import annotations

import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastlib
from fastlib import losses
from fastlib.losses import (accuracy, loss_value, loss_value_and_grad, onehot, resolve_loss,
                            validate_targets)

mpmath.mp.dps = 50
TOL = {np.float64: 1e-13, np.float32: 64 * float(np.finfo(np.float32).eps)}


# ------------------------------------------------------------------------------ exact oracles
def mp(a):
    return [[mpmath.mpf(float(v)) for v in row] for row in np.atleast_2d(a)]


def exact(loss, pred, target):
    """(loss, dloss/dpred) at 50 digits from the definitions."""
    p = np.asarray(pred, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    if loss == "mse":
        n = p.size
        d = [mpmath.mpf(float(a)) - mpmath.mpf(float(b)) for a, b in zip(p.ravel(), t.ravel())]
        return sum(x * x for x in d) / n, np.array([float(2 * x / n) for x in d]).reshape(p.shape)
    if loss in ("cross_entropy", "categorical_cross_entropy"):
        rows = mp(p)
        n, c = p.shape
        if loss == "cross_entropy":
            onehot_rows = [[mpmath.mpf(1 if j == int(t.ravel()[i]) else 0) for j in range(c)]
                           for i in range(n)]
        else:
            onehot_rows = mp(t)
        total, grad = mpmath.mpf(0), np.zeros((n, c))
        for i in range(n):
            lse = mpmath.log(sum(mpmath.exp(z) for z in rows[i]))
            total += sum(-y * (z - lse) for y, z in zip(onehot_rows[i], rows[i]))
            ysum = sum(onehot_rows[i])
            for j in range(c):
                grad[i, j] = float((ysum * mpmath.exp(rows[i][j] - lse) - onehot_rows[i][j]) / n)
        return total / n, grad
    n = p.size
    zs = [mpmath.mpf(float(v)) for v in p.ravel()]
    ts = [mpmath.mpf(float(v)) for v in t.ravel()]
    if loss == "binary_cross_entropy":
        total = sum(-(y * mpmath.log(q) + (1 - y) * mpmath.log(1 - q)) for q, y in zip(zs, ts))
        grad = [(-(y / q) + (1 - y) / (1 - q)) / n for q, y in zip(zs, ts)]
    else:  # with logits
        sig = [1 / (1 + mpmath.exp(-z)) for z in zs]
        total = sum(-(y * mpmath.log(s) + (1 - y) * mpmath.log(1 - s)) for s, y in zip(sig, ts))
        grad = [(s - y) / n for s, y in zip(sig, ts)]
    return total / n, np.array([float(g) for g in grad]).reshape(p.shape)


@st.composite
def loss_batches(draw, loss):
    n = draw(st.integers(1, 5))
    c = draw(st.integers(2, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    if loss == "mse":
        shape = draw(st.sampled_from([(n, c), (n, 1), (n,)]))
        return rng.standard_normal(shape) * 3, rng.standard_normal(shape) * 3
    if loss == "cross_entropy":
        idx = rng.integers(0, c, size=draw(st.sampled_from([(n, 1), (n,)])))
        return rng.standard_normal((n, c)) * 4, idx
    if loss == "categorical_cross_entropy":
        soft = draw(st.booleans())
        target = rng.dirichlet(np.ones(c), size=n) if soft else np.eye(c)[rng.integers(0, c, n)]
        return rng.standard_normal((n, c)) * 4, target
    if loss == "binary_cross_entropy":
        return rng.uniform(0.02, 0.98, (n, c)), rng.uniform(0, 1, (n, c))
    return rng.standard_normal((n, c)) * 4, (rng.uniform(0, 1, (n, c)) > 0.5).astype(float)


# ------------------------------------------------------------------------------ values
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("loss", losses.LOSSES)
@settings(max_examples=10)
@given(data=st.data())
def test_value_and_gradient_match_exact(loss, dtype, data):
    pred, target = data.draw(loss_batches(loss))
    pred = pred.astype(dtype)
    value, grad = loss_value_and_grad(loss, pred, target)
    want, want_grad = exact(loss, pred, target)
    tol = TOL[dtype]
    assert isinstance(value, float)
    assert abs(value - float(want)) <= tol * max(abs(float(want)), 1e-300)
    assert grad.dtype == dtype and grad.shape == pred.shape
    err = np.linalg.norm(grad.astype(np.float64) - want_grad)
    assert err <= tol * np.linalg.norm(want_grad)
    assert loss_value(loss, pred, target) == pytest.approx(value, rel=tol)
    # check=False on targets that validate_targets normalised gives the same answer
    normalised = validate_targets(loss, pred, target)
    v2, g2 = loss_value_and_grad(loss, pred, normalised, check=False)
    assert v2 == value
    np.testing.assert_array_equal(g2, grad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropies_are_finite_for_huge_logits(dtype):
    logits = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4]], dtype=dtype)
    for loss, target in [("cross_entropy", [[1], [2]]),
                         ("categorical_cross_entropy", [[0, 1, 0], [0, 0, 1]]),
                         ("binary_cross_entropy_with_logits", np.ones((2, 3)))]:
        value, grad = loss_value_and_grad(loss, logits, target)
        assert np.isfinite(value) and np.isfinite(grad).all()
    value, _ = loss_value_and_grad("cross_entropy", logits, [[1], [2]])
    assert value == pytest.approx(1e4, rel=1e-6)  # row 0 costs 2e4, row 1 costs 0


def test_binary_cross_entropy_at_saturated_probabilities():
    # p in {0, 1} with an agreeing target costs exactly 0: left to the kernel
    p = np.array([[0.0, 1.0, 0.5]], dtype=np.float32)
    value, grad = loss_value_and_grad("binary_cross_entropy", p, [[0.0, 1.0, 1.0]])
    assert value == pytest.approx(np.log(2) / 3, rel=TOL[np.float32])
    assert np.isfinite(grad).all()
    # a disagreeing target would cost inf: p is clamped to [eps, 1 - eps], so each term is
    # -log(eps32) (float32 rounding of 1 - eps32 is exact), finite with a finite gradient
    value, grad = loss_value_and_grad("binary_cross_entropy", p[:, :2], [[1.0, 0.0]])
    eps = float(np.finfo(np.float32).eps)
    assert value == pytest.approx(-np.log(eps), rel=1e-6)
    assert np.isfinite(grad).all()
    unchecked, _ = loss_value_and_grad("binary_cross_entropy", p[:, :2],
                                       np.array([[1.0, 0.0]], np.float32), check=False)
    assert unchecked == value


# ------------------------------------------------------------------------------ names
def test_names_are_case_insensitive_and_alias_warns():
    assert resolve_loss("MSE") == "mse"
    assert resolve_loss(" Cross_Entropy ") == "cross_entropy"
    with pytest.warns(DeprecationWarning, match="deprecated; use 'cross_entropy'"):
        assert resolve_loss("sparse_cross_entropy") == "cross_entropy"
    with pytest.warns(DeprecationWarning):
        value, _ = loss_value_and_grad("Sparse_Cross_Entropy", np.zeros((2, 3)), [[0], [1]])
    assert value == pytest.approx(np.log(3), rel=1e-15)  # uniform logits: log C


def test_unknown_loss_names():
    with pytest.raises(ValueError, match=r"unknown loss_type 'cross_entropi'; did you mean "
                                         r"'cross_entropy'"):
        resolve_loss("cross_entropi")
    with pytest.raises(ValueError, match=r"choose one of \['mse'"):
        resolve_loss("hinge")
    with pytest.raises(TypeError, match="must be a name"):
        resolve_loss(3)


# ------------------------------------------------------------------------------ errors
ERRORS = [
    ("cross_entropy", np.zeros((4, 10)), np.eye(10)[[1, 2, 3, 4]],
     "cross_entropy expects class indices [batch, 1], got [batch, 10]: use "
     "categorical_cross_entropy for one-hot targets, or pass class indices"),
    ("categorical_cross_entropy", np.zeros((4, 10)), np.array([[1], [2], [3], [4]]),
     "categorical_cross_entropy expects one-hot targets [batch, 10], got [batch, 1]: convert "
     "class indices with fastlib.onehot(y, 10), or use cross_entropy"),
    ("cross_entropy", np.zeros((3, 4)), np.array([[0], [4], [1]]),
     "cross_entropy: class index 4 at row 1 is out of range for 4 classes (valid 0..3)"),
    ("cross_entropy", np.zeros((3, 4)), np.array([[0], [-1], [1]]),
     "cross_entropy: class index -1 at row 1 is out of range"),
    ("cross_entropy", np.zeros((2, 4)), np.array([[0.0], [1.5]]),
     "cross_entropy expects whole-number class indices, got 1.5"),
    ("cross_entropy", np.zeros(4), np.array([0, 1, 2, 3]),
     "cross_entropy expects logits [batch, classes], got [4]"),
    ("cross_entropy", np.zeros((3, 4)), np.array([[0], [1]]),
     "cross_entropy: batch sizes differ: predictions have 3 rows [3, 4], targets 2 rows [2, 1]"),
    ("mse", np.zeros((3, 2)), np.zeros((3, 1)),
     "mse expects targets of the prediction's shape [3, 2], got [3, 1]"),
    ("mse", np.zeros((3, 1)), np.zeros(3),
     "mse expects targets of the prediction's shape [3, 1], got [3]; reshape them (e.g. "
     "y.reshape(3, 1))"),
    ("mse", np.zeros((3, 1)), np.zeros((2, 1)), "mse: batch sizes differ"),
    ("mse", np.array([[0.0], [np.nan]]), np.zeros((2, 1)),
     "mse: predictions contain NaN or Inf (first at index (1, 0), value nan); the model "
     "diverged"),
    ("mse", np.zeros((2, 1)), np.array([[0.0], [np.inf]]),
     "mse: targets contain NaN or Inf (first at index (1, 0), value inf)"),
    ("binary_cross_entropy", np.array([[0.5], [1.3]]), np.zeros((2, 1)),
     "binary_cross_entropy expects probabilities in [0, 1] as predictions, got 1.3 at index "
     "(1, 0): end the model with a sigmoid, or use binary_cross_entropy_with_logits"),
    ("binary_cross_entropy", np.array([[0.5], [0.3]]), np.array([[0.0], [2.0]]),
     "binary_cross_entropy expects targets in [0, 1], got 2.0 at index (1, 0)"),
    ("binary_cross_entropy_with_logits", np.zeros((2, 1)), np.array([[-0.5], [1.0]]),
     "binary_cross_entropy_with_logits expects targets in [0, 1], got -0.5"),
    ("categorical_cross_entropy", np.zeros((2, 3)), np.array([[0.5, 0.2, 0.1], [0, 0, 1]]),
     "categorical_cross_entropy expects one-hot (or probability) rows: non-negative and summing "
     "to 1; row 0 sums to 0.8"),
    # a row that sums to 1 but holds a negative entry: the message names the entry
    ("categorical_cross_entropy", np.zeros((2, 3)), np.array([[0, 0, 1], [1.5, -0.5, 0]]),
     "row 1 holds -0.5 at class 1"),
]


@pytest.mark.parametrize("index", range(len(ERRORS)))
def test_target_errors_say_what_to_do(index):
    loss, pred, target, message = ERRORS[index]
    for call in (validate_targets, loss_value_and_grad, accuracy, loss_value):
        if call is accuracy and loss == "mse":
            continue  # mse has no accuracy, so nothing to check
        with pytest.raises(ValueError) as err:
            call(loss, pred, target)
        assert message in str(err.value)


def test_type_errors():
    with pytest.raises(TypeError, match="targets must be a numeric array"):
        validate_targets("mse", np.zeros((2, 1)), np.array([["a"], ["b"]]))
    with pytest.raises(TypeError, match="predictions must be a float array"):
        validate_targets("mse", np.array([["a"]]), np.zeros((1, 1)))


def test_valid_targets_are_normalised():
    idx = validate_targets("cross_entropy", np.zeros((3, 4)), np.array([[0.0], [3.0], [1.0]]))
    assert idx.dtype == np.int64 and idx.tolist() == [0, 3, 1]
    t = validate_targets("mse", np.zeros((2, 2), np.float32), np.ones((2, 2), np.int64))
    assert t.dtype == np.float32
    t = validate_targets("binary_cross_entropy", np.full((2, 1), 0.5), np.array([[True], [False]]))
    assert t.tolist() == [[1.0], [0.0]]


# ------------------------------------------------------------------------------ accuracy
def test_accuracy_per_loss_on_hand_built_cases():
    logits = np.array([[2.0, 1.0, 0.0],    # argmax 0
                       [0.0, 3.0, 1.0],    # argmax 1
                       [1.0, 1.0, 0.5],    # tie: first maximum, 0
                       [0.0, 0.0, 9.0]])   # argmax 2
    assert accuracy("cross_entropy", logits, [[0], [1], [1], [0]]) == 0.5
    assert accuracy("cross_entropy", logits, np.array([0, 1, 0, 2])) == 1.0
    assert accuracy("categorical_cross_entropy", logits, np.eye(3)[[0, 2, 0, 2]]) == 0.75
    p = np.array([[0.9, 0.2], [0.5, 0.51]])        # 0.5 predicts 0 (ties to class 0)
    assert accuracy("binary_cross_entropy", p, [[1, 0], [0, 1]]) == 1.0
    assert accuracy("binary_cross_entropy", p, [[1, 1], [1, 1]]) == 0.5
    z = np.array([[3.0, -1.0, 0.0]])                 # z = 0 is sigmoid 0.5: predicts 0
    assert accuracy("binary_cross_entropy_with_logits", z, [[1, 0, 0]]) == 1.0
    assert accuracy("binary_cross_entropy_with_logits", z, [[0.9, 0.2, 0.7]]) == pytest.approx(
        2 / 3)
    assert accuracy("mse", logits, np.zeros_like(logits)) is None


def test_onehot():
    out = onehot(np.array([[2], [0], [1]]), 4)
    np.testing.assert_array_equal(out, [[0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0]])
    assert out.dtype == np.float32
    assert fastlib.onehot([1.0, 0.0], 2, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="out of range for 3 classes"):
        onehot([[3]], 3)
    with pytest.raises(ValueError, match=r"expects class indices \[batch, 1\]"):
        onehot(np.zeros((2, 3)), 3)
    with pytest.raises(ValueError, match="num_classes must be a positive int"):
        onehot([1], 0)
    # a round trip through categorical_cross_entropy equals cross_entropy on the indices
    logits = np.random.default_rng(0).standard_normal((5, 4))
    y = np.array([[0], [3], [2], [2], [1]])
    a = loss_value_and_grad("cross_entropy", logits, y)
    b = loss_value_and_grad("categorical_cross_entropy", logits, onehot(y, 4, np.float64))
    assert a[0] == pytest.approx(b[0], rel=1e-15)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-15, atol=1e-17)


@settings(max_examples=10)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(2, 5)),
                  elements=st.floats(-50, 50)))
def test_accuracy_is_a_fraction_matching_a_direct_count(logits):
    idx = np.arange(logits.shape[0]) % logits.shape[1]
    got = accuracy("cross_entropy", logits, idx.reshape(-1, 1))
    count = sum(int(np.argmax(row) == i) for row, i in zip(logits, idx))
    assert got == count / logits.shape[0]


def test_accuracy_alias_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert accuracy("sparse_cross_entropy", np.eye(2), [[0], [1]]) == 1.0
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
