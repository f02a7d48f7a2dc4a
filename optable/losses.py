"""The loss names every engine accepts, and the one function that reads a user's loss name.

fastlib and reflib take the same ``loss_type`` strings (DataCode's names, case-insensitive, one
deprecated alias); resolving them is naming, not arithmetic, so it is written here once. Each
engine checks the targets and computes the loss itself.
"""
from __future__ import annotations

import warnings

from optable.layers import close_matches
from optable.table import SIGNATURES

__all__ = ["LOSSES", "LOSS_CODES", "DEPRECATED_ALIASES", "resolve_loss"]

#: The loss ops of the table, in its order.
LOSSES = tuple(s.name for s in SIGNATURES if s.category == "loss")
DEPRECATED_ALIASES = {"sparse_cross_entropy": "cross_entropy"}
#: Each loss's integer code in the engines' compiled kernels: its op's code in the table (the
#: same as ``optable.loss_codes()``).
LOSS_CODES = {s.name: s.code for s in SIGNATURES if s.category == "loss"}


def resolve_loss(name):
    """The canonical loss name for ``name`` (case-insensitive; the deprecated alias warns).

    Parameters
    ----------
    name : str

    Returns
    -------
    str
        One of ``LOSSES``.

    Raises
    ------
    TypeError
        ``name`` is not a string.
    ValueError
        Unknown name; the message lists close matches and every valid name.
    """
    if not isinstance(name, str):
        raise TypeError(f"loss_type must be a name (str), got {name!r}")
    key = name.strip().lower()
    if key in DEPRECATED_ALIASES:
        new = DEPRECATED_ALIASES[key]
        warnings.warn(f"loss_type {name!r} is deprecated; use {new!r} (same class-index "
                      "targets)", DeprecationWarning, stacklevel=3)
        return new
    if key not in LOSSES:
        hint = close_matches(key, LOSSES + tuple(DEPRECATED_ALIASES))
        raise ValueError(f"unknown loss_type {name!r}{hint}; choose one of {list(LOSSES)}")
    return key
