"""``report.html``: one self-contained page (coverage.py's report is the model).

Figures are embedded as base64 PNG, styles and the sorting script are inline, so the file
opens from disk in any browser with no server and no network. The page holds the bar, a
sortable summary table (click a header; numbers sort as numbers, "inf" last), the overview
figure, and one collapsible drill-down per op (every row incl. the floor and the finite
differences, the op's figure, and the worst element of each engine row, ready to reproduce).
"""
from __future__ import annotations

import base64
import html
import json
import math

from reports.accuracy import as_float
from reports.render import fmt_num, fmt_share, is_failing, status_text
from reports.render.markdown import (SECOND_ORDER_READING, bar_section, fd_table,
                                      regressions_section, second_order_table)

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;
max-width:1250px;padding:0 1em;color:#1d2330;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.6em;
border-bottom:1px solid #d0d4dc;padding-bottom:.2em} .meta{color:#5a6272;font-size:.9em}
table{border-collapse:collapse;font-size:.86em;margin:.6em 0}
th,td{border:1px solid #d0d4dc;padding:.25em .55em;text-align:right;white-space:nowrap}
th{background:#eef1f6;position:sticky;top:0}
td.l,th.l{text-align:left} th.sortable{cursor:pointer;user-select:none}
th.sortable:after{content:" \\2195";color:#9aa3b2} th.asc:after{content:" \\2191";color:#1d2330}
th.desc:after{content:" \\2193";color:#1d2330}
tr:nth-child(even) td{background:#fafbfd}
.bad{color:#b3261e;font-weight:600} .good{color:#1e7b34} .ref td{color:#5a6272}
details{border:1px solid #d0d4dc;border-radius:4px;margin:.4em 0;padding:.2em .6em}
details[open]{padding-bottom:.6em} summary{cursor:pointer;font-weight:600}
summary span{font-weight:400;color:#5a6272;margin-left:.6em}
img{max-width:100%;border:1px solid #e3e6ec;margin:.4em 0}
pre{background:#f5f6f8;padding:.5em;overflow-x:auto;font-size:.8em;max-height:18em}
code{background:#f1f3f6;padding:0 .2em;border-radius:3px}
#filter{margin:.4em 0;padding:.3em;width:22em} .wide{overflow-x:auto}
"""

SCRIPT = """
function cellValue(td){const v=td.getAttribute('data-v');
  if(v===null){return td.textContent.trim().toLowerCase();}
  if(v==='inf'){return Infinity;} if(v===''){return -1;} return parseFloat(v);}
function sortTable(th){const table=th.closest('table');const body=table.tBodies[0];
  const idx=Array.prototype.indexOf.call(th.parentNode.children,th);
  const asc=!th.classList.contains('asc');
  table.querySelectorAll('th').forEach(h=>h.classList.remove('asc','desc'));
  th.classList.add(asc?'asc':'desc');
  const rows=Array.from(body.rows);
  rows.sort((a,b)=>{const x=cellValue(a.cells[idx]),y=cellValue(b.cells[idx]);
    if(x<y){return asc?-1:1;} if(x>y){return asc?1:-1;} return 0;});
  rows.forEach(r=>body.appendChild(r));}
document.querySelectorAll('th.sortable').forEach(th=>th.addEventListener('click',()=>sortTable(th)));
function openTarget(){const id=decodeURIComponent(location.hash.slice(1));
  const el=id&&document.getElementById(id); if(el&&el.tagName==='DETAILS'){el.open=true;
  el.scrollIntoView();}}
window.addEventListener('hashchange',openTarget); openTarget();
const filter=document.getElementById('filter');
if(filter){filter.addEventListener('input',()=>{const q=filter.value.toLowerCase();
  document.querySelectorAll('#summary tbody tr').forEach(r=>{
    r.style.display=r.textContent.toLowerCase().includes(q)?'':'none';});});}
"""


def _e(text):
    return html.escape(str(text))


def _num_td(value, bad_above=None):
    v = as_float(value)
    data = "" if math.isnan(v) else ("inf" if math.isinf(v) else repr(v))
    cls = ' class="bad"' if bad_above is not None and not math.isnan(v) and v > bad_above else ""
    return f'<td data-v="{data}"{cls}>{_e(fmt_num(value))}</td>'


def _share_td(value):
    v = as_float(value)
    data = "" if math.isnan(v) else repr(v)
    return f'<td data-v="{data}">{_e(fmt_share(value))}</td>'


def _img(png, alt):
    if not png:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _md_block(text):
    """The small Markdown of the shared sections (lists, pipe tables, `code`, **bold**) as HTML."""
    import re

    def inline(s):
        s = _e(s.replace("\\|", "|"))
        s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
        return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)

    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split(" | ")]
                if not all(set(c) <= set("- ") for c in cells):
                    rows.append(cells)
                i += 1
            head = "".join(f'<th class="l">{inline(c)}</th>' for c in rows[0])
            body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>"
                           for r in rows[1:])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            continue
        if line.lstrip().startswith("- "):
            items = []
            while i < len(lines) and lines[i].lstrip().startswith("- "):
                depth = len(lines[i]) - len(lines[i].lstrip())
                items.append((depth, lines[i].lstrip()[2:]))
                i += 1
            html_items = "".join(
                f'<li style="margin-left:{d}em">{inline(t)}</li>' for d, t in items)
            out.append(f"<ul>{html_items}</ul>")
            continue
        if line.strip():
            out.append(f"<p>{inline(line)}</p>")
        i += 1
    return "\n".join(out)


def summary_table(report):
    """The sortable summary: one line per op × engine × dtype, worst first."""
    few = report["bar"]["few_ulps"]
    head = ("<tr>" + "".join(
        f'<th class="sortable{" l" if i < 3 else ""}">{h}</th>'
        for i, h in enumerate(["op", "engine", "dtype", "median ULP", "p99 ULP", "max ULP",
                               f"max ULP (&kappa; &le; {report['config']['kappa_well']:g})",
                               "correctly rounded", "elements", "status"])) + "</tr>")
    body = []
    for r in report["summary"]:
        op = _e(r["op"])
        link = f'<td class="l"><a href="#op-{op}">{op}</a></td>'
        if r["status"] == "unsupported":
            body.append(f"<tr>{link}<td class=\"l\">{_e(r['engine'])}</td><td class=\"l\">"
                        f"{r['dtype']}</td>" + '<td data-v=""></td>' * 6
                        + '<td data-v="">–</td><td class="l">unsupported</td></tr>')
            continue
        status, bad = status_text(r), is_failing(r)
        body.append(
            f"<tr>{link}<td class=\"l\">{_e(r['engine'])}</td><td class=\"l\">{r['dtype']}</td>"
            + _num_td(r["median_ulp"]) + _num_td(r["p99_ulp"]) + _num_td(r["max_ulp"])
            + _num_td(r["max_ulp_well"], bad_above=few) + _share_td(r["correctly_rounded"])
            + f'<td data-v="{r["n"]}">{r["n"]}</td>'
            + f'<td class="l{" bad" if bad else ""}">{_e(status)}</td></tr>')
    return (f'<table id="summary"><thead>{head}</thead><tbody>{"".join(body)}</tbody>'
            f"</table>")


def _rows_table(result, kappa_well):
    head = "".join(f'<th class="sortable{" l" if i < 3 else ""}">{h}</th>' for i, h in enumerate(
        ["row", "dtype", "status", "elements", "median ULP", "p99 ULP", "max ULP",
         f"max ULP (&kappa; &le; {kappa_well:g})", "median rel.", "max rel.",
         "correctly rounded", "uniform med/max", "log-uniform med/max", "special med/max",
         "overflow", "undefined"]))
    body = []
    for r in result["rows"]:
        cls = "" if r["kind"] == "engine" else ' class="ref"'
        if r["status"] == "unsupported":
            body.append(f"<tr{cls}><td class=\"l\">{_e(r['engine'])}</td><td class=\"l\">"
                        f"{r['dtype']}</td><td class=\"l\">unsupported: {_e(r['reason'])}</td>"
                        + "<td></td>" * 13 + "</tr>")
            continue
        src = "".join(
            f"<td>{fmt_num(r['by_source'][s]['median_ulp'])} / "
            f"{fmt_num(r['by_source'][s]['max_ulp'])}</td>"
            for s in ("uniform", "log_uniform", "special"))
        body.append(
            f"<tr{cls}><td class=\"l\">{_e(r['engine'])}</td><td class=\"l\">{r['dtype']}</td>"
            f"<td class=\"l{' bad' if is_failing(r) else ''}\">{_e(status_text(r))}</td><td data-v=\"{r['n']}\">{r['n']}</td>"
            + _num_td(r["ulp"]["median"]) + _num_td(r["ulp"]["p99"]) + _num_td(r["ulp"]["max"])
            + _num_td(r["well_conditioned"]["max_ulp"]) + _num_td(r["rel"]["median"])
            + _num_td(r["rel"]["max"]) + _share_td(r["correctly_rounded"]) + src
            + f"<td>{r['out_of_range']}</td><td>{r['undefined']}</td></tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _worst_block(result):
    parts = []
    for r in result["rows"]:
        if r["kind"] != "engine" or not r.get("worst"):
            continue
        for key, title in (("worst", "worst element"),
                           ("worst_well", "worst well-conditioned element")):
            w = r.get(key)
            if not w or (key == "worst_well" and r.get("worst") and
                         (w["case"], w["input"], w["index"]) ==
                         (r["worst"]["case"], r["worst"]["input"], r["worst"]["index"])):
                continue                     # no such element, or the same one again
            parts.append(f"<p><b>{_e(r['engine'])} {r['dtype']}</b>, {title}: "
                         f"{_e(fmt_num(w['ulp']))} ULPs (kappa {_e(fmt_num(w['kappa']))}), "
                         f"d/d{_e(w['input'])}{_e(w['index'])} from a {_e(w['source'])} case"
                         f"</p><pre>{_e(_case_text(w))}</pre>")
    return "\n".join(parts)


def _case_text(worst):
    """The worst element's record, one field per line (arrays kept on one line)."""
    return "\n".join(f"{k}: {json.dumps(v)}" for k, v in worst.items())


def op_section(name, result, report, png):
    """The drill-down of one op: its rows, its figure, its worst elements."""
    rows = [r for r in result["rows"] if r["kind"] == "engine" and r["status"] != "unsupported"]
    worst = max((as_float(r["ulp"]["max"]) for r in rows), default=math.nan)
    median = max((as_float(r["ulp"]["median"]) for r in rows), default=math.nan)
    cond = result["conditioning"]
    cases = ", ".join(f"{n} {s}" for s, n in result["cases"].items())
    rejected = ""
    if result["rejected"]:
        rejected = (f"<p>{len(result['rejected'])} case(s) left out by the exact oracle: "
                    f"{_e(result['rejected'][0]['reason'])}</p>")
    return (
        f'<details id="op-{_e(name)}"><summary>{_e(name)}<span>worst median '
        f"{_e(fmt_num(median))} ULP, worst max {_e(fmt_num(worst))} ULP</span></summary>"
        f"<p>{_e(result['category'])}; inputs {_e(', '.join(result['inputs']))} "
        f"(differentiable: {_e(', '.join(result['differentiable']))}); cases: {_e(cases)}; "
        f"{result['elements']} VJP elements, kappa: {cond['well']} well conditioned, "
        f"{cond['ill']} ill, {cond['singular']} singular.</p>{rejected}"
        + '<div class="wide">' + _rows_table(result, report["config"]["kappa_well"]) + "</div>"
        + _img(png, f"{name}: error distribution, error vs magnitude, finite differences")
        + _worst_block(result) + "</details>")


def render(report, figures=None):
    """The whole report as one HTML page.

    Parameters
    ----------
    report : dict
        A measured report (``reports.accuracy.measure``), possibly with regressions.
    figures : dict, optional
        ``{"overview": png bytes, op name: png bytes}``; missing figures are left out.

    Returns
    -------
    str
    """
    figures = figures or {}
    cfg, v = report["config"], report["versions"]
    engines = ", ".join(e["name"] for e in report["engines"] if e["available"])
    meta = (f"Generated {_e(report['generated'])} in {report['timing']['total_seconds']:.0f} s"
            f" · {len(report['ops'])} ops · engines {_e(engines)} · dtypes "
            f"{_e(', '.join(cfg['dtypes']))} · {cfg['samples']} cases per random source "
            f"(seed {cfg['seed']}{', quick' if cfg['quick'] else ''}) · verigrad "
            f"{_e(v.get('verigrad'))}" + (f" at {_e(v['git_commit'])}" if v.get("git_commit")
                                          else ""))
    sections = [
        f"<h1>verigrad gradient-accuracy report</h1><p class=\"meta\">{meta}</p>",
        "<h2>The bar</h2>" + _md_block(bar_section(report)),
    ]
    reg = regressions_section(report)
    if reg:
        sections.append("<h2>Regressions</h2>" + _md_block(reg))
    sections.append(
        "<h2>Summary</h2><p>Every engine row, worst first; click a header to sort, an op to "
        "open its details. Errors are in ULPs of the dtype at the exact value; 0.5 is correct "
        "rounding. kappa is the componentwise condition number of the exact VJP.</p>"
        '<input id="filter" placeholder="filter rows (op, engine, dtype)">'
        + summary_table(report))
    second = second_order_table(report)
    if second:
        sections.append("<h2>Second order: VJP, JVP and HVP (median / max ULPs)</h2>"
                        + _md_block(second) + f"<p>{_e(SECOND_ORDER_READING)}</p>")
    if figures.get("overview"):
        sections.append("<h2>Overview</h2>" + _img(figures["overview"], "overview"))
    fd = fd_table(report)
    if fd:
        sections.append("<h2>Finite differences: where they fail</h2>" + _md_block(fd))
    sections.append("<h2>Ops</h2>" + "\n".join(
        op_section(name, res, report, figures.get(name)) for name, res in report["ops"].items()))
    if report.get("notes"):
        sections.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>"
                                                      for n in report["notes"]) + "</ul>")
    sections.append("<h2>Versions</h2><table><tbody>" + "".join(
        f'<tr><td class="l">{_e(k)}</td><td class="l">{_e(val)}</td></tr>'
        for k, val in v.items()) + "</tbody></table>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>verigrad gradient accuracy</title><style>{STYLE}</style></head><body>"
            + "\n".join(sections) + f"<script>{SCRIPT}</script></body></html>\n")
