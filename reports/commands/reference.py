"""The CLI reference (docs/cli.md), rendered from the parsers themselves so it cannot drift.

    python -m reports.commands.reference > docs/cli.md

``tests/test_cli_grammar.py`` fails when docs/cli.md differs from what this prints.
"""
from __future__ import annotations

import argparse

from reports.commands.arguments import _default_text

INTRO = """\
# The `verigrad` command line

Generated from the parsers by `python -m reports.commands.reference > docs/cli.md` (a test
fails when this file and the parsers disagree); every default below is the parser's own.

One grammar holds in every subcommand:

- lists take spaces or commas: `--engines fastlib torch` or `--engines fastlib,torch`;
- no abbreviations: `--op` is refused, not taken as `--ops`;
- every usage error (an unknown flag, name or value, an impossible device or combination, a
  path that cannot be written) exits with status 2 before any work, printing the subcommand's
  usage and one message per rule broken, with a did-you-mean for a mistyped flag or choice; a
  flag renamed since an earlier release names its new spelling (`--engine` -> `--engines`,
  `--dtype` -> `--dtypes` in `conform`, `--only` -> `--ops`, `--repeat` -> `--repeats`);
- `verigrad --version` prints the version (`fastlib.__version__`).

The flags several subcommands share take the same form and mean the same in each (a test
holds them to it):
"""

#: the shared flags: spelling -> what it means wherever it is taken
SHARED = {
    "--engines": "engines by registered name (or a plugin `module:Class` where engines are "
                 "checked or measured)",
    "--dtypes": "`float32` and/or `float64`",
    "--ops": "only these ops (or the subcommand's other subjects)",
    "--json": "`--json FILE`: also write the results as JSON to FILE (the table is still "
              "printed)",
    "--repeats": "`--repeats N`: rounds per measurement",
    "--seed": "`--seed N`: the same seed draws the same examples (or the same initialisation)",
    "--threads": "`--threads N ...`: thread counts; several measure each in its own process",
    "--device": "`--device cpu|cuda`: cuda without a usable GPU is refused before any work",
    "--progress": "`--progress` / `--no-progress`: progress on stderr, by default only when "
                  "stderr is a terminal (a redirected log never holds carriage-return frames)",
    "--data-dir": "`--data-dir DIR`: the folder with the four MNIST IDX files",
}

EXIT_STATUS = """\
Exit status: 0 done (for `train`, also a run that early stopping or a callback ended); 1 a
check failed (or, for `train`, an error while training); 2 a usage error; 3 `train` stopped
because the run diverged (a non-finite loss or a divergence rule: the table keeps the epochs
it ran, `stopped:` says why, the last good weights are scored and saved).
"""


def shared_flags(parser):
    """``{flag: [(command path, action)]}`` of the :data:`SHARED` flags, every subcommand."""
    found = {flag: [] for flag in SHARED}
    for path, p in parsers(parser):
        for action in options(p):
            if action.option_strings[0] in found:
                found[action.option_strings[0]].append((path[1:], action))
    return found


def _grammar_table(parser):
    lines = ["| flag | means | taken by |", "|---|---|---|"]
    for flag, uses in shared_flags(parser).items():
        where = ", ".join(f"`{' '.join(path)}`" for path, _ in uses)
        lines.append(f"| `{flag}` | {_cell(SHARED[flag])} | {where} |")
    return "\n".join(lines) + "\n"


def parsers(parser, path=("verigrad",)):
    """``(command path, parser)`` for the parser and every subcommand below it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, path + (name,))


def options(parser):
    """The parser's flags (``--help``, ``--version`` and hidden test-only flags apart)."""
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and a.default != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


def _value(action):
    if action.nargs == 0:
        return ""
    metavar = action.metavar or action.dest.upper()
    return f"{metavar} ..." if action.nargs in ("+", "*") else metavar


def _choices(action):
    choices = getattr(action, "valid", None) or action.choices
    return ", ".join(f"`{c}`" for c in choices) if choices else ""


def _cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def render(parser=None) -> str:
    """The whole reference as Markdown."""
    if parser is None:
        from reports.cli import build_parser

        parser = build_parser()
    out = [INTRO, _grammar_table(parser), EXIT_STATUS]
    for path, p in parsers(parser):
        if len(path) == 1:
            continue
        flags = options(p)
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        out.append(f"## `{' '.join(path)}`\n")
        out.append(_cell(p.description or "") + "\n")
        if subs:
            names = ", ".join(f"`{' '.join(path)} {n}`" for n in subs[0].choices)
            out.append(f"Subcommands: {names}.\n")
        if not flags:
            continue
        out.append("| flag | value | default | choices | what it does |")
        out.append("|---|---|---|---|---|")
        for a in flags:
            flag = " / ".join(f"`{o}`" for o in a.option_strings)
            out.append(f"| {flag} | {_cell(_value(a))} | {_cell(_default_text(a))} | "
                       f"{_choices(a)} | {_cell(a.help or '')} |")
        out.append("")
    from reports.commands import environment

    out.append(environment.render())
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
