"""``verigrad report``: measure every op's VJP accuracy on every engine and write the report.

Writes ``report.md``, ``report.html`` (self-contained), ``report.json`` (validated against
``reports.schema``, which is written beside it as ``report_schema.json``) and one PNG per op
plus ``overview.png`` into ``--out``. Exit codes: 0 done; 1 with ``--fail-on-regression`` when
an op's error grew by more than 2× against ``--baseline``; 2 for a usage error (an unknown or
unavailable engine, a bad dtype or op, an unreadable baseline).
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

DEFAULT_OUT = "accuracy-report"


def add_arguments(parser):
    """Options of ``verigrad report``."""
    from reports import accuracy
    from reports.commands import arguments as shared

    parser.add_argument("--out", metavar="DIR", default=DEFAULT_OUT,
                        help="directory to write into")
    shared.add_json(parser, help="also write the report's JSON (report.json) to FILE")
    shared.add_engines(parser, help="engines to measure: registered names (reflib fastlib "
                                    "fastlib-cuda torch jax) or 'module:Engine' plugins",
                       default_text="every registered engine available here")
    shared.add_dtypes(parser, default=list(accuracy.DTYPES),
                      help="float32 float64 bfloat16 float16: the 16-bit formats on the same "
                           "draws rounded to the format, in its ULPs",
                      default_text="float32 float64")
    parser.add_argument("--samples", type=shared.positive_int, metavar="N",
                        help="random cases per source (uniform, log-uniform) and op",
                        default_text=f"{accuracy.DEFAULT_SAMPLES}; {accuracy.QUICK_SAMPLES} "
                                     "with --quick")
    parser.add_argument("--quick", action="store_true",
                        help="a fast report: few samples and three finite-difference steps")
    parser.add_argument("--second-order", action="store_true",
                        help="also measure every engine's JVP and HVP of each op in ULPs of "
                             "spec's exact values (two draws per op and dtype), shown beside "
                             "the first-order figures; an engine without jvp/hvp reads 'not "
                             "provided' (slower: spec's dual numbers per draw)")
    shared.add_ops(parser, help="measure only these registry ops")
    shared.add_seed(parser, help="seed of the random cases")
    parser.add_argument("--baseline", metavar="OLD.json",
                        help="an earlier report.json: flag each op whose error grew by more "
                             "than 2x", default_text="none")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 when --baseline flags a regression (for CI)")
    shared.add_workers(parser, help="processes that measure the ops, one op each at a time (the "
                                    "report is the same for any count; 1: this process)",
                       default_text="one per usable core")
    shared.add_progress(parser, "progress bars (measuring, plotting)")
    parser.add_argument("--cluster", metavar="SPEC", default=None,
                        help="measure the ops as tasks on Dask: local:N or tcp://host:8786; "
                             "the report is a serial run's (needs verigrad[dask])",
                        default_text="none, measure here")


def _fail(message):
    print(f"verigrad report: {message}", file=sys.stderr)
    return 2


def _engines(names):
    """(engine objects, [(name, reason)] unavailable) for ``names`` (None: the defaults)."""
    from reports.conformance import engines as registry

    if names is None:
        statuses = registry.available_engines()
        chosen = [registry.get_engine(s.name) for s in statuses if s.available]
        return chosen, [(s.name, s.reason) for s in statuses if not s.available]
    chosen = []
    for name in dict.fromkeys(names):            # each engine once, in the order given
        engine = registry.get_engine(name)
        if any(e.name == engine.name for e in chosen):
            raise ValueError(f"two engines are named {engine.name!r} ({name!r} and another); "
                             f"rows are keyed by engine name, so give each a distinct name")
        chosen.append(engine)
    return chosen, []


def _load_baseline(path):
    from reports import schema

    try:
        return schema.load(path)
    except FileNotFoundError:
        raise ValueError(f"cannot read baseline {path}: no such file") from None
    except OSError as exc:
        raise ValueError(f"cannot read baseline {path}: {exc.strerror}") from None


class FigureWorker:
    """Draws each op's figure in a second process while the main one measures the next op.

    NOTE: matplotlib needs about a second per figure here, as long as measuring a quick op;
    overlapping the two keeps ``--quick`` within its minute on two cores. Where a process
    cannot be started (or dies), the figures are drawn in this process instead.
    """

    def __init__(self, engine_names, edges, parallel=True):
        from reports.render import plots

        self.colors = plots.engine_colors(engine_names)
        self.edges = edges
        self.pending = {}
        self.pool = None
        if parallel:
            try:
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor

                self.pool = ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            except (OSError, ValueError, ImportError):  # no processes here: draw inline
                self.pool = None

    def submit(self, name, result):
        """Start drawing op ``name``'s figure."""
        from reports.render import plots

        if self.pool is not None:
            try:
                self.pending[name] = self.pool.submit(plots.op_figure, name, result,
                                                      self.edges, self.colors)
                return
            except RuntimeError:  # the pool broke: fall back to drawing later, inline
                self.pool = None
        self.pending[name] = None

    def collect(self, report, progress=None):
        """Every op's figure (drawing here whatever the worker did not), then stop it."""
        from reports.render import plots

        figures = {}
        for name, result in report["ops"].items():
            future = self.pending.get(name)
            png = None
            if future is not None:
                try:
                    png = future.result()
                except Exception:  # noqa: BLE001 - a dead worker: draw it here instead
                    png = None
            figures[name] = png or plots.op_figure(name, result, self.edges, self.colors)
            if progress is not None:
                progress(name)
        self.close()
        return figures

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def write_outputs(report, out, figures=None, progress=None):
    """Render ``report`` into directory ``out``: PNGs, report.md/.html/.json, the schema.

    Parameters
    ----------
    report : dict
        A measured report.
    out : str or pathlib.Path
        The directory (created if needed).
    figures : dict, optional
        Op name -> PNG bytes already drawn (a :class:`FigureWorker`'s); the rest are drawn here.
    progress : callable, optional
        Called with each op's name as its figure is ready.

    Returns
    -------
    list of pathlib.Path
        The files written.
    """
    from reports import schema
    from reports.render import html, markdown, plots

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    figures = dict(figures or {})
    colors = plots.engine_colors(plots.engine_names(report))
    for name, result in report["ops"].items():
        if not figures.get(name):
            figures[name] = plots.op_figure(name, result, report["histogram_edges"], colors)
        if progress is not None:
            progress(name)
    figures["overview"] = plots.overview_figure(report)
    written = []
    for name, png in figures.items():
        path = out / f"{name}.png"
        path.write_bytes(png)
        written.append(path)
    report["timing"]["render_seconds"] = round(time.perf_counter() - started, 3)
    schema.check(report)
    for filename, text in (("report.md", markdown.render(report)),
                           ("report.html", html.render(report, figures)),
                           ("report.json", json.dumps(report, indent=1)),
                           ("report_schema.json", schema.dumps())):
        path = out / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _bar_lines(report):
    b = report["bar"]
    lines = []
    f64 = [e for e in b["float64"]]
    if f64:
        miss = [e["op"] for e in f64 if e["status"] == "fail"]
        lines.append(f"  {b['engine']} float64 within {b['few_ulps']:g} ULPs (well-conditioned): "
                     f"{len(f64) - len(miss)}/{len(f64)} ops" + (f"; misses: {', '.join(miss)}"
                                                                if miss else ""))
    f32 = [e for e in b["float32"] if e["status"] != "not measured"]
    if f32:
        miss = [e["op"] for e in f32 if e["status"] == "fail"]
        lines.append(f"  {b['engine']} float32 median <= {b['rival']} float32: "
                     f"{len(f32) - len(miss)}/{len(f32)} ops" + (f"; misses: {', '.join(miss)}"
                                                                if miss else ""))
    for dtype in dict.fromkeys(e["dtype"] for e in b.get("storage", ())):
        rows = [e for e in b["storage"] if e["dtype"] == dtype and e["status"] != "not measured"]
        miss = [e["op"] for e in rows if e["status"] == "fail"]
        if rows:
            lines.append(f"  {b['engine']} {dtype} median <= {b['rival']} {dtype}: "
                         f"{len(rows) - len(miss)}/{len(rows)} ops"
                         + (f"; misses: {', '.join(miss)}" if miss else ""))
    return lines


def _second_order_lines(report):
    """The worst JVP and HVP row of a report measured with ``--second-order`` (or [])."""
    from reports.render import fmt_num

    rows = [dict(r, op=op) for op, rs in (report.get("second_order") or {}).items() for r in rs
            if "max_ulp" in r]
    lines = []
    for kind in ("jvp", "hvp"):
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            w = max(mine, key=lambda r: (r["median_ulp"], r["max_ulp"]))
            lines.append(f"  worst {kind.upper()} row: {w['op']} on {w['engine']} {w['dtype']}: "
                         f"median {fmt_num(w['median_ulp'])} ULP, max {fmt_num(w['max_ulp'])} "
                         f"ULP")
    return lines


def _config(args):
    from reports import accuracy

    overrides = dict(dtypes=tuple(args.dtypes), seed=args.seed,
                     ops=tuple(args.ops) if args.ops else None,
                     second_order=bool(getattr(args, "second_order", False)))
    if args.samples is not None:
        overrides["samples"] = args.samples
    return (accuracy.Config.quick_config(**overrides) if args.quick
            else accuracy.Config(**overrides))


def validate(args):
    """Every usage error of ``verigrad report`` (None: none), before anything is measured.

    Resolves what the run needs on the way: ``args._config``, ``args._baseline`` and
    ``args._engines`` (engines, unavailable).
    """
    from reports.commands import checks
    from reports.conformance.engines import EngineUnavailableError, UnknownEngineError

    if args.fail_on_regression and not args.baseline:
        return ("--fail-on-regression needs --baseline OLD.json (the report to compare "
                "with)")
    if getattr(args, "cluster", None) and getattr(args, "workers", None):
        return ("--workers and --cluster both say where to measure: give one (--cluster runs "
                "on the Dask cluster's workers)")
    problem = checks.writable_dir(args.out, "--out") or (
        checks.writable_file(args.json, "--json") if args.json else None)
    if problem:
        return problem
    try:
        args._config = _config(args)
        args._config.validate()
        args._baseline = _load_baseline(args.baseline) if args.baseline else None
    except (ValueError, TypeError, ImportError) as exc:
        return str(exc)
    try:
        args._engines = _engines(args.engines)
    except (ValueError, TypeError, ImportError, UnknownEngineError,
            EngineUnavailableError) as exc:
        return f"--engines: {exc}"        # conform's wording for the same refusals
    if getattr(args, "cluster", None):
        from reports.distributed import cluster

        try:
            cluster.parse_cluster(args.cluster)
            cluster.require_dask()
        except (ValueError, ImportError) as exc:
            return str(exc)
    if not args._engines[0]:
        return "no engine to measure (see `verigrad conform --help` for the engines)"
    return None


def run(args) -> int:
    """Measure, compare with the baseline, write every output; the exit code."""
    from tqdm import tqdm

    from reports import accuracy
    from reports.commands.arguments import progress_enabled
    from reports.commands.tables import wrap
    from reports.render import fmt_num

    problem = None if getattr(args, "_validated", False) else validate(args)
    if problem:
        return _fail(problem)
    config, baseline, (engines, unavailable) = args._config, args._baseline, args._engines
    quiet = not progress_enabled(args)
    import spec

    ops = list(config.ops or spec.OPS)
    worker = FigureWorker([e.name for e in engines], [accuracy.json_number(e) for e in
                                                      accuracy.HIST_EDGES])
    try:
        with tqdm(total=len(ops), desc="measuring", unit="op", file=sys.stderr,
                  disable=quiet) as bar:
            def advance(name, result):
                worker.submit(name, result)
                bar.set_postfix_str(name)
                bar.update(1)

            if getattr(args, "cluster", None):  # each op a task on a Dask cluster; the same report
                from reports.distributed import cluster

                def done(name):
                    bar.set_postfix_str(name)
                    bar.update(1)

                report = cluster.measure_report(
                    args.cluster, config, engines, unavailable, progress=done,
                    on_op=lambda name, result: worker.submit(name, result),
                    engine_refs=list(dict.fromkeys(args.engines)) if args.engines else None)
            else:
                from reports import local_workers

                workers = args.workers or local_workers.default_workers(len(ops))
                report = local_workers.measure_report(
                    config, engines, unavailable, workers=workers, on_op=advance,
                    engine_refs=list(dict.fromkeys(args.engines)) if args.engines else None)
        if baseline is not None:
            report["regressions"] = accuracy.compare(baseline, report, source=args.baseline)
        with tqdm(total=len(ops), desc="plotting", unit="op", file=sys.stderr,
                  disable=quiet) as bar:
            figures = worker.collect(report, progress=lambda name: bar.update(1))
            written = write_outputs(report, args.out, figures)
    finally:
        worker.close()
    out = pathlib.Path(args.out)
    if args.json:
        pathlib.Path(args.json).write_text((out / "report.json").read_text(encoding="utf-8"),
                                           encoding="utf-8")
    print(wrap(f"wrote {out / 'report.md'}, {out / 'report.html'}, {out / 'report.json'} and "
               f"{sum(p.suffix == '.png' for p in written)} PNG plots"
               + (f" (and {args.json})" if args.json else ""), indent="  "))
    print(f"  {report['timing']['total_seconds']:.0f} s measuring, "
          f"{report['timing']['render_seconds']:.0f} s rendering")
    worst = next((r for r in report["summary"] if r["status"] != "unsupported"), None)
    if worst is not None:
        print(f"  worst row: {worst['op']} on {worst['engine']} {worst['dtype']}: median "
              f"{fmt_num(worst['median_ulp'])} ULP, max {fmt_num(worst['max_ulp'])} ULP")
    for line in _bar_lines(report) + _second_order_lines(report):
        print(line)
    reg = report["regressions"]
    if reg is not None:
        flagged = reg["flagged"]
        print(f"  against {args.baseline}: {len(flagged)} regression(s) in {reg['compared']} "
              f"rows (growth > {reg['factor']:g}x)")
        for f in flagged:
            print(f"    {f['op']} {f['engine']} {f['dtype']} {f['metric']}: "
                  f"{fmt_num(f['baseline'])} -> {fmt_num(f['current'])} "
                  f"({fmt_num(f['ratio'])}x)")
        if reg["config_differs"]:
            print(f"  note: configuration differs from the baseline in "
                  f"{', '.join(reg['config_differs'])}")
        if flagged and args.fail_on_regression:
            return 1
    return 0
