"""`verigrad conform`: not built yet."""
from __future__ import annotations

import sys


def add_arguments(parser):
    """No options until the subcommand is built."""
    parser.add_argument("rest", nargs="*", help="(not available yet)")


def run(args) -> int:
    """Say in one line that the subcommand is not built yet; exit code 2."""
    print("verigrad conform: not implemented yet (see the open issues)", file=sys.stderr)
    return 2
