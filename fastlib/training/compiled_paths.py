"""Registry of whole-epoch compiled training paths for back-propagation.

Each path recognises the models it can run (``try_run_epoch`` returns ``None`` for any other)
and runs one epoch in compiled code. ``bp`` tries them in registration order and falls back to
the generic per-batch path when none accepts the model. Paths register themselves when their
module is imported; :data:`PATH_MODULES` names the modules ``bp`` imports on first use, so a new
path is one module plus one line here.
"""
from __future__ import annotations

import importlib
from typing import Callable

# The modules that hold compiled paths, imported lazily (Numba kernels compile on first use).
PATH_MODULES = (
    "fastlib.training.fused_mlp",
    "fastlib.training.compiled_recurrent",
    "fastlib.training.compiled_attention",
)

_PATHS: list[tuple[str, Callable]] = []
_loaded = False


def register_compiled_path(name: str, try_run_epoch: Callable) -> None:
    """Register ``try_run_epoch(ctx, x, y, order) -> EpochStats or None`` under ``name``.

    Parameters
    ----------
    name : str
        Short name reported in ``EpochStats.fused_path``-style diagnostics and error messages.
    try_run_epoch : callable
        Runs one epoch and returns its ``EpochStats``, or returns ``None`` (having changed
        nothing) when the model, loss, optimizer or options are outside the path. It takes
        ``ctx`` (the run's ``StepContext``: model, optimizer and its state, rate, clipping),
        the inputs ``x`` in the form its path documents, ``y`` (the targets as
        ``fastlib.losses.validate_targets`` normalised them) and ``order`` (the epoch's
        sample order, None for 0..N-1).
    """
    for i, (existing, _) in enumerate(_PATHS):
        if existing == name:
            _PATHS[i] = (name, try_run_epoch)
            return
    _PATHS.append((name, try_run_epoch))


def compiled_paths() -> list[tuple[str, Callable]]:
    """The registered paths in the order ``bp`` tries them (imports :data:`PATH_MODULES` once)."""
    global _loaded
    if not _loaded:
        for module in PATH_MODULES:
            importlib.import_module(module)
        # NOTE: registration happens at import, and a program may import a path's module
        # before this runs (the attention module before the recurrent one, say); the order
        # of PATH_MODULES decides, so a chain the recurrent path runs never reaches the
        # attention program
        rank = {m: i for i, m in enumerate(PATH_MODULES)}
        _PATHS.sort(key=lambda entry: rank.get(entry[1].__module__, len(rank)))
        _loaded = True
    return list(_PATHS)


def run_compiled_epoch(ctx, x, y, order):
    """Run the epoch in the first compiled path that accepts the model; ``None`` if none does."""
    for _, try_run_epoch in compiled_paths():
        stats = try_run_epoch(ctx, x, y, order)
        if stats is not None:
            return stats
    return None
