"""Every code block of README.md and docs/*.md runs, and every shown output is what its
command prints; both are read from the Markdown itself, so an example cannot drift.

- fenced ``python`` blocks run as scripts in a fresh interpreter, in a temporary working
  directory, with the repository on ``PYTHONPATH``;
- fenced ``sh`` / ``shell`` / ``bash`` / ``console`` and indented blocks are shell: each line
  that starts with ``verigrad`` (or ``$ verigrad``) runs as ``python -m reports ...`` in such a
  directory, beside a ``../shared`` that points at the repository's; it must exit 0;
- a fenced ``text`` block right after such a shell block (blank lines between)
  is its output, and so is a ``text`` block under ``<!-- output: verigrad ... -->``: it is
  compared with what the command printed by ``doc_outputs.mismatch`` (``...`` masks);
- ``<!-- norun: reason -->`` before a block: not run here (the reason says why, or which test
  runs it); ``<!-- slow: reason -->``: runs under ``pytest -m slow``. Whatever the marker, every
  ``verigrad`` line is parsed by the real parser and every python block is compiled.

Each distinct command runs once per test process, however many blocks show it.
"""
from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from doc_outputs import WIDTH, mismatch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SHELL_TAGS = {"sh", "shell", "bash", "console"}
MARKER = re.compile(r"^\s*<!--\s*(norun|slow|output)\s*:\s*(.*?)\s*-->\s*$")
OUTPUT_TAGS = {"text"}
ANY_MARKER = re.compile(r"^\s*<!--\s*([A-Za-z_-]+)\s*:")
TIMEOUT = {"python": 300, "shell": 900}   # seconds per block; a hang fails instead of stalling


@dataclass(frozen=True)
class Block:
    """One code block: where it is, its language, its text and its marker."""

    path: Path
    line: int            # 1-based line of the block's first code line
    lang: str            # "python", "shell" or "" (not code)
    text: str
    marker: str | None   # None, "norun", "slow" or "output"
    reason: str          # the marker's text (for "output": the command that prints it)
    bad_marker: str | None = None   # an HTML comment that looks like a marker but is not one
    tag: str = ""        # a fenced block's tag as written ("text", "python", ...)
    end: int = 0         # 1-based line just after the block (its closing fence included)

    @property
    def name(self):
        return f"{self.path.name}:{self.line}"


def _is_list_or_continuation(line: str) -> bool:
    return bool(re.match(r"^\s*([-*+]|\d+[.)])\s", line)) or line[:1].isspace()


def extract(text: str, path: Path = Path("doc.md")) -> list[Block]:
    """The code blocks of a Markdown text (fenced and indented), with their markers.

    An indented block must follow a blank line whose previous non-blank line is not a list
    item or its continuation (Markdown reads those as part of the list); a marker is the
    nearest non-blank line above the block (above its fence, or above the blank line).
    """
    lines = text.splitlines()
    blocks, i = [], 0

    def marker_above(index):
        j = index - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j < 0:
            return None, "", None
        m = MARKER.match(lines[j])
        if m:
            return m.group(1), m.group(2), None
        other = ANY_MARKER.match(lines[j])
        return None, "", (lines[j].strip() if other else None)

    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)", line)
        if fence:
            close = fence.group(1)
            tag = fence.group(2).lower()
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith(close):
                j += 1
            body = "\n".join(lines[i + 1:j]) + "\n"
            lang = "python" if tag == "python" else "shell" if tag in SHELL_TAGS else ""
            marker, reason, bad = marker_above(i)
            blocks.append(Block(path, i + 2, lang, body, marker, reason, bad, tag, j + 2))
            i = j + 1
            continue
        starts_block = (line.startswith("    ") and line.strip() and i > 0
                        and not lines[i - 1].strip())
        if starts_block:
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            if k >= 0 and _is_list_or_continuation(lines[k]) and not MARKER.match(lines[k]):
                starts_block = False
        if starts_block:
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            while not lines[j - 1].strip():
                j -= 1
            body = textwrap.dedent("\n".join(lines[i:j])) + "\n"
            marker, reason, bad = marker_above(i)
            blocks.append(Block(path, i + 1, "shell", body, marker, reason, bad, "", j + 1))
            i = j
            continue
        i += 1
    return blocks


def _all_blocks():
    out = []
    for path in DOCS:
        out.extend(b for b in extract(path.read_text(encoding="utf-8"), path) if b.lang)
    return out


BLOCKS = _all_blocks()
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _is_verigrad(line: str) -> bool:
    words = line.split()
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    return bool(words) and words[0] == "verigrad"


def _commands(block: Block) -> list[str]:
    """The ``verigrad`` command lines of a shell block (a leading ``$ `` prompt removed)."""
    out = []
    for line in block.text.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:].strip()
        if _is_verigrad(line):
            out.append(line)
    return out


def _other_commands(block: Block) -> list[str]:
    """Lines of a shell block that are neither ``verigrad`` commands nor blank/comments."""
    lines = [ln.strip() for ln in block.text.splitlines()]
    if any(ln.startswith("$ ") for ln in lines):
        return []             # a transcript: only its prompted lines are commands
    return [ln for ln in lines if ln and not ln.startswith("#") and not _is_verigrad(ln)]


def _argv(command: str) -> tuple[dict, list[str]]:
    """``({NAME: value}, arguments after "verigrad")`` of a command line."""
    words = shlex.split(command, comments=True)
    env = {}
    while words and ENV_ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words[1:]


@dataclass(frozen=True)
class Output:
    """A shown output: its text, the command lines whose standard output it shows (run in
    order in one folder), and the marker that decides when it is compared."""

    path: Path
    line: int
    text: str
    commands: tuple
    marker: str | None
    reason: str
    shell: str | None = None    # the shell block that prints it (compared where it runs)

    @property
    def name(self):
        return f"{self.path.name}:{self.line}"


def outputs(text: str, path: Path = Path("doc.md")) -> list[Output]:
    """The shown outputs of a Markdown text: a ``text`` block right after a shell block (blank
    lines between), a ``text`` block under ``<!-- output: COMMAND -->``, and the lines after
    each ``$ verigrad`` line of a transcript."""
    lines = text.splitlines()
    blocks = extract(text, path)
    found = []
    for prev, block in zip([None] + blocks, blocks):
        if block.lang == "shell":
            found += _transcript_outputs(block)
            continue
        if block.lang or block.tag not in OUTPUT_TAGS:
            continue
        if block.marker == "output":
            found.append(Output(path, block.line, block.text, (block.reason,), None, ""))
            continue
        fence = block.line - 1
        if (prev is not None and prev.lang == "shell" and _commands(prev)
                and not any(lines[k].strip() for k in range(prev.end - 1, fence - 1))):
            found.append(Output(path, block.line, block.text, tuple(_commands(prev)),
                                prev.marker, prev.reason, prev.name))
    return found


def _transcript_outputs(block: Block) -> list[Output]:
    out, command, shown, first = [], None, [], 0
    for offset, line in enumerate(block.text.splitlines() + ["$ "]):
        if line.startswith("$ "):
            if command is not None and any(s.strip() for s in shown):
                out.append(Output(block.path, block.line + first, "\n".join(shown) + "\n",
                                  (command,), block.marker, block.reason))
            command, shown, first = line[2:].strip(), [], offset + 1
            command = command if _is_verigrad(command) else None
        else:
            shown.append(line)
    return out


OUTPUTS = [o for path in DOCS for o in outputs(path.read_text(encoding="utf-8"), path)]


def _params(kinds):
    params = []
    for block in BLOCKS:
        if block.lang not in kinds or block.marker == "norun":
            continue
        marks = [pytest.mark.slow] if block.marker == "slow" else []
        params.append(pytest.param(block, id=block.name, marks=marks))
    return params


def _workdir(tmp_path: Path) -> Path:
    """A working directory whose ``../shared`` is the repository's (for ../shared/data/mnist)."""
    work = tmp_path / "work"
    work.mkdir()
    shared = (ROOT / ".." / "shared").resolve()
    if shared.exists():
        (tmp_path / "shared").symlink_to(shared, target_is_directory=True)
    return work


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in
                                                       [env.get("PYTHONPATH", "")] if p])
    env.setdefault("MPLBACKEND", "Agg")
    return env


_RUNS: dict = {}


def run_commands(commands) -> list[subprocess.CompletedProcess]:
    """Each command line of ``commands`` run in order in one scratch folder (beside a
    ``../shared``), once per test process: a second block showing the same commands reuses
    the run."""
    commands = tuple(commands)
    if commands not in _RUNS:
        base = Path(tempfile.mkdtemp(prefix="verigrad-docs-"))
        atexit.register(shutil.rmtree, base, True)
        work, done = _workdir(base), []
        for command in commands:
            env, argv = _argv(command)
            done.append(subprocess.run([sys.executable, "-m", "reports"] + argv, cwd=work,
                                       env={**_env(), **env}, capture_output=True, text=True,
                                       timeout=TIMEOUT["shell"]))
            if done[-1].returncode != 0:
                break
        _RUNS[commands] = done
    return _RUNS[commands]


def _needs_mnist(commands) -> bool:
    return any("--data mnist" in c for c in commands) and not (
        ROOT / ".." / "shared" / "data" / "mnist").is_dir()


# ---------------------------------------------------------------------------------------------
# the extractor itself

SAMPLE = """\
# Title

Text.

    verigrad spec --list

- a list item
    with a continuation that is not code

<!-- norun: needs a GPU -->

    verigrad train --device cuda

```python
print("hi")
```

<!-- slow: a minute -->
```sh
verigrad conform
```

```
a diagram, not code
```

    verigrad spec --list

```text
| op | ... |
...
```

<!-- output: OPENBLAS_CORETYPE=Haswell verigrad bench ops --small -->
```text
WARNING: ...
```

<!-- norun: a transcript -->

    $ verigrad spec --list
    a line
    $ verigrad --version
    verigrad ...
"""


def test_extractor_finds_blocks_markers_and_skips_list_continuations():
    blocks = extract(SAMPLE)
    assert [(b.lang, b.line, b.marker) for b in blocks] == [
        ("shell", 5, None), ("shell", 12, "norun"), ("python", 15, None),
        ("shell", 20, "slow"), ("", 24, None), ("shell", 27, None), ("", 30, None),
        ("", 36, "output"), ("shell", 41, "norun")]
    assert blocks[1].reason == "needs a GPU"
    assert blocks[2].text == 'print("hi")\n'
    assert _commands(blocks[0]) == ["verigrad spec --list"]
    assert [(o.line, o.commands, o.marker) for o in outputs(SAMPLE)] == [
        (30, ("verigrad spec --list",), None),
        (36, ("OPENBLAS_CORETYPE=Haswell verigrad bench ops --small",), None),
        (42, ("verigrad spec --list",), "norun"), (44, ("verigrad --version",), "norun")]
    assert outputs(SAMPLE)[2].text == "a line\n"
    assert _argv("A=1 B=x verigrad bench ops") == ({"A": "1", "B": "x"}, ["bench", "ops"])


def test_a_shown_output_matches_only_what_was_printed():
    printed = "| op | 0.51 s |\n| tanh | 1 |\ntotal 3.2 s\n"
    assert mismatch("| op | ... |\n...\ntotal ... s\n", printed) is None
    assert mismatch("| op | 0.51 s |\n| tanh | 1 |\ntotal 3.2 s\n", printed) is None
    assert mismatch("| op | ... |\n...\n", printed) is None
    # a line the command does not print, a line left out without a gap, a changed figure
    assert "shown line 2" in mismatch("| op | ... |\n| relu | 1 |\n...\n", printed)
    assert "printed more lines" in mismatch("| op | ... |\n| tanh | 1 |\n", printed)
    assert "shown line 2" in mismatch("| op | ... |\n| tanh | 2 |\n...\n", printed)
    assert "wider than 100" in mismatch("...\n", "x" * 101 + "\n")


def test_the_docs_have_code_blocks():
    # README and docs/ both hold runnable examples; an extractor that finds none is broken
    assert {b.path.name for b in BLOCKS if b.lang == "python" and b.marker is None} >= {
        "README.md", "departures.md"}
    assert any(b.lang == "shell" for b in BLOCKS)


# ---------------------------------------------------------------------------------------------
# every block: classified, parsed, compiled

@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_every_block_runs_or_says_why_not(block):
    assert block.bad_marker is None, (
        f"{block.name}: {block.bad_marker!r} is not a marker; write <!-- norun: reason --> or "
        "<!-- slow: reason -->")
    if block.marker is not None:
        assert block.reason, f"{block.name}: a {block.marker} marker needs a reason"
    if block.lang == "python":
        compile(block.text, block.name, "exec")     # even a block that does not run must parse
    elif block.marker != "norun":
        others = _other_commands(block)
        assert not others, (f"{block.name}: shell lines that are not `verigrad` commands "
                            f"cannot run here: {others}; mark the block <!-- norun: reason -->")


def test_every_verigrad_line_parses():
    from reports.cli import build_parser

    parser = build_parser()
    failures = []
    shown = [(b.name, c) for b in BLOCKS if b.lang == "shell" for c in _commands(b)]
    shown += [(o.name, c) for o in OUTPUTS for c in o.commands]
    for name, command in shown:
        if True:
            _, argv = _argv(command)
            block_name = name
            try:
                parser.parse_args(argv)
            except SystemExit:
                failures.append(f"{block_name}: {command}")
    assert not failures, "documented commands the CLI refuses:\n" + "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# running them

@pytest.mark.parametrize("block", _params({"python"}))
def test_python_block_runs(block, tmp_path):
    work = _workdir(tmp_path)
    script = work / "example.py"
    script.write_text(block.text, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=work, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT["python"])
    assert proc.returncode == 0, (f"{block.name} failed (exit {proc.returncode}):\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


@pytest.mark.parametrize("block", _params({"shell"}))
def test_shell_block_runs(block):
    commands = _commands(block)
    assert commands, f"{block.name}: a shell block to run holds no verigrad command"
    if _needs_mnist(commands):
        pytest.skip("the block reads MNIST from ../shared/data/mnist, which is absent here (the "
                    "policy of every MNIST test)")
    _assert_shown(commands, [o for o in OUTPUTS if o.shell == block.name], block.name)


def _assert_shown(commands, shown, name):
    """Run ``commands`` (or reuse their run): each exits 0, and prints every output of
    ``shown``."""
    done = run_commands(commands)
    for command, proc in zip(commands, done):
        assert proc.returncode == 0, (f"{name}: `{command}` failed (exit "
                                      f"{proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                      f"{proc.stderr[-3000:]}")
    for out in shown:
        problem = mismatch(out.text, "".join(proc.stdout for proc in done))
        assert problem is None, f"{out.name}: {problem}"


# ---------------------------------------------------------------------------------------------
# the shown outputs

def _output_params():
    """The outputs no shell block test compares (an ``output`` marker's)."""
    params = []
    for out in OUTPUTS:
        if out.marker == "norun" or out.shell is not None:
            continue
        marks = [pytest.mark.slow] if out.marker == "slow" else []
        params.append(pytest.param(out, id=out.name, marks=marks))
    return params


def test_the_readme_shows_what_its_commands_print():
    # the three jobs' outputs are compared in the default run (not only under -m slow), each
    # by the test that runs its shell block
    readme = [o for o in OUTPUTS if o.path.name == "README.md"]
    assert {o.commands[0].split()[1] for o in readme} >= {"conform", "train", "report"}
    assert all(o.marker is None and o.shell for o in readme)
    assert {o.shell for o in OUTPUTS} - {None} <= {b.name for b in BLOCKS}


@pytest.mark.parametrize("out", OUTPUTS, ids=[o.name for o in OUTPUTS])
def test_every_shown_line_fits(out):
    wide = [line for line in out.text.splitlines() if len(line) > WIDTH]
    assert not wide, f"{out.name}: shown lines wider than {WIDTH} columns: {wide}"


@pytest.mark.parametrize("out", _output_params())
def test_shown_output_is_what_the_command_prints(out):
    if _needs_mnist(out.commands):
        pytest.skip("the command reads MNIST from ../shared/data/mnist, which is absent here")
    _assert_shown(out.commands, [out], out.name)
