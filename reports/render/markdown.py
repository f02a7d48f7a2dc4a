"""``report.md``: the summary table (op × engine × dtype, median / max ULP error), the bar,
the worst rows, where finite differences fail, regressions, notes and versions."""
from __future__ import annotations

import math

import numpy as np

from reports.accuracy import SINGLE_ROUNDING_OPS, as_float
from reports.render import cell, columns, find_row, fmt_num, fmt_share, status_text

WORST_ROWS = 12

READING = (
    "How to read it: every VJP element of every case is compared with the exact value "
    "(`spec.evaluate` at 50 digits, re-evaluated at more digits until stable). "
    "An error of 1 ULP is one unit in the last place of the dtype at the exact value; "
    "0.5 ULP is what correct rounding allows. kappa is the componentwise relative condition "
    "number of the exact VJP (how far it moves when every input and cotangent entry moves by "
    "a relative u): an element is well conditioned when kappa <= {kappa}, and there a "
    "backward-stable algorithm errs by a few ULPs at most. The floor is the exact value "
    "rounded to the dtype, the best any engine can return. Cases: `uniform` (the domains' "
    "samplers), `log_uniform` (magnitudes 1e{lo:g}..1e{hi:g}), `special` (the conformance "
    "suite's special-values table)."
)


def table(headers, rows):
    """A Markdown pipe table."""
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc]
    return "\n".join(lines)


def format_table(headers, rows):
    """A Markdown pipe table with aligned columns (readable in a terminal and in a .md file).

    Parameters
    ----------
    headers : sequence of str
    rows : sequence of sequence
        Cells are converted with ``str``; ``|`` inside a cell is escaped.

    Returns
    -------
    str
    """
    cells = [[str(h) for h in headers]] + [[str(c).replace("|", "\\|") for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def summary_table(report):
    """Op × (engine, dtype): ``median / max`` ULPs per cell."""
    cols = columns(report)
    headers = ["op"] + [f"{e} {d}" for e, d in cols]
    rows = []
    for name, res in report["ops"].items():
        rows.append([f"`{name}`"] + [cell(find_row(res, e, d)) for e, d in cols])
    return table(headers, rows)


SECOND_ORDER_READING = (
    "Each cell: the first-order VJP's median / max ULPs (as in the summary), then the JVP's "
    "(`J t`) and the HVP's (`∇<g, J t>`) on two draws per op and dtype, against `spec.jvp` / "
    "`spec.hvp`; a ULP is the dtype's spacing at the exact value, so a product that cancels "
    "shows ULPs that are its conditioning (the `jvp2` / `hvp` rows of `verigrad conform` hold "
    "each entry to its derived bound).")


def _second_order_cell(rows, engine, dtype, kind):
    row = next((r for r in rows if r["engine"] == engine and r["dtype"] == dtype
                and r["kind"] == kind), None)
    if row is None:
        return "–"
    if "median_ulp" not in row:
        return row.get("status", "–")
    return f"{fmt_num(row['median_ulp'])} / {fmt_num(row['max_ulp'])}"


def second_order_table(report):
    """Op × (engine, dtype): the VJP's, the JVP's and the HVP's ``median / max`` ULPs side by
    side; "" when the report did not measure second order (``--second-order``)."""
    second = report.get("second_order")
    if not second:
        return ""
    cols = columns(report)
    headers = ["op"] + [f"{e} {d}" for e, d in cols]
    rows = []
    for name, res in report["ops"].items():
        so = second.get(name, [])
        rows.append([f"`{name}`"] + [
            f"VJP {cell(find_row(res, e, d))}; JVP {_second_order_cell(so, e, d, 'jvp')}; "
            f"HVP {_second_order_cell(so, e, d, 'hvp')}" for e, d in cols])
    return table(headers, rows)


def worst_table(report, n=WORST_ROWS):
    """The ``n`` worst engine rows (the report's summary order)."""
    rows = []
    for r in [r for r in report["summary"] if r["status"] != "unsupported"][:n]:
        rows.append([f"`{r['op']}`", r["engine"], r["dtype"], fmt_num(r["median_ulp"]),
                     fmt_num(r["p99_ulp"]), fmt_num(r["max_ulp"]), fmt_num(r["max_ulp_well"]),
                     fmt_share(r["correctly_rounded"]), status_text(r)])
    return table(["op", "engine", "dtype", "median ULP", "p99 ULP", "max ULP",
                  "max ULP (well cond.)", "correctly rounded", "status"], rows)


def _pass_lines(entries, claim, what, miss):
    """``- claim: k of n <what> pass.`` and one indented line per failing entry (``miss(e)``)."""
    misses = [e for e in entries if e["status"] == "fail"]
    return ([f"- {claim}: {len(entries) - len(misses)} of {len(entries)} {what} pass."]
            + [f"  - {miss(e)}" for e in misses])


def _others(e):
    others = ", ".join(f"{k} {fmt_num(v)}" for k, v in e["others_max_ulp_well"].items())
    return f" (same elements: {others})" if others else ""


def bar_section(report):
    """The bar, op by op: what passes, what misses and by how much."""
    b = report["bar"]
    lines = []
    f64 = b["float64"]
    if f64:
        lines += _pass_lines(
            f64, f"**{b['engine']} float64 within {b['few_ulps']:g} ULPs on well-conditioned "
                 f"elements (kappa <= {b['kappa_well']:g})**", "ops",
            lambda e: f"`{e['op']}`: max {fmt_num(e['max_ulp_well'])} ULPs{_others(e)}")
    f32 = [e for e in b["float32"] if e["status"] != "not measured"]
    if f32:
        lines += _pass_lines(
            f32, f"**{b['engine']} float32 median no farther from exact than {b['rival']} "
                 "float32** (same inputs)", "ops",
            lambda e: f"`{e['op']}`: median {fmt_num(e['median_ulp'])} ULPs vs "
                      f"{fmt_num(e['rival_median_ulp'])}")
    elif b["float32"]:
        lines.append(f"- {b['engine']} float32 against {b['rival']} float32: not measured "
                     f"({b['rival']} was not run).")
    lowp = [e for e in b.get("storage", ()) if e["status"] != "not measured"]
    if lowp:
        lines += _pass_lines(
            lowp, f"**{b['engine']} bfloat16 and float16 median no farther from exact than "
                  f"{b['rival']}'s** (same inputs, ULPs of the format)", "op × format",
            lambda e: f"`{e['op']}` {e['dtype']}: median {fmt_num(e['median_ulp'])} ULPs vs "
                      f"{fmt_num(e['rival_median_ulp'])}")
    cr = b["correct_rounding"]
    if cr:
        lines += _pass_lines(
            cr, "**correctly rounded on every element** where one rounding suffices "
                f"({', '.join(f'`{o}`' for o in SINGLE_ROUNDING_OPS)})", "op × dtype",
            lambda e: f"`{e['op']}` {e['dtype']}: {fmt_share(e['correctly_rounded'])}")
    return "\n".join(lines) if lines else f"{b['engine']} was not measured."


def fd_table(report):
    """Per dtype, op × step: the median relative error of central differences (best in bold).

    The kind of table gradient-check discussions show: too large a step and truncation
    dominates, too small and the forward's rounding, divided by 2h, does.
    """
    steps = sorted({r["step"] for res in report["ops"].values() for r in res["rows"]
                    if r["kind"] == "finite_difference"}, reverse=True)
    if not steps:
        return ""
    parts = []
    for dtype in report["config"]["dtypes"]:
        rows, best_steps = [], []
        for name, res in report["ops"].items():
            by_step = {r["step"]: as_float(r["rel"]["median"]) for r in res["rows"]
                       if r["kind"] == "finite_difference" and r["dtype"] == dtype
                       and r.get("n")}
            if not by_step:
                continue
            engine = [as_float(r["rel"]["median"]) for r in res["rows"]
                      if r["kind"] == "engine" and r["dtype"] == dtype and r.get("n")]
            finite = [v for v in by_step.values() if not math.isnan(v)]
            best = min(finite) if finite else math.nan
            cells = []
            for h in steps:
                v = by_step.get(h, math.nan)
                text = fmt_num(v)
                cells.append(f"**{text}**" if v == best and best > 0 else text)
            if best > 0:
                best_steps.append(min(h for h in by_step if by_step[h] == best))
            rows.append([f"`{name}`"] + cells
                        + [fmt_num(np.median(engine)) if engine else "–"])
        if not rows:
            continue
        parts.append(f"**{dtype}**, median relative error of the VJP (bold: the best step; "
                     f"0 where differences are exact, as for linear ops):")
        parts.append(table(["op"] + [f"h={h:g}" for h in steps] + ["engines (median)"], rows))
        if best_steps:
            common = max(set(best_steps), key=best_steps.count)
            parts.append(f"In {dtype} the best step is most often h = {common:g} "
                         f"({best_steps.count(common)} of {len(best_steps)} inexact ops).")
    return "\n\n".join(parts)


def regressions_section(report):
    reg = report.get("regressions")
    if not reg:
        return ""
    head = (f"Against `{reg['baseline']}` (generated {reg['baseline_generated']}): "
            f"{reg['compared']} rows compared, {len(reg['flagged'])} grew by more than "
            f"{reg['factor']:g}×.")
    if reg["config_differs"]:
        head += (" The configuration differs in " + ", ".join(reg["config_differs"])
                 + ": the two reports measure different samples.")
    if not reg["flagged"]:
        return head
    rows = [[f"`{f['op']}`", f["engine"], f["dtype"], f["metric"], fmt_num(f["baseline"]),
             fmt_num(f["current"]), fmt_num(f["ratio"])] for f in reg["flagged"]]
    return head + "\n\n" + table(["op", "engine", "dtype", "metric", "baseline", "now",
                                  "ratio"], rows)


def render(report):
    """The whole report as Markdown text."""
    cfg = report["config"]
    v = report["versions"]
    engines = ", ".join(e["name"] for e in report["engines"] if e["available"])
    parts = [
        "# verigrad gradient-accuracy report",
        f"Generated {report['generated']} in {report['timing']['total_seconds']:.0f} s: "
        f"{len(report['ops'])} ops; engines {engines}; dtypes {', '.join(cfg['dtypes'])}; "
        f"{cfg['samples']} cases per random source and op (seed {cfg['seed']}"
        f"{', quick' if cfg['quick'] else ''}); verigrad {v.get('verigrad')}"
        + (f" at {v['git_commit']}" if v.get("git_commit") else "") + ".",
        "## Summary: median / max error in ULPs",
        summary_table(report),
        READING.format(kappa=cfg["kappa_well"], lo=cfg["log_magnitudes"][0],
                       hi=cfg["log_magnitudes"][1]),
    ]
    second = second_order_table(report)
    if second:
        parts += ["## Second order: VJP, JVP and HVP, median / max error in ULPs",
                  second, SECOND_ORDER_READING]
    parts += [
        "## The bar",
        bar_section(report),
        "## Worst rows",
        worst_table(report),
    ]
    fd = fd_table(report)
    if fd:
        parts += ["## Finite differences: where they fail",
                  "Central differences of the correctly rounded forward, step "
                  "h·max(1, |z|) (inputs z ± h rounded to the dtype), divided by the nominal "
                  "2h, on the first cases of each source.", fd]
    reg = regressions_section(report)
    if reg:
        parts += ["## Regressions", reg]
    if report.get("notes"):
        parts += ["## Notes", "\n".join(f"- {n}" for n in report["notes"])]
    parts += ["## Versions", "\n".join(f"- {k}: {val}" for k, val in v.items())]
    return "\n\n".join(parts) + "\n"
