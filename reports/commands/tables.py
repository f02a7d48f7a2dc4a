"""Tables for the terminal: the Markdown pipe layout, at most 100 columns, no escapes.

A cell too wide for its share of the line wraps onto continuation lines (the other cells of
those lines left blank), so a row's first line still reads ``| name | ... |``. Unlike
``reports.render.markdown.format_table`` (for .md files) nothing is escaped: ``|x|`` prints as
written.
"""
from __future__ import annotations

import textwrap

__all__ = ["terminal_table", "WIDTH"]

WIDTH = 100
MIN_COLUMN = 6   # a column is never squeezed below this many characters


def _fit(widths, limit, keep=()):
    """Column widths that fit ``limit``: narrow columns keep their width, wide ones share the rest.

    Water-filling: a column no wider than an equal share of the room left keeps its natural
    width; the room it leaves is shared among the others, until every remaining column is
    wider than the share, which each then gets.
    """
    room = limit - 3 * len(widths) - 1
    if sum(widths) <= room:
        return list(widths)
    fitted = [widths[i] if i in keep else None for i in range(len(widths))]
    room -= sum(widths[i] for i in keep)
    open_ = sorted((i for i in range(len(widths)) if i not in keep), key=lambda i: widths[i])
    while open_:
        share = room // len(open_)
        if widths[open_[0]] <= share:
            i = open_.pop(0)
            fitted[i] = widths[i]
            room -= widths[i]
            continue
        for i in open_:
            fitted[i] = max(MIN_COLUMN, share)
        break
    return fitted


def _wrap(text, width):
    lines = []
    for paragraph in text.splitlines() or [""]:
        lines += textwrap.wrap(paragraph, width, break_on_hyphens=False) or [""]
    return lines


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
    widths = _fit(natural, width, tuple(keep))
    lines = []
    for k, row in enumerate(cells):
        wrapped = [_wrap(c, w) for c, w in zip(row, widths)]
        for j in range(max(len(w) for w in wrapped)):
            parts = [(w[j] if j < len(w) else "").ljust(wd) for w, wd in zip(wrapped, widths)]
            lines.append("| " + " | ".join(parts) + " |")
        if k == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
