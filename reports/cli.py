"""The ``verigrad`` command line: parse, validate and dispatch, nothing else.

Each subcommand lives in ``reports/commands/<name>.py`` and exposes ``add_arguments(parser)``,
optionally ``validate(args) -> str | None`` (every usage error, found before any work), and
``run(args) -> int``. The grammar shared by all of them (spellings, lists, progress, the
parser's refusals) is ``reports/commands/arguments.py``. A subcommand's module is imported when
the parser is built, but its heavy dependencies only when it runs, so that ``verigrad train``
never pays for SymPy.
"""
from __future__ import annotations

import importlib
import os
import sys

from reports.commands.arguments import Parser

# (name, one-line help) in the order `verigrad --help` shows them.
SUBCOMMANDS = (
    ("conform", "hold every engine against the reference and the symbolic spec (the main job)"),
    ("spec", "list the op registry or prove its derivatives"),
    ("train", "train a model with fastlib"),
    ("report", "write gradient-accuracy reports (Markdown, HTML, JSON)"),
    ("bench", "measure fastlib's speed against NumPy and PyTorch"),
)


def version() -> str:
    """The installed distribution's version (``fastlib.__version__``)."""
    import fastlib

    return fastlib.__version__


def build_parser() -> Parser:
    """Build the top-level parser with one sub-parser per subcommand."""
    parser = Parser(
        prog="verigrad",
        description="verigrad: a verified-reference autograd (spec, reflib, fastlib, reports).",
    )
    parser.add_argument("--version", action="version", version=f"verigrad {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in SUBCOMMANDS:
        module = importlib.import_module(f"reports.commands.{name}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_module=module, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``verigrad`` console script; returns the process exit code.

    A usage error (a parse error, or a subcommand's ``validate``) prints the subcommand's
    usage and the problem and returns 2 before any work; ``--help`` and ``--version`` return 0.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    validate = getattr(args._module, "validate", None)
    problem = validate(args) if validate is not None else None
    if problem:
        return args._parser.usage_error(problem)
    args._validated = True
    from fastlib.errors import CheckpointLockedError, CorruptFileError

    try:
        return int(args._module.run(args) or 0)
    except (CorruptFileError, CheckpointLockedError, FileNotFoundError, PermissionError,
            IsADirectoryError, NotADirectoryError) as exc:
        # a file the user named cannot be used: a message, not a traceback
        print(f"verigrad {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        # verigrad's own code returns its exit code; a SystemExit here comes from code it ran
        # (a plug-in engine calling sys.exit): the run did not finish, which must not read as
        # a pass (exit 0 with no table)
        print(f"verigrad {args.command}: error: code the run called (a plug-in engine?) "
              f"raised SystemExit({exc.code!r}) before the run finished; nothing was checked "
              "to the end. An engine should raise an exception, which the suite reports as a "
              "failing row", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (``verigrad spec --list | head``): stop quietly, as cat does;
        # stdout is pointed at devnull so that the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
