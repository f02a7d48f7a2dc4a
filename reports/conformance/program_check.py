"""The ``program`` rows: Paddle-style backward programs of random networks, held entry by entry.

A drawn network (shared variables, a ``no_grad_vars`` subset, often an RNN step net) gets its
backward program from ``reflib.program.backward``; run exactly and in float64, its gradients are
held to the same computation on the exact ``reflib.Tape`` (exactly, and under the running error
bound of the program's own float64 evaluation), and every gradient the tape has must be written.

The long story: docs/reports-conformance.md, section ``reports/conformance/program_check.py``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["networks", "check_network", "program_rows", "tape_gradients", "EXACT_DPS",
           "EXACT_TOL", "K_ORDER", "SECOND_ORDER", "EXAMPLES"]

EXACT_DPS = 30          # 14 digits beyond float64
EXACT_TOL = 1e-24       # exact vs exact: a few hundred roundings at 1e-30 each
K_ORDER = 4.0           # libm's exp, log, tanh may be 2 ulp off: <= 4 u |result| per call
SECOND_ORDER = 64.0     # the running error bound is first order: eps**2 terms on top
EPS64 = 2.0 ** -52

# drawn networks per row and profile
EXAMPLES = {"dev": 6, "ci": 10, "thorough": 60}

_UNARY = ("tanh", "sigmoid", "softplus", "neg")
_ROWWISE = ("softmax", "layer_norm")
_BINARY = ("add", "sub", "mul")


# ---------------------------------------------------------------------------------------------
# drawing networks

def _op(type_, inputs, out, **attrs):
    from reflib.program import Operator

    return Operator(type_, dict(zip(("X", "Y"), ([v] for v in inputs))), {"Out": [out]}, attrs)


def _broadcast(a, b):
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


def _pick(draw, names, used):
    """A variable, half the time one already read (shared variables are the point)."""
    from hypothesis import strategies as st

    again = [n for n in names if n in used]
    if again and draw(st.booleans()):
        return draw(st.sampled_from(again))
    return draw(st.sampled_from(names))


def _draw_op(draw, shapes, used, out):
    from hypothesis import strategies as st

    names = sorted(shapes)
    rows = [n for n in names if len(shapes[n]) == 2 and shapes[n][-1] >= 2]
    mats = [n for n in names if len(shapes[n]) == 2 and shapes[n][0] == shapes[n][1] >= 2]
    kinds = ["unary", "binary", "binary"]
    if rows:
        kinds += ["rowwise", "reduce"]
    if any(shapes[m][0] == shapes[r][-1] for m in mats for r in rows):
        kinds += ["matmul", "matmul"]
    kind = draw(st.sampled_from(kinds))
    if kind == "unary":
        x = _pick(draw, names, used)
        return _op(draw(st.sampled_from(_UNARY)), [x], out), shapes[x]
    if kind == "binary":
        a = _pick(draw, names, used)
        b = _pick(draw, [n for n in names if _broadcast(shapes[a], shapes[n]) is not None], used)
        return _op(draw(st.sampled_from(_BINARY)), [a, b], out), _broadcast(shapes[a], shapes[b])
    if kind == "rowwise":
        x = _pick(draw, rows, used)
        return _op(draw(st.sampled_from(_ROWWISE)), [x], out), shapes[x]
    if kind == "reduce":
        x = _pick(draw, rows, used)
        return (_op(draw(st.sampled_from(("sum", "mean"))), [x], out, axis=-1, keepdims=True),
                shapes[x][:-1] + (1,))
    r = _pick(draw, [r for r in rows if any(shapes[m][0] == shapes[r][-1] for m in mats)], used)
    m = _pick(draw, [m for m in mats if shapes[m][0] == shapes[r][-1]], used)
    return _op("matmul", [r, m], out), shapes[r][:-1] + (shapes[m][1],)


def _draw_rnn(draw, shapes, used, k, B, D, T):
    """A recurrent op ``h = tanh(x_t W + h_prev ...)`` whose step net reads outer variables
    (W among them: a parameter shared by every step, and often by ops outside)."""
    from hypothesis import strategies as st

    from reflib.program import Memory, NetOp, RnnOp

    xs = f"xs{k}"
    shapes[xs] = (T, B, D)
    boot = _pick(draw, [n for n in sorted(shapes) if shapes[n] == (B, D)], used)
    visible = {n: s for n, s in shapes.items() if s in ((B, D), (B, 1), (D, D))}
    step = {**visible, "x_t": (B, D), "h_prev": (B, D)}
    step_used = {"W", "x_t", "h_prev"}
    body = [_op("matmul", ["x_t", "W"], "s_in")]
    step["s_in"] = (B, D)
    for i in range(draw(st.integers(0, 2))):
        o, shape = _draw_op(draw, step, step_used, f"s{i}")
        body.append(o)
        step[f"s{i}"] = shape
        step_used.update(o.input_names())
    last = [n for n in step if n.startswith("s") and step[n] == (B, D)][-1]
    body += [_op("add", [last, "h_prev"], "s_pre"), _op("tanh", ["s_pre"], "h")]
    outlinks = {"h": f"hs{k}"}
    shapes[f"hs{k}"] = (T, B, D)
    if draw(st.booleans()):   # a second output that reads the state: h@GRAD has two sources
        body.append(_op("mul", ["h", "h"], "y"))   # and one op reads it twice
        outlinks["y"] = f"ys{k}"
        shapes[f"ys{k}"] = (T, B, D)
    used.update(v for o in body for v in o.input_names() if v in visible)
    return RnnOp(NetOp(body), {xs: "x_t"}, outlinks, [Memory("h_prev", "h", boot)])


def networks():
    """Hypothesis strategy: ``(program, feeds, no_grad_vars, seed)`` of a random network whose
    last op writes the scalar ``loss`` (module doc)."""
    from hypothesis import strategies as st
    from hypothesis.extra.numpy import arrays

    from reflib.program import NetOp, Operator, all_var_names, final_outputs

    @st.composite
    def draw_network(draw):
        B, D, T = draw(st.integers(1, 2)), draw(st.integers(2, 3)), draw(st.integers(1, 3))
        shapes = {"x0": (B, D), "x1": (B, D), "W": (D, D), "b": (1, D)}
        used = set()
        units = []
        n_units = draw(st.integers(2, 6))
        rnn_at = draw(st.integers(0, n_units - 1)) if draw(st.booleans()) else -1
        for k in range(n_units):
            if k == rnn_at:
                units.append(_draw_rnn(draw, shapes, used, k, B, D, T))
                continue
            o, shape = _draw_op(draw, shapes, used, f"v{k}")
            units.append(o)
            used.update(o.input_names())
            shapes[f"v{k}"] = shape
        feeds = [n for n in ("x0", "x1", "W", "b") if n in shapes] + \
            [n for n in shapes if n.startswith("xs")]
        dangling = final_outputs(NetOp(units))
        units += [_op("sum", [d], f"r{i}") for i, d in enumerate(dangling)]
        parts = [f"r{i}" for i in range(len(dangling))]
        units.append(Operator("sum", {"X": parts}, {"Out": ["loss"]}, {"axis": ()}))
        program = NetOp(units)
        names = all_var_names(program)
        values = {n: draw(arrays(np.float64, shapes[n], elements=st.floats(
            -2, 2, width=64, allow_subnormal=False))) for n in feeds if n in names}
        pool = sorted(n for n in names - {"loss"} if "@" not in n)
        no_grad = draw(st.sets(st.sampled_from(pool), max_size=2))
        seed = draw(st.floats(0.5, 2.0))
        return program, values, frozenset(no_grad), float(seed)

    return draw_network()


# ---------------------------------------------------------------------------------------------
# the referee: the same computation on reflib.Tape

def _detach(tape, node, name, no_grad):
    return tape.leaf(tape.value(node), requires_grad=False) if name in no_grad else node


def _tape_ops(tape, operator, env, no_grad):
    from reflib.program import NetOp, RnnOp

    if isinstance(operator, NetOp):
        for child in operator.ops:
            _tape_ops(tape, child, env, no_grad)
        return
    if isinstance(operator, RnnOp):
        _tape_rnn(tape, operator, env, no_grad)
        return
    ids = [env[v] for s in ("X", "Y") for v in operator.inputs.get(s, ())]
    if operator.type == "sum" and len(ids) > 1:   # several variables: added, then reduced
        total = ids[0]
        for i in ids[1:]:
            total = tape.op("add", total, i)
        ids = [total]
    out = operator.outputs["Out"][0]
    env[out] = _detach(tape, tape.op(operator.type, *ids, **operator.attrs), out, no_grad)


def _tape_rnn(tape, rnn, env, no_grad):
    a = rnn.attrs
    steps = np.shape(tape.value(env[rnn.inputs["X"][0]]))[0]
    prev = {pre: env[boot] for pre, boot in zip(a["pre_memories"], rnn.inputs["Boot"])}
    outs = {alias: [] for alias in a["outlink_alias"]}
    for t in range(steps):
        step_env = dict(env)
        for outer, alias in zip(rnn.inputs["X"], a["inlink_alias"]):
            shape = np.shape(tape.value(env[outer]))[1:]
            piece = tape.op("reshape", tape.op("slice", env[outer], axis=0, start=t, stop=t + 1),
                            shape=shape)
            step_env[alias] = _detach(tape, piece, alias, no_grad)
        for pre, node in prev.items():
            step_env[pre] = _detach(tape, node, pre, no_grad)
        _tape_ops(tape, rnn.step_net, step_env, no_grad)
        prev = {pre: step_env[state] for pre, state in zip(a["pre_memories"], a["memories"])}
        for alias in a["outlink_alias"]:
            outs[alias].append(step_env[alias])
    for alias, outer in zip(a["outlink_alias"], rnn.outputs["Out"]):
        pieces = [tape.op("reshape", n, shape=(1,) + np.shape(tape.value(n)))
                  for n in outs[alias]]
        stacked = pieces[0]
        for p in pieces[1:]:
            stacked = tape.op("concat", stacked, p, axis=0)
        env[outer] = _detach(tape, stacked, outer, no_grad)


def tape_gradients(program, feeds, no_grad, seed, dps=EXACT_DPS):
    """``({variable: gradient}, live)``: the gradients of ``seed * loss`` on ``reflib.Tape`` at
    ``dps`` digits, for every fed or written variable outside ``no_grad`` that the tape reaches,
    and the variables whose gradient the tape tracks (a feed outside ``no_grad``, or a value
    computed from one); a tracked variable missing from the gradients is not reached."""
    from reflib import Tape

    tape = Tape(dps=dps)
    env = {n: tape.leaf(v, requires_grad=n not in no_grad) for n, v in feeds.items()}
    _tape_ops(tape, program, env, no_grad)
    grads = tape.backward(env["loss"], np.asarray(seed))
    live = {n for n, i in env.items() if n not in no_grad and tape.requires_grad(i)}
    return {n: grads[i] for n, i in env.items() if n in live and grads.get(i) is not None}, live


def program_gradients(program, feeds, no_grad, seed, dps=None):
    """The backward program's scope after running the forward and backward programs at
    ``dps`` (None: float64; an int: exact; a ``RunningError``: float64 with radii)."""
    from reflib.program import backward, run

    scope = run(program, dict(feeds), dps=dps)
    scope["loss@GRAD"] = np.asarray(seed) if dps is None else _lift(np.asarray(seed), scope)
    run(backward(program, no_grad), scope, dps=dps)
    return scope


def _lift(seed, scope):
    """The seed in the numeric of the run (the scope's loss tells which)."""
    loss = np.asarray(scope["loss"], dtype=object)
    kind = type(loss.reshape(-1)[0])
    out = np.empty(np.shape(seed), dtype=object)
    out.reshape(-1)[:] = [kind(float(v)) for v in seed.reshape(-1)]
    return out


# ---------------------------------------------------------------------------------------------
# the check

def _f(a):
    a = np.asarray(a)
    if a.dtype != object:
        return a.astype(np.float64)
    return np.array([float(getattr(v, "v", v)) for v in a.reshape(-1)]).reshape(a.shape)


def _outer_names(program):
    from reflib.program.ir import leaf_ops

    names = []
    for _, o in leaf_ops(program):
        names += [v for v in o.input_names() + o.output_names() if v not in names and "@" not in v]
    return names


def check_network(case):
    """Build ``case``'s backward program, run it exactly and in float64, and hold its gradients
    to the exact tape's (module doc).

    Returns
    -------
    properties.Result
    """
    from reflib.program import grad_var_name
    from reflib.running_error import RunningError, radii
    from reports.conformance.properties import Result
    from reports.conformance.training_rows import _measure

    program, feeds, no_grad, seed = case
    result = Result()
    truth, live = tape_gradients(program, feeds, no_grad, seed)
    try:
        exact = program_gradients(program, feeds, no_grad, seed, EXACT_DPS)
        with np.errstate(all="ignore"):
            f64 = program_gradients(program, feeds, no_grad, seed)
            bounded = program_gradients(program, feeds, no_grad, seed, RunningError(EPS64 / 2))
    except Exception as exc:
        return result.fail(f"the backward program failed to run: {type(exc).__name__}: {exc}")
    scale = max([1e-300] + [float(np.max(np.abs(_f(g)))) for g in truth.values() if np.size(g)])
    for name in _outer_names(program):
        g = grad_var_name(name)
        if name in no_grad:
            if g in exact:
                result.fail(f"{g} written, but {name!r} is in no_grad_vars")
            continue
        want = truth.get(name)
        if name not in live:   # computed from no-grad values only: the tape says nothing
            continue
        if want is None:       # tracked but never reached: no gradient, or an exact 0
            for label, scope in (("exact", exact), ("float64", f64)):
                if g in scope and np.any(_f(scope[g]) != 0):
                    result.fail(f"{g} = {_f(scope[g]).tolist()} ({label}); the tape gives "
                                f"{name!r} no gradient")
            continue
        if g not in exact or g not in f64:
            result.fail(f"{g} missing; the exact tape gives {_f(want).tolist()}")
            continue
        w = _f(want)
        tight = EXACT_TOL * scale
        result.measures.append(_measure(f"exact {g}", _f(exact[g]), w, tight, scale, EPS64))
        r = np.where(np.isfinite(radii(bounded[g])), radii(bounded[g]), 0.0)
        bound = K_ORDER * r + SECOND_ORDER * EPS64 * EPS64 * scale
        result.measures.append(_measure(f"float64 {g}", f64[g], w, bound, scale, EPS64))
    return result


def program_source(op):
    """Python that builds ``op`` (an Operator, NetOp or RnnOp) again."""
    from reflib.program import NetOp, RnnOp

    if isinstance(op, NetOp):
        return "NetOp([" + ", ".join(program_source(o) for o in op.ops) + "])"
    if isinstance(op, RnnOp):
        a = op.attrs
        links = dict(zip(op.inputs["X"], a["inlink_alias"]))
        outs = dict(zip(a["outlink_alias"], op.outputs["Out"]))
        mems = list(zip(a["pre_memories"], a["memories"], op.inputs["Boot"]))
        return (f"RnnOp({program_source(op.step_net)}, {links!r}, {outs!r}, {mems!r}, "
                f"{a['axis']!r})")
    ins = {k: list(v) for k, v in op.inputs.items()}
    outs = {k: list(v) for k, v in op.outputs.items()}
    return f"Operator({op.type!r}, {ins!r}, {outs!r}, {op.attrs!r})"


def reproduction(case):
    """Python that rebuilds the drawn network and runs the check again."""
    program, feeds, no_grad, seed = case
    values = {k: v.tolist() for k, v in feeds.items()}
    return ("import numpy as np\n"
            "from reflib.program import NetOp, Operator, RnnOp\n"
            "from reports.conformance.program_check import check_network\n"
            f"program = {program_source(program)}\n"
            f"feeds = {{k: np.array(v) for k, v in {values!r}.items()}}\n"
            f"result = check_network((program, feeds, frozenset({sorted(no_grad)!r}), {seed!r}))\n"
            "print(result)\n")


def fixed_networks():
    """Networks every ``program`` row checks before its draws: a variable shared by two ops
    and read twice by one (rename + sum), an op with one no-grad input (NOP only when all
    are), and a recurrent op whose step net shares ``W`` with an op outside and whose second
    output reads the state twice (the step net's backward, the carried gradient)."""
    from reflib.program import Memory, NetOp, Operator, RnnOp

    rng = np.random.default_rng(20240607)
    x0, x1, w = rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (3, 3))
    shared = NetOp([_op("matmul", ["x0", "W"], "v0"), _op("matmul", ["x1", "W"], "v1"),
                    _op("mul", ["v0", "v0"], "v2"), _op("tanh", ["v1"], "v3"),
                    _op("mul", ["v2", "v3"], "v4"), _op("sum", ["v4"], "loss")])
    partial = NetOp([_op("mul", ["x0", "x1"], "v0"), _op("tanh", ["v0"], "v1"),
                     _op("add", ["v1", "x0"], "v2"), _op("sum", ["v2"], "loss")])
    step = NetOp([_op("matmul", ["x_t", "W"], "s_in"), _op("add", ["s_in", "h_prev"], "s_pre"),
                  _op("tanh", ["s_pre"], "h"), _op("mul", ["h", "h"], "y")])
    rnn = NetOp([RnnOp(step, {"xs": "x_t"}, {"h": "hs", "y": "ys"}, [Memory("h_prev", "h", "x0")]),
                 _op("matmul", ["x1", "W"], "v0"), _op("sum", ["hs"], "r0"),
                 _op("sum", ["ys"], "r1"), _op("sum", ["v0"], "r2"),
                 Operator("sum", {"X": ["r0", "r1", "r2"]}, {"Out": ["loss"]}, {"axis": ()})])
    xs = rng.uniform(-1, 1, (3, 2, 3))
    return [(shared, {"x0": x0, "x1": x1, "W": w}, frozenset(), 1.0),
            (partial, {"x0": x0, "x1": x1}, frozenset({"x1"}), 1.0),
            (rnn, {"x0": x0, "x1": x1, "W": w, "xs": xs}, frozenset(), 1.0)]


def program_rows(engine_name):
    """The ``program`` row (``runner.Row``): random networks' backward programs, float64 and
    exact. The program builder and executor are reflib's; the row runs with the engines that
    carry reflib's algorithms (fastlib's and reflib's suites)."""
    from reports.conformance.rows import Row, run_property

    def run(profile, seed):
        n = EXAMPLES.get(profile.name, profile.algorithms)
        return run_property(networks(), check_network, n, seed, reproduction,
                            examples=fixed_networks())

    return [Row("program", "program random networks", engine_name, "float64", run)]
