"""Measured tables in README.md and docs/ rendered from the files that recorded the measurement.

A table sits between ``<!-- results: PATH table=NAME -->`` and ``<!-- /results -->``; PATH is a
results file under docs/results/ (the command, date, machine, load and versions beside the
command's own JSON) or the peers' findings file. ``--write`` re-renders every block, ``--check``
lists the blocks that disagree with their source, ``record`` runs a measuring command (its JSON
to a scratch file) and stores it. The long story: docs/results.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

from reports import provenance

__all__ = ["BLOCK", "TABLES", "render", "blocks", "check", "write", "record", "main",
           "without_outputs"]

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- results: (?P<path>\S+) table=(?P<table>[\w-]+) -->\n)(?P<body>.*?)"
                   r"(<!-- /results -->)", re.DOTALL)


def _doc_files(root=ROOT):
    return [root / "README.md"] + sorted((root / "docs").rglob("*.md"))


# ---------------------------------------------------------------------------------------------
# number formatting (one place, so a re-render is byte-identical)

def _num(x, digits=3):
    """A measured number as text: ``-`` for missing, ``inf``/``nan`` spelled out, else %g."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the tables

def _provenance(doc):
    """One line under every table: where its figures come from."""
    load = doc.get("load_before")
    load_text = ("" if load is None else f", load {load}" if isinstance(load, str)
                 else f", load average {_num(load, 2)} before")
    after = doc.get("load_after")
    load_text += f" and {_num(after, 2)} after" if after is not None else ""
    machine = doc.get("machine", {})
    took = f"; the command took {_num(doc['seconds'], 3)} s" if doc.get("seconds") else ""
    system = f" ({machine['system']})" if machine.get("system") else ""
    recorded = f"; {doc['recorded']}" if doc.get("recorded") else ""
    return (f"\n*`{doc['command']}`, {doc['date']}, {machine.get('cpus', '?')} cores"
            f"{system}{load_text}{took}{recorded}.*\n")


def accuracy_summary(doc):
    """Per op: median / max ULP error of each engine and dtype, and fastlib float64's max on
    well-conditioned elements (from ``verigrad report``'s summary rows)."""
    data = doc["data"]
    cells = {}
    for r in data["summary"]:
        if r["status"] == "unsupported":
            continue
        cells[(r["op"], r["engine"], r["dtype"])] = r
    columns = [(e, d) for d in ("float32", "float64") for e in data["engines"]
               if any(k[1:] == (e, d) for k in cells)]
    header = ["op"] + [f"{e} {d[-2:]}" for e, d in columns] + ["fastlib 64, κ ≤ 8"]
    rows = []
    for op in data["ops"]:
        row = [f"`{op}`"]
        for e, d in columns:
            r = cells.get((op, e, d))
            row.append("-" if r is None else f"{_num(r['median_ulp'])} / {_num(r['max_ulp'])}")
        well = cells.get((op, "fastlib", "float64"))
        row.append("-" if well is None else _num(well["max_ulp_well"]))
        rows.append(row)
    return _table(header, rows) + _provenance(doc)


def accuracy_bar(doc):
    """The bar fastlib is held to, as counted by ``verigrad report``: passes and misses."""
    b = doc["data"]["bar"]
    out = []

    def line(entries, text, detail):
        entries = [e for e in entries if e.get("status") != "not measured"]
        if not entries:   # a criterion of a format the run did not measure
            return
        passed = [e for e in entries if e["status"] == "pass"]
        missed = [e for e in entries if e["status"] != "pass"]
        miss = ("; misses: " + ", ".join(detail(e) for e in missed)) if missed else ""
        out.append(f"- {text}: {len(passed)} of {len(entries)}{miss}")

    line(b["float64"], f"{b['engine']} float64 within {_num(b['few_ulps'])} ULPs on "
         f"well-conditioned elements (κ ≤ {_num(b['kappa_well'])})",
         lambda e: f"`{e['op']}` ({_num(e['max_ulp_well'])})")
    line(b["float32"], f"{b['engine']} float32 median no farther from exact than {b['rival']} "
         "float32", lambda e: f"`{e['op']}` ({_num(e['median_ulp'])} vs "
                              f"{_num(e['rival_median_ulp'])})")
    if b.get("storage"):
        line(b["storage"], f"{b['engine']} bfloat16 and float16 median no farther from exact "
             f"than {b['rival']}'s (op × format)",
             lambda e: f"`{e['op']}` {e['dtype']} ({_num(e['median_ulp'])} vs "
                       f"{_num(e['rival_median_ulp'])})")
    line(b["correct_rounding"], "correctly rounded where one rounding suffices (op × dtype)",
         lambda e: f"`{e['op']}` {e['dtype']}")
    return "\n".join(out) + "\n" + _provenance(doc)


def accuracy_storage(doc):
    """Per op, in each 16-bit format measured: every engine's median / max VJP error in ULPs of
    the format, and whether the elements are within each engine's own 16-bit bound."""
    data = doc["data"]
    cells = {(r["op"], r["engine"], r["dtype"]): r for r in data["summary"]
             if r["status"] != "unsupported"}
    formats = [d for d in data["config"]["dtypes"] if d in ("bfloat16", "float16")]
    columns = [(e, d) for d in formats for e in data["engines"]
               if any(k[1:] == (e, d) for k in cells)]
    rows = []
    for op in data["ops"]:
        row = [f"`{op}`"]
        for e, d in columns:
            r = cells.get((op, e, d))
            row.append("-" if r is None else
                       f"{_num(r['median_ulp'])} / {_num(r['max_ulp'])}"
                       + ("" if r.get("beyond_bound", 0) == 0 else
                          f" ({r['beyond_bound']} beyond)"))
        rows.append(row)
    short = {"bfloat16": "bf16", "float16": "f16"}
    return (_table(["op"] + [f"{e} {short[d]}" for e, d in columns], rows)
            + _provenance(doc))


def conform_rows(doc):
    """``verigrad conform --json`` rows per engine and dtype: passing rows of each check kind,
    and the failing rows by name (the rows' own JSON)."""
    rows, failing = {}, {}
    for r in doc["data"]["rows"]:
        if r["dtype"] == "-" or r["status"] == "unsupported":
            continue
        key = (r["engine"], r["dtype"])
        counts = rows.setdefault(key, {})
        passed, total = counts.get(r["check"], (0, 0))
        counts[r["check"]] = (passed + (r["status"] == "pass"), total + 1)
        if r["status"] in ("FAIL", "error"):
            failing.setdefault(key, []).append(f"{r['check']} `{r['name']}`")
    kinds = list(dict.fromkeys(r["check"] for r in doc["data"]["rows"] if r["dtype"] != "-"))
    body = []
    for (engine, dtype), counts in rows.items():
        cells = [f"{counts[k][0]} / {counts[k][1]}" if k in counts else "-" for k in kinds]
        fails = failing.get((engine, dtype), [])
        body.append([engine, dtype, *cells, ", ".join(fails) if fails else "none"])
    return (_table(["engine", "dtype"] + [f"{k}: pass / rows" for k in kinds] + ["failing"],
                   body) + _provenance(doc))


def bench_ops(doc):
    """``verigrad bench ops`` rows: fastlib's time over NumPy's (below 1: fastlib is faster)."""
    cases = {}
    for r in doc["data"]["rows"]:
        column = 1 if r["direction"] in ("vjp", "backward") else 0
        cases.setdefault(r["case"], ["-", "-"])[column] = _num(r["ratio"], 2)
    rows = [[case] + cells for case, cells in cases.items()]
    return (_table(["case (float32)", "forward: fastlib / NumPy", "VJP or backward"], rows)
            + _provenance(doc))


def bench_train(doc):
    """``verigrad bench train --json`` rows: seconds per epoch per engine and batch size."""
    data = doc["data"]
    engines = data["engines"]
    rows = []
    for r in data["results"]:
        row = [data["model_name"], r["batch_size"], _num(r.get("load_1min"), 3)]
        row += [_num(r.get(e), 3) for e in engines]
        row += [_num(r.get(f"fastlib_over_{e}"), 2) for e in engines if e != "fastlib"]
        rows.append(row)
    header = (["model", "batch", "load"] + [f"{e} s/epoch" for e in engines]
              + [f"fastlib / {e}" for e in engines if e != "fastlib"])
    return _table(header, rows) + _provenance(doc)


def bench_precision(doc):
    """``verigrad bench train --dtypes --json``: per precision, s/epoch, test loss and accuracy
    (``-`` for a regression loss) and the bytes of parameters and activations, each against
    float32."""
    data = doc["data"]
    rows = []
    for r in data["results"]:
        accs = r.get("test_accuracies")
        rows.append([r["case"], r["path"], _num(r["s_per_epoch"], 3),
                     _num(r.get("time_over_float32"), 3),
                     _num(r.get("test_loss"), 4), _num(r.get("test_loss_over_float32"), 4),
                     "-" if r["test_accuracy"] is None else f"{100 * r['test_accuracy']:.2f}",
                     "-" if not accs else ", ".join(f"{100 * a:.2f}" for a in accs),
                     _num(None if r.get("accuracy_minus_float32") is None
                          else 100 * r["accuracy_minus_float32"], 2),
                     _num((r["parameter_bytes"] + r["activation_bytes"]) / 1024, 3),
                     _num(r.get("bytes_over_float32"), 3),
                     _num(None if r.get("traced_peak_bytes") is None
                          else r["traced_peak_bytes"] / 1024, 4)])
    header = ["case", "path", "s/epoch", "/ float32", "test loss", "/ float32", "test acc %",
              "per seed", "- float32 (points)", "param+act KiB", "/ float32",
              "traced peak KiB"]
    return f"{data['model']}.\n\n" + _table(header, rows) + _provenance(doc)


def peers_summary(doc):
    """Per engine: version, and per derivative (VJP, J t, H t) its failures / conventions /
    contract findings (``-`` where it is not held there), and all its findings
    (``tests/peers/findings.json``)."""
    from reports.peers_findings import DERIVATIVE_TEXT, column_of

    counts = {}
    for f in doc["findings"]:
        per = counts.setdefault(f["engine"], {})
        c = per.setdefault(column_of(f), {"failure": 0, "convention": 0, "contract": 0})
        c[f["kind"]] = c.get(f["kind"], 0) + 1
    rows = []
    for engine, info in doc["engines"].items():
        if not info.get("available", True):
            continue
        per = counts.get(engine, {})
        held = info.get("seconds") or {"vjp": None}      # a file from before: VJPs only
        cells = [("-" if d not in held else
                  "{failure} / {convention} / {contract}".format(
                      **per.get(d, {"failure": 0, "convention": 0, "contract": 0})))
                 for d in DERIVATIVE_TEXT]
        rows.append([engine, info["version"], *cells,
                     sum(sum(c.values()) for c in per.values())])
    return _table(["engine", "version"] + [f"{t}: failures / conventions / contract"
                                           for t in DERIVATIVE_TEXT.values()] + ["findings"],
                  rows) + _findings_provenance(doc)


def _findings_provenance(doc):
    """The line under a findings table: the command that wrote the file and, for a merge, how
    many runs it joins (their records are in the file's ``runs``)."""
    if not doc.get("command"):
        return ""
    runs = doc.get("runs") or []
    joined = (f"; it joins {len(runs)} runs, from {runs[0]['date']} to {runs[-1]['date']}, "
              "each with its command, date, machine and versions in the file's `runs`"
              if runs else f", {doc['machine'].get('cpus', '?')} cores "
                           f"({doc['machine'].get('system', '?')})")
    return f"\n*`{doc['command']}`, {doc['date']}{joined}.*\n"


def peers_findings(doc):
    """The full findings table, one row per engine, derivative, op and dtype."""
    from reports.peers_findings import markdown

    return markdown(doc)


def mutants(doc):
    """``verigrad conform --mutants --json`` verdicts: each mutant, caught or not, by which row
    first, and the control run (the unchanged engine must pass)."""
    data = doc["data"]
    rows = [[f"`{m['key']}`", m["what"], "caught" if m["caught"] else "**SURVIVED**",
             m["failed_row"] or "-"] for m in data["mutants"]]
    control = data["control"]
    verdict = "passes" if not control["caught"] else f"FAILS ({control['failed_row']})"
    caught = sum(m["caught"] for m in data["mutants"])
    return (_table(["mutant", "bug", "verdict", "first failing row"], rows)
            + f"\n{caught} of {len(rows)} caught; the control (fastlib unchanged) {verdict}.\n"
            + _provenance(doc))


def first_run(doc):
    """``tools/first_run.py``: the cold and the warm ``verigrad conform`` side by side."""
    data = doc["data"]
    targets = data.get("targets", {})
    rows = []
    for run in data["runs"]:
        target = targets.get(run["cache"])
        verdict = "-" if target is None else (
            f"{'met' if run['seconds'] <= target else 'missed'} (at most {target} s)")
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(run["statuses"].items()))
        load = f"{_num(run['load_before'], 2)} / {_num(run['load_after'], 2)}"
        rows.append([run["cache"], _num(run["seconds"], 4), verdict,
                     _num(run.get("cpu_seconds"), 4), f"{run['checks']} ({statuses})",
                     run["proofs"], run["kernels_compiled"], _num(run["compile_seconds"], 3),
                     _num(run.get("compiled_again_seconds"), 3), run["workers"], load])
    return (_table(["Numba cache", "seconds", "target", "processor s", "checks", "proofs",
                    "kernels compiled", "compiling s (wall, all processes)",
                    "of it, compiled again in another process", "workers",
                    "load before / after"], rows)
            + _provenance(doc))


def first_run_stages(doc):
    """Where the cold run's time went: compiling by kernel module, the proofs, and the checks
    by kind (seconds summed over the run's processes; a check's seconds include the compiling
    it waited for)."""
    cold = next(run for run in doc["data"]["runs"] if run["cache"] == "cold")
    warm = {run["cache"]: run for run in doc["data"]["runs"]}.get("warm", {})
    rows = [[f"compiling `{module}`", entry["kernels"], _num(entry["seconds"], 3), "-"]
            for module, entry in sorted(cold["compiles"].items(),
                                        key=lambda kv: -kv[1]["seconds"])]
    rows.append(["proving the spec (SymPy)", cold["proofs"], _num(cold["proof_seconds"], 3),
                 _num(warm.get("proof_seconds"), 3)])
    warm_rows = warm.get("row_seconds", {})
    rows += [[f"checks: `{kind}`", "-", _num(seconds, 3), _num(warm_rows.get(kind), 3)]
             for kind, seconds in sorted(cold["row_seconds"].items(), key=lambda kv: -kv[1])]
    return (_table(["stage", "kernels or proofs", "cold s (wall, all processes)", "warm s"], rows)
            + _provenance(doc))


def compare_training(doc):
    """``tools/compare_training.py``: per model, its schedules before / after, the arrays equal
    bit for bit, and the largest difference of a differing parameter in ulps of its largest
    entry (the loss history and the attention key bias, whose exact gradient is zero, apart:
    docs/architecture.md says why)."""
    models = {}
    for row in doc["data"]["rows"]:
        model, optimizer, _ = row["case"].split("/")
        m = models.setdefault(model, {"cases": 0, "equal": 0, "arrays": 0, "worst": None,
                                      "schedules": set()})
        m["cases"] += 1
        m["equal"] += row["equal_arrays"]
        m["arrays"] += row["arrays"]
        m["schedules"].add(f"{row['schedule_there']} / {row['schedule_here']}")
        for part in filter(None, (p.strip() for p in row["differing_by_ulps"].split(";"))):
            name, ulps = part.rsplit(" ", 1)
            if name == "loss_history" or name.endswith(".b_k"):
                continue
            if m["worst"] is None or float(ulps) > m["worst"][0]:
                m["worst"] = (float(ulps), f"`{name.split(':', 1)[-1]}`, {optimizer}")
    rows = [[f"`{model}`", m["cases"], ", ".join(sorted(m["schedules"])),
             f"{m['equal']} of {m['arrays']}",
             "none differs" if m["worst"] is None else f"{_num(m['worst'][0])} ({m['worst'][1]})"]
            for model, m in models.items()]
    data = doc["data"]
    return (_table(["model", "cases", "schedule before / after", "arrays equal",
                    "largest difference, ulps of the array's largest entry"], rows)
            + f"\nHere: commit `{data['here'][:7]}`; before: commit `{data['there'][:7]}`.\n"
            + _provenance(doc))


TABLES = {"accuracy-summary": accuracy_summary, "accuracy-bar": accuracy_bar,
          "accuracy-storage": accuracy_storage, "conform-rows": conform_rows,
          "mutants": mutants,
          "bench-ops": bench_ops, "bench-train": bench_train, "bench-precision": bench_precision,
          "peers-summary": peers_summary, "peers-findings": peers_findings,
          "first-run": first_run, "first-run-stages": first_run_stages,
          "compare-training": compare_training}


def render(path, table, root=ROOT):
    """The Markdown of table ``table`` rendered from the source file ``path`` (repo-relative)."""
    if table not in TABLES:
        raise ValueError(f"unknown results table {table!r}; known: {', '.join(sorted(TABLES))}")
    source = root / path
    if not source.is_file():
        raise FileNotFoundError(f"results file {path} does not exist; record it with "
                                "`python -m reports.results_tables record ...`")
    return TABLES[table](json.loads(source.read_text(encoding="utf-8")))


def blocks(text):
    """``[(path, table, body)]`` of the results blocks of a Markdown text."""
    return [(m["path"], m["table"], m["body"]) for m in BLOCK.finditer(text)]


def _rerender(text, root=ROOT):
    return BLOCK.sub(lambda m: m.group(1) + render(m["path"], m["table"], root) + m.group(5),
                     text)


def check(root=ROOT):
    """``["file: table from PATH differs"]`` for every block whose text is not its render."""
    stale = []
    for doc in _doc_files(root):
        text = doc.read_text(encoding="utf-8")
        for path, table, body in blocks(text):
            if render(path, table, root) != body:
                stale.append(f"{doc.relative_to(root)}: table {table} from {path} differs from "
                             "its source (run `python -m reports.results_tables --write`)")
    return stale


def write(root=ROOT):
    """Re-render every block in place; returns the files changed."""
    changed = []
    for doc in _doc_files(root):
        text = doc.read_text(encoding="utf-8")
        new = _rerender(text, root)
        if new != text:
            doc.write_text(new, encoding="utf-8")
            changed.append(doc.relative_to(root).as_posix())
    return changed


# ---------------------------------------------------------------------------------------------
# recording a measurement

#: the flags that only say where a command writes (scratch paths are not part of a record)
OUTPUT_FLAGS = ("--json", "--out")


def without_outputs(argv):
    """``argv`` without ``--json FILE`` / ``--out DIR`` (either spelling, ``=`` or not)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        flag = word.split("=", 1)[0]
        if flag in OUTPUT_FLAGS:
            skip = "=" not in word
            continue
        out.append(word)
    return out


def _trim(kind, data):
    """Keep what the tables and a reader need (a full report.json holds every element; a
    conform run's rows keep their figures and the first line of a failure)."""
    if kind == "conform":
        keep = ("check", "name", "engine", "dtype", "examples", "error", "bound", "unit",
                "status", "command")
        rows = [{**{k: r.get(k) for k in keep},
                 "detail": (r.get("detail") or "").strip().splitlines()[:1]} for r in data["rows"]]
        return {"profile": data["profile"], "seed": data["seed"], "engines": data["engines"],
                "rows": rows, "ok": data["ok"]}
    if kind == "report":
        return {"engines": [e["name"] for e in data["engines"] if e["available"]],
                "ops": list(data["ops"]), "config": data["config"], "versions": data["versions"],
                "summary": data["summary"], "bar": data["bar"], "timing": data["timing"]}
    return data


def record(out, argv, kind="json", ran=None, reads=None):
    """Run ``verigrad ARGV`` (or take ``ran``: a run already made) and store its JSON in ``out``.

    The command writes its JSON to a scratch file this function names (``--json``, and
    ``--out`` for a report's pages), and is recorded without it: the record says what was
    measured, not where a file went.

    Parameters
    ----------
    out : str or path
        The results file to write (under docs/results/).
    argv : list of str
        The ``verigrad`` arguments (an output flag among them is dropped).
    kind : {"json", "report", "conform"}
        ``report`` keeps the summary, bar, configuration and versions of a report.json;
        ``conform`` a ``verigrad conform --json`` file's rows without their reproductions.
    ran : dict or None
        ``{"seconds", "load_before", "load_after"}`` of a run made outside (then nothing runs
        and ``reads`` names the JSON it wrote).
    reads : str or None
        With ``ran``: the JSON file that run wrote.
    """
    import tempfile

    argv = without_outputs(argv)
    if ran is None:
        with tempfile.TemporaryDirectory(prefix="verigrad-record-") as tmp:
            result = pathlib.Path(tmp) / "result.json"
            scratch = ["--json", str(result)] + (["--out", str(pathlib.Path(tmp) / "pages")]
                                                 if argv[:1] == ["report"] else [])
            load_before = os.getloadavg()[0]
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "reports", *argv, *scratch], cwd=ROOT,
                                  capture_output=True, text=True)
            seconds = time.perf_counter() - t0
            load_after = os.getloadavg()[0]
            if proc.returncode not in (0, 1) or not result.is_file():
                raise SystemExit(f"verigrad {shlex.join(argv)} exited {proc.returncode}:\n"
                                 f"{proc.stderr[-2000:]}")
            text, printed = result.read_text(encoding="utf-8"), proc.stdout
    else:
        seconds, load_before, load_after = ran["seconds"], ran["load_before"], ran["load_after"]
        text, printed = pathlib.Path(reads).read_text(), ran.get("printed", "")
    doc = {"command": "verigrad " + shlex.join(argv), "date": provenance.now(),
           "seconds": round(seconds, 1), "load_before": round(load_before, 2),
           "load_after": round(load_after, 2), "machine": provenance.machine(),
           "versions": provenance.versions(),
           "printed": printed.splitlines()[-40:], "data": _trim(kind, json.loads(text))}
    pathlib.Path(out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n",
                                 encoding="utf-8")
    return doc


def main(argv=None):
    """Command line: ``--write``, ``--check``, or ``record OUT [--kind KIND] -- ARGS``.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m reports.results_tables",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="re-render every results block")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 listing the blocks that disagree with their source")
    sub = parser.add_subparsers(dest="action")
    rec = sub.add_parser("record", help="run a measuring command and store its JSON")
    rec.add_argument("out", help="results file to write, e.g. docs/results/accuracy-quick.json")
    rec.add_argument("--kind", choices=("json", "report", "conform"), default="json",
                     help="report: keep a report's summary, bar and configuration; conform: a "
                          "conform run's rows without their reproductions")
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.action == "record":
        if not command:
            parser.error("record needs the verigrad arguments after --, e.g. "
                         "record docs/results/x.json -- bench train --json")
        record(args.out, command, args.kind)
        return 0
    if args.write:
        for name in write():
            print(f"rewrote {name}")
        return 0
    stale = check()
    print("\n".join(stale) if stale else "every results table matches its source")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
