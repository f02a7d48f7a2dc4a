"""Renderers of a gradient-accuracy report (the dict of ``reports.accuracy.measure``).

``markdown.render(report)`` -> str, ``html.render(report, figures)`` -> str (self-contained),
``plots.op_figure`` / ``plots.overview_figure`` -> PNG bytes. The number formats below are
shared so that every output shows a figure the same way.
"""
from __future__ import annotations

import math

from reports.accuracy import as_float, verdict


def fmt_num(value):
    """An error figure for a table: 3 significant digits, ``0``, ``inf`` or ``–`` (no data)."""
    v = as_float(value)
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "inf"
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e5:
        return f"{v:.3g}"
    return f"{v:.2e}"


def fmt_share(value):
    """A share in [0, 1] as a percentage (``100%`` only when every element qualifies)."""
    v = as_float(value)
    if math.isnan(v):
        return "–"
    if v == 1.0:
        return "100%"
    return f"{min(v * 100, 99.9):.1f}%"


def columns(report):
    """The (engine, dtype) pairs of the engine rows, in first-seen order."""
    out = []
    for res in report["ops"].values():
        for r in res["rows"]:
            key = (r["engine"], r["dtype"])
            if r["kind"] == "engine" and key not in out:
                out.append(key)
    return out


def status_text(row):
    """The status column of a row: its verdict (within its bound or not), with the count of
    elements beyond the bound and the reason when there is one."""
    v = verdict(row)
    if v == "beyond bound":
        v = f"beyond bound: {row['beyond_bound']} of {row['n']} elements"
    return v + (f": {row['reason']}" if row.get("reason") else "")


def is_failing(row):
    """True when a row is not within its bound (beyond it, or its cases raised)."""
    return verdict(row) in ("beyond bound", "error")


def cell(row):
    """``median / max`` ULPs of an engine row, or its status when it has no figures."""
    if row is None:
        return "–"
    if row["status"] == "unsupported":
        return "unsupported"
    text = f"{fmt_num(row['ulp']['median'])} / {fmt_num(row['ulp']['max'])}"
    if row["status"] == "error":
        return text + " (errors)"
    if row.get("beyond_bound", 0) > 0:
        return text + f" ({row['beyond_bound']} beyond bound)"
    return text


def find_row(result, engine, dtype, kind="engine"):
    """The row of ``result`` (one op) for ``engine`` in ``dtype``, or None."""
    for r in result["rows"]:
        if r["kind"] == kind and r["engine"] == engine and r["dtype"] == dtype:
            return r
    return None
