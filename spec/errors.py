"""Errors raised by ``spec``, each with a message that says what to do."""
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


class _KeyErrorWithMessage(KeyError):
    """A KeyError whose ``str`` is its message (KeyError would wrap it in quotes)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class UnknownOpError(_KeyErrorWithMessage):
    """An op name that is not in ``spec.OPS``; the message lists close names."""


class UnknownOptimizerError(_KeyErrorWithMessage):
    """An optimizer name that is not in ``spec.OPTIMIZERS``; the message lists close names."""


class RegistryError(ValueError):
    """A registry entry (op or optimizer) is malformed; the message says what to fix."""
