"""The ``jvp2`` and ``hvp`` checks: an engine's forward mode and second order against spec's exact
``spec.jvp`` / ``spec.hvp``.

An engine without the optional ``jvp``/``hvp`` methods is reported "not provided", not failed.
The bound per entry is ``K · eps · κ · (|exact_i| + max_j |exact_j|)``, ``K = 64``: every rule
of a JVP or HVP is a fixed number (a few dozen) of roundings of quantities no larger than the
largest entry of the product on the O(1) draws these checks use, each relative error amplified
by ``κ``: 1, except for layer_norm, where σ comes from a variance that cancels (relative error
``eps · mean(x²)/var(x)``) and the second derivative carries ``1/σ²``: ``κ = 1 + max_row
mean(x²)/var(x)``. The derivation and what is not yet covered: docs/second-order.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

K = 64
CHECKS = ("jvp2", "hvp")


@dataclass
class SecondOrderResult:
    """One check of one engine on one draw: ``status`` passed / failed / not provided."""

    check: str
    op: str
    engine: str
    dtype: str
    status: str
    worst_ratio: float = 0.0        # largest |error| / bound over the entries (<= 1 passes)
    detail: str = ""
    failures: list = field(default_factory=list)


def condition(name, inputs, params):
    """κ of the bound (see the module docstring)."""
    if name != "layer_norm":
        return 1.0
    x = np.asarray(inputs[0], np.float64)
    var = x.var(axis=-1) + params.get("eps", 1e-5)
    return float(np.max(1 + (x * x).mean(axis=-1) / var, initial=1.0))


def _compare(got, exact, dtype, kappa):
    """(worst ratio, first failing index or None) of ``got`` against ``exact`` (mpf array)."""
    exact = np.asarray(exact, dtype=object).astype(np.float64)
    got = np.asarray(got, dtype=np.float64)
    if got.shape != exact.shape:
        return np.inf, f"shape {got.shape}, expected {exact.shape}"
    eps = float(np.finfo(dtype).eps)
    bound = K * eps * kappa * (np.abs(exact) + np.max(np.abs(exact), initial=0.0)) \
        + float(np.finfo(dtype).tiny)
    err = np.abs(got - exact)
    err = np.where(np.isfinite(err), err, np.inf)
    ratio = err / bound
    worst = float(np.max(ratio, initial=0.0))
    if worst <= 1:
        return worst, None
    i = tuple(int(k) for k in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
    return worst, f"entry {list(i)}: {got[i]!r}, exact {exact[i]!r} (bound {bound[i]:.3g})"


def draw(name, dtype, seed):
    """A draw of inputs (spec's samples), tangents and a cotangent for op ``name``."""
    import spec
    from spec.samples import sample_inputs

    op = spec.OPS[name]
    rng = np.random.default_rng(seed)
    example = op.examples[seed % len(op.examples)]
    params = dict(example.params)
    raw = sample_inputs(op, rng, example.shapes, params)
    inputs = [np.asarray(x) if op.domains[n] == "class_index" else np.asarray(x, dtype=dtype)
              for n, x in zip(op.inputs, raw)]
    tangents = [None if op.vjp.get(n) is None else rng.standard_normal(np.shape(x)).astype(dtype)
                for n, x in zip(op.inputs, inputs)]
    out_shape = op.check_shapes([np.shape(x) for x in inputs], params)
    cotangent = rng.standard_normal(out_shape).astype(dtype)
    return inputs, tangents, cotangent, params


def check_second_order(engine, name, dtype, seed=0):
    """Run ``jvp2`` and ``hvp`` for ``engine`` on one draw of op ``name``; two results."""
    import spec

    dtype = np.dtype(dtype)
    base = dict(op=name, engine=engine.name, dtype=dtype.name)
    if not getattr(engine, "second_order", False):
        return [SecondOrderResult(check=c, status="not provided",
                                  detail=f"{engine.name} has no jvp/hvp", **base) for c in CHECKS]
    inputs, tangents, cotangent, params = draw(name, dtype, seed)
    kappa = condition(name, inputs, params)
    results = []
    _, exact_j = spec.jvp(name, inputs, tangents, params, dps=30)
    try:
        _, got_j = engine.jvp(name, list(inputs), list(tangents), **params)
        worst, bad = _compare(got_j, exact_j, dtype, kappa)
    except Exception as exc:  # an engine that raises fails the check, with what it raised
        worst, bad = np.inf, f"raised {type(exc).__name__}: {exc}"
    results.append(SecondOrderResult(check="jvp2", status="failed" if bad else "passed",
                                     worst_ratio=worst, detail=bad or "", **base))
    exact_h = spec.hvp(name, inputs, cotangent, tangents, params, dps=30)
    try:
        got_h = engine.hvp(name, list(inputs), cotangent, list(tangents), **params)
        worst, bad = 0.0, None
        for iname, g, e in zip(spec.OPS[name].inputs, got_h, exact_h):
            if e is None:
                continue
            w, b = _compare(g, e, dtype, kappa)
            worst = max(worst, w)
            bad = bad or (b and f"d/d{iname} {b}")
    except Exception as exc:
        worst, bad = np.inf, f"raised {type(exc).__name__}: {exc}"
    results.append(SecondOrderResult(check="hvp", status="failed" if bad else "passed",
                                     worst_ratio=worst, detail=bad or "", **base))
    return results


def run_second_order(engine, names=None, dtypes=None, seeds=(0, 1)):
    """Every op (or ``names``) in every dtype of ``engine``: a list of SecondOrderResult."""
    import spec

    names = list(spec.OPS) if names is None else list(names)
    dtypes = engine.dtypes if dtypes is None else dtypes
    out = []
    for name in names:
        ok, reason = engine.supports(name)
        if not ok:
            continue
        for dtype in dtypes:
            for seed in seeds:
                out.extend(check_second_order(engine, name, dtype, seed))
    return out


__all__ = ["check_second_order", "run_second_order", "SecondOrderResult", "CHECKS", "K"]
