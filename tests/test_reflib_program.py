"""Tests for reflib.program: the program IR, the grad-op registry, Paddle's backward builder and the
executor (docs/semantics.md).

Gradients of generated backward programs are held against two independent sources:
- ``reflib.Tape`` running the same computation (the test's own interpreter puts each op on the
  tape; recurrent ops are unrolled with slice / reshape / concat ops, no-grad variables are
  detached as leaves without requires_grad), and
- central finite differences of the forward program in exact arithmetic (mpmath at 60 digits).
Structural tests pin the builder's rules (reverse order, NOP, renaming plus ``sum``,
``fill_zeros_like``, recursion) against backward programs written out by hand from Paddle's backward design rules.
"""
from __future__ import annotations

from collections import Counter

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from reflib import Tape
from reflib.ops import OPS
from reflib.program import (
    EMPTY_VAR, NOP, Executor, Memory, NetOp, Operator, ProgramError, RnnGradOp, RnnOp, all_var_names, backward,
    final_outputs, grad_var_name, op_info, registered_types, required_seeds, run,
)
from reflib.program.ir import leaf_ops

# Tolerances.
# float64: the program and the tape call the same reflib VJPs on the same values; they differ
# only in the order gradient contributions are added (rename order vs node-id order) and in how
# sequences are sliced / stacked (exact copies either way). Re-associating a sum of at most a few
# dozen terms of size <= S moves it by <= ~50 eps S ~ 1e-14 S; 1e-10 S leaves room for that
# error being carried through a few more (well-conditioned: bounded activations, small shapes)
# VJPs, and is still far below any real bug (a missing or doubled contribution is O(S)).
FLOAT_TOL = 1e-10
# dps=50: every mpf operation rounds at ~1e-50 relative; a few thousand of them stay below 1e-45.
EXACT_DPS = 50
EXACT_TOL = 1e-40
# Finite differences at 60 digits with step h = 1e-20: truncation h^2 |f'''| / 6 ~ 1e-41 |f'''|
# and rounding 1e-60 / h = 1e-40 relative to |f|; the generated programs keep |f'''| and |f| well
# under 1e10, so 1e-25 relative to (1 + |f| + |f'|) is a safe, still very sharp, bound.
FD_DPS = 60
FD_STEP = mpmath.mpf("1e-20")
FD_TOL = 1e-25

SLOW_PROPERTY = settings(max_examples=min(settings.default.max_examples, 8))


# -- helpers -----------------------------------------------------------------------------------


def op(type_, inputs, out, **attrs):
    """``Operator`` with slots given compactly: ``op("add", ["a", "b"], "c")`` -> X=a, Y=b, Out=c."""
    if isinstance(inputs, dict):
        return Operator(type_, inputs, {"Out": [out]}, attrs)
    return Operator(type_, dict(zip(("X", "Y"), ([v] for v in inputs))), {"Out": [out]}, attrs)


def to_float(a):
    return np.array([float(v) for v in np.asarray(a, dtype=object).flat], dtype=np.float64).reshape(np.shape(a))


def rel_err(a, b, scale):
    """max |a - b| / scale, in mpmath for exact arrays."""
    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    assert a.shape == b.shape, (a.shape, b.shape)
    diff = max((abs(mpmath.mpf(x) - mpmath.mpf(y)) for x, y in zip(a.flat, b.flat)), default=0)
    return diff / scale


def tape_run(program, feeds, no_grad, dps=None):
    """Put ``program``'s computation on a reflib.Tape; return ``(tape, env: name -> node id)``.

    Independent of the executor: ops are replayed with ``tape.op``; a recurrent op is unrolled
    with slice + reshape per step and reshape + concat to stack; a variable in ``no_grad`` is
    replaced by a leaf without requires_grad holding its value (Paddle's no-grad semantics).
    """
    tape = Tape(dps=dps)
    env = {name: tape.leaf(value, requires_grad=name not in no_grad) for name, value in feeds.items()}
    _tape_ops(tape, program, env, no_grad)
    return tape, env


def _detach(tape, node, name, no_grad):
    return tape.leaf(tape.value(node), requires_grad=False) if name in no_grad else node


def _tape_ops(tape, operator, env, no_grad):
    if isinstance(operator, NetOp):
        for child in operator.ops:
            _tape_ops(tape, child, env, no_grad)
        return
    if isinstance(operator, RnnOp):
        _tape_rnn(tape, operator, env, no_grad)
        return
    ids = [env[v] for s in ("X", "Y") for v in operator.inputs.get(s, ())]
    if operator.type == "sum" and len(ids) > 1:  # several variables: add them, then reduce
        total = ids[0]
        for i in ids[1:]:
            total = tape.op("add", total, i)
        ids = [total]
    out = operator.outputs["Out"][0]
    env[out] = _detach(tape, tape.op(operator.type, *ids, **operator.attrs), out, no_grad)


def _tape_rnn(tape, rnn, env, no_grad):
    a = rnn.attrs
    assert a["axis"] == 0
    steps = np.shape(tape.value(env[rnn.inputs["X"][0]]))[0]
    prev = {pre: env[boot] for pre, boot in zip(a["pre_memories"], rnn.inputs["Boot"])}
    outs = {alias: [] for alias in a["outlink_alias"]}
    for t in range(steps):
        step_env = dict(env)
        for outer, alias in zip(rnn.inputs["X"], a["inlink_alias"]):
            shape = np.shape(tape.value(env[outer]))[1:]
            piece = tape.op("reshape", tape.op("slice", env[outer], axis=0, start=t, stop=t + 1), shape=shape)
            step_env[alias] = _detach(tape, piece, alias, no_grad)
        for pre, node in prev.items():
            step_env[pre] = _detach(tape, node, pre, no_grad)
        _tape_ops(tape, rnn.step_net, step_env, no_grad)
        prev = {pre: step_env[state] for pre, state in zip(a["pre_memories"], a["memories"])}
        for alias in a["outlink_alias"]:
            outs[alias].append(step_env[alias])
    for alias, outer in zip(a["outlink_alias"], rnn.outputs["Out"]):
        pieces = [tape.op("reshape", n, shape=(1,) + np.shape(tape.value(n))) for n in outs[alias]]
        stacked = pieces[0]
        for p in pieces[1:]:
            stacked = tape.op("concat", stacked, p, axis=0)
        env[outer] = _detach(tape, stacked, outer, no_grad)


def program_grads(program, feeds, seeds, no_grad=frozenset(), dps=None):
    """Run the forward program, put the seeds in the scope, run its backward program."""
    scope = run(program, dict(feeds), dps=dps)
    scope.update(seeds)
    run(backward(program, no_grad), scope, dps=dps)
    return scope


def outer_vars(program):
    names = []
    for _, o in leaf_ops(program):
        names.extend(v for v in o.input_names() + o.output_names() if v not in names and "@" not in v)
    return names


def assert_matches_tape(program, feeds, no_grad, seed, dps):
    """The backward program's gradients equal the tape's for every outer variable."""
    scope = program_grads(program, feeds, {"loss@GRAD": seed}, no_grad, dps)
    tape, env = tape_run(program, feeds, no_grad, dps)
    tape_grads = tape.backward(env["loss"], np.asarray(seed))
    tol = FLOAT_TOL if dps is None else EXACT_TOL
    values = [g for g in tape_grads.values()]
    scale = max([1.0] + [float(np.max(np.abs(to_float(g)))) for g in values if np.size(g)])
    # the forward values agree too (same kernels; an unrolled RNN is the same arithmetic)
    assert rel_err(scope["loss"], tape.value(env["loss"]), max(1.0, abs(float(scope["loss"])))) <= tol
    compared = 0
    for name in outer_vars(program):
        if name in no_grad or name not in env:
            assert grad_var_name(name) not in scope or name not in feeds, name
            continue
        mine, theirs = scope.get(grad_var_name(name)), tape_grads.get(env[name])
        if theirs is not None:
            assert mine is not None, f"{name}@GRAD missing; the tape has {theirs}"
            assert rel_err(mine, theirs, scale) <= tol, (name, mine, theirs)
            compared += 1
        elif name in feeds or tape.requires_grad(env[name]):
            # not reached on the tape: the program gives it no gradient, or a zero one (a
            # fill_zeros_like output gradient carried through a grad op)
            g = scope.get(grad_var_name(name))
            assert g is None or all(v == 0 for v in np.ravel(g)), f"{name}@GRAD = {g}; the tape never reaches it"
    return scope, compared


def fd_directional(program, feeds, direction, seed, dps=FD_DPS):
    """d/de <seed, loss(feeds + e * direction)> at e = 0 by central differences, exactly."""
    def loss_at(e):
        with mpmath.workdps(dps):
            shifted = {k: (np.vectorize(mpmath.mpf, otypes=[object])(v) +
                           (e * direction[k] if k in direction else 0)) for k, v in feeds.items()}
        return run(program, shifted, dps=dps)["loss"][()]
    with mpmath.workdps(dps):
        hi, lo = loss_at(FD_STEP), loss_at(-FD_STEP)
        s = mpmath.mpf(float(seed))
        return s * (hi - lo) / (2 * FD_STEP), s * loss_at(0)


# -- program strategies ------------------------------------------------------------------------

_UNARY = ("tanh", "sigmoid", "silu", "softplus", "gelu", "gelu_tanh", "neg", "identity")
_ROWWISE = ("softmax", "log_softmax", "layer_norm", "rms_norm")
_REDUCE = ("sum", "mean", "logsumexp")


def _broadcast(a, b):
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


def _draw_op(draw, shapes, out, binary):
    """One random op reading variables of ``shapes`` (name -> shape), writing ``out``."""
    names = sorted(shapes)
    rows = [n for n in names if len(shapes[n]) >= 2 and shapes[n][-1] >= 2]
    mats = [n for n in names if len(shapes[n]) == 2 and shapes[n][0] == shapes[n][1]]
    kinds = ["unary", "binary"] + (["rowwise", "reduce", "concat", "slice"] if rows else [])
    kinds += ["matmul"] if any(shapes[m][0] == shapes[r][-1] for m in mats for r in rows) else []
    kind = draw(st.sampled_from(kinds))
    if kind == "unary":
        x = draw(st.sampled_from(names))
        return op(draw(st.sampled_from(_UNARY)), [x], out), shapes[x]
    if kind == "binary":
        a = draw(st.sampled_from(names))
        b = draw(st.sampled_from([n for n in names if _broadcast(shapes[a], shapes[n]) is not None]))
        return op(draw(st.sampled_from(binary)), [a, b], out), _broadcast(shapes[a], shapes[b])
    if kind == "rowwise":
        x = draw(st.sampled_from(rows))
        return op(draw(st.sampled_from(_ROWWISE)), [x], out), shapes[x]
    if kind == "reduce":
        x = draw(st.sampled_from(rows))
        name = draw(st.sampled_from(_REDUCE))
        if len(shapes[x]) == 3 and draw(st.booleans()):  # collapse a sequence over time
            return op(name, [x], out, axis=0), shapes[x][1:]
        return op(name, [x], out, axis=-1, keepdims=True), shapes[x][:-1] + (1,)
    if kind == "concat":
        a = draw(st.sampled_from(rows))
        b = draw(st.sampled_from([n for n in rows if shapes[n] == shapes[a]]))
        return op("concat", [a, b], out, axis=-1), shapes[a][:-1] + (2 * shapes[a][-1],)
    if kind == "slice":
        x = draw(st.sampled_from(rows))
        n = shapes[x][-1]
        start = draw(st.integers(0, n - 1))
        stop = draw(st.integers(start + 1, n))
        step = draw(st.integers(1, 2))
        return op("slice", [x], out, axis=-1, start=start, stop=stop, step=step), \
            shapes[x][:-1] + (len(range(start, stop, step)),)
    r = draw(st.sampled_from([r for r in rows if any(shapes[m][0] == shapes[r][-1] for m in mats)]))
    m = draw(st.sampled_from([m for m in mats if shapes[m][0] == shapes[r][-1]]))
    return op("matmul", [r, m], out), shapes[r][:-1] + (shapes[m][1],)


def _nest(draw, ops, depth):
    """Group contiguous runs of ``ops`` into nested NetOps (the run order is unchanged)."""
    if depth == 0 or len(ops) < 2 or not draw(st.booleans()):
        return list(ops)
    i = draw(st.integers(0, len(ops) - 1))
    j = draw(st.integers(i + 1, len(ops)))
    inner = NetOp(_nest(draw, ops[i:j], depth - 1))
    return _nest(draw, ops[:i], depth - 1) + [inner] + _nest(draw, ops[j:], depth - 1)


def _draw_rnn(draw, shapes, feeds, k, B, D, T, nested):
    """A recurrent op: h = tanh(a + b) over random step ops; returns the op, adds outer vars."""
    seqs = [n for n in sorted(shapes) if shapes[n] == (T, B, D)]
    xs = f"xs{k}"
    if seqs and draw(st.booleans()):
        xs = draw(st.sampled_from(seqs))
    else:
        feeds[xs] = (T, B, D)
        shapes[xs] = (T, B, D)
    boot = draw(st.sampled_from([n for n in sorted(shapes) if shapes[n] == (B, D)]))
    visible = {n: s for n, s in shapes.items() if s in ((B, D), (B, 1), (D, D))}
    step = {**visible, "x_t": (B, D), "h_prev": (B, D)}
    body = []
    for i in range(draw(st.integers(0, 3))):
        o, shape = _draw_op(draw, step, f"s{i}", binary=("add", "sub"))
        body.append(o)
        step[f"s{i}"] = shape
    own = [n for n in step if n not in visible]
    bd = [n for n in sorted(step) if step[n] == (B, D)]
    a = draw(st.sampled_from([n for n in bd if n in own] or bd))
    b = draw(st.sampled_from([n for n in sorted(step) if _broadcast((B, D), step[n]) == (B, D)]))
    body += [op(draw(st.sampled_from(("add", "sub"))), [a, b], "s_pre"), op("tanh", ["s_pre"], "h")]
    step["s_pre"] = step["h"] = (B, D)
    written = [o.outputs["Out"][0] for o in body[:-2]]
    if draw(st.booleans()):  # an op after the state that reads it: h@GRAD then has two sources
        o, shape = _draw_op(draw, {**step, "h": (B, D)}, "s_after", binary=("add", "sub", "mul"))
        if "h" not in o.input_names():
            o = o.renamed(o.input_names()[0], "h") if step[o.input_names()[0]] == (B, D) else o
        body.append(o)
        step["s_after"] = shape
        written.append("s_after")
    outlinks = {"h": f"hs{k}"}
    if written and draw(st.booleans()):
        y = draw(st.sampled_from(written))
        outlinks[y] = f"ys{k}"
        shapes[f"ys{k}"] = (T,) + step[y]
    shapes[f"hs{k}"] = (T, B, D)
    net = NetOp(_nest(draw, body, 2 if nested else 0))
    return RnnOp(net, {xs: "x_t"}, outlinks, [Memory("h_prev", "h", boot)])


@st.composite
def programs(draw, rnn=True, nested=True, no_grad="any", binary=("add", "sub", "mul")):
    """A random forward program ending in a scalar ``loss``, its feeds, no-grad set and seed.

    Variables are shared freely (an op may read one variable twice); the dangling values, or a
    random subset of them, are summed into the loss. ``no_grad`` is "any" (any variable but the loss), "feeds" or "none".
    """
    B, D, T = draw(st.integers(1, 2)), draw(st.integers(2, 3)), draw(st.integers(1, 3))
    feeds = {"x0": (B, D), "x1": (B, D), "W": (D, D), "c": (B, 1)}
    shapes = dict(feeds)
    units = []
    n_units = draw(st.integers(1, 5))
    rnn_at = draw(st.integers(0, n_units - 1)) if rnn and draw(st.booleans()) else -1
    second_rnn_at = draw(st.integers(0, n_units - 1)) if rnn_at >= 0 and draw(st.booleans()) else -1
    for k in range(n_units):
        if k in (rnn_at, second_rnn_at):
            units.append(_draw_rnn(draw, shapes, feeds, k, B, D, T, nested))
            continue
        o, shape = _draw_op(draw, shapes, f"v{k}", binary)
        units.append(o)
        shapes[f"v{k}"] = shape
    dangling = final_outputs(NetOp(units))
    if len(dangling) > 1 and draw(st.booleans()):
        # leave some values unread: only the loss is seeded, so they get no gradient (pruning)
        dangling = draw(st.lists(st.sampled_from(dangling), min_size=1, unique=True))
    if len(dangling) == 1:
        units.append(op("sum", [dangling[0]], "loss"))
    else:
        units += [op("sum", [d], f"r{i}") for i, d in enumerate(dangling)]
        parts = [f"r{i}" for i in range(len(dangling))]
        if draw(st.booleans()):  # one n-ary sum (axis=() reduces nothing)
            units.append(Operator("sum", {"X": parts}, {"Out": ["loss"]}, {"axis": ()}))
        else:
            total = parts[0]
            for i, p in enumerate(parts[1:]):
                name = "loss" if i == len(parts) - 2 else f"t{i}"
                units.append(op("add", [total, p], name))
                total = name
    program = NetOp(_nest(draw, units, 3 if nested else 0))
    values = {n: draw(arrays(np.float64, s, elements=st.floats(-2, 2, width=64))) for n, s in feeds.items()}
    if no_grad == "any":
        pool = sorted(all_var_names(program) - {"loss"} - {n for n in all_var_names(program) if "@" in n})
    elif no_grad == "feeds":
        pool = sorted(set(feeds) & all_var_names(program))
    else:
        pool = []
    chosen = draw(st.sets(st.sampled_from(pool), max_size=2)) if pool else set()
    seed = draw(st.floats(0.5, 2.0))
    return program, values, chosen, np.array(seed)


# -- properties: gradients ---------------------------------------------------------------------


@given(programs())
def test_backward_program_gradients_equal_the_tape(case):
    program, feeds, no_grad, seed = case
    _, compared = assert_matches_tape(program, feeds, no_grad, seed, dps=None)
    assert compared >= 1  # the loss itself is always compared


@SLOW_PROPERTY
@given(programs(no_grad="feeds"))
def test_exact_backward_program_equals_exact_tape_and_finite_differences(case):
    program, feeds, no_grad, seed = case
    scope, _ = assert_matches_tape(program, feeds, no_grad, seed, dps=EXACT_DPS)
    rng = np.random.default_rng(0)
    direction = {k: rng.uniform(-1, 1, np.shape(v)) for k, v in feeds.items() if k not in no_grad}
    with mpmath.workdps(FD_DPS):
        predicted = mpmath.mpf(0)
        for k, d in direction.items():
            g = scope.get(grad_var_name(k))
            if g is not None:
                predicted += sum((mpmath.mpf(x) * mpmath.mpf(y) for x, y in zip(np.ravel(g), np.ravel(d))),
                                 mpmath.mpf(0))
        fd, value = fd_directional(program, feeds, direction, seed)
        assert abs(fd - predicted) <= FD_TOL * (1 + abs(value) + abs(fd)), (fd, predicted)


def _seed_everything(program):
    """Sum every unread value into one output, so that every op's output gradient exists."""
    return NetOp(list(program.ops) + [Operator("sum", {"X": final_outputs(program)}, {"Out": ["all"]},
                                               {"axis": ()})])


@given(programs(rnn=False, nested=False, no_grad="none"))
def test_renamed_and_summed_exactly_where_a_gradient_has_several_producers(case):
    """In a flat program, v@GRAD is written once, by a grad op when one op slot reads v, else by a
    sum whose renamed parts (expanded through nested sums) are exactly the k gradient-op writes."""
    program, _, _, _ = case
    program = _seed_everything(program)
    bwd = backward(program)  # every value reaches the seeded `all`, so every op has a grad op
    writers = {}
    for _, o in leaf_ops(bwd):
        for v in o.output_names():
            assert v not in writers, f"{v} written twice"
            writers[v] = o
    producers = Counter()
    for _, o in leaf_ops(program):
        producers.update(o.input_names())

    def leaves(name):
        o = writers[name]
        if o.type != "sum":
            return [o]
        return [leaf for part in o.inputs["X"] for leaf in leaves(part)]

    for v, k in producers.items():
        g = grad_var_name(v)
        renamed = [w for w in writers if w.startswith(g + "@RENAME@")]
        found = leaves(g)
        assert len(found) == k and all(o.type.endswith("_grad") for o in found)
        assert (writers[g].type == "sum") == (k > 1)
        assert len(renamed) == (0 if k == 1 else len(set(renamed)))
        if k == 1:
            assert renamed == []


@given(programs(rnn=False, nested=True, no_grad="none"))
def test_grad_ops_come_in_reverse_order(case):
    program = _seed_everything(case[0])
    forward_types = [o.type for _, o in leaf_ops(program)]
    grad_types = [o.type for _, o in leaf_ops(backward(program)) if o.type.endswith("_grad")]
    assert grad_types == [t + "_grad" for t in reversed(forward_types)]


# -- every registry op in a program ------------------------------------------------------------

_X = np.array([[0.3, -1.2, 0.7], [1.5, -0.4, 2.0]])
_POS = np.array([[0.3, 1.2, 0.7], [1.5, 0.4, 2.0]])
_B = np.array([0.5, -1.5, 2.5])
_P = np.array([[0.2, 0.7, 0.45], [0.9, 0.1, 0.6]])
_DIST = np.array([[0.2, 0.5, 0.3], [0.0, 1.0, 0.0]])
# op -> (inputs, attrs): small values away from kinks and domain edges, non-default attributes
# where the op has any, so that a grad op that dropped or mangled an attribute would show.
CASES = {
    **{u: ([_X], {}) for u in ("neg", "exp", "square", "abs", "relu", "silu", "gelu", "gelu_tanh",
                               "tanh", "sigmoid", "softplus", "identity")},
    "log": ([_POS], {}), "sqrt": ([_POS], {}),
    "leaky_relu": ([_X], {"negative_slope": 0.2}),
    **{b: ([_X, _B], {}) for b in ("add", "sub", "mul", "div")},
    "maximum": ([_X, _B[None, :] * 0.9], {}),
    "sum": ([_X], {"axis": 0, "keepdims": True}),
    "mean": ([_X], {"axis": (0, 1)}),
    "logsumexp": ([_X], {"axis": 1}),
    "matmul": ([np.arange(12.0).reshape(2, 2, 3) / 7, _X.T], {}),
    "transpose": ([_X], {"axes": (1, 0)}),
    "reshape": ([_X], {"shape": (3, -1)}),
    "concat": ([_X, _X[:1] * 2], {"axis": 0}),
    "slice": ([_X], {"axis": 1, "start": 1, "stop": 3, "step": 1}),
    "softmax": ([_X], {"axis": 0}),
    "log_softmax": ([_X], {"axis": -1}),
    "layer_norm": ([_X], {"eps": 1e-3}),
    "rms_norm": ([_X], {"eps": 1e-2}),
    "mse": ([_X, _X[::-1]], {}),
    "cross_entropy": ([_X, np.array([[2], [0]])], {}),
    "categorical_cross_entropy": ([_X, _DIST], {}),
    "binary_cross_entropy": ([_P, _DIST], {}),
    "binary_cross_entropy_with_logits": ([_X, _P], {}),
}


def test_cases_cover_every_registry_op():
    assert set(CASES) == set(OPS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_registry_op_backward_program(name):
    """One op: its grad op (via reflib.vjp) equals the tape, and exact finite differences."""
    inputs, attrs = CASES[name]
    slots = ("X", "Y")[: len(inputs)]
    feeds = dict(zip(("a", "b"), inputs))
    program = NetOp([Operator(name, {s: [n] for s, n in zip(slots, feeds)}, {"Out": ["y"]}, attrs)])
    out = run(program, dict(feeds))["y"]
    seed = np.linspace(0.5, 1.5, max(out.size, 1)).reshape(out.shape)
    scope = program_grads(program, feeds, {"y@GRAD": seed})
    tape = Tape()
    ids = [tape.leaf(v, requires_grad=not (name == "cross_entropy" and k == "b")) for k, v in feeds.items()]
    expected = tape.backward(tape.op(name, *ids, **attrs), seed)
    for k, i in zip(feeds, ids):
        if name == "cross_entropy" and k == "b":
            assert "b@GRAD" not in scope  # class indices: not differentiable
            continue
        np.testing.assert_allclose(scope[k + "@GRAD"], expected[i], rtol=1e-14, atol=1e-14)
    # exact: the directional derivative along a fixed direction, against central differences
    exact = program_grads(program, feeds, {"y@GRAD": seed}, dps=EXACT_DPS)
    direction = {k: np.cos(np.arange(np.size(v)) + 1.0).reshape(np.shape(v))
                 for k, v in feeds.items() if not (name == "cross_entropy" and k == "b")}
    with mpmath.workdps(FD_DPS):
        predicted = sum((mpmath.mpf(g) * mpmath.mpf(d) for k in direction
                         for g, d in zip(np.ravel(exact[k + "@GRAD"]), np.ravel(direction[k]))), mpmath.mpf(0))

        def f(e):
            shifted = {k: np.vectorize(mpmath.mpf, otypes=[object])(v) + (e * direction[k] if k in direction else 0)
                       for k, v in feeds.items()}
            y = run(program, shifted, dps=FD_DPS)["y"]
            return sum((mpmath.mpf(a) * mpmath.mpf(s) for a, s in zip(np.ravel(y), np.ravel(seed))), mpmath.mpf(0))
        fd = (f(FD_STEP) - f(-FD_STEP)) / (2 * FD_STEP)
        assert abs(fd - predicted) <= FD_TOL * (1 + abs(fd)), (name, fd, predicted)


# -- structure: the builder's rules, written out by hand ---------------------------------------


def _shared_weight_program():
    return NetOp([op("matmul", ["x", "W"], "h1"), op("matmul", ["y", "W"], "h2"),
                  op("add", ["h1", "h2"], "s"), op("sum", ["s"], "loss")])


def test_shared_weight_gradient_is_renamed_and_summed():
    expected = NetOp([
        Operator("sum_grad", {"X": ["s"], "Out@GRAD": ["loss@GRAD"]}, {"X@GRAD": ["s@GRAD"]}),
        Operator("add_grad", {"X": ["h1"], "Y": ["h2"], "Out@GRAD": ["s@GRAD"]},
                 {"X@GRAD": ["h1@GRAD"], "Y@GRAD": ["h2@GRAD"]}),
        Operator("matmul_grad", {"X": ["y"], "Y": ["W"], "Out@GRAD": ["h2@GRAD"]},
                 {"X@GRAD": ["y@GRAD"], "Y@GRAD": ["W@GRAD@RENAME@0"]}),
        Operator("matmul_grad", {"X": ["x"], "Y": ["W"], "Out@GRAD": ["h1@GRAD"]},
                 {"X@GRAD": ["x@GRAD"], "Y@GRAD": ["W@GRAD@RENAME@1"]}),
        Operator("sum", {"X": ["W@GRAD@RENAME@0", "W@GRAD@RENAME@1"]}, {"Out": ["W@GRAD"]}, {"axis": ()}),
    ])
    assert backward(_shared_weight_program()) == expected


def test_shared_weight_numbers():
    rng = np.random.default_rng(1)
    x, y, w = rng.normal(size=(2, 3)), rng.normal(size=(2, 3)), rng.normal(size=(3, 3))
    scope = program_grads(_shared_weight_program(), {"x": x, "y": y, "W": w}, {"loss@GRAD": np.array(1.0)})
    # by hand: d/dW sum(x W) + sum(y W) = x^T 1 + y^T 1
    np.testing.assert_allclose(scope["W@GRAD"], (x + y).T @ np.ones((2, 3)), rtol=1e-14)
    np.testing.assert_allclose(scope["W@GRAD@RENAME@1"], x.T @ np.ones((2, 3)), rtol=1e-14)


def test_variable_read_twice_by_one_op_gets_both_gradients():
    prog = NetOp([op("mul", ["h", "h"], "q"), op("sum", ["q"], "loss")])
    bwd = backward(prog)
    assert bwd.ops[1] == NetOp([
        Operator("mul_grad", {"X": ["h"], "Y": ["h"], "Out@GRAD": ["q@GRAD"]},
                 {"X@GRAD": ["h@GRAD@RENAME@0"], "Y@GRAD": ["h@GRAD@RENAME@1"]}),
        Operator("sum", {"X": ["h@GRAD@RENAME@0", "h@GRAD@RENAME@1"]}, {"Out": ["h@GRAD"]}, {"axis": ()}),
    ])
    h = np.array([[1.0, -2.0, 0.5]])
    scope = program_grads(prog, {"h": h}, {"loss@GRAD": np.array(3.0)})
    np.testing.assert_allclose(scope["h@GRAD"], 3.0 * 2 * h, rtol=1e-15)  # d(3 h^2)/dh


def test_nop_where_every_output_is_no_grad_and_inputs_get_no_gradient():
    prog = NetOp([op("tanh", ["x"], "h"), op("mul", ["h", "w"], "y"), op("sum", ["y"], "loss")])
    bwd = backward(prog, no_grad_vars={"h"})
    assert bwd.ops[0].type == "sum_grad"
    assert bwd.ops[1] == Operator("mul_grad", {"X": ["h"], "Y": ["w"], "Out@GRAD": ["y@GRAD"]},
                                  {"X@GRAD": [EMPTY_VAR], "Y@GRAD": ["w@GRAD"]})
    assert bwd.ops[2] == NOP
    feeds = {"x": np.array([[0.5, -1.0]]), "w": np.array([[2.0, 3.0]])}
    scope = program_grads(prog, feeds, {"loss@GRAD": np.array(1.0)}, {"h"})
    assert "x@GRAD" not in scope and "h@GRAD" not in scope and EMPTY_VAR not in scope
    np.testing.assert_allclose(scope["w@GRAD"], np.tanh(feeds["x"]), rtol=1e-15)


def test_nop_where_every_input_is_no_grad():
    prog = NetOp([op("tanh", ["x"], "h"), op("mul", ["h", "w"], "y"), op("sum", ["y"], "loss")])
    bwd = backward(prog, no_grad_vars={"x"})
    assert [o.type for o in bwd.ops] == ["sum_grad", "mul_grad", "nop"]
    # a whole net whose inputs are all no-grad is one NOP
    nested = NetOp([NetOp([op("tanh", ["x"], "h"), op("mul", ["h", "w"], "y")]), op("mul", ["y", "k"], "z"),
                    op("sum", ["z"], "loss")])
    assert [o.type for o in backward(nested, no_grad_vars={"x", "w"}).ops] == ["sum_grad", "mul_grad", "nop"]
    assert backward(nested, no_grad_vars={"x", "w", "k"}) == NOP


def test_no_grad_output_propagates_upstream():
    """y is no-grad: mul becomes a NOP, so h@GRAD is never made and tanh is a NOP too."""
    prog = NetOp([op("tanh", ["x"], "h"), op("mul", ["h", "w"], "y"), op("add", ["y", "x"], "z"),
                  op("sum", ["z"], "loss")])
    bwd = backward(prog, no_grad_vars={"y"})
    assert [o.type for o in bwd.ops] == ["sum_grad", "add_grad", "nop", "nop"]
    assert bwd.ops[1].outputs == {"X@GRAD": (EMPTY_VAR,), "Y@GRAD": ("x@GRAD",)}


def _rnn_two_outlinks():
    step = NetOp([op("matmul", ["x_t", "W"], "a"), op("add", ["a", "h_prev"], "b"), op("tanh", ["b"], "h"),
                  op("sigmoid", ["a"], "y")])
    return RnnOp(step, {"xs": "x_t"}, {"h": "hs", "y": "ys"}, [Memory("h_prev", "h", "h0")])


def _rnn_feeds(T=3, B=2, D=3):
    rng = np.random.default_rng(7)
    return {"xs": rng.normal(size=(T, B, D)), "h0": rng.normal(size=(B, D)), "W": rng.normal(size=(D, D)) / 2}


def test_fill_zeros_like_where_an_output_gradient_does_not_exist():
    """ys is never read, so ys@GRAD does not exist: a fill_zeros_like makes ys@ZERO for the grad op."""
    prog = NetOp([_rnn_two_outlinks(), op("sum", ["hs"], "loss")])
    bwd = backward(prog)
    assert bwd.ops[0].type == "sum_grad"
    fill, grad = bwd.ops[1].ops
    assert fill == Operator("fill_zeros_like", {"X": ["ys"]}, {"Out": ["ys@ZERO"]})
    assert isinstance(grad, RnnGradOp)
    assert grad.inputs["Out@GRAD"] == ("hs@GRAD", "ys@ZERO")
    assert grad.outputs == {"X@GRAD": ("xs@GRAD",), "Boot@GRAD": ("h0@GRAD",), "Params@GRAD": ("W@GRAD",)}
    assert_matches_tape(prog, _rnn_feeds(), set(), np.array(1.0), dps=None)


def test_fill_zeros_like_where_an_output_is_no_grad():
    prog = NetOp([_rnn_two_outlinks(), op("sum", ["hs"], "l1"), op("sum", ["ys"], "l2"), op("add", ["l1", "l2"], "loss")])
    bwd = backward(prog, no_grad_vars={"ys"})
    fill, grad = bwd.ops[-1].ops
    assert fill.type == "fill_zeros_like" and grad.inputs["Out@GRAD"] == ("hs@GRAD", "ys@ZERO")
    assert_matches_tape(prog, _rnn_feeds(), {"ys"}, np.array(1.0), dps=None)


def test_rnn_step_net_backward_is_built_recursively():
    rnn = _rnn_two_outlinks()
    prog = NetOp([rnn, op("sum", ["hs"], "l1"), op("sum", ["ys"], "l2"), op("add", ["l1", "l2"], "loss")])
    grad = backward(prog).ops[-1]
    # the step net's own backward: the gradient of `a` has two producers (add and sigmoid) and
    # h@GRAD / y@GRAD are fed by the executor at each step
    step = grad.step_net
    assert [o.type for _, o in leaf_ops(step)] == ["sigmoid_grad", "tanh_grad", "add_grad", "sum", "matmul_grad"]
    assert leaf_ops_by_type(step, "sum")[0].inputs["X"] == ("a@GRAD@RENAME@0", "a@GRAD@RENAME@1")
    scope, _ = assert_matches_tape(prog, _rnn_feeds(), set(), np.array(0.7), dps=None)
    assert scope["xs@GRAD"].shape == (3, 2, 3) and scope["h0@GRAD"].shape == (2, 3)


def test_rnn_nested_in_a_step_net():
    """An inner RnnOp over the rows of each outer step's input, inside the outer step net."""
    inner = RnnOp(NetOp([op("add", ["g_prev", "r_t"], "gp"), op("tanh", ["gp"], "g")]),
                  {"x_t": "r_t"}, {"g": "gs"}, [Memory("g_prev", "g", "g0")])
    step = NetOp([inner, op("mul", ["gs", "h_prev"], "m"), op("tanh", ["m"], "h")])
    prog = NetOp([RnnOp(step, {"xs": "x_t"}, {"h": "hs"}, [Memory("h_prev", "h", "h0")]),
                  op("sum", ["hs"], "loss")])
    rng = np.random.default_rng(11)
    feeds = {"xs": rng.normal(size=(3, 2, 4)), "h0": rng.normal(size=(2, 4)), "g0": rng.normal(size=(4,))}
    scope, compared = assert_matches_tape(prog, feeds, set(), np.array(1.3), dps=None)
    assert {"xs@GRAD", "h0@GRAD", "g0@GRAD"} <= set(scope) and compared >= 4


def leaf_ops_by_type(program, type_):
    return [o for _, o in leaf_ops(program) if o.type == type_]


def test_rnn_gradients_by_hand_for_a_linear_recurrence():
    """h_t = h_{t-1} + x_t (identity step): every x_t and h0 get the sum of the later seeds."""
    step = NetOp([op("add", ["h_prev", "x_t"], "h")])
    prog = NetOp([RnnOp(step, {"xs": "x_t"}, {"h": "hs"}, [("h_prev", "h", "h0")])])
    xs, h0 = np.arange(6.0).reshape(3, 1, 2), np.array([[10.0, 20.0]])
    scope = run(prog, {"xs": xs, "h0": h0})
    np.testing.assert_array_equal(scope["hs"], h0 + np.cumsum(xs, axis=0))
    seed = np.arange(1.0, 7.0).reshape(3, 1, 2)
    scope["hs@GRAD"] = seed
    run(backward(prog), scope)
    # d hs_t / d x_s = 1 for s <= t: the gradient of x_s is sum_{t >= s} seed_t
    np.testing.assert_array_equal(scope["xs@GRAD"], np.cumsum(seed[::-1], axis=0)[::-1])
    np.testing.assert_array_equal(scope["h0@GRAD"], seed.sum(axis=0))


def test_rnn_on_axis_one_and_two_memories():
    step = NetOp([op("mul", ["p", "x_t"], "q"), op("add", ["q", "r"], "s"), op("tanh", ["s"], "pn"),
                  op("sigmoid", ["q"], "rn")])
    rnn = RnnOp(step, {"xs": "x_t"}, {"pn": "ps"}, [Memory("p", "pn", "p0"), Memory("r", "rn", "r0")], axis=1)
    prog = NetOp([rnn, op("mean", ["ps"], "loss")])
    rng = np.random.default_rng(3)
    feeds = {"xs": rng.normal(size=(2, 4, 3)), "p0": rng.normal(size=(2, 3)), "r0": rng.normal(size=(2, 3))}
    scope = run(prog, dict(feeds))
    assert scope["ps"].shape == (2, 4, 3)
    scope["loss@GRAD"] = np.array(1.0)
    run(backward(prog), scope)
    # by hand, backwards through the 4 steps (independent of the executor's loop)
    xs, p, r = feeds["xs"], [feeds["p0"]], [feeds["r0"]]
    for t in range(4):
        q = p[-1] * xs[:, t]
        p.append(np.tanh(q + r[-1]))
        r.append(1 / (1 + np.exp(-q)))
    gp, gr = np.zeros((2, 3)), np.zeros((2, 3))
    gx = np.zeros_like(xs)
    for t in range(3, -1, -1):
        q = p[t] * xs[:, t]
        gp = gp + np.ones((2, 3)) / xs.size  # mean over ps
        gs = gp * (1 - p[t + 1] ** 2)
        sig = 1 / (1 + np.exp(-q))
        gq = gs + gr * sig * (1 - sig)
        gx[:, t] = gq * p[t]
        gp, gr = gq * xs[:, t], gs
    np.testing.assert_allclose(scope["xs@GRAD"], gx, rtol=1e-13)
    np.testing.assert_allclose(scope["p0@GRAD"], gp, rtol=1e-13)
    np.testing.assert_allclose(scope["r0@GRAD"], gr, rtol=1e-13)


def test_nested_nets_recurse_and_rename_across_levels():
    inner = NetOp([op("matmul", ["x", "W"], "h"), op("tanh", ["h"], "a")])
    prog = NetOp([inner, op("matmul", ["a", "W"], "z"), op("sum", ["z"], "loss")])
    bwd = backward(prog)
    assert bwd.ops[1] == Operator("matmul_grad", {"X": ["a"], "Y": ["W"], "Out@GRAD": ["z@GRAD"]},
                                  {"X@GRAD": ["a@GRAD"], "Y@GRAD": ["W@GRAD@RENAME@0"]})
    assert bwd.ops[2] == NetOp([
        Operator("tanh_grad", {"X": ["h"], "Out@GRAD": ["a@GRAD"]}, {"X@GRAD": ["h@GRAD"]}),
        Operator("matmul_grad", {"X": ["x"], "Y": ["W"], "Out@GRAD": ["h@GRAD"]},
                 {"X@GRAD": ["x@GRAD"], "Y@GRAD": ["W@GRAD@RENAME@1"]}),
    ])
    assert bwd.ops[3] == Operator("sum", {"X": ["W@GRAD@RENAME@0", "W@GRAD@RENAME@1"]}, {"Out": ["W@GRAD"]},
                                  {"axis": ()})
    rng = np.random.default_rng(5)
    assert_matches_tape(prog, {"x": rng.normal(size=(2, 3)), "W": rng.normal(size=(3, 3))}, set(),
                        np.array(1.0), dps=None)


def test_gradient_arriving_from_outside_a_net_is_added_not_overwritten():
    """v is written and read inside the net and read again after it: its producer's grad op must
    see both contributions."""
    inner = NetOp([op("tanh", ["x"], "v"), op("square", ["v"], "u")])
    prog = NetOp([inner, op("mul", ["u", "v"], "z"), op("sum", ["z"], "loss")])
    bwd = backward(prog)
    inner_bwd = bwd.ops[2]
    assert inner_bwd.ops[0] == Operator("square_grad", {"X": ["v"], "Out@GRAD": ["u@GRAD"]},
                                        {"X@GRAD": ["v@GRAD@RENAME@0"]})
    assert inner_bwd.ops[1] == Operator("sum", {"X": ["v@GRAD", "v@GRAD@RENAME@0"]}, {"Out": ["v@GRAD"]},
                                        {"axis": ()})
    x = np.array([[0.3, -0.8]])
    scope = program_grads(prog, {"x": x}, {"loss@GRAD": np.array(1.0)})
    # loss = sum(tanh(x)^3): d/dx = 3 tanh^2 (1 - tanh^2)
    np.testing.assert_allclose(scope["x@GRAD"], 3 * np.tanh(x) ** 2 * (1 - np.tanh(x) ** 2), rtol=1e-14)


def test_a_nop_does_not_take_the_gradient_of_a_shared_input():
    """y2 = z W is no-grad, so its op is a NOP; W must still get its gradient from y1 = x W."""
    prog = NetOp([op("matmul", ["x", "W"], "y1"), op("matmul", ["z", "W"], "y2"), op("add", ["y1", "y2"], "s"),
                  op("sum", ["s"], "loss")])
    bwd = backward(prog, no_grad_vars={"y2"})
    assert [o.type for o in bwd.ops] == ["sum_grad", "add_grad", "nop", "matmul_grad"]
    assert bwd.ops[3].outputs == {"X@GRAD": ("x@GRAD",), "Y@GRAD": ("W@GRAD",)}
    x, z, w = np.ones((1, 2)), np.full((1, 2), 5.0), np.eye(2)
    scope = program_grads(prog, {"x": x, "z": z, "W": w}, {"loss@GRAD": np.array(1.0)}, {"y2"})
    np.testing.assert_array_equal(scope["W@GRAD"], x.T @ np.ones((1, 2)))  # x^T 1, nothing from z
    assert "z@GRAD" not in scope


def test_unused_output_prunes_its_producer():
    """A value no gradient reaches (its only reader is a NOP) makes its producer a NOP."""
    prog = NetOp([op("tanh", ["x"], "a"), op("mul", ["a", "c"], "b"), op("sum", ["b"], "loss")])
    bwd = backward(prog, no_grad_vars={"c", "a"})
    assert [o.type for o in bwd.ops] == ["sum_grad", "nop", "nop"]


def test_single_op_program_returns_its_grad_op():
    assert backward(op("tanh", ["x"], "y")) == Operator("tanh_grad", {"X": ["x"], "Out@GRAD": ["y@GRAD"]},
                                                        {"X@GRAD": ["x@GRAD"]})
    assert backward(op("tanh", ["x"], "y"), {"y"}) == NOP
    assert required_seeds(_shared_weight_program()) == ["loss@GRAD"]


def test_targets_choose_the_seeds():
    prog = NetOp([op("tanh", ["x"], "h"), op("sum", ["h"], "a"), op("mean", ["h"], "b")])
    assert required_seeds(prog) == ["b@GRAD"]  # the last op's output
    assert [o.type for o in backward(prog).ops] == ["mean_grad", "nop", "tanh_grad"]
    assert required_seeds(prog, targets=["a", "b"]) == ["a@GRAD", "b@GRAD"]
    x = np.array([[0.2, -0.3, 0.9]])
    scope = program_grads(prog, {"x": x}, {"a@GRAD": np.array(2.0), "b@GRAD": np.array(3.0)})
    np.testing.assert_allclose(scope["x@GRAD"], 3.0 / 3 * (1 - np.tanh(x) ** 2), rtol=1e-15)
    scope = run(prog, {"x": x})
    scope.update({"a@GRAD": np.array(2.0), "b@GRAD": np.array(3.0)})
    run(backward(prog, targets=["a", "b"]), scope)
    np.testing.assert_allclose(scope["x@GRAD"], (2.0 + 1.0) * (1 - np.tanh(x) ** 2), rtol=1e-15)
    with pytest.raises(ProgramError, match=r"target 'h' cannot be seeded: a later op reads it"):
        backward(prog, targets=["h"])
    with pytest.raises(ProgramError, match=r"target 'B'.*did you mean 'b'"):
        backward(prog, targets=["B"])


def test_cross_entropy_target_gets_no_gradient_slot():
    g = backward(op("cross_entropy", ["z", "t"], "loss"))
    assert g.outputs == {"X@GRAD": ("z@GRAD",)} and g.inputs["Y"] == ("t",)


# -- the registry ------------------------------------------------------------------------------


def test_registry_has_every_reference_op_and_its_grad_op():
    types = set(registered_types())
    for name in OPS:
        assert {name, name + "_grad"} <= types
        assert op_info(name).grad == name + "_grad" and op_info(name).kind == "forward"
        assert set(op_info(name).attrs) == set(OPS[name].params)
    assert {"fill_zeros_like", "nop", "recurrent", "recurrent_grad"} <= types
    assert op_info("cross_entropy").nd_inputs == {"Y"}


def test_n_ary_sum_adds_then_reduces():
    a, b, c = np.arange(6.0).reshape(2, 3), np.ones((2, 3)), np.full((2, 3), 2.0)
    prog = NetOp([Operator("sum", {"X": ["a", "b", "c"]}, {"Out": ["s"]}, {"axis": ()}),
                  Operator("sum", {"X": ["a", "b"]}, {"Out": ["t"]}, {"axis": 1})])
    scope = run(prog, {"a": a, "b": b, "c": c})
    np.testing.assert_array_equal(scope["s"], a + b + c)
    np.testing.assert_array_equal(scope["t"], (a + b).sum(axis=1))
    with pytest.raises(ValueError, match="different shapes"):
        run(prog, {"a": a, "b": np.ones(3), "c": c})


def test_register_op_one_registration_gives_the_op_and_its_grad_op():
    from reflib.program.registry import _REGISTRY, ONE, OpInfo, register_op
    try:
        register_op(OpInfo("my_tanh", "forward", {"X": ONE}, {"Out": ONE}, grad="my_tanh_grad", ref="tanh"))
        assert op_info("my_tanh_grad").inputs == {"X": ONE, "Out@GRAD": ONE}
        assert op_info("my_tanh_grad").outputs == {"X@GRAD": ONE}
        prog = NetOp([op("my_tanh", ["x"], "y"), op("sum", ["y"], "loss")])
        scope = program_grads(prog, {"x": np.array([0.5])}, {"loss@GRAD": np.array(1.0)})
        np.testing.assert_allclose(scope["x@GRAD"], 1 - np.tanh([0.5]) ** 2, rtol=1e-15)
        with pytest.raises(ValueError, match="registered twice"):
            register_op(OpInfo("my_tanh", "forward", {"X": ONE}, {"Out": ONE}, ref="tanh"))
    finally:
        _REGISTRY.pop("my_tanh", None)
        _REGISTRY.pop("my_tanh_grad", None)


def test_operators_compare_and_hash_by_content():
    a = Operator("add", {"X": "a", "Y": "b"}, {"Out": "c"})
    assert a == Operator("add", {"X": ["a"], "Y": ["b"]}, {"Out": ["c"]}) != a.renamed("b", "d")
    assert len({a, a.renamed("c", "c"), NetOp([a])}) == 2
    assert "add(X=[a], Y=[b]) -> Out=[c]" in NetOp([a]).to_text()


# -- the executor ------------------------------------------------------------------------------


def test_exact_execution_gives_mpf_arrays():
    prog = NetOp([op("tanh", ["x"], "y"), op("sum", ["y"], "loss")])
    scope = Executor(dps=EXACT_DPS).run(prog, {"x": np.array([[0.5, 1.0]])})
    scope["loss@GRAD"] = np.array(1.0)
    Executor(dps=EXACT_DPS).run(backward(prog), scope)
    assert scope["x@GRAD"].dtype == object and isinstance(scope["x@GRAD"][0, 0], mpmath.mpf)
    with mpmath.workdps(EXACT_DPS):
        expected = 1 - mpmath.tanh(mpmath.mpf(1)) ** 2
        assert abs(scope["x@GRAD"][0, 1] - expected) < mpmath.mpf(10) ** -45


def test_forward_run_matches_the_tape_values():
    prog = NetOp([_rnn_two_outlinks(), op("sum", ["hs"], "l1"), op("sum", ["ys"], "l2"), op("add", ["l1", "l2"], "loss")])
    feeds = _rnn_feeds()
    scope = run(prog, dict(feeds))
    tape, env = tape_run(prog, feeds, set())
    for name in ("hs", "ys", "loss"):
        # same reflib kernels on the same values: equal to the last bit
        np.testing.assert_array_equal(scope[name], tape.value(env[name]))
    assert len(scope["hs@STEP_SCOPES"]) == 3


# -- errors ------------------------------------------------------------------------------------


def test_unknown_op_type_lists_close_names():
    with pytest.raises(ProgramError, match=r"unknown op type 'tahn'.*did you mean 'tanh'"):
        run(NetOp([op("tahn", ["x"], "y")]), {"x": np.ones(2)})


def test_variable_read_before_written():
    prog = NetOp([op("tanh", ["h"], "y"), op("exp", ["x"], "h")])
    with pytest.raises(ProgramError, match=r"'h' is read by op #0 \(tanh\) before it is written.*op #1 \(exp\)"):
        backward(prog)
    with pytest.raises(ProgramError, match=r"op #0 \(tanh\) reads variable 'h' \(slot X\) before it is written"):
        run(prog, {"x": np.ones(2)})
    with pytest.raises(ProgramError, match=r"reads variable 'loss@GRAD'.*put the seed"):
        run(backward(NetOp([op("sum", ["x"], "loss")])), {"x": np.ones(2)})


def test_slot_names_must_match_the_op():
    with pytest.raises(ProgramError, match=r"unknown input slot 'x'; did you mean 'X'"):
        run(Operator("tanh", {"x": ["a"]}, {"Out": ["b"]}), {"a": np.ones(2)})
    with pytest.raises(ProgramError, match=r"input slot 'Y' holds 0 variable\(s\) but takes exactly 1"):
        run(Operator("add", {"X": ["a"]}, {"Out": ["b"]}), {"a": np.ones(2)})
    with pytest.raises(ProgramError, match=r"output slot 'Out' holds 2"):
        backward(Operator("exp", {"X": ["a"]}, {"Out": ["b", "c"]}))


def test_attributes_must_match_the_op():
    with pytest.raises(ProgramError, match=r"unknown attribute 'axes'; did you mean 'axis'"):
        backward(op("softmax", ["x"], "y", axes=0))
    with pytest.raises(ProgramError, match=r"attribute 'shape' is required"):
        backward(op("reshape", ["x"], "y"))


def test_rnn_without_step_net():
    with pytest.raises(ProgramError, match="recurrent op has no step net"):
        RnnOp(None, {"xs": "x_t"}, {"h": "hs"})
    with pytest.raises(ProgramError, match="recurrent op has no step net"):
        run(Operator("recurrent", {"X": ["xs"]}, {"Out": ["hs"], "StepScopes": ["s"]}), {})


def test_rnn_links_must_be_written_by_the_step_net():
    step = NetOp([op("tanh", ["x_t"], "y")])
    with pytest.raises(ProgramError, match=r"memory state 'h' is not written by the step net"):
        backward(RnnOp(step, {"xs": "x_t"}, {"y": "ys"}, [Memory("h_prev", "h", "h0")]))
    with pytest.raises(ProgramError, match=r"writes 'x_t', which is a step input"):
        backward(RnnOp(NetOp([op("tanh", ["y"], "x_t")]), {"xs": "x_t"}, {"x_t": "ys"}))
    with pytest.raises(ValueError, match=r"lengths \[3, 2\]"):
        two = NetOp([op("add", ["a_t", "b_t"], "y")])
        run(RnnOp(two, {"a": "a_t", "b": "b_t"}, {"y": "ys"}), {"a": np.ones((3, 2)), "b": np.ones((2, 2))})


def test_bad_no_grad_vars_and_data_flow():
    prog = _shared_weight_program()
    with pytest.raises(ProgramError, match=r"no_grad_vars names 'w'.*did you mean 'W'"):
        backward(prog, {"w"})
    with pytest.raises(TypeError, match="set of variable names"):
        backward(prog, "W")
    with pytest.raises(ProgramError, match=r"'h' is written twice"):
        backward(NetOp([op("tanh", ["x"], "h"), op("exp", ["x"], "h")]))
    with pytest.raises(ProgramError, match="reserved for gradient names"):
        backward(NetOp([op("tanh", ["x@GRAD"], "h")]))
    with pytest.raises(ProgramError, match="second-order"):
        backward(Operator("tanh_grad", {"X": ["x"], "Out@GRAD": ["y"]}, {"X@GRAD": ["g"]}))
    with pytest.raises(TypeError, match="not an Operator"):
        NetOp([op("tanh", ["x"], "y"), "exp"])


def test_kernel_errors_name_the_op():
    prog = NetOp([op("tanh", ["x"], "h"), op("matmul", ["h", "w"], "y")])
    with pytest.raises(ValueError, match=r"op #1 \(matmul\): matmul: inner dimensions differ"):
        run(prog, {"x": np.ones((2, 3)), "w": np.ones((2, 2))})
    with pytest.raises(ValueError, match=r"op #0 \(tanh\).*non-finite"):
        run(prog, {"x": np.array([[np.nan, 1.0]]), "w": np.ones((2, 2))})
