"""fastlib.Tape against reflib.Tape: same gradients, same Nones, same errors, on random DAGs.

Oracles: reflib's tape (the referee, float64) on the identical DAG, graph reachability written
out here for which slots are reached, and hand derivations. Gradients of ops agree to 1e-12
normwise (both float64; the kernels and the reference ops are different code, so they agree to
a few ulps per op, and these DAGs have at most 8 ops on values in [-2, 2], well conditioned).
Traversal itself (custom nodes only, integer values) must agree exactly.
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlib
import reflib
from fastlib.tape import AutogradError, Tape

# The DAG strategy and the reachability oracle live in reports.conformance.strategies
# (`verigrad conform` runs the tape laws on the same DAGs).
from reports.conformance.strategies import build_dag as build
from reports.conformance.strategies import dags, reached


def both(nodes):
    fast, ref = Tape(), reflib.Tape()
    return fast, build(fast, nodes), ref, build(ref, nodes)


def assert_same_slots(fast, ref, rtol):
    assert len(fast) == len(ref)
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert (a is None) == (b is None), f"slot {i}: fast {a}, reference {b}"
        if a is not None:
            a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
            assert a.shape == b.shape
            if rtol == 0:
                np.testing.assert_array_equal(a, b, err_msg=f"slot {i}")
                continue
            scale = max(np.linalg.norm(b), 1.0)
            assert np.linalg.norm(a - b) <= rtol * scale, f"slot {i}: {a} vs {b}"


def seed_for(tape, out, rng):
    return rng.standard_normal(np.shape(tape.value(out)))


# ------------------------------------------------------------------------------ random DAGs
@given(dags(with_ops=False, integer=True), st.integers(0, 2**31 - 1))
def test_traversal_matches_reference_exactly_on_custom_nodes(dag, seed):
    # Integer values and integer seeds: every sum is exact in float64, so traversal order,
    # skipping and dropping must give bit-identical slots.
    nodes, out = dag
    fast, fast_calls, ref, ref_calls = both(nodes)
    s = np.round(seed_for(fast, out, np.random.default_rng(seed)) * 3)
    assert_same_slots(fast.backward_dense(out, s), ref.backward_dense(out, s), rtol=0.0)
    assert fast_calls == ref_calls  # the same VJPs ran, in the same order (ids n-1..0)
    assert {i for i, g in enumerate(fast.backward_dense(out, s)) if g is not None} == \
        reached(nodes, out)


@given(dags(), st.integers(0, 2**31 - 1))
def test_every_form_matches_reference_on_random_dags(dag, seed):
    nodes, out = dag
    fast, _, ref, _ = both(nodes)
    rng = np.random.default_rng(seed)
    s = seed_for(fast, out, rng)
    tol = 1e-12  # float64 kernels vs reference ops: a few ulps per op, <= 8 ops (module doc)
    dense = fast.backward_dense(out, s)
    assert_same_slots(dense, ref.backward_dense(out, s), tol)
    assert {i for i, g in enumerate(dense) if g is not None} == reached(nodes, out)
    assert_same_slots(fast.backward_dense_all(out, s), ref.backward_dense_all(out, s), tol)
    sparse = fast.backward(out, s)
    assert sorted(sparse) == sorted(ref.backward(out, s))
    assert sorted(sparse) == [i for i, g in enumerate(dense) if g is not None]
    grads0 = [rng.standard_normal(np.shape(fast.value(i))) for i in range(len(fast))]
    assert_same_slots(fast.backward_dense_from(grads0), ref.backward_dense_from(grads0), tol)
    k = int(rng.integers(0, len(fast) + 1))
    assert_same_slots(fast.backward_dense_from_loop(grads0, k),
                      ref.backward_dense_from_loop(grads0, k), tol)


@settings(max_examples=15)
@given(dags())
def test_dense_all_equals_dense_from_one_hot_when_vjps_preserve_zero(dag):
    # TorchLean's property: every VJP here maps a zero cotangent to zero (finite values).
    nodes, out = dag
    fast, _, _, _ = both(nodes)
    s = np.ones(np.shape(fast.value(out)))
    one_hot = [np.zeros(np.shape(fast.value(i))) for i in range(len(fast))]
    one_hot[out] = s
    all_form = fast.backward_dense_all(out, s)
    from_form = fast.backward_dense_from(one_hot)
    for i in range(len(fast)):
        np.testing.assert_array_equal(all_form[i], from_form[i])


def test_dense_all_and_dense_from_differ_on_an_unreached_singular_node():
    # y = custom node whose VJP is g * (1 / 0) (the derivative of 1/x at 0); out = 3 x.
    # backward_dense_all never runs y's VJP, so x's gradient is 3; backward_dense_from runs
    # every node, and y's zero cotangent times inf is NaN.
    with np.errstate(divide="ignore", invalid="ignore"):
        t = Tape()
        x = t.leaf(np.array(0.0))
        t.node(np.array(np.inf), [x], lambda g: [(x, g * (1.0 / t.value(x)))])
        out = t.node(3 * t.value(x), [x], lambda g: [(x, 3 * g)])
        all_form = t.backward_dense_all(out, np.array(1.0))
        from_form = t.backward_dense_from([np.array(0.0), np.array(0.0), np.array(1.0)])
    assert all_form[x] == 3.0 and all_form[1] == 0.0
    assert np.isnan(from_form[x])


# ------------------------------------------------------------------------------ semantics
def test_contributions_fold_left_to_right_and_dropped_parents():
    t = Tape()
    a = t.leaf([1.0, 2.0])
    b = t.leaf([5.0, 7.0], requires_grad=False)
    c = t.op("mul", a, b)          # dc/da = b
    d = t.op("add", c, a)          # a reached twice: b + 1
    grads = t.backward_dense(d, np.array([1.0, 1.0]))
    np.testing.assert_array_equal(grads[a], [6.0, 8.0])
    assert grads[b] is None        # requires_grad False: contribution dropped
    assert t.requires_grad(c) and not t.requires_grad(b)
    assert t.parents(d) == (c, a)


def test_scalar_backward_and_values_of_every_node():
    t = Tape()
    x = t.leaf([1.0, -2.0, 3.0])
    y = t.op("sum", t.op("square", x))
    grads = t.backward_scalar(y)
    np.testing.assert_array_equal(grads[x], [2.0, -4.0, 6.0])  # d/dx sum x^2 = 2x
    assert grads[y] == 1.0 and set(grads) == {0, 1, 2}        # intermediate node 1 kept too
    assert t.value(y) == 14.0


def test_op_params_and_nondifferentiable_inputs():
    t = Tape()
    logits = t.leaf([[2.0, 0.0, -1.0]])
    target = t.leaf([[0.0]], requires_grad=False)
    loss = t.op("cross_entropy", logits, target)
    g = t.backward_scalar(loss)[logits]
    z = np.array([2.0, 0.0, -1.0])
    expected = np.exp(z) / np.exp(z).sum() - np.array([1.0, 0.0, 0.0])  # softmax - onehot
    np.testing.assert_allclose(g[0], expected, rtol=1e-14, atol=1e-15)
    assert 1 not in t.backward_scalar(loss)
    s = t.op("sum", logits, axis=1, keepdims=True)
    assert t.value(s).shape == (1, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_of_values_and_gradients(dtype):
    t = Tape(dtype=dtype)
    x = t.leaf([0.5, 1.5])
    y = t.op("sum", t.op("tanh", x))
    g = t.backward_scalar(y)[x]
    assert t.value(x).dtype == dtype and g.dtype == dtype
    # tanh' = sech^2, exact from mpmath; the kernel's result is a few roundings of a
    # well-conditioned value: 8 eps of the dtype
    exact = [float(mpmath.sech(mpmath.mpf(v)) ** 2) for v in (0.5, 1.5)]
    np.testing.assert_allclose(g, exact, rtol=8 * np.finfo(dtype).eps)


def test_bad_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="float32 or float64"):
        Tape(dtype=np.int32)
    with pytest.raises(TypeError, match="real array"):
        Tape().leaf(np.array(["a"]))


def test_autograd_error_is_a_value_error():
    assert issubclass(AutogradError, ValueError)
    assert fastlib.AutogradError is AutogradError and fastlib.Tape is Tape


# ------------------------------------------------------------------------------ same errors
def _pair():
    """The same small tape on both engines: a leaf, a scalar op, a custom node."""
    tapes = []
    for t in (Tape(), reflib.Tape()):
        x = t.leaf([1.0, 2.0])
        s = t.node(np.array(3.0), [x], lambda g: [(x, g * np.ones(2))])  # sum, by hand
        t.node(np.array([0.0, 0.0]), [x], lambda g: [(x, np.ones(3))])   # wrong shape
        t.node(np.array(0.0), [x], lambda g: [(99, g)])                   # invalid parent
        t.node(np.array(0.0), [x], lambda g: [(x, None)])                 # None contribution
        tapes.append((t, x, s))
    return tapes


ERROR_CASES = {
    "invalid output id": lambda t, x, s: t.backward_dense(17, np.ones(())),
    "negative output id": lambda t, x, s: t.backward_dense(-1, np.ones(())),
    "bool output id": lambda t, x, s: t.backward(True, np.ones(())),
    "float output id": lambda t, x, s: t.backward(1.0, np.ones(())),
    "seed shape": lambda t, x, s: t.backward_dense(s, np.ones(2)),
    "scalar of non-scalar": lambda t, x, s: t.backward_scalar(x),
    "wrong contribution shape": lambda t, x, s: t.backward(2, np.zeros(2)),
    "invalid parent during backward": lambda t, x, s: t.backward(3, np.ones(())),
    "None contribution": lambda t, x, s: t.backward(4, np.ones(())),
    "grads0 length": lambda t, x, s: t.backward_dense_from([np.zeros(2)]),
    "grads0 ndarray": lambda t, x, s: t.backward_dense_from(np.zeros(5)),
    "grads0 shape": lambda t, x, s: t.backward_dense_from(
        [np.zeros(2), np.zeros(3), np.zeros(2), np.zeros(()), np.zeros(())]),
    "grads0 None": lambda t, x, s: t.backward_dense_from(
        [np.zeros(2), None, np.zeros(2), np.zeros(()), np.zeros(())]),
    "loop bound": lambda t, x, s: t.backward_dense_from_loop(
        [np.zeros(2), np.zeros(()), np.zeros(2), np.zeros(()), np.zeros(())], 9),
    "op input id": lambda t, x, s: t.op("neg", 42),
    "node parent id": lambda t, x, s: t.node(np.zeros(()), [7], lambda g: []),
    "value id": lambda t, x, s: t.value(5),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_errors_match_reference_type_and_message(case):
    (fast, fx, fs), (ref, rx, rs) = _pair()
    with pytest.raises(AutogradError) as fast_err:
        ERROR_CASES[case](fast, fx, fs)
    with pytest.raises(reflib.AutogradError) as ref_err:
        ERROR_CASES[case](ref, rx, rs)
    assert str(fast_err.value) == str(ref_err.value)
    assert str(fast_err.value).startswith("autograd: ")


def test_error_messages_name_the_node_and_both_shapes():
    (fast, x, s), _ = _pair()
    with pytest.raises(AutogradError, match=r"seed gradient shape mismatch for output 1: "
                                            r"output shape \(\), seed shape \(2,\)"):
        fast.backward_dense(s, np.ones(2))
    with pytest.raises(AutogradError, match=r"wrong shape for parent 0 from node 2: "
                                            r"contribution shape \(3,\), parent shape \(2,\)"):
        fast.backward(2, np.zeros(2))
    with pytest.raises(AutogradError, match=r"wrong shape for node 1: node shape \(\), "
                                            r"gradient shape \(3,\)"):
        fast.backward_dense_from([np.zeros(2), np.zeros(3), np.zeros(2), np.zeros(()),
                                  np.zeros(())])


def test_callable_backward_is_required():
    with pytest.raises(TypeError, match="callable"):
        Tape().node(np.zeros(()), [], None)
