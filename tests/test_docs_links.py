"""Every relative link of README.md and docs/ resolves: its file exists, and its anchor names a
heading (or an explicit ``<a id>``) of the page it points to.

Links are read from the Markdown itself (inline ``[text](target)``, images, and reference
definitions ``[label]: target``), outside code blocks and inline code; a link to another site
(``http:``, ``https:``, ``mailto:``) is not fetched. Anchors follow GitHub's rule: the heading's
text in lower case, punctuation dropped, spaces as hyphens, a repeated heading suffixed -1, -2.
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md"] + sorted((ROOT / "docs").rglob("*.md"))
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)


def _prose_lines(text):
    """``(line number, line)`` of the lines outside fenced and indented code blocks, with
    inline code spans blanked out. An indented block starts after a blank line whose previous
    non-blank line is not a list item or its continuation (Markdown's rule)."""
    out, fence, code, last = [], None, False, ""
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        if code and (line.startswith("    ") or not line.strip()):
            continue
        code = False
        after_blank = number > 1 and not lines[number - 2].strip()
        if (line.startswith("    ") and line.strip() and after_blank
                and not re.match(r"^\s*([-*+]|\d+[.)])\s", last) and not last[:1].isspace()):
            code = True
            continue
        if line.strip():
            last = line
        out.append((number, re.sub(r"`+[^`]*`+", "``", line)))
    return out


def links(text):
    """``(line number, target)`` of every link of a Markdown text."""
    found = []
    for number, line in _prose_lines(text):
        found += [(number, m.group(1)) for m in INLINE.finditer(line)]
        m = REFERENCE.match(line)
        if m:
            found.append((number, m.group(1)))
    return found


def slug(heading, seen):
    """GitHub's anchor of a heading's text (``seen`` counts the slugs used so far)."""
    text = re.sub(r"<[^>]+>", "", heading)                 # inline HTML
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    base = text.replace(" ", "-")
    count = seen.get(base, 0)
    seen[base] = count + 1
    return base if count == 0 else f"{base}-{count}"


def anchors(text):
    """Every anchor a Markdown page offers: its headings' slugs and explicit ``<a id>``."""
    seen, out = {}, set()
    for _, line in _prose_lines(text):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            out.add(slug(m.group(1).replace("``", ""), seen))
        out |= set(EXPLICIT_ANCHOR.findall(line))
    # inline code in a heading keeps its text in the slug: read the raw heading lines too
    seen = {}
    for line in text.splitlines():
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            out.add(slug(m.group(1), seen))
    return out


def problem(page, target, root=ROOT):
    """Why ``target`` (a link on ``page``, a file of the repository ``root``) does not
    resolve, or None."""
    if EXTERNAL.match(target) or target.startswith("//"):
        return None
    path, _, anchor = target.partition("#")
    dest = (page.parent / unquote(path)).resolve() if path else page
    if not dest.exists():
        shown = dest.relative_to(root) if root in dest.parents else dest
        return f"{target}: {shown} does not exist"
    if root not in dest.parents and dest != root:
        return f"{target}: points outside the repository"
    if anchor:
        if dest.is_dir() or dest.suffix.lower() != ".md":
            return f"{target}: an anchor into a file that is not Markdown"
        if unquote(anchor) not in anchors(dest.read_text(encoding="utf-8")):
            return f"{target}: {dest.name} has no heading with the anchor #{anchor}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page):
    text = page.read_text(encoding="utf-8")
    broken = [f"{page.relative_to(ROOT)}:{number}: {why}" for number, target in links(text)
              for why in [problem(page, target)] if why]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_checker_reads_links_anchors_and_code(tmp_path):
    root = tmp_path.resolve()
    (root / "docs").mkdir()
    (root / "docs" / "b.md").write_text("# The `verigrad` command line\n\n## Files\n\n## Files\n",
                                        encoding="utf-8")
    page = root / "docs" / "a.md"
    text = ("See [b](b.md), [files](b.md#files-1), [cli](b.md#the-verigrad-command-line),\n"
            "![img](missing.png) and [ref].\n\n[ref]: docs/b.md\n\n"
            "`[not a link](nowhere.md)`\n\n```text\n[inside](code.md)\n```\n\n"
            "    [indented](code.md)\n")
    page.write_text(text, encoding="utf-8")
    assert [t for _, t in links(text)] == ["b.md", "b.md#files-1",
                                           "b.md#the-verigrad-command-line", "missing.png",
                                           "docs/b.md"]
    for good in ("b.md", "b.md#files", "b.md#files-1", "b.md#the-verigrad-command-line",
                 "#", "https://example.org/x.md"):
        assert problem(page, good, root) is None, good
    assert "no heading" in problem(page, "b.md#files-2", root)
    assert "does not exist" in problem(page, "missing.png", root)
    assert "does not exist" in problem(page, "docs/b.md", root)   # relative to docs/ itself
    assert problem(page, "../../elsewhere.md", root) is not None
