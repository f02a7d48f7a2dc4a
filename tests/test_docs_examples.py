"""Every code block of README.md and docs/*.md runs, extracted from the Markdown itself.

So an example can never drift from the code: the blocks are read from the files at test time,
not copied here. What counts as a code block, and how each runs:

- fenced blocks tagged ``python`` run as a script in a fresh interpreter, in a temporary
  working directory (files they write land there), with the repository on ``PYTHONPATH``;
- fenced blocks tagged ``sh`` / ``shell`` / ``bash`` / ``console`` and indented (4-space)
  blocks are shell: every line that starts with ``verigrad`` (or ``$ verigrad``) runs as
  ``python -m reports ...`` in such a directory, beside a ``../shared`` that points at the
  repository's, so the documented ``../shared/data/mnist`` is found; it must exit 0;
- fenced blocks with another tag or none (diagrams, other systems' code) are not code here.

A block that is not meant to run says why in an HTML comment on the line before it (before
the blank line that precedes an indented block): ``<!-- norun: needs a GPU -->``. A block that
runs but takes long says ``<!-- slow: reason -->`` and runs under ``pytest -m slow``. Whatever
the marker, every ``verigrad`` line of every block is parsed by the real command-line parser
(a renamed or removed option fails), and every python block is compiled.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SHELL_TAGS = {"sh", "shell", "bash", "console"}
MARKER = re.compile(r"^\s*<!--\s*(norun|slow)\s*:\s*(.*?)\s*-->\s*$")
ANY_MARKER = re.compile(r"^\s*<!--\s*([A-Za-z_-]+)\s*:")
TIMEOUT = {"python": 300, "shell": 900}   # seconds per block; a hang fails instead of stalling


@dataclass(frozen=True)
class Block:
    """One code block: where it is, its language, its text and its marker."""

    path: Path
    line: int            # 1-based line of the block's first code line
    lang: str            # "python", "shell" or "" (not code)
    text: str
    marker: str | None   # None, "norun" or "slow"
    reason: str
    bad_marker: str | None = None   # an HTML comment that looks like a marker but is not one

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
            blocks.append(Block(path, i + 2, lang, body, marker, reason, bad))
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
            blocks.append(Block(path, i + 1, "shell", body, marker, reason, bad))
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


def _commands(block: Block) -> list[str]:
    """The ``verigrad`` command lines of a shell block (a leading ``$ `` prompt removed)."""
    out = []
    for line in block.text.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:].strip()
        if line == "verigrad" or line.startswith("verigrad "):
            out.append(line)
    return out


def _other_commands(block: Block) -> list[str]:
    """Lines of a shell block that are neither ``verigrad`` commands nor blank/comments."""
    lines = [ln.strip() for ln in block.text.splitlines()]
    if any(ln.startswith("$ ") for ln in lines):
        return []             # a transcript: only its prompted lines are commands
    return [ln for ln in lines if ln and not ln.startswith("#")
            and not (ln == "verigrad" or ln.startswith("verigrad "))]


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
"""


def test_extractor_finds_blocks_markers_and_skips_list_continuations():
    blocks = extract(SAMPLE)
    assert [(b.lang, b.line, b.marker) for b in blocks] == [
        ("shell", 5, None), ("shell", 12, "norun"), ("python", 15, None),
        ("shell", 20, "slow"), ("", 24, None)]
    assert blocks[1].reason == "needs a GPU"
    assert blocks[2].text == 'print("hi")\n'
    assert _commands(blocks[0]) == ["verigrad spec --list"]


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
    for block in BLOCKS:
        if block.lang != "shell":
            continue
        for command in _commands(block):
            argv = shlex.split(command, comments=True)[1:]
            try:
                parser.parse_args(argv)
            except SystemExit:
                failures.append(f"{block.name}: {command}")
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
def test_shell_block_runs(block, tmp_path):
    commands = _commands(block)
    assert commands, f"{block.name}: a shell block to run holds no verigrad command"
    work = _workdir(tmp_path)
    if any("--data mnist" in c for c in commands) and not (work / ".." / "shared" / "data" /
                                                          "mnist").is_dir():
        pytest.skip("the block reads MNIST from ../shared/data/mnist, which is absent here (the "
                    "policy of every MNIST test)")
    for command in commands:
        argv = [sys.executable, "-m", "reports"] + shlex.split(command, comments=True)[1:]
        proc = subprocess.run(argv, cwd=work, env=_env(), capture_output=True, text=True,
                              timeout=TIMEOUT["shell"])
        assert proc.returncode == 0, (f"{block.name}: `{command}` failed (exit "
                                      f"{proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                      f"{proc.stderr[-3000:]}")
