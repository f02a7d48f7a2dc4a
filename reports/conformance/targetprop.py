"""Target Propagation checks: fastlib against reflib against spec, step by step.

Moved here from ``tests/test_targetprop.py`` (which imports them) so that ``verigrad conform``
runs them from an installed package. Oracles, independent of the engine under test:

- ``spec.targetprop``: the rules evaluated in exact arithmetic (mpmath, 30 digits); its
  chain-rule signal J_xᵀ g and local update J_θᵀ (t − y) are high-precision numerical
  derivatives (``mpmath.diff``) of layer forwards built from the registry's op formulas;
- ``reflib.targetprop``: each layer traced on its own reference tape (float64), pure routes in
  plain NumPy.

The long story: docs/reports-conformance.md, section ``reports/conformance/targetprop.py``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

import optable
import fastlib
import fastlib.targetprop as ft
import reflib.targetprop as rt
import spec.targetprop as stp
from fastlib.layers import LSTM, RNN, Dense, MultiHeadAttention, Sequential, SwiGLU
from reflib.models import twin
from reports.conformance.oracle import as_float64

F64_TOL = 1e-11    # float64 engines against each other and against exact (module doc)
F32_TOL = 2e-4     # float32 fastlib against float64 reflib (module doc)
SPEC_DPS = 30      # exact values to 30 digits: far beyond float64's 16
KINDS = ("Dense", "RNN", "LSTM", "MultiHeadAttention", "SwiGLU")
ACTIVATIONS = tuple(optable.ACTIVATIONS)            # every activation of the op table


class Case(NamedTuple):
    """A model (fastlib, float64) with random parameters, an input and an output target."""

    model: object
    x: np.ndarray
    target: np.ndarray


def _close(actual, expected, tol, what, floor=1e-300):
    """max |actual − expected| <= tol · max(max |expected|, floor).

    ``floor`` is the scale of the whole model's arrays of that kind, for entries that are 0 in
    exact arithmetic (the key bias of attention: softmax ignores a per-row shift), where each
    engine keeps its own rounding residue.
    """
    a, e = as_float64(actual), as_float64(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    scale = max(float(np.max(np.abs(e))) if e.size else 0.0, floor)
    err = float(np.max(np.abs(a - e))) if e.size else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3e} > {tol:.0e} x scale {scale:.3e}"


# ---------------------------------------------------------------------------------------------
# strategies

def _main_layer(draw, kind, width, small):
    """(layer, input shape without batch, output width, output is 3-D)."""
    seq = draw(st.integers(1, 2 if small else 3))
    if kind == "Dense":
        out = draw(st.integers(1, 3 if small else 4))
        act = draw(st.sampled_from(ACTIVATIONS))
        three_d = draw(st.booleans())
        return Dense(width, out, act), ((seq, width) if three_d else (width,)), out, three_d
    if kind in ("RNN", "LSTM"):
        hidden = draw(st.integers(1, 2 if small else 3))
        seqs = draw(st.booleans())
        cls = RNN if kind == "RNN" else LSTM
        return cls(width, hidden, return_sequences=seqs), (seq, width), hidden, seqs
    if kind == "MultiHeadAttention":
        heads = draw(st.integers(1, 2))
        d = heads * draw(st.integers(1, 2))
        causal = draw(st.booleans())
        return MultiHeadAttention(d, heads, causal=causal), (seq, d), d, True
    hidden = draw(st.integers(1, 2 if small else 4))
    out = draw(st.integers(1, 2 if small else 3))
    three_d = draw(st.booleans())
    return SwiGLU(width, hidden, out), ((seq, width) if three_d else (width,)), out, three_d


@st.composite
def tp_cases(draw, kind, small=False, dtype=np.float64):
    """A model around one layer of ``kind``: alone, after a Dense, before a Dense, or nested
    (``Sequential([Dense, Sequential([layer, Dense])])``); parameters and data from one seed."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    width = draw(st.integers(1, 2 if small else 4))
    main, in_shape, out_width, _ = _main_layer(draw, kind, width, small)
    layout = draw(st.sampled_from(["alone", "before", "after", "nested"]))
    width0 = draw(st.integers(1, 3))
    first_in = in_shape[-1]
    pre = Dense(width0, first_in, draw(st.sampled_from(("tanh", "linear", "sigmoid"))))
    post = Dense(out_width, draw(st.integers(1, 3)), draw(st.sampled_from(("linear", "tanh"))))
    if layout == "alone":
        layers, x_shape = [main], in_shape
    elif layout == "before":
        layers, x_shape = [pre, main], in_shape[:-1] + (width0,)
    elif layout == "after":
        layers, x_shape = [main, post], in_shape
    else:
        layers, x_shape = [pre, Sequential([main, post])], in_shape[:-1] + (width0,)
    model = Sequential(layers, dtype=dtype, seed=0)
    for value in model.parameters().values():
        # NOTE: every parameter (biases included) is a random normal: no exact zeros, so no
        # pre-activation sits on a relu kink, where the spec's numerical derivative would
        # average the two sides.
        value[...] = rng.normal(0.0, 0.6, value.shape)
    batch = draw(st.integers(1, 2 if small else 3))
    x = rng.normal(size=(batch,) + x_shape).astype(dtype)
    y = model(x)
    target = (y + rng.normal(0.0, draw(st.sampled_from((0.1, 0.5, 2.0))), y.shape)).astype(dtype)
    return Case(model, x, target)


@st.composite
def budget_pairs(draw):
    """(actual, target) arrays, including all-zero ones and exact multiples."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    y = rng.normal(size=shape)
    kind = draw(st.sampled_from(["random", "zero_actual", "zero_target", "both_zero",
                                 "aligned", "opposite"]))
    t = rng.normal(size=shape)
    if kind in ("zero_actual", "both_zero"):
        y = np.zeros(shape)
    if kind in ("zero_target", "both_zero"):
        t = np.zeros(shape)
    if kind == "aligned":
        t = 3.0 * y
    if kind == "opposite":
        t = -0.5 * y
    return y, t


# ---------------------------------------------------------------------------------------------
# properties

def _fast_copy(model, dtype=np.float64):
    copy = fastlib.layers.from_config(model.get_config(), dtype=dtype)
    copy.load_parameters(model.parameters())
    return copy


def _run_fastlib(case, chain, lr=None, steps=1, dtype=np.float64):
    """TargetProp steps on a copy of the case's model (the case is left as it was)."""
    model = _fast_copy(case.model, dtype)
    state = ft.TargetPropState(model, ft.TargetPropConfig(use_chain_rule=chain))
    for _ in range(steps):
        ft.targetprop_forward(model, state, case.x.astype(dtype))
        ft.targetprop_backward(model, state, case.target.astype(dtype), input_target=True)
        state.calculate_link_budgets()
        if lr is not None:
            ft.apply_targetprop_gaps(model, state, lr)
    return model, state


def _run_reflib(case, chain, lr=None, steps=1):
    """The same steps on the reference twin (a copy) of the case's model."""
    ref = twin(case.model)
    state = rt.TargetPropState(ref, rt.TargetPropConfig(use_chain_rule=chain))
    for _ in range(steps):
        rt.targetprop_forward(ref, state, case.x)
        rt.targetprop_backward(ref, state, case.target, input_target=True)
        state.calculate_link_budgets()
        if lr is not None:
            rt.apply_targetprop_gaps(ref, state, lr)
    return ref, state


def prop_targets_fastlib_vs_reflib(case, chain, dtype=np.float64):
    """Every layer's output, target, signal and the input target agree (fastlib vs reflib)."""
    tol = F64_TOL if dtype == np.float64 else F32_TOL
    _, fs = _run_fastlib(case, chain, dtype=dtype)
    _, rs = _run_reflib(case, chain)
    L = len(rs.layers)
    for l in range(L):
        _close(fs.forward_acts[l], rs.forward_acts[l], tol, f"forward_acts[{l}]")
        _close(fs.backward_targets[l], rs.backward_targets[l], tol, f"backward_targets[{l}]")
        _close(fs.gradients[l], rs.gradients[l], tol, f"gradients[{l}]")
    _close(fs.input_target, rs.input_target, tol, "input_target")
    _close(fs.gaps, rs.gaps, tol, "gaps")
    _close(fs.link_budgets, rs.link_budgets, tol, "link_budgets")


def prop_targets_reflib_vs_spec(case, chain):
    """reflib's targets and signals equal the spec's exact ones (chain-rule or pure)."""
    _, rs = _run_reflib(case, chain)
    exact = stp.backward(case.model.get_config(), case.model.parameters(), case.x, case.target,
                         {"use_chain_rule": chain}, dps=SPEC_DPS, input_target=True)
    for l in range(len(rs.layers)):
        _close(rs.forward_acts[l], exact["forward_acts"][l], F64_TOL, f"forward_acts[{l}]")
        _close(rs.backward_targets[l], exact["backward_targets"][l], F64_TOL,
               f"backward_targets[{l}]")
        _close(rs.gradients[l], exact["gradients"][l], F64_TOL, f"gradients[{l}]")
    _close(rs.input_target, exact["input_target"], F64_TOL, "input_target")


def _velocity_scale(velocities):
    return max(float(np.max(np.abs(as_float64(v)))) for v in velocities.values())


def _same_apply(model, fs, ref, rs):
    """fastlib's step (``model``, its state ``fs``) and reflib's (``ref``, ``rs``) agree: gates,
    layer rates, parameters and velocities."""
    assert fs.updated == rs.updated, f"gates differ: {fs.updated} vs {rs.updated}"
    _close(fs.layer_rates, rs.layer_rates, F64_TOL, "layer_rates")
    params = model.parameters()
    floor = _velocity_scale(rs.velocities)
    for name, value in ref.parameters().items():
        _close(params[name], value, F64_TOL, f"parameter {name}")
        _close(fs.velocities[name], rs.velocities[name], F64_TOL, f"velocity {name}", floor)


def prop_apply_fastlib_vs_reflib(case, chain, lr, steps=2):
    """``steps`` full TargetProp steps (momentum carried over): budgets, gates, rates,
    velocities and parameters agree."""
    model, fs = _run_fastlib(case, chain, lr, steps)
    ref, rs = _run_reflib(case, chain, lr, steps)
    _same_apply(model, fs, ref, rs)


def prop_apply_reflib_vs_spec(case, chain, lr):
    """One apply with non-zero starting velocities: reflib equals the spec's exact step."""
    ref = twin(case.model)
    rs = rt.TargetPropState(ref, rt.TargetPropConfig(use_chain_rule=chain))
    rng = np.random.default_rng(0)
    start = {k: rng.normal(0, 0.01, np.shape(v)) for k, v in ref.parameters().items()}
    rs.velocities = {k: v.copy() for k, v in start.items()}
    old = {k: np.array(v, dtype=np.float64) for k, v in ref.parameters().items()}
    rt.targetprop_forward(ref, rs, case.x)
    rt.targetprop_backward(ref, rs, case.target)
    rs.calculate_link_budgets()
    rt.apply_targetprop_gaps(ref, rs, lr)
    exact = stp.apply(case.model.get_config(), old, case.x, rs.backward_targets, start, lr,
                      {"use_chain_rule": chain}, dps=SPEC_DPS)
    assert rs.updated == exact["updated"]
    _close(rs.link_budgets, exact["link_budgets"], F64_TOL, "link_budgets")
    _close(rs.gaps, exact["gaps"], F64_TOL, "gaps")
    _close(rs.layer_rates, exact["rates"], F64_TOL, "rates")
    floor = _velocity_scale(exact["velocities"])
    for name, value in ref.parameters().items():
        _close(value, exact["params"][name], F64_TOL, f"parameter {name}")
        _close(rs.velocities[name], exact["velocities"][name], F64_TOL, f"velocity {name}",
               floor)


def _fast_budget(y, t):
    state = ft.TargetPropState(Sequential([Dense(1, 1)], dtype=np.float64))
    state.forward_acts, state.backward_targets = [np.asarray(y)], [np.asarray(t)]
    state.calculate_link_budgets()
    return state.link_budgets[0], state.gaps[0]


def _ref_budget(y, t):
    state = rt.TargetPropState(twin(Sequential([Dense(1, 1)], dtype=np.float64)))
    state.forward_acts, state.backward_targets = [np.asarray(y)], [np.asarray(t)]
    state.calculate_link_budgets()
    return state.link_budgets[0], state.gaps[0]


def prop_link_budget_three_ways(y, t):
    """The budget and gap of fastlib, reflib and the spec agree; 0 when a norm is 0."""
    b_spec, g_spec = stp.link_budget(y, t, SPEC_DPS), stp.gap(y, t, SPEC_DPS)
    for engine, (b, g) in (("fastlib", _fast_budget(y, t)), ("reflib", _ref_budget(y, t))):
        assert abs(b - b_spec) <= 4e-16, f"{engine} budget {b!r} != spec {b_spec!r}"
        assert abs(g - g_spec) <= 4e-16 * max(1.0, g_spec), f"{engine} gap {g!r} != {g_spec!r}"
        if not np.any(y) or not np.any(t):
            assert b == 0.0, f"{engine}: a zero norm must give budget 0, got {b}"
        assert 0.0 <= b <= 1.0


# ---------------------------------------------------------------------------------------------
# at and around the thresholds: the route's θ (``weight_threshold``) and the gate's τ
# (``budget_threshold``), where an engine that compares the wrong way (> for >=), compares
# against another constant or rounds the compared value differs from the rule

# relative offsets from a threshold: on it, one ulp either side, and farther out
THRESHOLD_OFFSETS = (0.0, "up", "down", 1e-12, -1e-12, 1e-6, -1e-6, 1e-3, -1e-3)
# |b − τ| below which the gate of a float64 engine may go either way: the budget
# (cos + 1) / 2 is a few roundings (a dot product, two norms, a square root, a division)
GATE_ZONE = 16 * 2.0 ** -52


def _at(value, offset):
    """``value`` moved by ``offset`` (relative, or "up" / "down": one float64 ulp)."""
    if offset == "up":
        return float(np.nextafter(value, np.inf))
    if offset == "down":
        return float(np.nextafter(value, -np.inf))
    return float(value * (1.0 + offset))


@st.composite
def route_threshold_cases(draw):
    """A lone pure-mode Dense whose weight rows sum (in |.|) to θ moved by the offsets.

    Each row's absolute sum is exact in float64 (one entry, or two equal halves), so the
    spec's exact comparison and the engines' float comparison see the same number.
    """
    theta = ft.TargetPropConfig().weight_threshold
    # the first row sits exactly on θ in every case
    offsets = [0.0] + draw(st.lists(st.sampled_from(THRESHOLD_OFFSETS), max_size=3))
    out = draw(st.integers(2, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = []
    for offset in offsets:
        den = _at(theta, offset)
        row = np.zeros(out)
        cols = rng.permutation(out)
        signs = rng.choice([-1.0, 1.0], 2)
        if draw(st.booleans()):
            row[cols[0]] = signs[0] * den
        else:                       # two halves: den / 2 is exact, and so is their sum
            row[cols[0]], row[cols[1]] = signs[0] * den / 2, signs[1] * den / 2
        rows.append(row)
    rows.append(rng.normal(0, 0.6, out))          # one ordinary row
    model = Sequential([Dense(len(rows), out, "linear")], dtype=np.float64, seed=0)
    model.load_parameters({"0.weight": np.array(rows), "0.bias": rng.normal(0, 0.3, out)})
    batch = draw(st.integers(1, 3))
    x = rng.normal(size=(batch, len(rows)))
    target = model(x) + rng.normal(0, 0.5, (batch, out))
    return Case(model, x, target)


def prop_route_at_threshold(case):
    """Pure mode: fastlib, reflib and the exact spec route exactly the rows whose Σ|W| exceeds
    θ (and 0 for the others), with the same targets."""
    theta = ft.TargetPropConfig().weight_threshold
    W = case.model.parameters()["0.weight"]
    routes = np.sum(np.abs(W), axis=1) > theta      # exact: the sums are exact (see cases)
    _, fs = _run_fastlib(case, False)
    _, rs = _run_reflib(case, False)
    exact = stp.backward(case.model.get_config(), case.model.parameters(), case.x, case.target,
                         {"use_chain_rule": False}, dps=SPEC_DPS, input_target=True)
    want = as_float64(exact["input_target"])
    for name, got in (("fastlib", fs.input_target), ("reflib", rs.input_target)):
        got = as_float64(got)
        for i, r in enumerate(routes):
            if not r:
                assert np.all(got[..., i] == 0), (
                    f"{name}: row {i} with Σ|W| = {np.sum(np.abs(W[i]))!r} <= θ = {theta} must "
                    f"route nothing, got {got[..., i]}")
            else:
                assert np.any(want[..., i] != 0) or np.all(got[..., i] == 0)
        _close(got, want, F64_TOL, f"{name} input_target")


# the matrices each kind's pure route divides by Σ|W| (per row, or per column under
# normalisation="column"): Dense through its weight; RNN and LSTM through w_hh (back in time)
# and w_ih; SwiGLU through w_down and [w_gate | w_up] side by side; attention through w_o and
# w_v (its route through the attention probabilities compares a sum of rounded exps, never
# exactly θ, and is covered by the random rows)
ROUTED = {"Dense": ("weight",), "RNN": ("w_hh", "w_ih"), "LSTM": ("w_hh", "w_ih"),
          "SwiGLU": ("w_down", "w_gate"), "MultiHeadAttention": ("w_o", "w_v")}


def _threshold_line(rng, n, den, halves):
    """``n`` entries whose absolute values sum to ``den`` exactly (one entry, or two halves)."""
    line = np.zeros(n)
    cols = rng.permutation(n)
    signs = rng.choice([-1.0, 1.0], 2)
    if halves and n > 1:
        line[cols[0]], line[cols[1]] = signs[0] * den / 2, signs[1] * den / 2
    else:
        line[cols[0]] = signs[0] * den
    return line


@st.composite
def route_threshold_kind_cases(draw, kind, column=None):
    """``(case, options)``: a lone layer of ``kind`` in pure mode whose routed matrices
    (``ROUTED``) have rows (or, with ``normalisation="column"``, columns) summing in |.| to θ
    moved by ``THRESHOLD_OFFSETS``: the first exactly on θ, the rest drawn, the others random.

    The sums are exact in float64 (one entry, or two equal halves, the rest 0), so the spec's
    exact comparison and the engines' float comparison see the same number. SwiGLU's w_up
    rows (columns) beside a threshold line of w_gate are zeroed, so the pair's sum is θ's.
    """
    theta = ft.TargetPropConfig().weight_threshold
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    column = draw(st.booleans()) if column is None else column
    width = draw(st.integers(2, 3))
    hidden = draw(st.integers(2, 3))
    seq = draw(st.integers(2, 3))
    if kind == "Dense":
        layer, x_shape = Dense(width, hidden, "linear"), (width,)
    elif kind in ("RNN", "LSTM"):
        cls = RNN if kind == "RNN" else LSTM
        layer = cls(width, hidden, return_sequences=draw(st.booleans()))
        x_shape = (seq, width)
    elif kind == "SwiGLU":
        layer, x_shape = SwiGLU(width, hidden, draw(st.integers(1, 2))), (width,)
    else:
        heads = draw(st.integers(1, 2))
        layer = MultiHeadAttention(2 * heads, heads, causal=draw(st.booleans()))
        x_shape = (seq, 2 * heads)
    model = Sequential([layer], dtype=np.float64, seed=0)
    params = {k: rng.normal(0.0, 0.6, v.shape) for k, v in model.parameters().items()}
    for name in ROUTED[kind]:
        W = params["0." + name]
        lines = W.T if column else W               # a view: writing a line writes W
        count = lines.shape[0]
        offsets = [0.0] + draw(st.lists(st.sampled_from(THRESHOLD_OFFSETS),
                                        max_size=max(count - 2, 0)))
        picks = rng.permutation(count)[:len(offsets)]
        for i, offset in zip(picks, offsets):
            lines[i] = _threshold_line(rng, lines.shape[1], _at(theta, offset),
                                       draw(st.booleans()))
            if name == "w_gate":
                up = params["0.w_up"]
                (up.T if column else up)[i] = 0.0
    model.load_parameters(params)
    x = rng.normal(size=(draw(st.integers(1, 2)),) + x_shape)
    target = model(x) + rng.normal(0, 0.5, model(x).shape)
    return Case(model, x, target), {"use_chain_rule": False,
                                    "normalisation": "column" if column else "row"}


def _targets(engine, case, options):
    """(backward_targets, input_target) of one pure-mode backward with ``options``."""
    mod, model = (ft, _fast_copy(case.model)) if engine == "fastlib" else (rt, twin(case.model))
    state = mod.TargetPropState(model, mod.TargetPropConfig(**options))
    mod.targetprop_forward(model, state, case.x)
    mod.targetprop_backward(model, state, case.target, input_target=True)
    return state.backward_targets, state.input_target


def prop_route_kind_at_threshold(case, options):
    """Pure mode around θ, any layer kind: fastlib's and reflib's targets equal the exact
    spec's (which routes exactly the lines whose Σ|W| exceeds θ); a line on θ routed, or one
    just above it dropped, moves the target by the routed gap, far beyond the tolerance."""
    exact = stp.backward(case.model.get_config(), case.model.parameters(), case.x, case.target,
                         options, dps=SPEC_DPS, input_target=True)
    for engine in ("fastlib", "reflib"):
        targets, input_target = _targets(engine, case, options)
        for l, t in enumerate(targets):
            _close(t, exact["backward_targets"][l], F64_TOL, f"{engine} backward_targets[{l}]")
        _close(input_target, exact["input_target"], F64_TOL,
               f"{engine} input_target ({options['normalisation']} normalisation)")


@st.composite
def gate_threshold_cases(draw):
    """(offset, lr): a lone Dense(1, 2) whose output y = [1, 0] has the target t = [a, 4]
    with a chosen so the exact link budget (cos(y, t) + 1) / 2 is τ moved by ``offset``."""
    return (draw(st.sampled_from(THRESHOLD_OFFSETS + (2e-15, -2e-15))),
            draw(st.sampled_from([0.01, 0.1])))


def _gate_case(offset):
    import mpmath

    tau = ft.TargetPropConfig().budget_threshold
    b = _at(tau, offset) if isinstance(offset, str) else tau * (1 + offset)
    with mpmath.workdps(SPEC_DPS):
        c = 2 * mpmath.mpf(b) - 1
        a = float(4 * c / mpmath.sqrt(1 - c * c))
    model = Sequential([Dense(1, 2, "linear")], dtype=np.float64, seed=0)
    model.load_parameters({"0.weight": np.array([[1.0, 0.0]]), "0.bias": np.zeros(2)})
    return Case(model, np.array([[1.0]]), np.array([[a, 4.0]]))


def prop_gate_at_threshold(offset, lr):
    """The layer is updated iff its exact budget is >= τ (``spec``'s gate), in fastlib and
    reflib alike; within ``GATE_ZONE`` of τ (where the float64 budget is not decisive) the
    two engines must at least agree. Rates, velocities and parameters agree either way."""
    case = _gate_case(offset)
    tau = ft.TargetPropConfig().budget_threshold
    y = case.model(case.x)
    b_exact = float(stp.link_budget(y, case.target, SPEC_DPS))
    import mpmath

    with mpmath.workdps(SPEC_DPS):
        above = stp.link_budget(y, case.target, SPEC_DPS) >= mpmath.mpf(tau)
    model, fs = _run_fastlib(case, True, lr, 1)
    ref, rs = _run_reflib(case, True, lr, 1)
    assert fs.updated == rs.updated, f"gates differ: fastlib {fs.updated}, reflib {rs.updated}"
    if abs(b_exact - tau) > GATE_ZONE:
        assert fs.updated == [bool(above)], (
            f"budget {b_exact!r} {'>=' if above else '<'} τ = {tau}: the spec "
            f"{'updates' if above else 'skips'} the layer, fastlib updated={fs.updated}")
    _close(fs.link_budgets, rs.link_budgets, F64_TOL, "link_budgets")
    _close(fs.layer_rates, rs.layer_rates, F64_TOL, "layer_rates")
    params = model.parameters()
    for name, value in ref.parameters().items():
        _close(params[name], value, F64_TOL, f"parameter {name}")
# Loom's switchable rules: update="loom" (Dense delta rule) and normalisation="column" (the
# pure routes divided per output column). Same oracles and tolerances as above: the delta rule
# is one product xᵀ·gap per entry, the column route one division by a sum > θ per output.

VARIANTS = ({"update": "loom"}, {"normalisation": "column"},
            {"update": "loom", "normalisation": "column"})


@st.composite
def variant_cases(draw, kind=None, small=False):
    """``(case, options)``: a TargetProp case around a layer of ``kind`` (drawn when None) and
    a non-default setting of ``update`` / ``normalisation`` with ``use_chain_rule``.
    ``update="loom"`` is drawn on Dense-only models (its rule is Dense's); a column
    normalisation in pure mode (where routes are used)."""
    choices = VARIANTS if kind in (None, "Dense") else ({"normalisation": "column"},)
    options = dict(draw(st.sampled_from(choices)))
    if options.get("update") == "loom":
        kind = "Dense"
    elif kind is None:
        kind = draw(st.sampled_from(KINDS))
    options["use_chain_rule"] = (False if "normalisation" in options else
                                 draw(st.booleans()))
    return draw(tp_cases(kind, small=small)), options


def _run_variant(engine, case, options, lr, steps):
    """``steps`` TargetProp steps with ``options`` on a copy of the case's model (fastlib or
    the reflib twin)."""
    mod, model = (ft, _fast_copy(case.model)) if engine == "fastlib" else (rt, twin(case.model))
    state = mod.TargetPropState(model, mod.TargetPropConfig(**options))
    for _ in range(steps):
        mod.targetprop_forward(model, state, case.x)
        mod.targetprop_backward(model, state, case.target, input_target=True)
        state.calculate_link_budgets()
        mod.apply_targetprop_gaps(model, state, lr)
    return model, state


def prop_variant_fastlib_vs_reflib(case, options, lr, steps=2):
    """With Loom's switchable rules: targets, budgets, gates, rates, velocities and parameters
    of ``steps`` full steps agree (fastlib vs reflib)."""
    model, fs = _run_variant("fastlib", case, options, lr, steps)
    ref, rs = _run_variant("reflib", case, options, lr, steps)
    for l in range(len(rs.layers)):
        _close(fs.backward_targets[l], rs.backward_targets[l], F64_TOL, f"backward_targets[{l}]")
    _close(fs.input_target, rs.input_target, F64_TOL, "input_target")
    _same_apply(model, fs, ref, rs)


def prop_variant_reflib_vs_spec(case, options, lr):
    """With Loom's switchable rules: reflib's targets and one apply equal the spec's exact
    ones."""
    old = {k: np.array(v, dtype=np.float64) for k, v in case.model.parameters().items()}
    ref, rs = _run_variant("reflib", case, options, lr, 1)
    exact = stp.backward(case.model.get_config(), old, case.x, case.target, options,
                         dps=SPEC_DPS, input_target=True)
    for l in range(len(rs.layers)):
        _close(rs.backward_targets[l], exact["backward_targets"][l], F64_TOL,
               f"backward_targets[{l}]")
    _close(rs.input_target, exact["input_target"], F64_TOL, "input_target")
    step = stp.apply(case.model.get_config(), old, case.x, rs.backward_targets, None, lr,
                     options, dps=SPEC_DPS)
    assert rs.updated == step["updated"], f"gates differ: {rs.updated} vs {step['updated']}"
    _close(rs.layer_rates, step["rates"], F64_TOL, "rates")
    for name, value in ref.parameters().items():
        _close(value, step["params"][name], F64_TOL, f"parameter {name}")
