"""One grammar for the whole command line, walked flag by flag.

Every subcommand and every flag comes from the parsers themselves (never a hand-written list),
so a flag added tomorrow is held to the same rules: its help renders with its default and
choices, it parses a valid value, a bad value is exit 2 with the subcommand's own usage, and no
shorter spelling is silently taken for it.
"""
from __future__ import annotations

import argparse
import pathlib
import re

import pytest

from reports.cli import build_parser, main
from reports.commands import arguments, reference

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARSER = build_parser()
COMMANDS = [(path[1:], p) for path, p in reference.parsers(PARSER) if len(path) > 1
            and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]
FLAGS = [(path, a) for path, p in COMMANDS for a in reference.options(p)]


def _id(item):
    path, action = item
    return f"{' '.join(path)} {action.option_strings[0]}"


def _parse(argv, capsys):
    """(namespace or None, exit code or None, stderr)."""
    try:
        ns = PARSER.parse_args(argv)
        code = None
    except SystemExit as exc:
        ns, code = None, exc.code
    return ns, code, capsys.readouterr().err


def _valid_value(action):
    """A value the flag must accept (None: it takes none)."""
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return None
    choices = getattr(action, "valid", None) or action.choices
    if choices:
        return str(list(choices)[-1])
    if action.type in (arguments.positive_int, arguments.nonnegative_int):
        return "3"
    if action.type in (arguments.positive_float, arguments.nonnegative_float,
                       arguments.fraction, float):
        return "0.5"
    if action.type is int:
        return "3"
    return "8"   # a name, a path, a width list: parsing accepts it (validation comes later)


def _bad_values(action):
    """Values the parser itself must refuse."""
    if getattr(action, "valid", None) or action.choices:
        yield "no_such_choice"
    if action.type in (arguments.positive_int, arguments.nonnegative_int, int):
        yield "-7"
        yield "1.5"
    if action.type in (arguments.positive_float, arguments.nonnegative_float,
                       arguments.fraction, float):
        yield "nan-ish"
    if action.type in (arguments.positive_int, arguments.positive_float):
        yield "0"


def test_the_walk_covers_every_subcommand():
    walked = {" ".join(path) for path, _ in COMMANDS}
    assert walked == {"conform", "spec", "train", "report", "bench ops", "bench train"}
    assert len(FLAGS) > 60


@pytest.mark.parametrize("path, parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_renders_with_every_default_and_choice(path, parser):
    text = parser.format_help()
    assert max(len(line) for line in text.splitlines()) <= 100
    formatter = parser._get_formatter()
    for action in reference.options(parser):
        line = formatter._get_help_string(action)
        assert "default" in line, (action.option_strings, line)
        for choice in getattr(action, "valid", None) or action.choices or ():
            assert str(choice) in line, (action.option_strings, choice)


@pytest.mark.parametrize("path, action", FLAGS, ids=[_id(f) for f in FLAGS])
def test_every_flag_parses_a_valid_value(path, action, capsys):
    value = _valid_value(action)
    for flag in action.option_strings:
        argv = list(path) + [flag] + ([] if value is None else [value])
        ns, code, err = _parse(argv, capsys)
        assert code is None, (argv, err)
        if value is not None and action.type is None and not getattr(action, "valid", None) \
                and not action.choices and not isinstance(action, arguments.ListAction):
            expected = [value] if action.nargs in ("*", "+") else value
            assert getattr(ns, action.dest) == expected


@pytest.mark.parametrize("path, action", FLAGS, ids=[_id(f) for f in FLAGS])
def test_a_bad_value_is_exit_2_with_the_subcommands_usage(path, action, capsys):
    usage = f"usage: verigrad {' '.join(path)}"
    bad = list(_bad_values(action))
    if _valid_value(action) is None:
        bad.append("=yes")  # a switch given a value
    elif action.nargs not in ("*", "?"):
        bad.append(None)   # the value left out
    for value in bad:
        flag = action.option_strings[0]
        argv = list(path) + ([flag + value] if value == "=yes" else
                             [flag] if value is None else [flag, value])
        _, code, err = _parse(argv, capsys)
        assert code == 2, argv
        assert err.startswith(usage), (argv, err[:200])
        assert "Traceback" not in err


@pytest.mark.parametrize("path, action", FLAGS, ids=[_id(f) for f in FLAGS])
def test_no_prefix_of_a_flag_is_taken_for_it(path, action, capsys):
    parser = dict((tuple(p), q) for p, q in COMMANDS)[tuple(path)]
    names = set(parser.option_names())
    flag = max(action.option_strings, key=len)
    value = _valid_value(action)
    for cut in range(3, len(flag)):
        prefix = flag[:cut]
        if prefix in names or not prefix.startswith("--"):
            continue
        argv = list(path) + [prefix] + ([] if value is None else [value])
        _, code, err = _parse(argv, capsys)
        assert code == 2, argv
        assert f"unrecognized arguments: {prefix}" in err and err.startswith(
            f"usage: verigrad {' '.join(path)}")


@pytest.mark.parametrize("old, new, command", [
    ("--engine", "--engines", ["conform"]), ("--dtype", "--dtypes", ["conform"]),
    ("--only", "--ops", ["bench", "ops"]), ("--repeat", "--repeats", ["bench", "ops"]),
    ("--engine", "--engines", ["report"]),
])
def test_an_old_spelling_names_the_new_one(old, new, command, capsys):
    assert main(command + [old, "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: verigrad {' '.join(command)}")
    assert f"{old} (renamed: use {new})" in err


def test_a_mistyped_flag_gets_a_did_you_mean(capsys):
    assert main(["train", "--optimiser", "Adam"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: verigrad train") and "did you mean '--optimizer'?" in err


def test_lists_take_spaces_or_commas(capsys):
    for argv in (["--engines", "reflib,fastlib", "--dtypes", "float64"],
                 ["--engines", "reflib", "fastlib", "--dtypes", "float64,"]):
        ns, code, _ = _parse(["conform"] + argv, capsys)
        assert code is None and ns.engines == ["reflib", "fastlib"] and ns.dtypes == ["float64"]


def test_progress_is_on_only_on_a_terminal():
    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    ns = argparse.Namespace(progress=None)
    assert arguments.progress_enabled(ns, Stream(True))
    assert not arguments.progress_enabled(ns, Stream(False))
    assert not arguments.progress_enabled(argparse.Namespace(progress=False), Stream(True))
    assert arguments.progress_enabled(argparse.Namespace(progress=True), Stream(False))


def test_version_is_the_distributions(capsys):
    import fastlib

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)
    assert fastlib.__version__ == declared
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"verigrad {declared}"


def test_docs_cli_md_is_the_parsers_reference():
    # rendered in a fresh process: the registries it reads (training algorithms, engines) are
    # process-wide, and other tests in this worker register their own names
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    fresh = subprocess.run([sys.executable, "-m", "reports.commands.reference"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    written = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert written == fresh.stdout, (
        "docs/cli.md is stale: python -m reports.commands.reference > docs/cli.md")
    for path, action in FLAGS:
        assert f"`{action.option_strings[0]}`" in written


# ---------------------------------------------------------------------------------------------
# defaults, shared flags and did-you-mean, walked over every subcommand's flags

@pytest.mark.parametrize("path, action", FLAGS, ids=[_id(f) for f in FLAGS])
def test_every_flag_states_its_real_default_once(path, action):
    # a flag whose parsed default is None says what None means (docs/cli.md shows it), and
    # its help does not state a default of its own beside the table's column
    switch = action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction)
    if action.default is None and not switch:
        assert getattr(action, "default_text", None), (path, action.option_strings)
    assert "(default" not in (action.help or ""), (path, action.option_strings, action.help)
    assert arguments._default_text(action) != "none" or action.option_strings[0] in (
        "--save", "--checkpoint", "--resume", "--plot", "--baseline", "--first"), (
        path, action.option_strings)


def test_a_shared_flag_takes_the_same_form_everywhere():
    def form(action):
        return (type(action).__name__, action.metavar, action.nargs, action.type,
                getattr(action, "convert", None), action.choices is None)

    for flag, uses in reference.shared_flags(PARSER).items():
        assert uses, f"{flag} is in reference.SHARED but no subcommand takes it"
        forms = {form(action) for _, action in uses}
        assert len(forms) == 1, (flag, [(" ".join(p), form(a)) for p, a in uses])
    # the reference says where each is taken
    written = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for flag, uses in reference.shared_flags(PARSER).items():
        row = next(line for line in written.splitlines() if line.startswith(f"| `{flag}` |"))
        for path, _ in uses:
            assert f"`{' '.join(path)}`" in row


@pytest.mark.parametrize("path, action", FLAGS, ids=[_id(f) for f in FLAGS])
def test_every_choice_flag_answers_a_misspelling_with_the_choice(path, action, capsys):
    choices = getattr(action, "valid", None) or action.choices
    if not choices:
        return
    flag = action.option_strings[0]
    for choice in [str(c) for c in choices]:
        typo = choice + choice[-1]              # one letter too many
        _, code, err = _parse(list(path) + [flag, typo], capsys)
        assert code == 2 and err.startswith(f"usage: verigrad {' '.join(path)}"), (flag, typo)
        assert f"did you mean {choice!r}?" in err, (flag, typo, err[-300:])


@pytest.mark.parametrize("argv, message", [
    (["train", "--algorithm", "tp"], "did you mean 'targetprop'?"),
    (["conform", "--profile", "fast"], "did you mean 'dev'?"),
    (["bench", "train", "--model", "lstmm"], "did you mean 'lstm'?"),
    (["bench", "train", "--engines", "fastlb"], "did you mean 'fastlib'?"),
    (["bench", "train", "--threads", "abc"], "argument --threads: expects an integer >= 1, "
                                             "got 'abc'"),
    (["bench", "train", "--batch-sizes", "0"], "argument --batch-sizes: expects an integer >= 1, "
                                               "got '0'"),
    (["bench", "ops", "--threads", "abc"], "argument --threads: expects an integer >= 1, "
                                           "got 'abc'"),
])
def test_the_grammar_answers_these_with_usage_and_the_fix(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: verigrad {' '.join(a for a in argv[:2] if a[0] != '-')}")
    assert message in err
    assert err.count("error:") == 1       # one rule, one message


@pytest.mark.parametrize("argv, message", [
    (["train", "--algorithm", "targetprop", "--pieces", "2"],
     "--pieces applies to the compiled epoch of --algorithm bp; --algorithm targetprop has no "
     "piece plan"),
    (["train", "--algorithm", "cd", "--pieces", "2"], "--algorithm cd has no piece plan"),
    (["train", "--cd-k", "3"], "--cd-k applies only with --algorithm cd"),
    (["train", "--patience", "2"], "--patience applies only with --early-stopping"),
    (["train", "--monitor", "acc"], "--monitor applies only with --early-stopping"),
    (["train", "--blocks", "4"], "--blocks applies only with --distributed"),
    (["train", "--clip-mode", "norm"], "--clip-mode applies only with --gradient-clip C > 0"),
    (["train", "--algorithm", "targetprop", "--normalisation", "column"],
     "--normalisation applies only with --pure"),
    (["train", "--data-dir", "."], "--data-dir applies only with --data mnist"),
    (["bench", "train", "--model", "lstm", "--engines", "numpy"],
     "--engines numpy: not an engine of --model lstm; its engines: fastlib, torch, jax"),
    (["bench", "train", "--ranks", "1"], "--ranks applies only with --distributed"),
    (["bench", "train", "--blocks", "4"], "--blocks applies only with --distributed"),
    (["report", "--json", "/nonexistent-folder/r.json"], "--json /nonexistent-folder/r.json: "
                                                         "folder /nonexistent-folder does not "
                                                         "exist"),
])
def test_an_invalid_combination_is_refused_before_any_work(argv, message, capsys,
                                                            monkeypatch):
    # nothing may be loaded or measured: the data loaders and the measurement would raise
    from fastlib import datasets

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the usage error")

    monkeypatch.setattr(datasets, "load_digits", no_work)
    monkeypatch.setattr(datasets, "load_mnist", no_work)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: verigrad") and message in err, err[-400:]
