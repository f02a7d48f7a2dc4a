"""Tables and lines for the terminal: the Markdown pipe layout, at most 100 columns, no escapes.

A cell too wide for its share of the line wraps onto continuation lines (the other cells of
those lines left blank), so a row's first line still reads ``| name | ... |``. Unlike
``reports.render.markdown.format_table`` (for .md files) nothing is escaped: ``|x|`` prints as
written.
"""
from __future__ import annotations

import textwrap

__all__ = ["terminal_table", "wrap", "WIDTH"]

WIDTH = 100
MIN_COLUMN = 6   # a column is never squeezed below this many characters


def _fit(widths, limit, keep=(), shortest=None):
    """Column widths that fit ``limit``, each at least its ``shortest`` (its longest word, so
    that no word is cut) where the room allows.

    Every column starts at its shortest width (``keep``: its natural one) and the room left is
    shared out toward the natural widths, the smallest needs first. Where even the shortest
    widths do not fit, they are water-filled: a column whose shortest width is within an equal
    share of the room keeps it, and the columns with longer words share what is left (only
    their words are cut).
    """
    room = limit - 3 * len(widths) - 1
    if sum(widths) <= room:
        return list(widths)
    shortest = [MIN_COLUMN] * len(widths) if shortest is None else shortest
    start = [widths[i] if i in keep else min(widths[i], max(MIN_COLUMN, shortest[i]))
             for i in range(len(widths))]
    if sum(start) > room:
        fitted = [start[i] if i in keep else None for i in range(len(widths))]
        room -= sum(start[i] for i in keep)
        open_ = sorted((i for i in range(len(widths)) if i not in keep), key=lambda i: start[i])
        while open_:
            share = room // len(open_)
            if start[open_[0]] > share:
                for i in open_:
                    fitted[i] = max(MIN_COLUMN, share)
                break
            i = open_.pop(0)
            fitted[i] = start[i]
            room -= start[i]
        start = fitted
    return _share(start, widths, limit - 3 * len(widths) - 1 - sum(start))


def _share(fitted, widths, spare):
    """``fitted`` widened toward ``widths`` by ``spare`` columns, the smallest needs first."""
    fitted = list(fitted)
    open_ = sorted((i for i in range(len(widths)) if fitted[i] < widths[i]),
                   key=lambda i: widths[i] - fitted[i])
    while open_ and spare > 0:
        share = max(1, spare // len(open_))
        i = open_.pop(0)
        give = min(widths[i] - fitted[i], share, spare)
        fitted[i] += give
        spare -= give
        if fitted[i] < widths[i]:
            open_.append(i)
    return fitted


def _wrap(text, width):
    lines = []
    for paragraph in text.splitlines() or [""]:
        lines += textwrap.wrap(paragraph, width, break_on_hyphens=False,
                               break_long_words=max(map(len, paragraph.split() or [""])) > width
                               ) or [""]
    return lines


def wrap(text, width=WIDTH, indent=""):
    """``text`` broken at spaces into lines of at most ``width`` columns (a word longer than
    that, such as a long path, keeps its own line); continuation lines start with ``indent``."""
    return textwrap.fill(text, width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def terminal_table(headers, rows, width=WIDTH, keep=(0,)):
    """A pipe table of ``headers`` and ``rows`` whose lines are at most ``width`` wide.

    Parameters
    ----------
    headers : sequence of str
    rows : sequence of sequence
        Cells are converted with ``str``.
    width : int
        The longest line allowed (default 100).
    keep : sequence of int
        Columns never wrapped (default: the first, the row's name, so that ``| name |``
        stays greppable).

    Returns
    -------
    str
    """
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    natural = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    longest_word = [max(len(w) for r in cells for w in r[i].split() or [""])
                    for i in range(len(headers))]
    widths = _fit(natural, width, tuple(keep), longest_word)
    lines = []
    for k, row in enumerate(cells):
        wrapped = [_wrap(c, w) for c, w in zip(row, widths)]
        for j in range(max(len(w) for w in wrapped)):
            parts = [(w[j] if j < len(w) else "").ljust(wd) for w, wd in zip(wrapped, widths)]
            lines.append("| " + " | ".join(parts) + " |")
        if k == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
