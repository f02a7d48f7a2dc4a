"""reflib.Tape: TorchLean's backward semantics, on random DAGs and on every error path.

Oracles: graph reachability written out here (which slots are reached), central finite
differences in mpmath at 100 digits of a re-evaluation of the same DAG (what the gradients
are), exact integer arithmetic (float64 tapes on integer-valued DAGs), and hand derivations.
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import reflib
from reflib import AutogradError, Tape

# ---------------------------------------------------------------------------------------------
# Random DAGs: leaves, registry ops and custom nodes, parents drawn from any earlier node (so
# shared subexpressions, diamonds and repeated parents occur), random requires_grad on leaves
# and custom nodes, and an output anywhere (so nodes after it, and side branches, are unreached).
# ---------------------------------------------------------------------------------------------

SHAPES = [(), (3,)]
# ops exact on small integers in float64 (no division, no transcendental function)
INT_OPS = {"add": 2, "sub": 2, "mul": 2, "neg": 1, "identity": 1, "sum": 1}
# (maximum stays out: two different nodes can tie, where the derivative is a convention that a
# finite difference cannot see; its tie rule is pinned in test_reflib_ops)
REAL_OPS = {**INT_OPS, "tanh": 1, "sigmoid": 1, "softplus": 1, "silu": 1, "square": 1,
            "mean": 1, "gelu": 1}


def custom_forward(kind, values):
    """The value of a custom node (works on float64 and mpf object arrays alike)."""
    p, q = values
    return {"scale": lambda: 2 * p, "twice": lambda: p + p, "prod": lambda: p * q}[kind]()


def custom_backward(kind, parents, values, calls, node_id):
    """backward(cotangent) -> [(parent, contribution)]; records each call in ``calls``."""
    (pid, qid), (p, q) = parents, values

    def backward(g):
        calls.append(node_id)
        if kind == "scale":
            return [(pid, 2 * g)]
        if kind == "twice":  # the same parent twice: its two contributions must be summed
            return [(pid, g), (pid, g)]
        return [(pid, g * q), (qid, g * p)]

    return backward


MOSTLY_TRUE = st.sampled_from([True, True, True, False])  # requires_grad: most nodes take part


@st.composite
def dags(draw, ops, values):
    """A DAG description: a list of ("leaf", value, rg) / ("op", name, parents) /
    ("custom", kind, parents, rg) entries, and the output id."""
    nodes, shapes = [], []
    for _ in range(draw(st.integers(1, 3))):
        shape = draw(st.sampled_from(SHAPES))
        if values == "int":
            v = np.array(draw(st.lists(st.integers(-3, 3), min_size=3, max_size=3))[:int(np.prod(shape))],
                         dtype=np.float64).reshape(shape)
        else:
            v = np.array(draw(st.lists(st.floats(-2, 2), min_size=3, max_size=3))[:int(np.prod(shape))],
                         dtype=np.float64).reshape(shape)
        nodes.append(("leaf", v, draw(MOSTLY_TRUE)))
        shapes.append(shape)
    for _ in range(draw(st.integers(1, 8))):
        # the newest node half the time (long chains), else any earlier one (diamonds, sharing)
        parent = st.one_of(st.just(len(nodes) - 1), st.integers(0, len(nodes) - 1))
        if draw(st.integers(0, 3)) == 0:  # a custom node
            kind = draw(st.sampled_from(["scale", "twice", "prod"]))
            p = draw(parent)
            same = [i for i, s in enumerate(shapes) if s == shapes[p]]
            q = draw(st.sampled_from(same)) if kind == "prod" else p
            nodes.append(("custom", kind, (p, q), draw(MOSTLY_TRUE)))
            shapes.append(shapes[p])
        else:
            name = draw(st.sampled_from(sorted(ops)))
            parents = tuple(draw(parent) for _ in range(ops[name]))
            nodes.append(("op", name, parents))
            reduced = name in ("sum", "mean")
            shapes.append(() if reduced else np.broadcast_shapes(*(shapes[p] for p in parents)))
    # the last node half the time (most of the DAG reached), else anywhere (much of it unreached)
    out = draw(st.one_of(st.just(len(nodes) - 1), st.integers(0, len(nodes) - 1)))
    seed_values = draw(st.lists(st.integers(-3, 3) if values == "int" else st.floats(-2, 2),
                                min_size=3, max_size=3))
    seed = np.array(seed_values[:int(np.prod(shapes[out]))], dtype=np.float64).reshape(shapes[out])
    return nodes, out, seed


def build(desc, dps=None):
    """Record ``desc`` on a new tape; returns the tape and the list of custom-backward calls."""
    t, calls = Tape(dps=dps), []
    for entry in desc:
        if entry[0] == "leaf":
            t.leaf(entry[1], requires_grad=entry[2])
        elif entry[0] == "op":
            t.op(entry[1], *entry[2])
        else:
            _, kind, parents, rg = entry
            vals = [t.value(p) for p in parents]
            with mpmath.workdps(dps or 15):  # a custom value is computed at the tape's precision
                value = custom_forward(kind, vals)
            t.node(value, parents,
                   custom_backward(kind, parents, vals, calls, len(t)), requires_grad=rg)
    return t, calls


def reached_set(t, out):
    """Which slots backward_dense fills: the output, then every requires-grad parent of a
    requires-grad reached node (graph reachability, written independently of the tape)."""
    reached = {out}
    for j in range(out, -1, -1):
        if j in reached and t.requires_grad(j):
            reached.update(p for p in t.parents(j) if t.requires_grad(p))
    return reached


FD_DPS, FD_STEP = 100, mpmath.mpf("1e-30")


def reevaluate(desc, t, i, delta):
    """The output's value with node i's value moved by ``delta``, in mpmath at FD_DPS digits.

    Nodes that do not require grad keep their recorded value (they stop the gradient, as the
    tape's dropped contributions do); every other node after i is recomputed from its parents.
    """
    vals = [np.asarray(t.value(k), dtype=object) for k in range(len(t))]
    vals[i] = np.asarray(vals[i] + delta, dtype=object)
    for k in range(i + 1, len(t)):
        entry = desc[k]
        if entry[0] == "leaf" or not t.requires_grad(k):
            continue
        if entry[0] == "op":
            vals[k] = reflib.forward(entry[1], [vals[p] for p in entry[2]], dps=FD_DPS)
        else:
            vals[k] = np.asarray(custom_forward(entry[1], [vals[p] for p in entry[2]]), dtype=object)
    return vals


def fd_directional(desc, t, out, seed, i, v):
    """d/dh <seed, out(node i + h v)> at h = 0 by a central difference at 100 digits."""
    with mpmath.workdps(FD_DPS):
        dot = lambda vals: mpmath.fsum(a * b for a, b in zip(seed.flat, vals[out].flat))  # noqa: E731
        up, down = reevaluate(desc, t, i, FD_STEP * v), reevaluate(desc, t, i, -FD_STEP * v)
        return (dot(up) - dot(down)) / (2 * FD_STEP)


def norm(a):
    return mpmath.sqrt(mpmath.fsum(mpmath.mpf(x) ** 2 for x in np.asarray(a).flat))


def check_against_oracles(desc, out, seed, dps, tol):
    t, calls = build(desc, dps=dps)
    dense = t.backward_dense(out, seed)
    reached = reached_set(t, out)
    assert len(dense) == len(t)
    assert {i for i, g in enumerate(dense) if g is not None} == reached
    # unreached custom nodes never ran their backward
    assert set(calls) <= {i for i in reached if t.requires_grad(i)}
    rng = np.random.default_rng(len(desc) * 7919 + out)
    for i in sorted(reached - {out}):
        g = dense[i]
        assert np.shape(g) == np.shape(t.value(i))
        v = rng.choice([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0], size=np.shape(g))  # never all zero
        fd = fd_directional(desc, t, out, seed, i, v)
        with mpmath.workdps(60):
            claimed = mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b) for a, b in zip(g.flat, v.flat))
            # scale by (||g|| + ||seed||) ||v||: a slot that cancels to ~0 is still held to the
            # size of the cotangents that flowed into it
            scale = (norm(g) + norm(seed)) * norm(v)
            err = abs(fd - claimed) / scale if scale else abs(fd)
        assert err <= tol, (i, float(err))
    assert [float(x) for x in np.asarray(dense[out]).flat] == [float(x) for x in seed.flat]
    return t, dense, calls


# Integer-valued DAGs on a float64 tape: values (kept below 2^20 by the assume) and cotangents are
# integers, exact in float64 until a product passes 2^53, and then off by one rounding (1e-16
# relative) per fold of at most ten nodes; the FD oracle is exact for these polynomials to ~1e-60.
# So 1e-12 is loose for rounding and still catches any misrouted or dropped contribution (O(1)).
@given(dags(INT_OPS, "int"))
def test_float64_tape_matches_finite_differences_on_integer_dags(case):
    desc, out, seed = case
    t, _ = build(desc)
    assume(max(np.max(np.abs(t.value(i)), initial=0) for i in range(len(t))) < 2.0**20)
    check_against_oracles(desc, out, seed, None, 1e-12)


# dps=50 tapes with transcendental ops and kinks: the FD oracle at 100 digits and step 1e-30 is
# good to ~1e-55 (truncation h^2 |f'''|, rounding 1e-100 / h); the tape's gradient carries 50-digit
# roundings through at most ten nodes, so 1e-40 (the exact bound) holds with margin.
@given(dags(REAL_OPS, "real"))
def test_exact_tape_matches_finite_differences(case):
    desc, out, seed = case
    check_against_oracles(desc, out, seed, 50, 1e-40)


@given(dags(REAL_OPS, "real"))
def test_sparse_dense_all_and_dense_from_agree(case):
    desc, out, seed = case
    t, calls = build(desc)
    dense = t.backward_dense(out, seed)
    # sparse == dense filtered
    sparse = t.backward(out, seed)
    assert sorted(sparse) == [i for i, g in enumerate(dense) if g is not None]
    assert all(np.array_equal(sparse[i], dense[i]) for i in sparse)
    # dense_all: zeros of the node's shape where dense has None, the same arrays elsewhere
    calls.clear()
    full = t.backward_dense_all(out, seed)
    assert set(calls) <= set(sparse)  # the VJP of an unreached node never runs
    for i, (g, a) in enumerate(zip(dense, full)):
        assert a.shape == np.shape(t.value(i))
        assert np.array_equal(a, np.zeros(a.shape) if g is None else g)
    # every VJP here is linear in the cotangent (maps 0 to 0), so seeding the loop form one-hot
    # at the output gives the same arrays (TorchLean's theorem), bit for bit
    grads0 = [np.zeros(np.shape(t.value(i))) for i in range(len(t))]
    grads0[out] = seed
    calls.clear()
    from_ = t.backward_dense_from(grads0)
    assert sorted(set(calls)) == sorted(i for i, e in enumerate(desc)
                                        if e[0] == "custom" and e[3])  # every rg node ran
    assert all(np.array_equal(a, b) for a, b in zip(full, from_))
    assert all(np.array_equal(g0, np.zeros(np.shape(g0))) for i, g0 in enumerate(grads0) if i != out)


def test_dense_all_and_dense_from_differ_on_a_singular_unreached_node():
    # x -> y = tanh(x) is the output; z is a custom node on x, not reached from y, whose VJP
    # computes g * (1 / 0). backward_dense_all never runs it (x's gradient is 1 - tanh(x)^2);
    # backward_dense_from runs every node, so z sends 0 * inf = NaN into x.
    t = Tape()
    x = t.leaf(np.array([0.5]))
    y = t.op("tanh", x)
    z = t.node(np.array([2.0]), [x], lambda g: [(x, g * (np.float64(1.0) / np.float64(0.0)))])
    assert z > y
    seed = np.array([1.0])
    full = t.backward_dense_all(y, seed)
    # tanh'(0.5) = 1 - tanh(0.5)^2, to a few ulp (reflib forms it as 4e / (1 + e)^2)
    slope = 1 - np.tanh(0.5) ** 2
    assert abs(full[x][0] - slope) <= 4 * np.finfo(np.float64).eps * slope
    assert full[z][0] == 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        from_ = t.backward_dense_from([np.zeros(1), seed, np.zeros(1)])
    assert np.isnan(from_[x][0]) and from_[y][0] == 1.0
    assert t.backward_dense(y, seed)[z] is None


# ---------------------------------------------------------------------------------------------
# Semantics pinned by hand
# ---------------------------------------------------------------------------------------------

def test_ids_values_and_requires_grad_rule():
    t = Tape()
    a = t.leaf([1.0, 2.0])
    b = t.leaf(np.array([3.0, 4.0]), requires_grad=False)
    c = t.leaf(5.0, requires_grad=False)
    assert (a, b, c) == (0, 1, 2) and len(t) == 3
    ab = t.op("mul", a, b)
    bc = t.op("mul", b, c)  # no parent requires grad -> neither does the op
    assert (ab, bc) == (3, 4)
    assert t.requires_grad(ab) and not t.requires_grad(bc)
    assert t.parents(ab) == (a, b) and t.parents(a) == ()
    assert np.array_equal(t.value(ab), [3.0, 8.0]) and t.value(c).shape == ()
    assert t.value(a).dtype == np.float64
    # op params pass through
    s = t.op("sum", ab, axis=0, keepdims=True)
    assert t.value(s).shape == (1,)


def test_gradients_kept_for_every_node_and_contributions_sum():
    # y = x*x + x (a diamond on x plus a direct edge); dy/dx = 2x + 1, dy/d(x*x) = 1
    t = Tape()
    x = t.leaf(np.array([3.0, -1.0]))
    sq = t.op("mul", x, x)
    y = t.op("add", sq, x)
    s = t.op("sum", y)
    grads = t.backward_scalar(s)
    assert sorted(grads) == [x, sq, y, s]
    assert grads[x].tolist() == [7.0, -1.0]
    assert grads[sq].tolist() == [1.0, 1.0] and grads[s] == 1.0


def test_fold_order_is_left_to_right_and_ids_descend():
    # Contributions 2^53, -2^53 and 0.25 to x from children with ids 1, 2, 3. Children are visited
    # from the highest id down and each fold is existing + new: 0.25, then 0.25 - 2^53 rounds to
    # -2^53 (the gap below 2^53 is 1), then + 2^53 gives exactly 0.0. Ascending ids would give
    # (2^53 - 2^53) + 0.25 = 0.25.
    big = 2.0 ** 53
    t = Tape()
    x = t.leaf(np.array(0.0))
    kids = [t.node(np.array(0.0), [x], lambda g, c=c: [(x, np.array(c))]) for c in (big, -big, 0.25)]
    out = t.node(np.array(0.0), kids, lambda g: [(k, g) for k in kids])
    assert t.backward_scalar(out)[x] == 0.0
    # within one node, contributions fold in the order listed: (0.25 + 2^53) - 2^53 = 0.0
    # (the gap above 2^53 is 2), where right to left would give 0.25
    listed = [(0, np.array(0.25)), (0, np.array(big)), (0, np.array(-big))]
    t2 = Tape()
    x2 = t2.leaf(np.array(0.0))
    y2 = t2.node(np.array(0.0), [x2], lambda g: listed)
    assert t2.backward_scalar(y2)[x2] == 0.0
    # an exact tape does not round: the true sum 0.25
    t3 = Tape(dps=50)
    x3 = t3.leaf(np.array(0.0))
    y3 = t3.node(np.array(0.0), [x3], lambda g: listed)
    assert t3.backward_scalar(y3)[x3] == 0.25


def test_nodes_without_requires_grad_are_skipped_and_drop_contributions():
    ran = []
    t = Tape()
    x = t.leaf(np.ones(2))
    frozen = t.leaf(np.ones(2), requires_grad=False)
    # a detached custom node: its backward must never run
    d = t.node(np.ones(2), [x], lambda g: ran.append("d") or [(x, g)], requires_grad=False)
    # a node whose contribution to the frozen leaf has the wrong shape: dropped before the check
    y = t.node(np.ones(2), [x, frozen, d],
               lambda g: ran.append("y") or [(frozen, np.ones(5)), (d, g), (x, 3 * g)])
    dense = t.backward_dense(y, np.ones(2))
    assert ran == ["y"]
    assert dense[frozen] is None and dense[d] is None and dense[x].tolist() == [3.0, 3.0]
    # an output that does not require grad gets only its seed
    assert [g is None for g in t.backward_dense(frozen, np.ones(2))] == [True, False, True, True]


def test_backward_dense_from_loop_visits_only_the_first_k_nodes():
    order = []
    t = Tape()
    # node 0 is a custom node without parents, so that its backward running is observable too
    x = t.node(np.array(1.0), [], lambda g: order.append(0) or [])
    for k in range(3):
        t.node(np.array(0.0), [x], lambda g, k=k: order.append(k + 1) or [(x, g)])
    grads = [np.array(0.0)] + [np.array(float(10 ** k)) for k in range(3)]
    assert [float(g) for g in t.backward_dense_from(grads)] == [111.0, 1.0, 10.0, 100.0]
    assert order == [3, 2, 1, 0]
    order.clear()
    part = t.backward_dense_from_loop(grads, 2)
    assert order == [1, 0] and float(part[x]) == 1.0
    assert float(grads[x]) == 0.0  # the caller's array is not modified
    assert [float(g) for g in t.backward_dense_from_loop(grads, 0)] == [0.0, 1.0, 10.0, 100.0]


def test_exact_tape_values_and_gradients_are_mpf_at_the_precision():
    t = Tape(dps=50)
    one, three = t.leaf(1.0), t.leaf(3.0)
    q = t.op("div", one, three)
    with mpmath.workdps(50):
        third = mpmath.mpf(1) / 3
        assert t.value(q)[()] == third
        g = t.backward_scalar(q)
        # d(a/b)/db = -a/b^2 = -1/9, correctly rounded to 50 digits (the VJP is computed at working
        # precision, not from the rounded output)
        assert g[one][()] == third and g[three][()] == mpmath.mpf(-1) / 9
    assert all(isinstance(v, mpmath.mpf) for v in t.backward_dense_all(q, 1.0)[0].flat)
    assert t.dps == 50 and Tape().dps is None


# ---------------------------------------------------------------------------------------------
# Error paths: AutogradError (a ValueError), each message naming the node and both shapes
# ---------------------------------------------------------------------------------------------

def _tape():
    t = Tape()
    x = t.leaf(np.ones((2, 3)))
    y = t.op("tanh", x)
    return t, x, y


@pytest.mark.parametrize("bad", [2, -1, 99, True, 1.0, "0"])
def test_invalid_output_id(bad):
    t, _, _ = _tape()
    for call in (lambda: t.backward_dense(bad, np.ones((2, 3))), lambda: t.backward(bad, np.ones((2, 3))),
                 lambda: t.backward_dense_all(bad, np.ones((2, 3))), lambda: t.backward_scalar(bad)):
        with pytest.raises(AutogradError, match=r"^autograd: invalid output id .*tape has 2 nodes.*"
                                                r"seed shape \((2, 3|)\)"):
            call()


def test_seed_shape_mismatch_names_output_and_both_shapes():
    t, _, y = _tape()
    with pytest.raises(AutogradError, match=r"^autograd: seed gradient shape mismatch for output 1: "
                                            r"output shape \(2, 3\), seed shape \(3,\)"):
        t.backward_dense(y, np.ones(3))
    # backward_scalar on a non-scalar output is the same error, with the scalar seed's shape
    with pytest.raises(AutogradError, match=r"seed gradient shape mismatch for output 1: output "
                                            r"shape \(2, 3\), seed shape \(\)"):
        t.backward_scalar(y)


def test_invalid_parent_id_during_backward():
    t, x, _ = _tape()
    z = t.node(np.ones(2), [x], lambda g: [(7, g)])
    with pytest.raises(AutogradError, match=r"^autograd: invalid parent id during backward: node 2 "
                                            r"\(shape \(2,\)\) returned parent id 7 \(tape has 3 "
                                            r"nodes\) with a contribution of shape \(2,\)"):
        t.backward_dense(z, np.ones(2))
    w = t.node(np.ones(2), [x], lambda g: [(-1, g)])
    with pytest.raises(AutogradError, match="invalid parent id during backward: node 3"):
        t.backward_dense_all(w, np.ones(2))


def test_contribution_of_wrong_shape():
    t, x, _ = _tape()
    z = t.node(np.ones(2), [x], lambda g: [(x, np.ones(3))])
    msg = (r"^autograd: gradient contribution has wrong shape for parent 0 from node 2: "
           r"contribution shape \(3,\), parent shape \(2, 3\)")
    with pytest.raises(AutogradError, match=msg):
        t.backward_dense(z, np.ones(2))
    with pytest.raises(AutogradError, match=msg):  # the loop form checks the same
        t.backward_dense_from([np.zeros((2, 3)), np.zeros((2, 3)), np.ones(2)])
    n = t.node(np.ones(2), [x], lambda g: [(x, None)])
    with pytest.raises(AutogradError, match=r"contribution shape None, parent shape \(2, 3\)"):
        t.backward_dense(n, np.ones(2))


def test_dense_from_length_and_entry_shapes():
    t, _, _ = _tape()
    with pytest.raises(AutogradError, match=r"^autograd: initial dense gradient array has wrong "
                                            r"length: got 1 entries, the tape has 2 nodes"):
        t.backward_dense_from([np.zeros((2, 3))])
    with pytest.raises(AutogradError, match=r"^autograd: gradient array has wrong shape for node 1: "
                                            r"node shape \(2, 3\), gradient shape \(3, 2\)"):
        t.backward_dense_from([np.zeros((2, 3)), np.zeros((3, 2))])
    with pytest.raises(AutogradError, match=r"wrong shape for node 0: node shape \(2, 3\), "
                                            r"gradient shape None"):
        t.backward_dense_from([None, np.zeros((2, 3))])
    with pytest.raises(AutogradError, match=r"loop bound k=3 must be an int in 0..2"):
        t.backward_dense_from_loop([np.zeros((2, 3))] * 2, 3)


def test_building_errors():
    t, x, _ = _tape()
    with pytest.raises(AutogradError, match=r"^autograd: invalid input id 5"):
        t.op("tanh", 5)
    with pytest.raises(AutogradError, match=r"^autograd: invalid parent id 9"):
        t.node(np.ones(1), [9], lambda g: [])
    with pytest.raises(AutogradError, match=r"^autograd: invalid node id 4"):
        t.value(4)
    with pytest.raises(TypeError, match=r"backward must be callable"):
        t.node(np.ones(1), [x], "not a function")
    with pytest.raises(TypeError, match=r"pass a real array"):
        t.leaf(np.array(["a"]))
    # a bad op call surfaces the op's own error, and nothing is appended
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ"):
        t.op("matmul", x, x)
    assert len(t) == 2
    assert issubclass(AutogradError, ValueError)


@pytest.mark.parametrize("dps", [None, 50])
def test_scalar_slots_stay_arrays(dps):
    # 0-d + 0-d gives a bare scalar in NumPy (np.float64, or an mpf for object arrays); the tape
    # must keep every slot an ndarray of its dtype
    t = Tape(dps=dps)
    x = t.leaf(2.0)
    y = t.node(t.value(x) * 2, [x], lambda g: [(x, g), (x, g)])
    g = t.backward_scalar(y)[x]
    assert isinstance(g, np.ndarray) and g.shape == () and float(g) == 2.0
    assert g.dtype == (np.float64 if dps is None else object)


@pytest.mark.parametrize("dps", [None, 30])
def test_class_index_target_on_the_tape(dps):
    # cross_entropy's target has no VJP: its slot stays None even when it requires grad, and the
    # logits get (softmax - onehot) / N, here by hand in mpmath
    t = Tape(dps=dps)
    logits = np.array([[0.5, -1.0, 2.0], [1.0, 1.0, 0.0]])
    z = t.leaf(logits)
    y = t.leaf(np.array([[2], [0]]))
    loss = t.op("cross_entropy", z, y)
    grads = t.backward_dense(loss, np.array(1.0))
    assert grads[y] is None
    with mpmath.workdps(40):
        for n, k in ((0, 2), (1, 0)):
            row = [mpmath.mpf(v) for v in logits[n]]
            s = mpmath.fsum(mpmath.exp(v) for v in row)
            want = [(mpmath.exp(v) / s - (c == k)) / 2 for c, v in enumerate(row)]
            got = grads[z][n]
            # entries are O(1): a handful of roundings each, 4 eps in float64, 1e-27 at 30 digits
            tol = 4 * np.finfo(float).eps if dps is None else 1e-27
            assert max(abs(mpmath.mpf(a) - b) for a, b in zip(got, want)) <= tol


def test_values_are_read_only():
    t = Tape()
    x = t.leaf(np.ones(2))
    with pytest.raises(ValueError, match="read-only"):
        t.value(x)[0] = 5.0
