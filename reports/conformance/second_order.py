"""The ``jvp2`` and ``hvp`` checks: an engine's ``J t`` and ``∇_x <g, J(x) t>`` against spec's
exact ``spec.jvp`` / ``spec.hvp``, entry by entry.

A case is an op call (``strategies.OpExample``, its ``grad`` the cotangent) and tangents drawn
from its seed (:func:`tangents_for`); each entry is held to ``K · u · E_i`` plus the underflow
floor, ``E_i`` the running-error bound of the rule at the draw (``second_order_bounds``). At a
kink the JVP follows the first-order rows' ``--kinks`` policy; the HVP there is 0 in both modes.
An engine without ``jvp``/``hvp`` is "not provided", never failed. The long story:
docs/second-order.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from reports.conformance.second_order_bounds import K

__all__ = ["check_second_order", "run_second_order", "SecondOrderResult", "CHECKS", "K",
           "check_jvp2", "check_hvp", "tangents_for", "exact_second_order", "draw",
           "not_provided"]

CHECKS = ("jvp2", "hvp")
EXACT_DPS = 30


def not_provided(engine):
    """Why ``engine`` has no second-order rows ("" when it has ``jvp`` and ``hvp``)."""
    if getattr(engine, "second_order", False):
        return ""
    return "not provided: no jvp/hvp"


def tangents_for(ex):
    """The tangents of case ``ex``: standard normal, one per differentiable input, in its dtype,
    drawn from the case's seed and shapes (so a reproduction rebuilds them)."""
    import spec

    op = spec.OPS[ex.name]
    rng = np.random.default_rng([int(ex.seed) % 2**32, 2])
    return [None if op.vjp.get(n) is None
            else rng.standard_normal(np.shape(x)).astype(ex.dtype)
            for n, x in zip(op.inputs, ex.inputs)]


def exact_second_order(ex, tangents):
    """``{"jvp": (hi, lo), "hvp": [(hi, lo) or None], "jvp_E": E, "hvp_E": [E or None]}``:
    spec's exact JVP and HVP as double-double pairs and their running-error bounds (cached)."""
    import spec

    from reports.conformance import oracle
    from reports.conformance.second_order_bounds import running_error

    def compute():
        inputs = [oracle.as_float64(x) for x in ex.inputs]
        tans = [None if t is None else np.asarray(t, np.float64) for t in tangents]
        g = np.asarray(ex.grad, np.float64)
        if _by_value(ex.name, inputs):
            return _unary_by_value(ex.name, inputs[0], g, tans[0], ex.params)
        # 30 digits: the double-double pair keeps 32, a float64 error needs 17
        _, jv = spec.jvp(ex.name, inputs, tans, ex.params or None, dps=EXACT_DPS)
        hv = spec.hvp(ex.name, inputs, g, tans, ex.params or None, dps=EXACT_DPS)
        jvp_e, hvp_e = running_error(ex.name, inputs, g, tans, ex.params)
        return {"jvp": oracle._split(jv), "jvp_E": jvp_e, "hvp_E": hvp_e,
                "hvp": [None if h is None else oracle._split(h) for h in hv]}

    arrays = list(ex.inputs) + [ex.grad] + [t for t in tangents if t is not None]
    return oracle.cached("second-order", ex.name, arrays, ex.params, compute)


#: a unary call of more entries than this is evaluated once per distinct input value
#: (:func:`_unary_by_value`); a shorter one entry by entry, as spec states it
BY_VALUE_FROM = 64


def _by_value(name, inputs):
    """Whether the call's exact second order is taken per distinct value (a long unary call
    whose entries are finite)."""
    import spec

    x = inputs[0]
    return (spec.OPS[name].category == "unary" and x.size > BY_VALUE_FROM
            and bool(np.all(np.isfinite(x))))


def _unary_by_value(name, x, g, t, params):
    """The exact JVP and HVP of a unary op, and their running-error bounds, from one
    evaluation per distinct entry of ``x``.

    A unary op acts entry by entry, so ``J t = f'(x) t`` and ``∇<g, J t> = f''(x) t g``: spec's
    dual numbers at a unit tangent and cotangent give ``f'`` and ``f''`` (kinks included, as
    ``spec.jvp`` sets them), scaled by each entry's ``t`` and ``g`` in mpmath. The running-error
    bound is the same rule on duals whose tangent parts are linear in ``t`` and ``g`` (no
    product of two tangent parts survives), so it scales by ``|t|`` and ``|t g|`` exactly.
    The long calls repeat a few dozen values (the tables' tails): the cost follows the values,
    not the entries.
    """
    import mpmath

    import spec

    from reports.conformance import oracle
    from reports.conformance.second_order_bounds import running_error

    values, where = np.unique(x.reshape(-1), return_inverse=True)
    ones = np.ones_like(values)
    _, d1 = spec.jvp(name, [values], [ones], params or None, dps=EXACT_DPS)
    (d2,) = spec.hvp(name, [values], ones, [ones], params or None, dps=EXACT_DPS)
    e1, (e2,) = running_error(name, [values], ones, [ones], params)
    tf, gf = t.reshape(-1), g.reshape(-1)
    jv = np.empty(x.size, dtype=object)
    hv = np.empty(x.size, dtype=object)
    with mpmath.workdps(EXACT_DPS):
        for i, k in enumerate(where):
            jv[i] = d1[k] * mpmath.mpf(float(tf[i]))
            hv[i] = d2[k] * mpmath.mpf(float(tf[i])) * mpmath.mpf(float(gf[i]))
    shape = x.shape
    return {"jvp": oracle._split(jv.reshape(shape)),
            "jvp_E": (e1[where] * np.abs(tf)).reshape(shape),
            "hvp_E": [(e2[where] * np.abs(tf * gf)).reshape(shape)],
            "hvp": [oracle._split(hv.reshape(shape))]}


def _admissible(E):
    """``K · u · E`` in units of eps (``u = eps / 2``), the form ``bounds.entrywise`` takes."""
    with np.errstate(over="ignore"):   # a bound beyond float64 admits the overflow it allows
        return K * np.asarray(E, np.float64) / 2


def _where(ex, tangents, shape, index):
    from reports.conformance.properties import _value_at

    import spec

    names = list(spec.OPS[ex.name].inputs)
    parts = [f"{n} = {_value_at(x, shape, index)!r}" for n, x in zip(names, ex.inputs)]
    parts += [f"t_{n} = {_value_at(t, shape, index)!r}" for n, t in zip(names, tangents)
              if t is not None]
    return ", ".join(parts)


def _kink_interval(ex, tangents):
    """``(mask, low, high)``: the JVP entries on a kink and the subdifferential's range of
    ``J t`` there (None when the call has no entry on a kink)."""
    from reports.conformance.kinks import ZERO_KINK_INTERVAL

    name = ex.name
    if name in ZERO_KINK_INTERVAL:
        x = np.asarray(ex.inputs[0], np.float64)
        at = x == 0
        if not np.any(at):
            return None
        lo_d, hi_d = ZERO_KINK_INTERVAL[name](dict(ex.params))
        t = np.asarray(tangents[0], np.float64)
        return at, np.minimum(lo_d * t, hi_d * t), np.maximum(lo_d * t, hi_d * t)
    if name == "maximum":
        a, b = (np.asarray(v, np.float64) for v in ex.inputs)
        shape = np.broadcast_shapes(a.shape, b.shape)
        at = np.broadcast_to(a, shape) == np.broadcast_to(b, shape)
        if not np.any(at):
            return None
        ta, tb = (np.broadcast_to(np.asarray(t, np.float64), shape) for t in tangents)
        return at, np.minimum(ta, tb), np.maximum(ta, tb)
    return None


def _judge_kinks(m, got, exact, admissible, dtype, interval, kinks, ex, result):
    """Re-judge a failing JVP whose failing entries are all on kinks (the kink policy)."""
    from reports.conformance import bounds, oracle
    from reports.conformance.properties import _registry_convention

    at, low, high = interval
    g = np.asarray(got, np.float64)
    _, allowed, ok = bounds.entrywise(g, exact[0], exact[1], admissible, dtype)
    if not np.all(ok | at):
        return m                        # an entry off the kinks fails anyway
    inside = at & (g >= low - allowed) & (g <= high + allowed)
    if not np.all(ok | inside):
        i = tuple(int(k) for k in np.argwhere(~(ok | inside))[0])
        return replace(m, note=(f"J t{list(i)} on a kink: engine {g[i]!r} is outside the "
                                f"Clarke subdifferential applied to t ([{low[i]!r}, "
                                f"{high[i]!r}]): not a convention, a wrong derivative"))
    if kinks == "subgradient":
        result.conventions.append(f"{ex.name} J t at a kink: another member of the "
                                  f"subdifferential than the registry's")
        return oracle.measure(m.what, got, exact, np.where(at, np.inf, admissible), dtype)
    return replace(m, note=(f"{m.what}: a valid subgradient at a kink (inside the Clarke "
                            f"subdifferential) but not the registry's convention "
                            f"({_registry_convention(ex.name)}); --kinks subgradient accepts "
                            f"it as the engine's convention"))


def check_jvp2(engine, ex, kinks="strict"):
    """The engine's ``J t`` on case ``ex`` against spec's, entry by entry.

    Parameters
    ----------
    engine : engine with ``jvp`` (``engines.get_engine``)
    ex : strategies.OpExample
        The call; its tangents are :func:`tangents_for` (``ex``).
    kinks : {"strict", "subgradient"}

    Returns
    -------
    properties.Result
    """
    from reports.conformance import oracle
    from reports.conformance.properties import Result, _call

    result = Result()
    dtype = np.dtype(ex.dtype)
    tangents = tangents_for(ex)
    exact = exact_second_order(ex, tangents)
    got = _call(result, "jvp", lambda: engine.jvp(ex.name, list(ex.inputs), list(tangents),
                                                  **ex.params))
    if got is None:
        return result
    if not isinstance(got, tuple) or len(got) != 2:
        return result.fail("jvp must return (output, J t)")
    admissible = _admissible(exact["jvp_E"])
    m = oracle.measure("J t", np.asarray(got[1]), exact["jvp"], admissible, dtype)
    interval = _kink_interval(ex, tangents)
    if not m.ok and not m.note and interval is not None and m.index is not None:
        m = _judge_kinks(m, np.asarray(got[1]), exact["jvp"], admissible, dtype, interval,
                         kinks, ex, result)
    if m.index is not None and not m.note:
        m = replace(m, where=_where(ex, tangents, np.shape(exact["jvp"][0]), m.index))
    result.measures.append(m)
    return result


def check_hvp(engine, ex, kinks="strict"):
    """The engine's ``∇_x <g, J(x) t>`` per input on case ``ex`` against spec's, entrywise.

    ``kinks`` is accepted for symmetry with :func:`check_jvp2`: the second derivative at
    every kink of the registry is 0 in both modes (module docstring).
    """
    from reports.conformance import oracle
    from reports.conformance.properties import Result, _call, measurable, one_per_input

    result = Result()
    dtype = np.dtype(ex.dtype)
    tangents = tangents_for(ex)
    exact = exact_second_order(ex, tangents)
    got = _call(result, "hvp", lambda: engine.hvp(ex.name, list(ex.inputs), ex.grad,
                                                  list(tangents), **ex.params))
    if got is None:
        return result
    got, names = tuple(got), one_per_input(result, "hvp", got, ex.name)
    if names is None:
        return result
    for iname, h, e, E in zip(names, got, exact["hvp"], exact["hvp_E"]):
        if not measurable(result, "hvp", iname, h, e):
            continue
        m = oracle.measure(f"H t (d/d{iname})", np.asarray(h), e, _admissible(E), dtype)
        if m.index is not None and not m.note:
            m = replace(m, where=_where(ex, tangents, np.shape(e[0]), m.index))
        result.measures.append(m)
    return result


# ---------------------------------------------------------------------------------------------
# a single draw, for tests and the accuracy report


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


def example(name, dtype, seed):
    """The ``seed``-th plain draw of op ``name``: spec's samples at one of its examples."""
    import spec

    from reports.conformance.strategies import make_example

    op = spec.OPS[name]
    case = op.examples[seed % len(op.examples)]
    return make_example(name, case.shapes, dict(case.params), seed, np.dtype(dtype))


def draw(name, dtype, seed):
    """``(inputs, tangents, cotangent, params)`` of :func:`example` (``name``, ``dtype``,
    ``seed``), the tangents those of :func:`tangents_for`."""
    ex = example(name, dtype, seed)
    return list(ex.inputs), tangents_for(ex), ex.grad, dict(ex.params)


def _ratio(result):
    w = result.worst
    if w is None or w.error == 0:
        return 0.0
    return np.inf if w.bound == 0 else w.error / w.bound


def check_second_order(engine, name, dtype, seed=0):
    """Run ``jvp2`` and ``hvp`` for ``engine`` on one draw of op ``name``; two results."""
    dtype = np.dtype(dtype)
    base = dict(op=name, engine=engine.name, dtype=dtype.name)
    reason = not_provided(engine)
    if reason:
        return [SecondOrderResult(check=c, status="not provided", detail=reason, **base)
                for c in CHECKS]
    ex = example(name, dtype, seed)
    out = []
    for check, fn in zip(CHECKS, (check_jvp2, check_hvp)):
        r = fn(engine, ex)
        out.append(SecondOrderResult(check=check, status="passed" if r.ok else "failed",
                                     worst_ratio=_ratio(r), detail=r.describe(), **base))
    return out


def run_second_order(engine, names=None, dtypes=None, seeds=(0, 1)):
    """Every op (or ``names``) in every dtype of ``engine`` (by default its float32 and float64:
    the 16-bit storage formats have first-order rows only, as in the runner): a list of
    SecondOrderResult."""
    import optable
    import spec

    names = list(spec.OPS) if names is None else list(names)
    if dtypes is None:
        dtypes = [d for d in engine.dtypes if not optable.formats.is_storage(d)]
    out = []
    for name in names:
        ok, reason = engine.supports(name)
        if not ok:
            continue
        for dtype in dtypes:
            for seed in seeds:
                out.extend(check_second_order(engine, name, dtype, seed))
    return out
