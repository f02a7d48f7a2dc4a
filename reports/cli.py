"""The ``verigrad`` command line: parse and dispatch, nothing else.

Each subcommand lives in ``reports/commands/<name>.py`` and exposes
``add_arguments(parser)`` and ``run(args) -> int``; this module only wires them up, importing a
subcommand's module when it is chosen so that ``verigrad train`` never pays for SymPy.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# (name, one-line help) in the order `verigrad --help` shows them.
SUBCOMMANDS = (
    ("conform", "hold every engine against the reference and the symbolic spec (the main job)"),
    ("spec", "list the op registry or prove its derivatives"),
    ("train", "train a model with fastlib"),
    ("report", "write gradient-accuracy reports (Markdown, HTML, JSON)"),
    ("bench", "measure fastlib's speed against NumPy and PyTorch"),
)


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with one sub-parser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="verigrad",
        description="verigrad: a verified-reference autograd (spec, reflib, fastlib, reports).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in SUBCOMMANDS:
        module = importlib.import_module(f"reports.commands.{name}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``verigrad`` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from fastlib.errors import CheckpointLockedError, CorruptFileError

    try:
        return int(args._module.run(args) or 0)
    except (CorruptFileError, CheckpointLockedError, FileNotFoundError, PermissionError,
            IsADirectoryError, NotADirectoryError) as exc:
        # a file the user named cannot be used: a message, not a traceback
        print(f"verigrad {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
