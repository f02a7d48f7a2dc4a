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


def run(args) -> int:
    """Run the chosen suite and return its exit code."""
    return int(_suite_module(args._suite).run(args) or 0)
