"""The one compiled training path: a model's program, then the first schedule that takes its rows.

Back-propagation on the CPU compiles every model it can to one program of checked instruction
rows (:mod:`fastlib.training.program`). A schedule decides how those rows run as whole
epochs in compiled code; each reads the rows (instruction kinds and their named fields) and
either takes the program, returning its plan, or declines it. They are tried in the order of
:data:`SCHEDULE_MODULES`: ``"mlp"`` (a chain of Dense rows on ``(N, d)`` data, cut into
column pieces), ``"general"`` (the one interpreter of the rows, cut into pieces of samples,
which takes every program). A schedule registers itself when its module is imported, so a
new schedule is one module plus one line here. A model with no program trains in the generic
per-batch loop.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from fastlib import config

# The modules that hold schedules, most specialised first; imported on first use (their Numba
# kernels compile on first call).
SCHEDULE_MODULES = (
    "fastlib.training.mlp_schedule",
    "fastlib.training.general_schedule",
)


class ScheduleError(ValueError):
    """A schedule handed rows it does not run (a schedule's or the builder's bug)."""


@dataclass(frozen=True)
class Schedule:
    """A registered schedule: its ``name``, ``plan_from_program`` and ``run``
    (:func:`register_schedule`)."""

    name: str
    plan_from_program: Callable
    run: Callable


_SCHEDULES: list[Schedule] = []
_loaded = False


def register_schedule(name: str, plan_from_program: Callable, run: Callable) -> None:
    """Register a schedule of the program under ``name`` (replacing one of the same name).

    Parameters
    ----------
    name : str
        Reported as ``TrainingResult.schedule``.
    plan_from_program : callable
        ``plan_from_program(ctx, program, x) -> plan or None``: the schedule's plan read from
        the program's rows (``ctx`` is the run's ``StepContext``, ``x`` the training inputs),
        or None, having recorded nothing, when the rows are not this schedule's. Called once
        per run and sample shape; it resolves and records the run's piece plan
        (``fastlib.training.piece_plan.resolve``) when it takes the program.
    run : callable
        ``run(ctx, plan, x, y, order) -> EpochStats``: one epoch; ``y`` holds the targets as
        ``fastlib.losses.validate_targets`` normalised them and ``order`` the epoch's sample
        order (None for 0..N-1).
    """
    entry = Schedule(name, plan_from_program, run)
    for i, existing in enumerate(_SCHEDULES):
        if existing.name == name:
            _SCHEDULES[i] = entry
            return
    _SCHEDULES.append(entry)


def schedules() -> list[Schedule]:
    """The registered schedules in the order they are tried (imports
    :data:`SCHEDULE_MODULES` once), those ``fastlib.config.SCHEDULES`` allows."""
    global _loaded
    if not _loaded:
        for module in SCHEDULE_MODULES:
            importlib.import_module(module)
        # registration happens at import, and a schedule's module may import another's first;
        # the order of SCHEDULE_MODULES decides
        rank = {m: i for i, m in enumerate(SCHEDULE_MODULES)}
        _SCHEDULES.sort(key=lambda s: rank.get(s.run.__module__, len(rank)))
        _loaded = True
    allowed = config.SCHEDULES
    return [s for s in _SCHEDULES if allowed is None or s.name in allowed]


def schedule_for(ctx, x):
    """``(schedule, plan)`` of this run for inputs ``x``, or None when the model has no
    program or no schedule takes it (decided once per run and sample shape)."""
    from fastlib.training.program import program_for

    key = ("schedule", x.shape[1:], x.dtype.kind, config.SCHEDULES)
    if key not in ctx.scratch:
        chosen = None
        program = program_for(ctx, x)
        if program is not None:
            for schedule in schedules():
                plan = schedule.plan_from_program(ctx, program, x)
                if plan is not None:
                    chosen = (schedule, plan)
                    break
        ctx.scratch[key] = chosen
    return ctx.scratch[key]


def run_compiled_epoch(ctx, x, y, order):
    """Run one epoch of the model's program under its schedule; None (having changed nothing)
    when the model has no program or no schedule takes it.

    ``ctx`` is the run's ``StepContext``; ``x`` the inputs (``(N, d)``, ``(N, T, d)``, or
    ``(N, T)`` token ids for a model that starts with an Embedding) in the model's dtype; ``y``
    the targets as ``fastlib.losses.validate_targets`` normalised them; ``order`` the epoch's
    sample order (None for 0..N-1). The stats' ``schedule`` names the schedule that ran it.
    """
    chosen = schedule_for(ctx, x)
    if chosen is None:
        return None
    schedule, plan = chosen
    return schedule.run(ctx, plan, x, y, order)
