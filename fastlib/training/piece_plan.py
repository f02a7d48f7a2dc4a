"""The piece plan of a compiled training run: how many pieces each step's work is cut into.

Each piece runs on one thread with single-threaded BLAS, and every summation order inside a step
is fixed by the shapes and ``P``, never by the thread count: the same plan gives the same bits on
any machine. ``P`` comes from, first match wins: ``train(..., pieces=P)`` / ``verigrad train
--pieces``; ``fastlib.config.PIECES`` (``VERIGRAD_PIECES``); a resumed checkpoint's plan; else
the schedule's choice from the usable cores and the model's size. It is kept in the run's
algorithm state (so checkpoints carry it) and reported as ``TrainingResult.piece_plan``
(docs/architecture.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from fastlib import config

# the key of the plan in the run's algorithm state (``StepContext.state``, checkpointed)
STATE_KEY = "piece_plan"
# no schedule cuts a step finer than this: a plan past it is a typo, not a machine
MAX_PIECES = 4096


@dataclass(frozen=True)
class PiecePlan:
    """A resolved plan: ``pieces`` per step, and where the number came from (``source``)."""

    pieces: int
    source: str

    def to_dict(self) -> dict:
        """``{"pieces": P, "source": ...}``, JSON-able (``TrainingResult.piece_plan``)."""
        return {"pieces": self.pieces, "source": self.source}


def check_pieces(value, where: str) -> int:
    """``value`` as a whole number of pieces in ``[1, MAX_PIECES]``, or a ValueError naming
    ``where`` it came from and the fix."""
    try:
        pieces = int(value)
        whole = float(value) == pieces
    except (TypeError, ValueError):
        whole = False
    if not whole or not 1 <= pieces <= MAX_PIECES:
        raise ValueError(f"{where} must be a whole number of pieces from 1 to {MAX_PIECES}, got "
                         f"{value!r}; leave it unset to let fastlib choose from this machine's "
                         "cores")
    return pieces


def requested_plan(ctx) -> PiecePlan | None:
    """The plan the user or a resumed checkpoint fixed for this run, or None (the schedule
    chooses)."""
    given = ctx.config.extra.get("pieces")
    if given is not None:
        return PiecePlan(check_pieces(given, "pieces"), "argument")
    if config.PIECES is not None:
        return PiecePlan(check_pieces(config.PIECES, "fastlib.config.PIECES (VERIGRAD_PIECES)"),
                         "config")
    saved = ctx.state.get(STATE_KEY)
    if saved is not None:
        return PiecePlan(check_pieces(saved, "the checkpoint's piece plan"), "checkpoint")
    return None


def resolve(ctx, machine_pieces, record=True) -> PiecePlan:
    """This run's plan: the requested one, else ``machine_pieces(cores)`` (the schedule's
    choice for ``cores`` usable cores); recorded in ``ctx.state`` for checkpoints unless
    ``record`` is False (a path that may still decline the model records it with
    :func:`record` once it accepts)."""
    plan = requested_plan(ctx)
    if plan is None:
        plan = PiecePlan(max(1, int(machine_pieces(config.usable_cores()))), "machine")
    if record:
        record_plan(ctx, plan)
    return plan


def record_plan(ctx, plan: PiecePlan) -> None:
    """Keep ``plan`` in the run's algorithm state, which checkpoints save and resume reads."""
    ctx.state[STATE_KEY] = plan.pieces


def piece_threads(pieces: int) -> int:
    """Threads that run ``pieces`` pieces: never more than the pieces, the threads fastlib
    may use (``fastlib.config.num_threads``) or the cores this process may use."""
    return max(1, min(pieces, config.num_threads(), config.usable_cores()))
