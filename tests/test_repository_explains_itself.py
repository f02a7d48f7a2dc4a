"""The repository explains itself: short module docstrings, no references a reader cannot open.

A module docstring says what the module is and why in a few lines (at most ``MAX_LINES``) and
points to docs/ for the long story. No file cites an issue number, a seed file or a design
document that lives outside the repository: everything a reader needs is in docs/.
"""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("spec", "reflib", "fastlib", "reports")
MAX_LINES = 12
# Built from pieces so that this file does not cite what it forbids.
CITATIONS = [re.compile(p, re.IGNORECASE) for p in (
    r"\bissues?\s*#?\d+", r"\bseeds/", "DESIGN" + r"\.md", "\u00a7")]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".json"}


def long_docstrings(root, packages=PACKAGES, limit=MAX_LINES):
    """[(relative path, lines)] of module docstrings longer than ``limit`` lines."""
    out = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
            n = len(doc.strip("\n").splitlines()) if doc else 0
            if n > limit:
                out.append((path.relative_to(root).as_posix(), n))
    return out


def _files(root):
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root,
                                capture_output=True, text=True, check=True).stdout.split()
        paths = [root / name for name in listed]
    except (OSError, subprocess.CalledProcessError):          # not a checkout: every file
        paths = [p for p in root.rglob("*") if ".git" not in p.parts]
    return [p for p in paths if p.is_file() and p.suffix in TEXT_SUFFIXES]


def citations(root):
    """["path:line: text"] of every line that cites an issue, a seed file or an outside doc."""
    out = []
    for path in _files(root):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(p.search(line) for p in CITATIONS):
                out.append(f"{path.relative_to(root).as_posix()}:{number}: {line.strip()}")
    return out


def test_module_docstrings_are_short():
    found = long_docstrings(ROOT)
    assert not found, (f"module docstrings over {MAX_LINES} lines (keep what the module is and "
                       f"why; move the rest to docs/ and point there): {found}")


def test_no_file_cites_what_the_reader_does_not_have():
    found = citations(ROOT)
    assert not found, ("describe the behaviour in your own words (docs/) instead of citing an "
                       "issue, a seed file or an outside document:\n" + "\n".join(found))


def test_the_docs_pages_the_docstrings_point_to_exist():
    pointer = re.compile(r"docs/([\w.-]+\.md)(?:, section ``([^`]+)``)?")
    missing = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
            for page, section in pointer.findall(" ".join(doc.split())):
                target = ROOT / "docs" / page
                if not target.exists():
                    missing.append(f"{path.relative_to(ROOT)}: docs/{page}")
                elif section and f"`{section}`" not in target.read_text():
                    missing.append(f"{path.relative_to(ROOT)}: docs/{page} has no `{section}`")
    assert not missing, missing


def test_the_checks_catch_planted_examples(tmp_path):
    pkg = tmp_path / "fastlib"
    pkg.mkdir()
    (pkg / "short.py").write_text('"""One line."""\n')
    (pkg / "long.py").write_text('"""Title.\n' + "more\n" * 12 + '"""\n')
    assert long_docstrings(tmp_path, ("fastlib",)) == [("fastlib/long.py", 13)]
    issue, seed = "Issue" + " 6", "../shared/see" + "ds/004"
    (tmp_path / "notes.md").write_text(f"as {issue}'s text says\nfine\n")
    (pkg / "cite.py").write_text(f"# see {seed}\nx = 1  # \u00a73\n")
    assert sorted(citations(tmp_path)) == [f"fastlib/cite.py:1: # see {seed}",
                                           "fastlib/cite.py:2: x = 1  # \u00a73",
                                           f"notes.md:1: as {issue}'s text says"]
