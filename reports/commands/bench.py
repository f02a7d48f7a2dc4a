"""`verigrad bench ops|train`: dispatch to the benchmark suite in ``reports/bench/<suite>.py``."""
from __future__ import annotations

import importlib

from reports.bench import SUITES


def add_arguments(parser):
    """One sub-parser per suite, each filled in by its own module."""
    sub = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for name in SUITES:
        p = sub.add_parser(name, help=f"benchmark suite '{name}'")
        p.set_defaults(_suite=name)
        _suite_module(name).add_arguments(p)


def _suite_module(name):
    return importlib.import_module(f"reports.bench.{name}")


def _check_paths(args):
    """The paths a suite was given, checked before any timing (None: all fine)."""
    import sys

    from reports.commands import checks

    problems = []
    if isinstance(getattr(args, "json", None), str):
        problems.append(checks.writable_file(args.json, "--json"))
    if getattr(args, "data_dir", None):
        problems.append(checks.existing_dir(args.data_dir, "--data-dir"))
    problem = next((p for p in problems if p), None)
    if problem:
        print(f"verigrad bench {args._suite}: {problem}", file=sys.stderr)
    return problem


def run(args) -> int:
    """Run the chosen suite and return its exit code (2 for a path that cannot be used)."""
    if _check_paths(args):
        return 2
    return int(_suite_module(args._suite).run(args) or 0)
