"""`verigrad bench ops|train`: dispatch to the benchmark suite in ``reports/bench/<suite>.py``."""
from __future__ import annotations

import importlib

from reports.bench import SUITES


def add_arguments(parser):
    """One sub-parser per suite, each filled in by its own module."""
    sub = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for name in SUITES:
        p = sub.add_parser(name, help=f"benchmark suite '{name}'",
                           description=f"verigrad bench {name}: benchmark suite '{name}'")
        p.set_defaults(_suite=name, _parser=p)
        _suite_module(name).add_arguments(p)


def _suite_module(name):
    return importlib.import_module(f"reports.bench.{name}")


def validate(args):
    """The paths a suite was given and ``--device cuda``, checked before any timing (None:
    all fine), then the suite's own ``validate`` where it has one."""
    from reports.commands import checks
    from reports.commands.arguments import cuda_problem

    problems = []
    if getattr(args, "json", None):
        problems.append(checks.writable_file(args.json, "--json"))
    if getattr(args, "data_dir", None):
        problems.append(checks.existing_dir(args.data_dir, "--data-dir"))
    if not getattr(args, "allow_simulator", False):
        problems.append(cuda_problem(args))
    own = getattr(_suite_module(args._suite), "validate", None)
    if own is not None:
        problems.append(own(args))
    return next((p for p in problems if p), None)


def run(args) -> int:
    """Run the chosen suite and return its exit code (2 for a usage error)."""
    import sys

    problem = None if getattr(args, "_validated", False) else validate(args)
    if problem:
        print(f"verigrad bench {args._suite}: {problem}", file=sys.stderr)
        return 2
    return int(_suite_module(args._suite).run(args) or 0)
