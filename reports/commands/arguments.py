"""The one grammar of the ``verigrad`` command line: its parser class and its shared options.

Every subcommand builds ``--engines``, ``--dtypes``, ``--ops`` (lists take spaces or commas),
``--json FILE``, ``--repeats``, ``--seed``, ``--threads N ...``, ``--device`` and
``--progress/--no-progress`` (bars only on a terminal) from here, so a flag is spelled, parsed
and documented the same way everywhere. :class:`Parser` refuses abbreviations, answers a
mistyped or renamed flag with the subcommand's usage and a did-you-mean, and exits 2 on usage
errors. The reference is docs/cli.md.
"""
from __future__ import annotations

import argparse
import difflib
import sys

import optable.formats

__all__ = ["Parser", "HelpFormatter", "ListAction", "Choices", "LazyChoices", "RENAMED",
           "did_you_mean", "closest", "add_engines", "add_dtypes", "add_ops", "add_json",
           "add_repeats", "add_seed", "add_progress", "add_thread_counts",
           "add_device", "progress_enabled", "positive_int", "nonnegative_int",
           "positive_float", "nonnegative_float", "fraction", "DTYPES"]

#: the float formats of the suite (optable.formats: NumPy's float64, float32 and float16, and
#: ml_dtypes' bfloat16)
DTYPES = optable.formats.names()

#: spellings earlier releases used -> the one spelling now (for the did-you-mean of a refusal)
RENAMED = {"--engine": "--engines", "--dtype": "--dtypes", "--only": "--ops",
           "--repeat": "--repeats"}


def closest(word, candidates):
    """The candidate ``word`` most likely meant, or None.

    In order: a hint the choices declare (``Choices(..., hints={"fast": "dev"})``: a word that
    names a choice by what it does), the same name in another case, the one candidate that
    starts with ``word``, the closest spelling (difflib), else the one candidate ``word``
    abbreviates (its letters in order, the first one first: ``tp`` for ``targetprop``).
    """
    word = str(word)
    names = [str(c) for c in candidates]
    hints = getattr(candidates, "hints", None) or {}
    low = word.lower()
    if low in hints:
        return hints[low]
    for test in (lambda n: n.lower() == low, lambda n: n.lower().startswith(low)):
        found = [n for n in names if test(n)]
        if len(found) == 1:
            return found[0]
    lowered = {n.lower(): n for n in reversed(names)}
    close = difflib.get_close_matches(low, list(lowered), n=1)
    if close:
        return lowered[close[0]]
    found = [n for n in names if _abbreviates(low, n.lower())]
    return found[0] if len(found) == 1 else None


def _abbreviates(word, name):
    """Whether ``word``'s letters appear in ``name`` in order, starting with its first."""
    if not word or not name or word[0] != name[0]:
        return False
    rest = iter(name[1:])
    return all(ch in rest for ch in word[1:])


def did_you_mean(word, candidates) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate (:func:`closest`), or ``""``."""
    close = closest(word, candidates)
    return f" (did you mean {close!r}?)" if close is not None else ""


class Choices(tuple):
    """A flag's choices, with ``hints``: words a user may type for a choice (``{"fast":
    "dev"}``), named by the did-you-mean of a refusal (never accepted in its place)."""

    def __new__(cls, names, hints=None):
        self = super().__new__(cls, names)
        self.hints = dict(hints or {})
        return self


class LazyChoices:
    """Choices read from a registry only when needed (parsing that flag, or rendering help).

    ``verigrad --help`` and the other subcommands never import the registry (``fastlib`` costs
    a second of Numba start-up); membership can ignore case where the registry does.
    """

    def __init__(self, load, ignore_case=False, hints=None):
        self._load = load
        self._names = None
        self.ignore_case = ignore_case
        self.hints = dict(hints or {})

    def names(self):
        if self._names is None:
            self._names = tuple(self._load())
        return self._names

    def __iter__(self):
        return iter(self.names())

    def __len__(self):
        return len(self.names())

    def __contains__(self, value):
        if self.ignore_case and isinstance(value, str):
            return value.lower() in (n.lower() for n in self.names())
        return value in self.names()


class HelpFormatter(argparse.HelpFormatter):
    """Help lines that always end with the flag's choices and default."""

    def __init__(self, prog, **kwargs):
        kwargs.setdefault("max_help_position", 30)
        kwargs.setdefault("width", 100)
        super().__init__(prog, **kwargs)

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or text == argparse.SUPPRESS
                or action.default == argparse.SUPPRESS):   # --help, --version
            return text
        choices = getattr(action, "valid", None) or action.choices
        if choices and "choices:" not in text:
            text += f" (choices: {', '.join(map(str, choices))})"
        if "default" not in text:
            text += f" (default: {_default_text(action)})"
        return text.replace("%", "%%")

    def _metavar_formatter(self, action, default_metavar):
        # a metavar, never the list of choices (the help line lists them)
        if action.metavar is None and action.choices is not None:
            return super()._metavar_formatter(
                argparse.Action(action.option_strings, action.dest,
                                metavar=action.dest.upper()), default_metavar)
        return super()._metavar_formatter(action, default_metavar)


def _default_text(action):
    stated = getattr(action, "default_text", None)
    if stated is not None:
        return stated
    default = action.default
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if default else ("only when stderr is a terminal" if default is None
                                     else "off")
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if default is False else "on"
    if default is None:
        return "none"
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` without abbreviations whose errors name the fix.

    A refusal prints this (sub)command's usage, the problem, and for an unknown flag the
    closest flag of this command (or the new spelling of a renamed one); exit status 2.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, default_text=None, **kwargs):
        """``ArgumentParser.add_argument``, plus ``default_text``: what a default of None
        means (``"both"``, ``"one per usable core"``), shown in the help and docs/cli.md."""
        action = super().add_argument(*args, **kwargs)
        action.default_text = default_text
        return action

    def option_names(self):
        """Every flag this parser takes (not its subcommands')."""
        return [o for a in self._actions for o in a.option_strings]

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        # an unknown flag is refused by the innermost parser that saw it, with its usage
        # (argparse would hand it up to the top-level parser and print that usage)
        if extras and self._subparsers is None:
            self.error(self.unknown_message(extras))
        return namespace, extras

    def unknown_message(self, extras):
        """The refusal of the arguments in ``extras``, each flag with its closest spelling."""
        parts = []
        names = self.option_names()
        for word in extras:
            flag = word.split("=", 1)[0]
            hint = ""
            if flag.startswith("-"):
                renamed = RENAMED.get(flag)
                if renamed in names:
                    hint = f" (renamed: use {renamed})"
                else:
                    hint = did_you_mean(flag, names)
            parts.append(f"{word}{hint}")
        return f"unrecognized arguments: {' '.join(parts)}"

    def _check_value(self, action, value):
        choices = action.choices
        if choices is not None and value not in choices:
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{did_you_mean(value, choices)} "
                        f"(choose from {', '.join(map(str, choices))})")

    def usage_error(self, message) -> int:
        """Print the usage and ``message`` like a parse error, and return 2 (no exit)."""
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        return 2


class ListAction(argparse.Action):
    """``nargs="+"`` whose values may also be comma-separated: ``--engines a,b c``.

    ``valid`` (a sequence or :class:`LazyChoices`) checks every name as it is parsed; None
    leaves the check to the command (names that need a registry lookup, or plugins).
    ``convert`` turns each item into its value (``positive_int`` for counts; an
    ``ArgumentTypeError`` refuses it); ``unique`` refuses an item given twice (else the
    repeat is dropped).
    """

    def __init__(self, option_strings, dest, valid=None, convert=None, unique=False,
                 **kwargs):
        kwargs.setdefault("nargs", "+")
        super().__init__(option_strings, dest, **kwargs)
        self.valid = valid
        self.convert = convert
        self.unique = unique

    def __call__(self, parser, namespace, values, option_string=None):
        names = [part.strip() for v in values for part in str(v).split(",") if part.strip()]
        if not names:
            raise argparse.ArgumentError(self, "expects at least one name")
        if self.valid is not None:
            for name in names:
                if name not in self.valid:
                    raise argparse.ArgumentError(
                        self, f"invalid choice: {name!r}{did_you_mean(name, self.valid)} "
                              f"(choose from {', '.join(map(str, self.valid))})")
        if self.convert is not None:
            try:
                names = [self.convert(name) for name in names]
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(self, str(exc)) from None
        if self.unique and len(set(names)) != len(names):
            repeated = next(n for n in names if names.count(n) > 1)
            raise argparse.ArgumentError(self, f"{repeated} is given twice; give each once")
        setattr(namespace, self.dest, list(dict.fromkeys(names)))


# -- value types: a bad value is a parse error (exit 2, the subcommand's usage) ---------------

def _number(kind, text, test, what):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects {what}, got {text!r}") from None
    if not test(value):
        raise argparse.ArgumentTypeError(f"expects {what}, got {text!r}")
    return value


def positive_int(text):
    """An integer >= 1."""
    return _number(int, text, lambda v: v >= 1, "an integer >= 1")


def nonnegative_int(text):
    """An integer >= 0."""
    return _number(int, text, lambda v: v >= 0, "an integer >= 0")


def positive_float(text):
    """A finite number > 0."""
    return _number(float, text, lambda v: 0 < v < float("inf"), "a finite number > 0")


def nonnegative_float(text):
    """A finite number >= 0."""
    return _number(float, text, lambda v: 0 <= v < float("inf"), "a finite number >= 0")


def fraction(text):
    """A number in [0, 1)."""
    return _number(float, text, lambda v: 0 <= v < 1, "a number in [0, 1)")


positive_int.__name__ = "integer >= 1"
nonnegative_int.__name__ = "integer >= 0"


# -- the shared options -----------------------------------------------------------------------

def add_engines(parser, help, default=None, valid=None, default_text=None):
    """``--engines NAME...``: engines by registered name (or plugin), spaces or commas."""
    parser.add_argument("--engines", action=ListAction, metavar="NAME", default=default,
                        valid=valid, help=help, default_text=default_text)


def add_dtypes(parser, default=None, help="dtypes to use: float32 float64 bfloat16 float16",
               default_text=None):
    """``--dtypes DTYPE...``: float formats of the suite (``DTYPES``)."""
    parser.add_argument("--dtypes", action=ListAction, metavar="DTYPE", valid=DTYPES,
                        default=default, help=help, default_text=default_text)


def add_ops(parser, help, valid=None, default_text="all"):
    """``--ops NAME...``: only these ops (or the subcommand's other subjects)."""
    parser.add_argument("--ops", action=ListAction, metavar="NAME", default=None, valid=valid,
                        help=help, default_text=default_text)


def add_json(parser, help="also write the results as JSON to FILE"):
    """``--json FILE``: write JSON to FILE (checked writable before any work)."""
    parser.add_argument("--json", metavar="FILE", default=None, help=help,
                        default_text="none (the table only)")


def add_repeats(parser, default, help, default_text=None):
    """``--repeats N``: an integer >= 1."""
    parser.add_argument("--repeats", type=positive_int, metavar="N", default=default, help=help,
                        default_text=default_text)


def add_seed(parser, help, default=0):
    """``--seed N``: an integer >= 0."""
    parser.add_argument("--seed", type=nonnegative_int, metavar="N", default=default, help=help)


def add_thread_counts(parser, help, default=None, default_text=None):
    """``--threads N ...``: one or more thread counts (spaces or commas), each an integer >= 1
    and each once; the benchmarks measure each count (several: each in its own process)."""
    parser.add_argument("--threads", action=ListAction, convert=positive_int, unique=True,
                        metavar="N", default=default, help=help, default_text=default_text)


def add_workers(parser, help, default=None, default_text=None):
    """``--workers N``: processes to spread the work over, an integer >= 1."""
    parser.add_argument("--workers", type=positive_int, metavar="N", default=default, help=help,
                        default_text=default_text)


def add_device(parser, help="where to run: cpu, or cuda (a GPU; refused at once without one)"):
    """``--device cpu|cuda``; ``cuda`` without a GPU is refused before any work."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help=help)


def add_progress(parser, what="progress bar"):
    """``--progress/--no-progress``: default on only when stderr is a terminal."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help=f"show the {what} on stderr")


def progress_enabled(args, stream=None) -> bool:
    """Whether to draw progress: ``--progress`` / ``--no-progress``, else stderr is a terminal."""
    chosen = getattr(args, "progress", None)
    if chosen is not None:
        return bool(chosen)
    stream = stream if stream is not None else sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def cuda_problem(args) -> str | None:
    """Why ``--device cuda`` cannot run here (fastlib.cuda's own reason), or None."""
    if getattr(args, "device", "cpu") != "cuda":
        return None
    from fastlib.cuda import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        return None
    return f"--device cuda: no usable GPU here: {reason}; pass --device cpu"
