"""Second-order accuracy for ``verigrad report``: each engine's JVP and HVP in ULPs of spec's
exact values, beside the first-order figures.

For every op and dtype, a few draws (``reports.conformance.second_order.draw``: spec's samples,
standard normal tangents and cotangent) are measured entry by entry: ``|engine - exact| /
ulp(exact)`` with the dtype's spacing at the exact value (``reports.conformance.bounds.ulp``).
An engine without ``jvp``/``hvp`` gets a "not provided" row. The long story:
docs/second-order.md.
"""
from __future__ import annotations

import numpy as np

import optable

DRAWS = 2


def _ulps(got, exact, dtype):
    from reports.conformance.bounds import ulp

    exact = np.asarray(exact, dtype=object).astype(np.float64)
    got = np.asarray(got, dtype=np.float64)
    err = np.abs(got - exact)
    return np.where(np.isfinite(err), err / ulp(exact, dtype), np.inf).reshape(-1)


def _row(engine, dtype, kind, ulps=None, status="ok", reason=""):
    row = {"engine": engine, "dtype": dtype, "kind": kind, "status": status, "reason": reason}
    if ulps is not None and ulps.size:
        row.update(median_ulp=float(np.median(ulps)), max_ulp=float(np.max(ulps)),
                   entries=int(ulps.size))
    return row


def measure_op(name, engines, dtypes, draws=DRAWS):
    """Rows ``{engine, dtype, kind: "jvp"|"hvp", median_ulp, max_ulp, entries, status}``."""
    import spec
    from reports.conformance.second_order import draw

    rows = []
    for engine in engines:
        ok, reason = engine.supports(name)
        # second order runs in the formats engines compute in, not the 16-bit storage ones
        for dtype in (d for d in engine.dtypes if np.dtype(d).name in dtypes
                      and not optable.formats.is_storage(d)):
            dtype = np.dtype(dtype)
            if not ok or not getattr(engine, "second_order", False):
                why = reason if not ok else f"{engine.name} has no jvp/hvp"
                rows += [_row(engine.name, dtype.name, k, status="not provided", reason=why)
                         for k in ("jvp", "hvp")]
                continue
            jvp_ulps, hvp_ulps = [], []
            for seed in range(draws):
                inputs, tangents, g, params = draw(name, dtype, seed)
                _, exact_j = spec.jvp(name, inputs, tangents, params, dps=30)
                exact_h = spec.hvp(name, inputs, g, tangents, params, dps=30)
                _, got_j = engine.jvp(name, list(inputs), list(tangents), **params)
                got_h = engine.hvp(name, list(inputs), g, list(tangents), **params)
                jvp_ulps.append(_ulps(got_j, exact_j, dtype))
                hvp_ulps += [_ulps(h, e, dtype) for h, e in zip(got_h, exact_h) if e is not None]
            rows.append(_row(engine.name, dtype.name, "jvp", np.concatenate(jvp_ulps)))
            rows.append(_row(engine.name, dtype.name, "hvp", np.concatenate(hvp_ulps)))
    return rows


def measure(ops, engines, dtypes, draws=DRAWS):
    """``{op: rows}`` for every op (see :func:`measure_op`)."""
    return {name: measure_op(name, engines, dtypes, draws) for name in ops}


__all__ = ["measure", "measure_op", "DRAWS"]
