"""`verigrad bench train --threads 1,2,4,8,16`: each engine's epoch time per thread count.

Each thread count runs in its own process (``verigrad bench train --threads N --json FILE``):
thread pools are sized when a library starts (XLA's at import, Numba's at its first parallel
call up to ``NUMBA_NUM_THREADS``), so one process cannot honestly measure several counts. The
child gets ``NUMBA_NUM_THREADS`` of at least N, so counts above the cores really run that many
threads; such rows are flagged, since the threads then share cores. Each engine's speedup is
its own time at the smallest count (1 when measured) over its time at N.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from reports.bench import environment


def child_command(args, sizes, engines, threads, out):
    """The ``verigrad bench train`` command line that measures one thread count into ``out``."""
    argv = [sys.executable, "-m", "reports", "bench", "train", "--model", args.model,
            "--batch-sizes", ",".join(map(str, sizes)), "--samples", str(args.samples),
            "--max-steps", str(args.max_steps), "--repeats", str(args.repeats),
            "--engines", ",".join(engines), "--threads", str(threads), "--json", out]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    return argv


def child_environment(threads, cores):
    """The child's environment: Numba's pool large enough for ``threads``."""
    env = dict(os.environ)
    env["NUMBA_NUM_THREADS"] = str(max(threads, cores))
    return env


def measure(args, sizes, engines, counts, cores):
    """``{N: report or {"error": text}}``, one child process per thread count, in order."""
    runs = {}
    for n in counts:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "bench.json")
            print(f"verigrad bench train: {n} threads ...", file=sys.stderr, flush=True)
            proc = subprocess.run(child_command(args, sizes, engines, n, out),
                                  env=child_environment(n, cores), capture_output=True,
                                  text=True)
            if proc.returncode == 0 and os.path.exists(out):
                with open(out) as fh:
                    runs[n] = json.load(fh)
            else:
                runs[n] = {"error": f"exit {proc.returncode}: "
                                    f"{(proc.stderr or proc.stdout).strip()[-1500:]}"}
    return runs


def scaling_rows(runs, sizes, engines, cores):
    """One row per (batch size, thread count): each engine's s/epoch and its speedup over the
    smallest thread count measured, fastlib's ratio to each peer, the oversubscription flag."""
    counts = sorted(runs)
    rows = []
    for bs in sizes:
        base = {}
        for n in counts:
            result = _result(runs[n], bs)
            row = {"batch_size": bs, "threads": n, "oversubscribed": n > cores,
                   "load_1min": result.get("load_1min") if result else None}
            for e in engines:
                seconds = result.get(e) if result else None
                row[e] = seconds
                row[f"{e}_loss"] = result.get(f"{e}_loss") if result else None
                if seconds is not None:
                    base.setdefault(e, seconds)
                    row[f"{e}_speedup"] = base[e] / seconds
            if "fastlib" in engines and row.get("fastlib") is not None:
                for e in engines:
                    if e != "fastlib" and row.get(e):
                        row[f"fastlib_over_{e}"] = row["fastlib"] / row[e]
            rows.append(row)
    return rows


def _result(report, bs):
    return next((r for r in report.get("results", ()) if r["batch_size"] == bs), None)


def run(args, model, sizes, engines, counts):
    """Measure every thread count, print the scaling table (or JSON); exit 0, or 1 when a
    thread count failed (its error is printed, the others still reported)."""
    cores = environment.usable_cores()
    env = environment.environment()
    runs = measure(args, sizes, engines, counts, cores)
    measured = [e for e in engines
                if any(e in r.get("engines", ()) for r in runs.values())]
    rows = scaling_rows(runs, sizes, measured, cores)
    skipped = {}
    for report in runs.values():
        skipped.update(report.get("skipped", {}))
    report = {"model": model.DESCRIPTION, "model_name": args.model, "threads": counts,
              "usable_cores": cores, "environment": env, "engines": measured,
              "skipped": skipped, "scaling": rows,
              "errors": {str(n): r["error"] for n, r in runs.items() if "error" in r},
              "runs": {str(n): r for n, r in runs.items()}}
    if args.json is True:
        for line in env["warnings"]:
            print(line, file=sys.stderr)
        print(json.dumps(report, indent=2))
    else:
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(report, fh, indent=2)
        print(render(report, args))
    return 1 if report["errors"] else 0


def render(report, args):
    """The scaling table as text."""
    engines, cores = report["engines"], report["usable_cores"]
    counts = report["threads"]
    lines = [f"verigrad bench train --model {report['model_name']} --threads "
             f"{','.join(map(str, counts))}: {report['model']}; {args.samples} samples per "
             f"epoch; median of {args.repeats} interleaved runs per thread count, each count "
             "in its own process"]
    lines += environment.header_lines(report["environment"], threads=False)
    base = min(counts)
    lines.append(f"speedup = the engine's own s/epoch at {base} thread{'s' * (base > 1)} / at N")
    peers = [e for e in engines if e != "fastlib"] if "fastlib" in engines else []
    head = f"{'batch':>6} {'threads':>8}"
    head += "".join(f"  {e + ' s/epoch':>16} {'speedup':>7}" for e in engines)
    head += "".join(f"  {'fastlib/' + e:>15}" for e in peers) + "  load"
    lines.append(head)
    for row in report["scaling"]:
        flag = "*" if row["oversubscribed"] else " "
        line = f"{row['batch_size']:>6} {str(row['threads']) + flag:>8}"
        for e in engines:
            s = row.get(e)
            line += (f"  {s:>16.3f} {row[e + '_speedup']:>6.2f}x" if s is not None
                     else f"  {'-':>16} {'-':>7}")
        for e in peers:
            ratio = row.get(f"fastlib_over_{e}")
            line += f"  {ratio:>15.2f}" if ratio is not None else f"  {'-':>15}"
        load = row.get("load_1min")
        lines.append(line + f"  {load if load is not None else '?':>4}")
    if any(r["oversubscribed"] for r in report["scaling"]):
        lines.append(f"* more threads than the {cores} cores this process may use: the "
                     "threads share cores, so these rows measure oversubscription, not scaling")
    lines.append("mean batch loss of the timed epoch, per thread count:")
    for row in report["scaling"]:
        losses = ", ".join(f"{e} {row[e + '_loss']:.4f}" for e in engines
                           if row.get(f"{e}_loss") is not None)
        lines.append(f"  batch {row['batch_size']}, {row['threads']} threads: {losses}")
    for engine, why in report["skipped"].items():
        lines.append(f"{engine}: {why}")
    for n, error in report["errors"].items():
        lines.append(f"FAILED at {n} threads: {error}")
    return "\n".join(lines)
