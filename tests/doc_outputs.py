"""How a shown output in the documentation is compared with what its command printed.

The shown block is the command's standard output, line for line, with one mask: ``...``
inside a line stands for any text (a timing, a path, a figure that depends on the machine),
with the spaces around it (a masked cell pads to its own width), and a line that is only
``...`` for any number of lines left out. Everything else must be printed exactly (trailing
spaces aside), and no printed line may be wider than ``WIDTH``.
"""
from __future__ import annotations

import functools
import re

__all__ = ["WIDTH", "GAP", "line_pattern", "mismatch"]

WIDTH = 100
GAP = "..."


def line_pattern(shown: str) -> re.Pattern:
    """The regular expression a printed line must match to be ``shown`` (``...`` masked)."""
    parts = shown.rstrip().split(GAP)
    last = len(parts) - 1
    parts = [re.escape((p.lstrip(" ") if i else p).rstrip(" ") if i < last else
                       (p.lstrip(" ") if i else p)) for i, p in enumerate(parts)]
    return re.compile("(?:" + " *.*? *".join(parts) + r")\Z")


def mismatch(shown: str, printed: str) -> str | None:
    """None when ``printed`` is what ``shown`` shows; else a message naming the first shown
    line that no printed line matches where it should, beside what was printed.

    Parameters
    ----------
    shown : str
        The block as the documentation shows it (masks included).
    printed : str
        The command's standard output.
    """
    want = [line.rstrip() for line in shown.strip("\n").splitlines()]
    got = [line.rstrip() for line in printed.strip("\n").splitlines()]
    wide = [line for line in got if len(line) > WIDTH]
    if wide:
        return (f"{len(wide)} printed line(s) wider than {WIDTH} columns, the first "
                f"({len(wide[0])}): {wide[0]!r}")
    patterns = [None if w.strip() == GAP else line_pattern(w) for w in want]
    furthest = [0]

    @functools.lru_cache(maxsize=None)
    def fits(i, j):
        furthest[0] = max(furthest[0], i)
        if i == len(want):
            return j == len(got)
        if patterns[i] is None:
            return any(fits(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and bool(patterns[i].match(got[j])) and fits(i + 1, j + 1)

    if fits(0, 0):
        return None
    at = furthest[0]
    where = (f"shown line {at + 1} {want[at]!r} matches no printed line where it should"
             if at < len(want) else "the command printed more lines than the block shows "
                                    "(end the block with a line of ... to leave them out)")
    return f"{where}\n--- shown:\n{shown.rstrip()}\n--- printed:\n{printed.rstrip()}"
