"""The kink policy: what a VJP may be where the op is not differentiable.

At a kink (relu, abs and leaky_relu at 0; maximum at a tie) the registry states one
*convention* (``spec``'s ``Kink``: relu'(0) = 0, ties to the first argument). Other engines
pick other members of the Clarke subdifferential (autograd's relu'(0) = 0.5, torch's even
split of a tied maximum); those are conventions, not bugs. A VJP outside the subdifferential
(a tie gradient doubled or lost) is a bug under any convention.

The long story: docs/reports-conformance.md, section ``reports/conformance/kinks.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reports.conformance.bounds import _sum_to_shape as _sum_back

__all__ = ["MODES", "KinkVerdict", "judge", "default_mode", "OWN_ENGINES"]

MODES = ("strict", "subgradient")
OWN_ENGINES = ("reflib", "fastlib", "fastlib-cuda")

# derivative interval at x == 0 of the "zero" kinks, by op (params -> (low, high))
ZERO_KINK_INTERVAL = {
    "relu": lambda p: (0.0, 1.0),
    "abs": lambda p: (-1.0, 1.0),
    "leaky_relu": lambda p: tuple(sorted((float(p.get("negative_slope", 0.01)), 1.0))),
}


def default_mode(engine_name):
    """``strict`` for verigrad's own engines, ``subgradient`` for anyone else's."""
    return "strict" if engine_name in OWN_ENGINES else "subgradient"


@dataclass
class KinkVerdict:
    """What the kink elements of one call say.

    ``accepted`` per VJP (index -> boolean mask): elements that are valid subgradients (so
    pass in subgradient mode); ``outside``: a message when some kink element is outside the
    subdifferential (fails in both modes); ``convention``: the engine's convention in words,
    when it differs from the registry's (``"relu'(0) = 0.5"``).
    """

    accepted: dict
    outside: str = ""
    convention: str = ""


def _fmt(v):
    return f"{v:.6g}"


def judge(ex, grads, allowed):
    """Judge the kink elements of call ``ex`` given the engine's VJPs.

    Parameters
    ----------
    ex : strategies.OpExample
    grads : sequence of ndarray or None
        The engine's VJPs (float64 views), one per input.
    allowed : sequence of ndarray or None
        Each VJP's absolute allowance per element (``bounds.entrywise``).

    Returns
    -------
    KinkVerdict or None
        None when the call has no element on a kink.
    """
    name = ex.name
    params = dict(ex.params)
    if name in ZERO_KINK_INTERVAL:
        return _zero_kink(name, ex, grads, allowed, params)
    if name == "maximum":
        return _tie(ex, grads, allowed)
    return None


def _zero_kink(name, ex, grads, allowed, params):
    x = np.asarray(ex.inputs[0], dtype=np.float64)
    at = x == 0
    if not np.any(at) or grads[0] is None:
        return None
    g = np.broadcast_to(np.asarray(ex.grad, dtype=np.float64), x.shape)
    v = np.asarray(grads[0], dtype=np.float64)
    lo_d, hi_d = ZERO_KINK_INTERVAL[name](params)
    low = np.minimum(lo_d * g, hi_d * g)
    high = np.maximum(lo_d * g, hi_d * g)
    tol = np.asarray(allowed[0])
    inside = (v >= low - tol) & (v <= high + tol)
    accepted = at & inside
    verdict = KinkVerdict({0: accepted})
    bad = at & ~inside
    if np.any(bad):
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        verdict.outside = (f"d/dx{list(i)} at x = 0: engine {v[i]!r} for cotangent {g[i]!r} is "
                           f"outside the Clarke subdifferential [{_fmt(lo_d)}, {_fmt(hi_d)}]·g "
                           f"of {name} at 0 (not a convention: a wrong gradient)")
    nz = at & inside & (g != 0)
    if np.any(nz):
        slopes = v[nz] / g[nz]
        registry = {"relu": 0.0, "abs": 0.0,
                    "leaky_relu": float(params.get("negative_slope", 0.01))}[name]
        found = sorted({float(f"{s:.6g}") for s in slopes})
        if any(abs(s - registry) > 1e-6 * max(1.0, abs(registry)) for s in found):
            verdict.convention = (f"{name}'(0) = " + (_fmt(found[0]) if len(found) == 1 else
                                  "{" + ", ".join(_fmt(s) for s in found[:4]) + "}"))
    return verdict


def _tie(ex, grads, allowed):
    a, b = (np.asarray(v, dtype=np.float64) for v in ex.inputs)
    shape = np.broadcast_shapes(a.shape, b.shape)
    A, B = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    tie = A == B
    if not np.any(tie) or grads[0] is None or grads[1] is None:
        return None
    g = np.broadcast_to(np.asarray(ex.grad, dtype=np.float64), shape)
    ga, gb = (np.asarray(v, dtype=np.float64) for v in grads)
    base_a = _sum_back(np.where(A > B, g, 0.0), a.shape)
    base_b = _sum_back(np.where(B > A, g, 0.0), b.shape)
    tg = np.where(tie, g, 0.0)
    lo_a, hi_a = base_a + _sum_back(np.minimum(tg, 0), a.shape), \
        base_a + _sum_back(np.maximum(tg, 0), a.shape)
    lo_b, hi_b = base_b + _sum_back(np.minimum(tg, 0), b.shape), \
        base_b + _sum_back(np.maximum(tg, 0), b.shape)
    ta, tb = np.asarray(allowed[0]), np.asarray(allowed[1])
    in_a = (ga >= lo_a - ta) & (ga <= hi_a + ta)
    in_b = (gb >= lo_b - tb) & (gb <= hi_b + tb)
    # every tie sends its whole cotangent somewhere: the totals add up to the cotangent's
    total = float(np.sum(ga) + np.sum(gb))
    want = float(np.sum(g))
    slack = float(np.sum(ta) + np.sum(tb)) + 4 * 2.0 ** -52 * float(np.sum(np.abs(g)))
    conserved = abs(total - want) <= slack
    touched_a = _sum_back(tie.astype(float), a.shape) > 0
    touched_b = _sum_back(tie.astype(float), b.shape) > 0
    verdict = KinkVerdict({0: touched_a & in_a & conserved, 1: touched_b & in_b & conserved})
    tied_g = float(np.sum(tg))
    if not conserved:
        share = (total - (want - tied_g)) / tied_g if tied_g else float("nan")
        verdict.outside = (f"maximum at a tie (a == b): d/da and d/db together carry "
                           f"{total!r} of the cotangent's {want!r} (the tied positions' "
                           f"{tied_g!r} counted {share:.3g} times): outside the Clarke "
                           f"subdifferential (θ g to a and (1 - θ) g to b, θ in [0, 1]); a "
                           f"doubled or lost tie gradient, not a convention")
    elif not (np.all(in_a | ~touched_a) and np.all(in_b | ~touched_b)):
        verdict.outside = ("maximum at a tie (a == b): a VJP entry lies outside what any θ in "
                           "[0, 1] gives (θ g to a, (1 - θ) g to b): outside the Clarke "
                           "subdifferential")
    elif tied_g:
        theta = float(np.sum(ga) - np.sum(base_a)) / tied_g
        if abs(theta - 1.0) > 1e-6:
            verdict.convention = (f"maximum ties: d/da = {_fmt(theta)} g, d/db = "
                                  f"{_fmt(1 - theta)} g")
    return verdict
