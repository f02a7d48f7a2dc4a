"""`verigrad bench train`: seconds per training epoch, fastlib against NumPy, PyTorch and JAX.

Also, per thread count (``--threads 1,2,4,8,16``, see :mod:`reports.bench.scaling`) and on a GPU
(``--device cuda``: fastlib-cuda beside fastlib's CPU engine, PyTorch CUDA eager and PyTorch
with the step as one CUDA graph, with fastlib.cuda's counters).

The long story: docs/reports.md, section ``reports/bench/train.py``; docs/performance.md.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

from reports.bench import environment
from reports.bench.models import MODELS, SIMULATOR_MODELS, load
from reports.commands.arguments import progress_enabled
from reports.commands.progress import ProgressLine

MAX_STEPS, REPEATS = 6000, 3  # defaults of --max-steps and --repeats
CUDA_ENGINES = ("fastlib-cuda", "fastlib", "torch-cuda", "torch-cuda-graph")
CUDA_BASELINE = "torch-cuda"  # the --device cuda table's ratios are over PyTorch CUDA eager
TORCH_CUDA_ENGINES = ("torch-cuda", "torch-cuda-graph")
# numba's simulator runs each CUDA thread as a Python thread: its defaults are tiny
SIMULATOR_DEFAULTS = {"samples": 8, "batch_sizes": [4], "max_steps": 2, "repeats": 1}
COUNTER_KEYS = ("kernel_launches", "graph_launches", "allocations", "h2d_copies", "d2h_copies",
                "synchronizations")
TARGETS = {64: 0.4, 1: 6.0}  # the MLP's seconds per epoch: the targets the README reports
RATIO_TARGETS = {"torch": 0.5, "jax": 1.0}  # fastlib / peer at RATIO_BATCH, every model
RATIO_BATCH = 32
FLOOR_BATCH, FLOOR_TARGET = 64, 2.0  # the MLP within 2x of the arithmetic floor at batch 64
# fastlib with its compiled schedules limited to these (fastlib.config.SCHEDULES): the schedule
# benchmark of docs/architecture.md times each specialised schedule against the interpreter
SCHEDULE_ENGINES = {"fastlib-general": ("general",)}


def _engine_names():
    """Every engine some model (or ``--device cuda``) runs, for the parser's did-you-mean; the
    model's own list is checked by :func:`validate`."""
    names = [e for name in MODELS + SIMULATOR_MODELS for e in load(name).CPU_ENGINES]
    return list(dict.fromkeys(names + list(SCHEDULE_ENGINES) + list(CUDA_ENGINES)))


def add_arguments(parser):
    """Options of ``verigrad bench train``."""
    from reports.commands import arguments as shared

    a = parser.add_argument
    a("--model", default=None, choices=shared.Choices(MODELS + SIMULATOR_MODELS),
      help="model to train (tiny: --device cuda on numba's CUDA simulator only)",
      default_text="mlp; tiny on the simulator")
    a("--batch-sizes", action=shared.ListAction, convert=shared.positive_int, unique=True,
      metavar="N", default=None,
      help="batch sizes, spaces or commas",
      default_text="the model's: " + "; ".join(f"{load(m).BATCH_SIZES} for {m}"
                                               for m in MODELS))
    a("--samples", type=shared.positive_int, metavar="N", default=None,
      help="samples per epoch (sequences for the sequence models)",
      default_text="the model's: " + "; ".join(f"{load(m).SAMPLES} for {m}" for m in MODELS))
    a("--max-steps", type=shared.positive_int, metavar="N", default=None,
      help="steps measured per case; longer epochs are scaled from them",
      default_text=str(MAX_STEPS))
    shared.add_thread_counts(parser, default=[2],
                             help="threads for every engine; several counts (1,2,4,8,16) "
                                  "measure each in its own process and print each engine's "
                                  "speedup over its own epoch at the smallest count")
    shared.add_engines(parser, valid=shared.LazyChoices(_engine_names),
                       help="engines to run (each model's own: see --model)",
                       default_text="the model's: " + "; ".join(
                           f"{' '.join(load(m).CPU_ENGINES)} for {m}" for m in MODELS)
                       + f"; with --device cuda {' '.join(CUDA_ENGINES)}; also, by name, "
                         "fastlib-general: fastlib with every model in its general schedule "
                         "(the schedule benchmark)")
    shared.add_repeats(parser, None, help="interleaved rounds per batch size; the median is "
                                          "reported", default_text=str(REPEATS))
    a("--data-dir", metavar="DIR", default=None, help="mlp: the MNIST folder",
      default_text="$VERIGRAD_MNIST_DIR, the user cache, ../shared/data/mnist; random data "
                   "when absent")
    shared.add_json(parser, help="also write the results as JSON to FILE")
    a("--device", choices=("cpu", "cuda"), default="cpu",
      help="cuda: fastlib on the GPU beside fastlib's CPU engine, PyTorch CUDA eager and "
           "PyTorch with the step captured as one CUDA graph, with the device's counters")
    a("--profile", action="store_true",
      help="with --device cuda: after the timing, one more fastlib-cuda run per batch size with "
           "each kernel launched and timed on its own; prints a per-launch table (kernel, "
           "grid, block, launches per step, GPU ms per step)")
    a("--distributed", action="store_true",
      help="mlp: data-parallel fastlib under mpiexec at each of --ranks (needs verigrad[mpi])")
    a("--ranks", action=shared.ListAction, convert=shared.positive_int, unique=True,
      metavar="N", default=[1, 2], help="with --distributed: rank counts, spaces or commas")
    a("--blocks", type=shared.positive_int, metavar="N", default=8,
      help="with --distributed: blocks per batch")
    shared.add_dtypes(parser, help="the digits MLP (verigrad train's; with --model lstm, "
                      "attention or transformer that model) in each precision: float32 float64 "
                      "bfloat16 float16 (16-bit: mixed precision over float32 masters); "
                      "s/epoch, test loss and accuracy, parameter and activation memory",
                      default_text="none (the engines' table)")
    shared.add_progress(parser, "progress line (case, engine, round)")


def validate(args):
    """The combinations ``verigrad bench train`` refuses, one rule per message (None: fine),
    before any data is read: the tiny model off the simulator, an engine the model does not
    run, --distributed off the MLP on the CPU, --ranks or --blocks without it, --profile off
    the GPU, several --threads counts with --device cuda."""
    simulated = args.device == "cuda" and on_simulator()
    model = args.model or (SIMULATOR_MODELS[0] if simulated else "mlp")
    if model in SIMULATOR_MODELS and not simulated:
        return (f"--model {model!r} runs only with --device cuda on numba's CUDA simulator "
                f"(NUMBA_ENABLE_CUDASIM=1); the models: {', '.join(MODELS)}")
    if args.engines:
        allowed = CUDA_ENGINES if args.device == "cuda" else load(model).CPU_ENGINES
        # the schedule engines by name only, beside the model's own
        named = tuple(SCHEDULE_ENGINES) if args.device == "cpu" else ()
        bad = [e for e in args.engines if e not in allowed and e not in named]
        if bad:
            where = f"--model {model}" + (" --device cuda" if args.device == "cuda" else "")
            return (f"--engines {bad[0]}: not an engine of {where}; its engines: "
                    f"{', '.join(allowed)}")
    if args.distributed and (model != "mlp" or args.device == "cuda"):
        return ("--distributed times the mlp model on the CPU only; drop it or pass "
                "--model mlp --device cpu")
    if not args.distributed:
        for flag, used in (("--ranks", args.ranks != [1, 2]), ("--blocks", args.blocks != 8)):
            if used:
                return f"{flag} applies only with --distributed"
    if getattr(args, "dtypes", None):
        digits = args.model in (None, "mlp")
        for flag, used in (("--distributed", args.distributed), ("--engines", args.engines),
                           ("--batch-sizes", args.batch_sizes is not None),
                           ("--max-steps", args.max_steps is not None),
                           ("--samples (the digits have their own split)",
                            digits and args.samples is not None),
                           ("--threads with several counts", len(args.threads) > 1)):
            if used:
                return (f"--dtypes trains one model with fastlib (the digits MLP, or --model's) "
                        f"in batches of 32 (on the CPU, or the device with --device cuda), one "
                        f"thread count: drop {flag}")
        if simulated:
            return ("--dtypes with --device cuda trains the model for whole epochs per "
                    "format and seed, hours on numba's CUDA simulator: run it on a GPU")
    if getattr(args, "profile", False) and args.device != "cuda":
        return "--profile times fastlib-cuda's launches: it needs --device cuda"
    if args.device == "cuda" and len(args.threads) > 1:
        return ("--device cuda takes one --threads count (the CPU engine's); measure thread "
                "scaling with --device cpu")
    return None


# ---------------------------------------------------------------------------------------------
# the device

def cuda_problem():
    """None when ``--device cuda`` can run here (a GPU, or numba's simulator), else why not."""
    try:
        import fastlib.cuda as fc
    except Exception as exc:  # a broken CUDA stack: say which import failed and why
        return f"import fastlib.cuda failed ({type(exc).__name__}: {exc})"
    if fc.is_available():
        return None
    return fc.unavailable_reason() or "no CUDA device"


def on_simulator():
    """Whether fastlib.cuda runs on numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)."""
    try:
        from fastlib.cuda import config
    except Exception:
        return False
    return bool(config.SIMULATOR)


# ---------------------------------------------------------------------------------------------
# threads

def _pin_jax_threads(threads):
    """Pin XLA's CPU pool to ``threads`` before JAX is imported; returns how (for the report).

    One thread: XLA's documented flags. Fewer threads than CPUs: the process's CPU affinity
    (XLA sizes its pool by the schedulable CPUs; the other engines' pools are already pinned,
    so they lose nothing). As many as the CPUs: XLA's default pool is that size.
    """
    if "jax" in sys.modules:
        return "not pinned (JAX was imported before the benchmark)"
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if threads == 1:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
        return f"XLA_FLAGS={flags}"
    if cpus and threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])
        return f"CPU affinity {cpus[:threads]}"
    return f"XLA's default pool ({len(cpus) or os.cpu_count()} CPUs)"


def _limit_threads(threads, engines=()):
    """Pin every engine to ``threads``: BLAS (threadpoolctl), Numba and fastlib's parallel
    kernels (no adaptive shrinking to idle cores: each engine gets the same count), PyTorch,
    and XLA (before JAX is imported)."""
    import numba
    # NOTE: threadpoolctl pins the BLAS libraries loaded now: SciPy's, the one Numba's np.dot
    # calls (fastlib's kernels under VERIGRAD_BLAS=numba), is loaded here so that it is pinned
    # too; NumPy's, the one they call otherwise (fastlib.blas_choice), is loaded already
    import scipy.linalg.cython_blas  # noqa: F401
    from threadpoolctl import threadpool_limits

    from fastlib import config

    jax_pin = _pin_jax_threads(threads) if "jax" in engines else None
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    config.THREADS = threads
    limiter = threadpool_limits(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    return limiter, jax_pin


def _loadavg():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover - platforms without it
        return None


def _error(message, code):
    print(f"verigrad bench train: error: {message}", file=sys.stderr)
    return code


# ---------------------------------------------------------------------------------------------
# options

def _options(args):
    """(model module, batch sizes, engines, thread counts), the defaults filled in.

    Usage errors were refused by :func:`validate` before any work; ``--device cuda`` where no
    device can run it is refused here (exit 2), before any data is read.
    """
    simulated = args.device == "cuda" and on_simulator()
    if args.model is None:
        args.model = SIMULATOR_MODELS[0] if simulated else "mlp"
    if args.device == "cuda":
        why = cuda_problem()
        if why is not None:
            return _error(f"--device cuda needs a CUDA GPU, and fastlib.cuda says: {why} "
                          "(fastlib.cuda.unavailable_reason()); run on a GPU machine, or drop "
                          "--device cuda", 2)
        if on_simulator():
            for key, value in SIMULATOR_DEFAULTS.items():
                if getattr(args, key) is None:
                    setattr(args, key, value)
    model = load(args.model)
    args.samples = model.SAMPLES if args.samples is None else args.samples
    if args.batch_sizes is None:
        args.batch_sizes = _counts(model.BATCH_SIZES)
    args.max_steps = MAX_STEPS if args.max_steps is None else args.max_steps
    args.repeats = REPEATS if args.repeats is None else args.repeats
    allowed = CUDA_ENGINES if args.device == "cuda" else model.CPU_ENGINES
    engines = list(args.engines) if args.engines else list(allowed)
    return model, list(args.batch_sizes), engines, list(args.threads)


def _counts(text):
    """``"1,32,128"`` (a model's default batch sizes) -> ``[1, 32, 128]``."""
    return [int(s) for s in str(text).split(",") if s.strip()]


def _missing(model, engine):
    """None when ``engine`` can run here, else the line saying why not."""
    if engine in TORCH_CUDA_ENGINES:
        from reports.bench.models import common

        return common.torch_cuda_missing()
    why = model.missing(engine)
    if why is None and engine == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            why = "not installed: pip install torch==2.13.0"
    return why


def run(args) -> int:
    """Run the benchmark; print a table (or JSON); 0 on success, 1 or 2 on bad options."""
    if getattr(args, "dtypes", None):
        from reports.bench import precision

        _limit_threads(args.threads[0])
        return precision.run(args, list(args.dtypes))
    chosen = _options(args)
    if isinstance(chosen, int):
        return chosen
    model, sizes, engines, threads = chosen
    if getattr(args, "distributed", False):
        from reports.distributed import bench

        args.threads = threads[0]
        return bench.run(args, sizes)
    if len(threads) > 1:
        from reports.bench import scaling

        return scaling.run(args, model, sizes, engines, threads)
    args.threads = threads[0]
    skipped = {}
    for engine in list(engines):
        why = _missing(model, engine)
        if why:
            engines.remove(engine)
            skipped[engine] = why
            print(f"verigrad bench train: {engine}: {why}; skipping it", file=sys.stderr)
    _, jax_pin = _limit_threads(args.threads, engines)
    env = environment.environment()
    load_start = _loadavg()
    x, y, source = model.data(args)
    progress = ProgressLine(enabled=progress_enabled(args))
    rows = [_measure(model, engines, x, y, bs, args, progress) for bs in sizes]
    progress.clear()
    profiles = _profiles(model, x, y, sizes, args) if _wants_profile(args, engines) else None
    floor = _floor(rows, len(x)) if args.model == "mlp" and args.device == "cpu" else None
    report = {"model": model.DESCRIPTION, "model_name": args.model, "data": source,
              "samples": len(x), "threads": args.threads, "jax_threads": jax_pin,
              "device": args.device, "simulator": args.device == "cuda" and on_simulator(),
              "repeats": args.repeats, "engines": engines, "skipped": skipped,
              "environment": env, "load_average": {"start": load_start, "end": _loadavg()},
              "results": rows, "targets": _targets(rows) if args.device == "cpu" else [],
              "floor": floor, "profile": profiles}
    _print_table(report, args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return 0


def _measure(model, engines, x, y, bs, args, progress=None):
    """One batch size: ``--repeats`` interleaved rounds, the engine order rotated each round."""
    row = {"batch_size": bs, "steps_per_epoch": -(-len(x) // bs), "load_1min": None}
    runs = {e: [] for e in engines}
    for r in range(args.repeats):
        k = r % len(engines)
        for engine in engines[k:] + engines[:k]:
            if progress is not None:
                progress.update(f"batch {bs}: {engine}, round {r + 1} of {args.repeats}")
            result = _engine(model, engine, args.device)(x, y, bs, args.max_steps)
            runs[engine].append((result.seconds * row["steps_per_epoch"] / result.steps,
                                 result))
    row["load_1min"] = (_loadavg() or [None])[0]
    for engine in engines:
        row[engine] = statistics.median(s for s, _ in runs[engine])
        row[f"{engine}_runs"] = [s for s, _ in runs[engine]]
        row[f"{engine}_steps_measured"] = runs[engine][0][1].steps
        row[f"{engine}_loss"] = statistics.median(res.loss for _, res in runs[engine])
        if runs[engine][-1][1].device is not None:  # the last run's: the counts do not vary
            row[f"{engine}_device"] = runs[engine][-1][1].device
    base = CUDA_BASELINE if args.device == "cuda" else "fastlib"
    for engine in engines:
        if engine != "fastlib" and "fastlib" in row:
            row[f"{engine}_over_fastlib"] = row[engine] / row["fastlib"]
            row[f"fastlib_over_{engine}"] = row["fastlib"] / row[engine]
        if base == CUDA_BASELINE and engine != base and base in row:
            row[f"{engine}_over_{base}"] = row[engine] / row[base]
    if args.model == "mlp" and args.device == "cpu" and bs in TARGETS and "fastlib" in row:
        row["target_s"] = TARGETS[bs]
        row["meets_target"] = row["fastlib"] < TARGETS[bs]
    return row


def _engine(model, engine, device):
    """The bench function of ``engine``; with ``--device cuda`` every engine, fastlib's CPU
    engine included, runs the steady-state protocol (``common.CUDA_EPOCHS``); a
    :data:`SCHEDULE_ENGINES` name runs the model's fastlib bench with the compiled schedules
    limited to its own."""
    from reports.bench.models import common

    if device == "cuda" and engine == "fastlib" and common.STEADY_CPU in model.ENGINES:
        return model.ENGINES[common.STEADY_CPU]
    if engine not in SCHEDULE_ENGINES:
        return model.ENGINES[engine]

    def limited(*args, **kwargs):
        # fastlib with its compiled schedules limited to the named engine's
        from fastlib import config

        before, config.SCHEDULES = config.SCHEDULES, SCHEDULE_ENGINES[engine]
        try:
            return model.ENGINES["fastlib"](*args, **kwargs)
        finally:
            config.SCHEDULES = before
    return limited


def _wants_profile(args, engines):
    return getattr(args, "profile", False) and args.device == "cuda" and "fastlib-cuda" in engines


def _profiles(model, x, y, sizes, args):
    """Per batch size, fastlib-cuda's per-launch table of its timed epoch (launches mode, each
    kernel timed with CUDA events on a GPU; ``fastlib.cuda.profile``)."""
    from fastlib.cuda import profile

    out = {}
    for bs in sizes:
        with profile.recording() as prof:
            run = model.ENGINES["fastlib-cuda"](x, y, bs, args.max_steps)
        out[bs] = {"rows": prof.table(), "steps": prof.steps,
                   "cuda_mode": (run.device or {}).get("cuda_mode")}
    return out


def print_profile(profiles, simulator):
    """The ``--profile`` table: one line per (kernel, grid, block) of the timed epoch."""
    for bs, prof in profiles.items():
        rows = prof["rows"]
        total = sum(r["launches_per_step"] for r in rows)
        print(f"profile, batch {bs}: {total:g} launches per step over {prof['steps']} steps "
              f"(mode {prof['cuda_mode']}; GPU time per launch from CUDA events"
              + ("; none under the simulator)" if simulator else ")"))
        width = max([len(r["kernel"]) for r in rows] + [6])
        print(f"  {'kernel':<{width}}  {'grid':>16}  {'block':>10}  {'per step':>8}  "
              f"{'ms/step':>9}")
        for r in rows:
            ms = "-" if r["ms_per_step"] is None else f"{r['ms_per_step']:.4f}"
            print(f"  {r['kernel']:<{width}}  {str(r['grid']):>16}  {str(r['block']):>10}  "
                  f"{r['launches_per_step']:>8g}  {ms:>9}")


def _targets(rows):
    """The ratio targets at batch 32 for the peers measured: fastlib / peer against the limit."""
    out = []
    for row in rows:
        if row["batch_size"] != RATIO_BATCH or "fastlib" not in row:
            continue
        for peer, limit in RATIO_TARGETS.items():
            if peer in row:
                ratio = row[f"fastlib_over_{peer}"]
                out.append({"batch_size": RATIO_BATCH, "peer": peer, "limit": limit,
                            "ratio": ratio, "met": ratio <= limit})
    return out


def _floor(rows, samples):
    """The MLP's arithmetic floor and fastlib's ratio to it, when batch 64 was measured."""
    from reports.bench.models import mlp

    row = next((r for r in rows if r["batch_size"] == FLOOR_BATCH and "fastlib" in r), None)
    if row is None:
        return None
    floor = mlp.arithmetic_floor(samples, FLOOR_BATCH)
    floor["fastlib_s"] = row["fastlib"]
    floor["fastlib_over_floor"] = row["fastlib"] / floor["floor_s"]
    floor["target"] = FLOOR_TARGET
    floor["met"] = floor["fastlib_over_floor"] <= FLOOR_TARGET
    return floor


def _verdict(met, ratio, limit):
    return "yes" if met else f"NO (misses by {ratio / limit:.2f}x)"


# ---------------------------------------------------------------------------------------------
# the table

def _print_table(report, args):
    if report["device"] == "cuda":
        _print_cuda_table(report, args)
        return
    engines = report["engines"]
    load = report["load_average"]
    print(f"verigrad bench train --model {report['model_name']}: {report['model']}; "
          f"{report['data']}; {report['samples']} samples per epoch; {args.threads} threads; "
          f"median of {args.repeats} interleaved runs; load average at start {load['start']}")
    print("\n".join(environment.header_lines(report["environment"])))
    peers = [e for e in engines if e != "fastlib"] if "fastlib" in engines else []
    head = f"{'batch':>6}" + "".join(f"  {e + ' s/epoch':>16}" for e in engines)
    head += "".join(f"  {'fastlib/' + e:>15}" for e in peers)
    print(head + "  load" + ("  target" if report["model_name"] == "mlp" else ""))
    rows = report["results"]
    for row in rows:
        line = f"{row['batch_size']:>6}" + "".join(f"  {row[e]:>16.3f}" for e in engines)
        line += "".join(f"  {row['fastlib_over_' + e]:>15.2f}" for e in peers)
        line += f"  {row['load_1min'] if row['load_1min'] is not None else '?':>4}"
        if "target_s" in row:
            line += f"  < {row['target_s']} s: {'yes' if row['meets_target'] else 'NO'}"
        print(line)
    _print_losses(rows, engines)
    for t in report["targets"]:
        print(f"target at batch {t['batch_size']}: fastlib <= {t['limit']}x {t['peer']}: "
              f"{t['ratio']:.2f}x: {_verdict(t['met'], t['ratio'], t['limit'])}")
    floor = report["floor"]
    if floor:
        print(f"arithmetic floor at batch {floor['batch_size']}: "
              f"{floor['flops_per_epoch'] / 1e9:.1f} GFLOP per epoch (GEMMs, forward and "
              f"backward) at {floor['gemm_gflops_peak']:.0f} GFLOP/s (1024^3 sgemm, "
              f"{args.threads} threads) = {floor['floor_s']:.3f} s; at the MLP's own GEMM "
              f"shapes {floor['gemm_gflops_at_mlp_shapes']:.0f} GFLOP/s = "
              f"{floor['floor_at_mlp_shapes_s']:.3f} s")
        print(f"target: fastlib within {floor['target']:.0f}x of the floor: "
              f"{floor['fastlib_over_floor']:.2f}x: "
              f"{_verdict(floor['met'], floor['fastlib_over_floor'], floor['target'])}")
    _print_footer(report, args)


def _print_losses(rows, engines):
    print("mean batch loss of the timed epoch (the engines train the same model from the same "
          "weights):")
    for row in rows:
        print(f"  batch {row['batch_size']}: " +
              ", ".join(f"{e} {row[e + '_loss']:.4f}" for e in engines))


def _print_footer(report, args):
    rows, engines, load = report["results"], report["engines"], report["load_average"]
    for engine, why in report["skipped"].items():
        print(f"{engine}: {why}")
    scaled = [r["batch_size"] for r in rows
              if any(r[f"{e}_steps_measured"] < r["steps_per_epoch"] for e in engines)]
    if scaled:
        print(f"(batch sizes {scaled}: {args.max_steps} steps measured, scaled to a full epoch)")
    print(f"load average at the end {load['end']}")
    busiest = max([r["load_1min"] or 0 for r in rows] + [(load["start"] or [0])[0]])
    cpus = os.cpu_count() or 1
    if busiest > cpus:
        print(f"note: the machine was loaded (1-minute load up to {busiest} on {cpus} CPUs): "
              "threads wait for cores, and the figures measure that contention as much as "
              "the engines; measure on an idle machine")


def _print_cuda_table(report, args):
    """``--device cuda``: every engine's s/epoch, its ratio to PyTorch CUDA eager, the mean
    losses, and fastlib-cuda's device counters per step beside its time."""
    engines = report["engines"]
    columns = [e for e in CUDA_ENGINES if e in engines or e in report["skipped"]]
    columns += [e for e in engines if e not in columns]
    load = report["load_average"]
    print(f"verigrad bench train --device cuda --model {report['model_name']}: "
          f"{report['model']}; {report['data']}; {report['samples']} samples per epoch; CPU "
          f"engine on {args.threads} threads; median of {args.repeats} interleaved runs; load "
          f"average at start {load['start']}")
    print("\n".join(environment.header_lines(report["environment"])))
    print("protocol: every engine trains two epochs from the same weights over the same sample "
          "orders; the first warms up (kernels compiled, CUDA graphs recorded), the second is "
          "timed whole; losses and counts are the timed epoch's")
    if report["simulator"]:
        print("note: numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), not a GPU: the timings "
              "measure Python; only the losses and the counts mean anything")
    base = CUDA_BASELINE
    ratio_cols = [e for e in columns if e != base]
    heads = [e + " s/epoch" for e in columns] + [e + "/" + base for e in ratio_cols]
    widths = [max(len(h), 17) for h in heads]
    print(f"{'batch':>6}" + "".join(f"  {h:>{w}}" for h, w in zip(heads, widths)) + "  load")
    for row in report["results"]:
        cells = [_cell(row, e, report) for e in columns]
        for e in ratio_cols:
            ratio = row.get(f"{e}_over_{base}")
            cells.append(f"{ratio:.2f}" if ratio is not None else (
                _short(report["skipped"][base]) if base in report["skipped"] else "-"))
        load = row["load_1min"] if row["load_1min"] is not None else "?"
        print(f"{row['batch_size']:>6}" + "".join(f"  {c:>{w}}" for c, w in zip(cells, widths))
              + f"  {load:>4}")
    _print_losses(report["results"], engines)
    for row in report["results"]:
        for e in engines:
            if f"{e}_device" in row:
                print(f"  batch {row['batch_size']}: {e}: {counters_line(row[e + '_device'])}")
    if report.get("profile"):
        print_profile(report["profile"], report["simulator"])
    _print_footer(report, args)


def _short(why):
    """The skipped engine's reason as a table cell: "torch has no CUDA" and the like."""
    return why.split(" (")[0].split(";")[0]


def _cell(row, engine, report):
    if engine in row:
        return f"{row[engine]:.3f}"
    return _short(report["skipped"].get(engine, "not run"))


def counters_line(device):
    """fastlib-cuda's mode and per-step counts as one line (or the note saying there are none).

    Parameters
    ----------
    device : dict
        ``Run.device``: ``cuda_mode``, ``cuda_graph_reason``, ``device_counts`` (per-step
        means, plus ``per_epoch``) and ``run_counts``.
    """
    mode = device.get("cuda_mode") or "not reported"
    if device.get("cuda_graph_reason"):
        mode += f" (not graphs: {device['cuda_graph_reason']})"
    counts = device.get("device_counts")
    if not counts:
        return f"mode {mode}; counters: {device.get('note', 'none reported')}"
    per_step = ", ".join(f"{k} {_num(counts[k])}" for k in COUNTER_KEYS if k in counts)
    text = f"mode {mode}; per step: {per_step}"
    per_epoch = counts.get("per_epoch")
    if isinstance(per_epoch, dict):
        text += "; per epoch: " + ", ".join(
            f"{k} {_num(per_epoch[k])}" for k in COUNTER_KEYS if k in per_epoch)
    return text


def _num(value):
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)
