"""`verigrad bench train`: not built yet."""
import sys


def add_arguments(parser):
    """No options until the suite is built."""


def run(args) -> int:
    """Say in one line that the suite is not built yet; exit code 2."""
    print("verigrad bench train: not implemented yet (see the open issues)", file=sys.stderr)
    return 2
