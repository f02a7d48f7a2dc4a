"""`verigrad conform`: hold every engine against the reference and the symbolic spec.

First the spec's proofs (every op's VJPs and every optimizer's equations, as before); then the
conformance suite of ``reports.conformance`` over the chosen engines: a tqdm progress bar, a
table (check, name, engine, dtype, examples, max error in eps, bound in eps, status), each
failure with its shrunk counterexample as a ready-to-paste reproduction, and exit 1 on any
failure. ``--json FILE`` writes the same rows for machines. ``--mutants`` measures the suite's
power instead: plausible bugs applied one at a time to a copy of fastlib.

``ProgressLine``, ``proof_rows`` and ``run_spec_proofs`` are reused by
``verigrad spec``.
"""
from __future__ import annotations

import json
import math
import sys
import time

from reports.commands.arguments import progress_enabled
from reports.commands.progress import ProgressLine  # noqa: F401 - re-exported (spec, tests)
from reports.commands.tables import terminal_table
from reports.render.markdown import format_table  # noqa: F401 - re-exported (tests, tools)


#: words for a profile by what it does, named by the did-you-mean of ``--profile fast``
PROFILE_HINTS = {"fast": "dev", "quick": "dev", "default": "dev", "short": "dev",
                 "slow": "thorough", "full": "thorough", "deep": "thorough", "long": "thorough"}


def add_arguments(parser):
    """Options of ``verigrad conform``."""
    from reports.commands import arguments as shared

    parser.add_argument("--profile", default="dev",
                        choices=shared.Choices(("dev", "ci", "thorough"), hints=PROFILE_HINTS),
                        help="examples per check: dev (fast), ci, thorough")
    shared.add_engines(parser, help="engines to check: reflib fastlib fastlib-cuda torch jax, "
                                    "'all', or a plugin module:Class",
                       default_text="reflib fastlib fastlib-cuda")
    shared.add_ops(parser, help="only these ops (with their rows of longer names, e.g. "
                                "maximum's `maximum NaN routing`; or optimizers, layer kinds, "
                                "or checks: exact jvp special jvp2 hvp optimizer tape train "
                                "targetprop cd program; with --mutants: mutant keys)")
    shared.add_dtypes(parser, help="only these dtypes: float32 float64 bfloat16 float16",
                      default_text="every dtype each engine computes in or stores")
    shared.add_json(parser, help="also write the rows as JSON to FILE")
    shared.add_seed(parser, help="Hypothesis seed: the same seed draws the same examples")
    parser.add_argument("--mutants", action="store_true",
                        help="plant each mutant (reports.conformance.mutants: source edits "
                             "applied to a copy of fastlib, and the training bugs of "
                             "training_mutants patched in at run time) and report which the "
                             "dev profile catches")
    parser.add_argument("--no-proofs", action="store_true",
                        help="skip the spec's proofs (run only the engine checks)")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop at the first failing row")
    parser.add_argument("--first", action=shared.ListAction, metavar="NAME", default=None,
                        help="run the rows of these ops / checks first (order only; used by "
                             "the mutant run to reach a mutant's likely failure sooner)",
                        default_text="none")
    shared.add_progress(parser, "progress bar and the proofs' status line")
    parser.add_argument("--kinks", choices=("strict", "subgradient"), default=None,
                        help="at a kink (relu'(0), a tie of maximum): strict = the registry's "
                             "conventions; subgradient = any member of the Clarke "
                             "subdifferential passes and is reported as the engine's "
                             "convention. A value outside the subdifferential fails in both "
                             "modes",
                        default_text="strict for reflib and fastlib, subgradient for other "
                                     "engines")
    shared.add_workers(parser, help="processes that run the checks and the proofs, one subject "
                                    "each at a time (the rows are the same for any count; 1: "
                                    "this process)",
                       default_text="one per usable core")
    parser.add_argument("--cluster", metavar="SPEC", default=None,
                        help="run the checks (or mutants) as tasks on Dask: local:N (N worker "
                             "processes here) or a scheduler address tcp://host:8786; the rows "
                             "are a serial run's (needs verigrad[dask])",
                        default_text="none, run here")


def dtype_filter(args):
    """The dtypes ``--dtypes`` selects (a sorted tuple), or None for every dtype (the runner's
    ``dtype=``)."""
    chosen = set(getattr(args, "dtypes", None) or ())
    return tuple(sorted(chosen)) or None


def proof_rows(results, kind, full_shapes=False):
    """Table rows (kind, name, method, cases, seconds, result) for a list of ProofResult."""
    rows = []
    for r in results:
        cases = "; ".join(r.shapes) if full_shapes else f"{len(r.shapes)} case(s)"
        # the result's own words: "proven", "proven on each piece", or "checked at N points"
        rows.append((kind, r.op, r.method, cases, f"{r.seconds:.2f}", r.verdict))
    return rows


def proof_count(results):
    """"proved 43/44, 1 only checked at sampled points": a sampled check is not counted proved."""
    proved = sum(r.ok and r.method != "sampling" for r in results)
    sampled = sum(r.ok and r.method == "sampling" for r in results)
    return f"proved {proved}/{len(results)}" + (
        f", {sampled} only checked at sampled points" if sampled else "")


PROOF_HEADERS = ("kind", "name", "method", "cases tried", "seconds", "result")
ROW_HEADERS = ("check", "name", "engine", "dtype", "examples", "worst error", "its bound",
               "status")


def run_spec_proofs(progress=None, ops=None, optimizers=None):
    """Prove the given ops and optimizers (default: all), updating ``progress`` as it goes.

    Returns
    -------
    (list of ProofResult, list of ProofResult)
        Op proofs, optimizer proofs.
    """
    import spec

    ops = list(spec.OPS) if ops is None else list(ops)
    optimizers = list(spec.OPTIMIZERS) if optimizers is None else list(optimizers)
    total = len(ops) + len(optimizers)

    def show(i, name, what):
        if progress is not None:
            progress.update(f"[{i + 1:>3}/{total}] {what} {name} ...")

    op_results = []
    for i, name in enumerate(ops):
        show(i, name, "proving op")
        op_results.append(spec.prove(name))
    opt_results = []
    for j, name in enumerate(optimizers):
        show(len(ops) + j, name, "proving optimizer")
        opt_results.extend(spec.prove_optimizers([name]))
    return op_results, opt_results


# ---------------------------------------------------------------------------------------------
# the engine checks


def _fmt(x):
    if isinstance(x, str):
        return x
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    if abs(x) < 1e-6:   # below a millionth of an eps: float64 residue of the measurement
        return "0"
    return f"{x:.3g}"


def _with_unit(x, unit):
    if unit == "abs":
        return "0" if x == 0 else ("inf" if math.isinf(x) else f"{x:.3g} abs")
    text = _fmt(x)
    return text if text in ("-", "0") else f"{text} {unit or 'eps'}"


def row_cells(row):
    """The table cells of one runner row, and its note (the reason of an ``unsupported`` row,
    what a passing row adds; "" for none), printed under the table.

    The error and bound are those of the worst element: in ULPs of its exact value
    (``ulp``), as absolute numbers where the exact value is 0 (``abs``), or in eps relative
    to the array (``eps``: the normwise checks of optimizers, training and the JVP identity).
    """
    r = row.result
    measured = r.status in ("pass", "FAIL") and (r.error or r.bound)
    note = r.detail if r.status in ("pass", "unsupported") and r.detail else ""
    unit = getattr(r, "unit", "")
    return (row.kind, row.name, row.engine, row.dtype, r.examples,
            _with_unit(r.error, unit) if measured else "-",
            _with_unit(r.bound, unit) if measured else "-", r.status), note


def rows_table(rows):
    """The rows as a terminal table, each note numbered once under it (``[1] reason``): a
    reason shared by many rows (an engine without second order) is printed once, and the
    table keeps its width whatever the reasons' length."""
    from reports.commands.tables import wrap

    notes, cells = {}, []
    for row in rows:
        (*first, status), note = row_cells(row)
        if note:
            status = f"{status} [{notes.setdefault(note, len(notes) + 1)}]"
        cells.append((*first, status))
    text = terminal_table(ROW_HEADERS, cells)
    if notes:
        text += "\n\n" + "\n".join(wrap(f"[{n}] {' '.join(note.split())}", indent="    ")
                                     for note, n in notes.items())
    return text


def _engine_names(requested):
    from reports.conformance import engines

    if not requested:
        return list(engines.DEFAULT_ENGINES)
    names = []
    for name in requested:
        names += list(engines.ENGINES) if name == "all" else [name]
    return list(dict.fromkeys(names))


def _progress_bar(total, enabled):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="check", file=sys.stderr, leave=False,
                dynamic_ncols=True, mininterval=0.5)


def _workers(args):
    """Processes for the rows and proofs: ``--workers``, else one per usable core (1 with
    ``--cluster``, whose workers are the cluster's, and for arguments built without the
    option)."""
    if getattr(args, "cluster", None):
        return 1
    from reports.conformance.workers import default_workers

    return getattr(args, "workers", 1) or default_workers(10 ** 6)


def run_engines(args, out=None, proofs=(), on_proofs=None, on_compiled=None):
    """Plan and run the engine rows; print the table and the failures; return (rows, code).

    ``proofs`` (``("op" | "optimizer", name)`` pairs) are proved alongside the rows, in the
    same worker processes; ``on_proofs(results)`` is called with them, in order, before the
    engine rows' table is printed. ``on_compiled(n)`` is told how many kernels the run
    compiled (0 when every kernel was in Numba's cache).
    """
    from reports.conformance import engines as _engines
    from reports.conformance.runner import PROFILES, order_rows, plan_rows, run_rows

    out = out or sys.stdout
    profile = PROFILES[args.profile]
    names = _engine_names(args.engines)
    try:
        rows, statuses = plan_rows(names, ops=args.ops, dtype=dtype_filter(args),
                                   kink_mode=getattr(args, "kinks", None))
    except (_engines.UnknownEngineError, TypeError) as exc:
        print(f"verigrad conform: {exc}", file=sys.stderr)
        return [], [], 2
    rows = order_rows(rows, args.first)
    named = set(args.engines or ())

    def print_unavailable():
        for status in statuses:
            # with no row to run, the closing "nothing to check" line names an engine asked
            # for by name and why it cannot run: said there, once
            if not status.available and (rows or status.name not in named):
                print(f"engine {status.name}: unavailable: {status.reason}", file=out)

    if not proofs:
        print_unavailable()
    bar = _progress_bar(len(rows), progress_enabled(args))

    def progress(row):
        if bar is not None:
            bar.set_description_str(row.label()[:60])
            bar.update(0 if row is rows[0] else 1)

    from fastlib.compile_notice import CompileWatch

    # a first run compiles fastlib's kernels: said on the bar, or in one line off a terminal
    watch = CompileWatch("verigrad conform", live=bar is not None,
                         show=None if bar is None else
                         lambda text: bar.set_postfix_str(text, refresh=True))
    with watch:
        if getattr(args, "cluster", None):  # the same rows as tasks on a Dask cluster
            from reports.distributed import cluster

            done = cluster.run_rows(args.cluster, rows, profile, args.seed, ops=args.ops,
                                    dtype=dtype_filter(args), fail_fast=args.fail_fast,
                                    progress=None if bar is None else lambda row: bar.update(1))
            if bar is not None:
                bar.close()
                bar = None
        elif _workers(args) > 1 or proofs:
            from reports.conformance import workers

            done, proved = workers.run_rows_and_proofs(
                rows, profile, args.seed, _workers(args), ops=args.ops, dtype=dtype_filter(args),
                kink_mode=getattr(args, "kinks", None), proofs=proofs,
                on_row=None if bar is None else lambda row: bar.update(1),
                fail_fast=args.fail_fast)
            if bar is not None:
                bar.close()
                bar = None
            if on_proofs is not None:
                on_proofs(proved)
            if proofs:
                print_unavailable()
        else:
            done = run_rows(rows, profile, args.seed, progress, fail_fast=args.fail_fast)
        if bar is not None:
            bar.update(1)
            bar.close()
    if on_compiled is not None:
        on_compiled(watch.compiled)
    if done:
        print(rows_table(done), file=out)
    else:
        print(_nothing_to_check(statuses, named), file=out)
    failed = [r for r in done if r.result.status in ("FAIL", "error")]
    for row in failed:
        detail = "\n".join("  " + line for line in row.result.detail.strip().splitlines())
        print(f"\nFAILED: {row.label()}\n{detail}", file=out)
        if row.result.reproduction:
            # NOTE: not indented, so that it pastes into python as printed
            print("reproduce (Python, paste as is):\n" + row.result.reproduction.rstrip()
                  + "\n# end of reproduction", file=out)
        print(f"reproduce (command): {row.result.command}", file=out)
    explicit = [s for s in statuses
                if not s.available and args.engines and s.name in args.engines]
    code = 1 if failed or (explicit and len(explicit) == len(statuses)) else 0
    return done, statuses, code


def _nothing_to_check(statuses, named):
    """The line of a run without a row: an engine named with ``--engines`` that cannot run
    here, with its reason (no GPU, a package missing), else the filters that left nothing."""
    missing = [s for s in statuses if not s.available and s.name in named]
    if not missing:
        return "nothing to check: no available engine has a row that matches the filters"
    return "nothing to check: " + "; ".join(f"engine {s.name} is unavailable: {s.reason}"
                                            for s in missing)


def _proof_subjects(ops):
    """(ops, optimizers) to prove: all of them, or those named by ``--ops``."""
    if not ops:
        return None, None
    import spec

    return [o for o in ops if o in spec.OPS], [o for o in ops if o in spec.OPTIMIZERS]


def _proof_requests(ops):
    """``("op", name)`` and ``("optimizer", name)`` for every proof a run asks for, in the
    order the table shows them."""
    import spec

    chosen_ops, chosen_optimizers = _proof_subjects(ops)
    return ([("op", n) for n in (list(spec.OPS) if chosen_ops is None else chosen_ops)]
            + [("optimizer", n) for n in (list(spec.OPTIMIZERS) if chosen_optimizers is None
                                          else chosen_optimizers)])


def _json_rows(rows):
    return [r.as_dict() for r in rows]


def validate_request(args):
    """Check ``--engines``, ``--ops``, ``--first`` and ``--json`` before any proof runs.

    Valid op names are the subjects and kinds of the rows the runner plans (its registry, not
    a second list). A request that selects no row is refused too.

    Returns
    -------
    str or None
        The message for a usage error (exit 2), or None.
    """
    from reports.commands import checks
    from reports.conformance import engines as _engines
    from reports.conformance.runner import plan_rows

    if args.json:
        problem = checks.writable_file(args.json, "--json")
        if problem:
            return problem
    names = _engine_names(args.engines)
    unknown = [n for n in names if n not in _engines.ENGINES and ":" not in n]
    if unknown:
        return checks.unknown_names(unknown, list(_engines.ENGINES) + ["all"], "--engines",
                                    "engine") + ", or a plugin module:Class"
    try:
        # reflib and fastlib always run: their rows name every op, optimizer, layer and check
        rows, _ = plan_rows(list(dict.fromkeys(["reflib", "fastlib"] + names)))
        selected, statuses = plan_rows(names, ops=args.ops, dtype=dtype_filter(args))
    except (_engines.UnknownEngineError, TypeError, ImportError, AttributeError) as exc:
        return f"--engines: {exc}"
    valid = [r.name for r in rows] + [r.kind for r in rows]
    for option, given in (("--ops", args.ops), ("--first", args.first)):
        problem = checks.unknown_names(given or (), valid, option, "name")
        if problem:
            return problem
    if not selected and any(s.available for s in statuses):
        return (f"--ops {' '.join(args.ops or ())}"
                f"{' --dtypes ' + ' '.join(args.dtypes) if args.dtypes else ''} selects no "
                f"check of engine(s) "
                f"{' '.join(names)}; valid names: {', '.join(sorted(set(valid)))}")
    return None


def validate(args):
    """Every usage error of ``verigrad conform`` (None: none), before any proof or check."""
    if getattr(args, "cluster", None):
        from reports.distributed import cluster

        try:
            cluster.parse_cluster(args.cluster)
            cluster.require_dask()
        except (ValueError, ImportError) as exc:
            return str(exc)
    if args.mutants:
        from reports.commands import conform_mutants

        return conform_mutants.validate(args)
    return validate_request(args)


def run(args) -> int:
    """Run the proofs and the engine checks; print the tables; 1 if anything failed."""
    problem = None if getattr(args, "_validated", False) else validate(args)
    if problem:
        print(f"verigrad conform: {problem}", file=sys.stderr)
        return 2
    if args.mutants:
        from reports.commands import conform_mutants

        return conform_mutants.run(args)
    start = time.perf_counter()
    proofs, asked = [], ()
    progress = ProgressLine(enabled=progress_enabled(args))

    def show_proofs(op_results, opt_results):
        if not (op_results or opt_results):   # nothing was asked to be proven: no table
            return
        proofs.extend(op_results + opt_results)
        progress.finish(f"{proof_count(proofs)} in "
                        f"{time.perf_counter() - start:.1f} s")
        print(terminal_table(PROOF_HEADERS, proof_rows(op_results, "op")
                           + proof_rows(opt_results, "optimizer")))
        print()

    if not args.no_proofs and _workers(args) > 1:   # proved in the rows' worker processes
        asked = _proof_requests(args.ops)
    elif not args.no_proofs:
        progress.update("loading spec ...")
        show_proofs(*run_spec_proofs(progress, *_proof_subjects(args.ops)))
    compiled = []
    rows, statuses, code = run_engines(
        args, proofs=asked, on_proofs=lambda results: show_proofs(
            [r for (kind, _), r in zip(asked, results) if kind == "op"],
            [r for (kind, _), r in zip(asked, results) if kind == "optimizer"]),
        on_compiled=compiled.append)
    failed_proofs = [r for r in proofs if not r.ok]
    elapsed = time.perf_counter() - start
    counts = {}
    for r in rows:
        counts[r.result.status] = counts.get(r.result.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none ran"
    if failed_proofs:
        print(f"\nFAILED proofs: {', '.join(r.op for r in failed_proofs)}")
        code = 1
    print(f"\n{len(rows)} checks ({summary}); {len(proofs)} proofs; profile {args.profile}, "
          f"seed {args.seed}; {elapsed:.1f} s")
    if compiled and compiled[0]:   # its own line: the summary stays one short line
        print(f"{compiled[0]} kernel{'s' if compiled[0] != 1 else ''} compiled, one time")
    if args.json:
        payload = {
            "profile": args.profile, "seed": args.seed, "seconds": round(elapsed, 2),
            "kernels_compiled": compiled[0] if compiled else 0,
            "workers": _workers(args),
            "engines": [s.__dict__ for s in statuses],
            "proofs": [{"name": r.op, "ok": r.ok, "method": r.method, "verdict": r.verdict,
                        "seconds": r.seconds, "detail": r.detail} for r in proofs],
            "rows": _json_rows(rows),
            "ok": code == 0,
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    return code
