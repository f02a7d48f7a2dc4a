"""`verigrad bench train`: seconds per training epoch, fastlib against NumPy, PyTorch and JAX.

The long story: docs/reports.md, section ``reports/bench/train.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from reports.bench.models import MODELS, load

TARGETS = {64: 0.4, 1: 6.0}  # the MLP's seconds per epoch: the targets the README reports
RATIO_TARGETS = {"torch": 0.5, "jax": 1.0}  # fastlib / peer at RATIO_BATCH, every model
RATIO_BATCH = 32
FLOOR_BATCH, FLOOR_TARGET = 64, 2.0  # the MLP within 2x of the arithmetic floor at batch 64


def add_arguments(parser):
    """Options of ``verigrad bench train``."""
    from reports.commands import arguments as shared

    a = parser.add_argument
    a("--model", default="mlp", choices=MODELS, help="model to train")
    a("--batch-sizes", default=None,
      help="comma-separated batch sizes (default: the model's, 1,32,64,128 for mlp, "
           "1,32,128 for the others)")
    a("--samples", type=shared.positive_int, default=None,
      help="samples per epoch (default: 60000 for mlp, 1024 sequences for the others)")
    a("--max-steps", type=shared.positive_int, default=6000,
      help="steps measured per case; longer epochs are scaled from them (default 6000)")
    a("--threads", type=shared.positive_int, default=2, help="threads for every engine")
    shared.add_engines(parser, help="engines to run (default: all of the model's: fastlib "
                                    "numpy torch jax for mlp, fastlib torch jax for the others)")
    shared.add_repeats(parser, 3, help="interleaved rounds per batch size; the median is "
                                       "reported")
    a("--data-dir", default=None, help="mlp: MNIST folder (default $VERIGRAD_MNIST_DIR or "
                                       "../shared/data/mnist; random data when absent)")
    shared.add_json(parser, help="also write the results as JSON to FILE (default: none)")
    a("--device", choices=("cpu", "cuda"), default="cpu",
      help="cuda (mlp only): fastlib on the GPU beside the CPU engine and PyTorch CUDA")
    # tests only: let --device cuda run on numba's simulator (tiny sizes; timings meaningless)
    a("--allow-simulator", action="store_true", help=argparse.SUPPRESS)
    a("--distributed", action="store_true",
      help="mlp: data-parallel fastlib under mpiexec at each of --ranks (needs verigrad[mpi])")
    a("--ranks", default="1,2", help="with --distributed: rank counts (default 1,2)")
    a("--blocks", type=shared.positive_int, default=8,
      help="with --distributed: blocks per batch (default 8)")


# ---------------------------------------------------------------------------------------------

def _cuda_engines(args):
    """(engines for --device cuda, None) or (None, the one line saying why nothing runs)."""
    import fastlib.cuda as fc
    from fastlib.cuda import config

    if not fc.is_available():
        return None, ("verigrad bench train --device cuda: no CUDA GPU here (numba.cuda."
                      "is_available() is False); nothing measured")
    if config.SIMULATOR and not args.allow_simulator:
        return None, ("verigrad bench train --device cuda: no GPU here: only numba's CUDA "
                      "simulator (NUMBA_ENABLE_CUDASIM=1), whose timings would measure Python")
    engines = ["fastlib-cuda", "fastlib"]
    try:
        import torch

        if torch.cuda.is_available():
            engines.append("torch-cuda")
    except ImportError:
        pass
    return engines, None


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
    import numba
    from threadpoolctl import threadpool_limits

    jax_pin = _pin_jax_threads(threads) if "jax" in engines else None
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
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


def _options(args):
    """(model module, batch sizes, engines) or an exit code after printing the problem."""
    from reports.commands import checks

    problem = checks.unknown_names([args.model], MODELS, "--model", "model")
    if problem:
        return _error(problem, 2)
    model = load(args.model)
    if args.samples is None:
        args.samples = model.SAMPLES
    if args.batch_sizes is None:
        args.batch_sizes = model.BATCH_SIZES
    if args.model != "mlp" and (args.device == "cuda" or args.distributed):
        option = "--device cuda" if args.device == "cuda" else "--distributed"
        return _error(f"{option} times the mlp model only; drop it or pass --model mlp", 2)
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
        engines = list(args.engines) if args.engines else list(model.CPU_ENGINES)
        bad = [e for e in engines if e not in model.ENGINES]
        if (bad or not sizes or min(sizes) < 1 or args.max_steps < 1 or args.samples < 1
                or args.repeats < 1):
            raise ValueError(f"engines must be among {', '.join(model.CPU_ENGINES)} for "
                             f"--model {args.model} (got {bad}); batch sizes, --samples, "
                             "--max-steps and --repeats must be >= 1")
    except ValueError as exc:
        return _error(exc, 2)
    return model, sizes, engines


def run(args) -> int:
    """Run the benchmark; print a table (or JSON); 0 on success, 1 or 2 on bad options."""
    chosen = _options(args)
    if isinstance(chosen, int):
        return chosen
    model, sizes, engines = chosen
    if args.device == "cuda":
        engines, why = _cuda_engines(args)
        if engines is None:
            print(why)
            return 1
    if getattr(args, "distributed", False):
        from reports.distributed import bench

        return bench.run(args, sizes)
    skipped = {}
    for engine in list(engines):
        why = model.missing(engine)
        if why is None and engine == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                why = "not installed: pip install torch==2.13.0"
        if why:
            engines.remove(engine)
            skipped[engine] = why
            print(f"verigrad bench train: {engine}: {why}; skipping it", file=sys.stderr)
    _, jax_pin = _limit_threads(args.threads, engines)
    load_start = _loadavg()
    x, y, source = model.data(args)
    rows = [_measure(model, engines, x, y, bs, args) for bs in sizes]
    floor = _floor(rows, len(x)) if args.model == "mlp" and args.device == "cpu" else None
    report = {"model": model.DESCRIPTION, "model_name": args.model, "data": source,
              "samples": len(x), "threads": args.threads, "jax_threads": jax_pin,
              "repeats": args.repeats, "engines": engines, "skipped": skipped,
              "load_average": {"start": load_start, "end": _loadavg()}, "results": rows,
              "targets": _targets(rows), "floor": floor}
    _print_table(report, args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return 0


def _measure(model, engines, x, y, bs, args):
    """One batch size: ``--repeats`` interleaved rounds, the engine order rotated each round."""
    row = {"batch_size": bs, "steps_per_epoch": -(-len(x) // bs), "load_1min": None}
    runs = {e: [] for e in engines}
    for r in range(args.repeats):
        k = r % len(engines)
        for engine in engines[k:] + engines[:k]:
            result = model.ENGINES[engine](x, y, bs, args.max_steps)
            runs[engine].append((result.seconds * row["steps_per_epoch"] / result.steps,
                                 result))
    row["load_1min"] = (_loadavg() or [None])[0]
    for engine in engines:
        row[engine] = statistics.median(s for s, _ in runs[engine])
        row[f"{engine}_runs"] = [s for s, _ in runs[engine]]
        row[f"{engine}_steps_measured"] = runs[engine][0][1].steps
        row[f"{engine}_loss"] = statistics.median(res.loss for _, res in runs[engine])
    for engine in engines:
        if engine != "fastlib" and "fastlib" in row:
            row[f"{engine}_over_fastlib"] = row[engine] / row["fastlib"]
            row[f"fastlib_over_{engine}"] = row["fastlib"] / row[engine]
    if args.model == "mlp" and bs in TARGETS and "fastlib" in row:
        row["target_s"] = TARGETS[bs]
        row["meets_target"] = row["fastlib"] < TARGETS[bs]
    return row


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


def _print_table(report, args):
    engines = report["engines"]
    load = report["load_average"]
    print(f"verigrad bench train --model {report['model_name']}: {report['model']}; "
          f"{report['data']}; {report['samples']} samples per epoch; {args.threads} threads; "
          f"median of {args.repeats} interleaved runs; load average at start {load['start']}")
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
    print("mean batch loss of the timed epoch (the engines train the same model from the same "
          "weights):")
    for row in rows:
        print(f"  batch {row['batch_size']}: " +
              ", ".join(f"{e} {row[e + '_loss']:.4f}" for e in engines))
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
