"""The conventions an engine may choose where the math gives no answer: ``maximum`` at a NaN.

verigrad pins the routing (docs/CONTRACTS.md, "Conventions"): the gradient goes to the argument
the forward returns. ``--kinks strict`` fails another routing; ``--kinks subgradient`` reports it.

The long story: docs/reports-conformance.md, section ``reports/conformance/conventions.py``.
"""
from __future__ import annotations


import numpy as np

__all__ = ["nan_routing_cases", "check_maximum_nan", "convention_rows"]

_NAN = float("nan")


def nan_routing_cases():
    """``(a, b, grad to a, grad to b)`` per element at cotangent 1, by the pinned routing."""
    return [  # a,    b,    to a, to b
        (_NAN, 0.5, 1.0, 0.0),
        (0.5, _NAN, 0.0, 1.0),
        (_NAN, _NAN, 1.0, 0.0),
        (_NAN, -np.inf, 1.0, 0.0),
        (np.inf, _NAN, 0.0, 1.0),
        (2.0, 1.0, 1.0, 0.0),       # finite neighbours keep the ordinary rule
        (1.0, 2.0, 0.0, 1.0),
    ]


def _routing(value):
    return "a" if value == (1.0, 0.0) else "b" if value == (0.0, 1.0) else f"{value}"


def check_maximum_nan(engine, dtype, strict=True):
    """``maximum`` on NaN arguments against the pinned routing (module doc).

    Returns
    -------
    properties.Result
    """
    from reports.conformance.properties import Result, nonfinite_call

    result = Result()
    cases = nan_routing_cases()
    a = np.array([c[0] for c in cases], dtype)
    b = np.array([c[1] for c in cases], dtype)
    g = np.ones(len(cases), dtype)
    called = nonfinite_call(
        result, lambda: (engine.forward("maximum", [a, b]), engine.vjp("maximum", [a, b], g)),
        "maximum rejects NaN arguments", "maximum with a NaN argument raised ",
        "reject NaN with a ValueError naming it, or propagate it")
    if called is None:
        return result
    out = np.asarray(called[0], np.float64)
    ga, gb = (np.asarray(v, np.float64) for v in called[1])
    for i, (x, y, want_a, want_b) in enumerate(cases):
        if (np.isnan(x) or np.isnan(y)) and not np.isnan(out[i]):
            result.fail(f"maximum({x}, {y}) = {out[i]!r}: a NaN argument must give NaN")
        got = (float(ga[i]), float(gb[i]))
        if got == (want_a, want_b):
            continue
        where = f"maximum({x}, {y}): the gradient goes to {_routing(got)}"
        if strict or not (np.isnan(x) or np.isnan(y)):
            result.fail(f"{where}; the contract sends it to {_routing((want_a, want_b))}")
        elif where not in result.conventions:
            result.conventions.append(where)
    return result


def convention_rows(engine, engine_name, dtypes, strict):
    """The ``special`` rows ``maximum NaN routing`` of ``engine`` (one per dtype)."""
    from reports.conformance.rows import Row, RowResult

    rows = []
    for dtype in dtypes:
        dt = np.dtype(dtype).name

        def run(profile, seed, dt=dt):
            out = RowResult()
            result = check_maximum_nan(engine, dt, strict)
            out.examples = len(nan_routing_cases())
            if not result.ok:
                out.status, out.detail = "FAIL", result.describe()
            elif result.conventions:
                out.detail = "convention: " + "; ".join(result.conventions)
            return out
        rows.append(Row("special", "maximum NaN routing", engine_name, dt, run))
    return rows
