"""The errors of the engine boundary and the did-you-mean helper their messages use."""
from __future__ import annotations

import difflib


def close_names(name, choices, n=3):
    """Return up to ``n`` names from ``choices`` that look like ``name`` (case-insensitive)."""
    lowered = {str(c).lower(): c for c in choices}
    hits = difflib.get_close_matches(str(name).lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[h] for h in hits]


def did_you_mean(name, choices):
    """A ``"; did you mean 'x' or 'y'?"`` suffix, or ``""`` when nothing is close."""
    hits = close_names(name, choices)
    if not hits:
        return ""
    return "; did you mean " + " or ".join(repr(h) for h in hits) + "?"


class KeyErrorWithMessage(KeyError):
    """A KeyError whose ``str`` is its message (KeyError would wrap it in quotes)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class UnknownOpError(KeyErrorWithMessage):
    """An op name that no engine knows; the message lists close names. The one class of every
    engine (``spec``, ``reflib``, ``fastlib``, ``fastlib.cuda`` re-export it)."""
