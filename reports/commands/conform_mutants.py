"""`verigrad conform --mutants`: run the mutants and print the table of verdicts.

The command half of ``reports.conformance.mutants`` (which holds the mutants and runs them):
argument handling, progress, the optional Dask cluster, the table and the JSON file.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from reports.commands.arguments import progress_enabled
from reports.conformance import mutants
from reports.commands.tables import terminal_table


def _table(results):
    rows = [(r.key, r.what, "caught" if r.caught else "SURVIVED", r.failed_row or "-",
             r.examples, f"{r.seconds:.1f}") for r in results]
    return terminal_table(("mutant", "bug", "verdict", "first failing check", "examples",
                         "seconds"), rows)


def validate(args):
    """``--ops`` names known mutants and ``--json`` is writable (None), or the usage error."""
    from reports.commands import checks

    if args.json:
        problem = checks.writable_file(args.json, "--json")
        if problem:
            return problem
    known = [m.key for m in mutants.all_mutants()]
    problem = checks.unknown_names(args.ops or (), known, "--ops", "mutant")
    return f"--mutants {problem}" if problem else None


def run(args):
    """``verigrad conform --mutants``: the table of verdicts; exit 1 if any mutant survived."""
    chosen = mutants.all_mutants()
    if args.ops:
        known = {m.key: m for m in chosen}
        chosen = tuple(known[k] for k in args.ops)
    start = time.perf_counter()
    bar = None
    if progress_enabled(args):
        from tqdm import tqdm

        bar = tqdm(total=len(chosen) + 1, unit="mutant", file=sys.stderr, leave=False)

    def progress(key):
        if bar is not None:
            bar.set_description_str(key)
            bar.update(0 if key == "control" else 1)

    try:
        run = mutants.run_all
        if getattr(args, "cluster", None):  # each mutant a task on a Dask cluster
            from reports.distributed import cluster

            run = cluster.run_mutants(args.cluster)
        ctrl, results = run(chosen, args.profile, args.seed, progress)
    except mutants.MutantError as exc:
        print(f"verigrad conform --mutants: {exc}", file=sys.stderr)
        return 2
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - start
    print(_table(results))
    caught = sum(r.caught for r in results)
    verdict = "passes" if not ctrl.caught else f"FAILS: {ctrl.failed_row} {ctrl.detail}"
    print(f"\ncontrol (fastlib unchanged): {verdict} in {ctrl.seconds:.1f} s")
    print(f"{caught} of {len(results)} mutants caught by the {args.profile} profile "
          f"(median {sorted(r.seconds for r in results)[len(results) // 2]:.1f} s per mutant); "
          f"{elapsed:.0f} s in all")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": args.profile, "seed": args.seed, "seconds": round(elapsed, 1),
                       "control": asdict(ctrl), "mutants": [asdict(r) for r in results]}, f,
                      indent=1)
    return 0 if caught == len(results) and not ctrl.caught else 1
