"""``spec.prove_second_order``: each op's JVP and HVP proven against SymPy's ``diff``.

The declared forward and VJP run on duals of SymPy expressions (``spec.dual``) and every entry is
compared with ``Σ_k ∂f_j/∂x_k t_k`` (JVP) or ``∂/∂x_i Σ_j g_j Σ_k ∂f_j/∂x_k t_k`` (HVP) through
``spec.prove``'s machinery: sampled, then simplified to 0, or 0 on each piece; what neither
decides stays "checked at N points". Kink points are conventions (docs/second-order.md).
"""
from __future__ import annotations

import numpy as np

from spec.backends import SYMPY
from spec.dual import DualBackend, make_duals, split
from spec.evaluate import lookup
from spec.prove import (DEFAULT_TOL, MIN_DPS, MIN_POINTS, _Failure, _prove_entry_cached,
                        _symbols, prove_examples, sample_differences)
from spec.samples import sample_inputs

ORDERS = ("jvp", "hvp")


def _setup(op, example, index, seed):
    params = op.resolve_params(example.params)
    rng = np.random.default_rng([seed, index, 2])
    fixed = sample_inputs(op, rng, example.shapes, dict(example.params))
    values, tangents = [], []
    for name, shape, concrete in zip(op.inputs, example.shapes, fixed):
        if op.domains[name] == "class_index":
            values.append(concrete)
            tangents.append(None)
        else:
            values.append(_symbols(name, shape, op.domains[name]))
            tangents.append(_symbols("t_" + name, shape, "real")
                            if op.vjp.get(name) is not None else None)
    return params, rng, values, tangents


def _jvp_truth(out, values, tangents):
    """Σ_k ∂out_j/∂x_k t_k for every output entry j."""
    sp = SYMPY.sp
    flat_out = [sp.sympify(v) for v in out.reshape(-1)]
    pairs = [(x, t) for v, tv in zip(values, tangents) if tv is not None
             for x, t in zip(v.reshape(-1), tv.reshape(-1))]
    truth = []
    for oj in flat_out:
        free = oj.free_symbols
        truth.append(sum((sp.diff(oj, x) * t for x, t in pairs if x in free), sp.Integer(0)))
    return np.array(truth, dtype=object).reshape(out.shape)


def _differences(op, order, params, values, tangents):
    """[(input or "output", index, stated - truth)] and the symbol arrays to sample."""
    sp = SYMPY.sp
    dual = DualBackend(SYMPY)
    duals = [v if t is None else make_duals(v, t) for v, t in zip(values, tangents)]
    out = np.asarray(op.run_forward(dual, duals, params), dtype=object)
    plain_out, stated_jvp = split(out, sp.Integer(0))
    truth_jvp = _jvp_truth(plain_out, values, tangents)
    extra = [t for t in tangents if t is not None]
    if order == "jvp":
        diffs = [("output", idx, sp.sympify(stated_jvp[idx]) - truth_jvp[idx])
                 for idx in np.ndindex(*out.shape)]
        return diffs, extra
    grad = _symbols("grad", out.shape, "real")
    stated = op.run_vjp(dual, duals, params, out, grad)
    pairing = sum((sp.sympify(g) * j for g, j in zip(grad.reshape(-1), truth_jvp.reshape(-1))),
                  sp.Integer(0))
    diffs = []
    for name, x, s in zip(op.inputs, values, stated):
        if s is None:
            continue
        _, hv = split(s, sp.Integer(0))
        if hv.shape != x.shape:
            raise _Failure(f"HVP for {name!r} has shape {hv.shape}, the input has {x.shape}")
        for idx in np.ndindex(*x.shape):
            truth = sp.diff(pairing, x[idx]) if x[idx] in pairing.free_symbols else 0
            diffs.append((name, idx, sp.sympify(hv[idx]) - truth))
    return diffs, extra + [grad]


def _prove_example(op, order, example, index, points, dps, tol, seed, cache):
    sp = SYMPY.sp
    params, rng, values, tangents = _setup(op, example, index, seed)
    diffs, extra = _differences(op, order, params, values, tangents)
    # NOTE: DiracDelta (the second derivative of a kink) is 0 away from the kink, which is
    # where random points fall; the value at the kink is the stated convention.
    diffs = [(n, i, d.replace(sp.DiracDelta, lambda *a: sp.Integer(0))) for n, i, d in diffs]
    worst = sample_differences(op, example, values, extra, diffs, rng, points, dps, tol,
                               order.upper(), "SymPy's derivative")
    kinds = [_prove_entry_cached(d, cache, boundaries=not op.kinks) for _, _, d in diffs]
    exact, pieces = kinds.count("exact"), kinds.count("pieces")
    return exact, pieces, len(diffs) - exact - pieces, worst


def prove_order(name, order, *, points=MIN_POINTS, dps=MIN_DPS, tol=DEFAULT_TOL, seed=0):
    """Prove op ``name``'s JVP (``order="jvp"``) or HVP (``order="hvp"``) on its examples.

    Parameters
    ----------
    name : str or OpSpec
        A registry op name, or an ``OpSpec`` (e.g. a deliberately broken copy in a test).
    order : {"jvp", "hvp"}
        Which derivative to prove.
    points, dps, tol, seed
        As for ``spec.prove``.

    Returns
    -------
    ProofResult
        Its ``op`` is ``"<name> jvp"`` or ``"<name> hvp"``; ``ok`` False (never an exception)
        when a derivative is wrong or a formula raises.
    """
    if order not in ORDERS:
        raise ValueError(f"prove_order: order must be one of {ORDERS}; got {order!r}")
    op = lookup(name)
    if points < MIN_POINTS or dps < MIN_DPS:
        raise ValueError(f"prove_order: points >= {MIN_POINTS} and dps >= {MIN_DPS} are "
                         f"required; got points={points}, dps={dps}")
    at_kinks = ["at the kinks: the derivative of the selected piece (convention)"] \
        if op.kinks else []
    return prove_examples(
        op, f"{op.name} {order}",
        lambda example, index, cache: _prove_example(op, order, example, index, points, dps,
                                                     tol, seed, cache),
        points, dps, lambda: at_kinks)


def prove_second(name, **options):
    """``[JVP proof, HVP proof]`` of op ``name`` (see :func:`prove_order`)."""
    return [prove_order(name, order, **options) for order in ORDERS]


__all__ = ["prove_order", "prove_second", "ORDERS"]
