"""``train_sh``'s plateau policy at work in a run: the rate it sets, the best weights it keeps.

The policy itself (:class:`~fastlib.training.early_stopping.PlateauPolicy`) only sees numbers;
this part feeds it the monitored value after each epoch, hands the rate it decides to the run,
keeps a snapshot of the best epoch's weights and puts them back at the end.
"""
from __future__ import annotations

__all__ = ["PlateauRun"]


class PlateauRun:
    """The policy of one ``train_sh`` run.

    Parameters
    ----------
    policy : PlateauPolicy
        A fresh policy (its ``lr`` is set to the run's rate by :meth:`start`) or, after a
        resume, the checkpoint's.
    restore_best : bool
        Put the best epoch's weights back at the end.
    """

    def __init__(self, policy, restore_best):
        self.policy = policy
        self.restore_best = bool(restore_best)
        self.best = None            # a back end's weights-only snapshot of the best epoch
        self.restored = False

    def start(self, lr) -> None:
        """A fresh run starts the policy at the run's learning rate; a ValueError when
        ``min_lr`` lies above it (the floor would be reached at once, or never be a floor)."""
        if self.policy.min_lr > lr:
            raise ValueError(f"min_lr={self.policy.min_lr:g} is above the learning rate "
                             f"{lr:g}: the rate only falls from there, so the first reduction "
                             "would stop the run; pass a min_lr below the learning rate (the "
                             "default is 1e-6)")
        self.policy.lr = lr

    def settings(self) -> dict:
        """The policy's settings (compared when a checkpoint is resumed)."""
        return {k: getattr(self.policy, k) for k in (
            "monitor", "patience", "min_delta", "lr_factor", "stop_patience", "min_lr")}

    def after_epoch(self, ctx, backend, logs, loss_type) -> str | None:
        """Feed the epoch's monitored value; set ``ctx.lr``; the stop reason or None."""
        value = logs[self.policy.monitor]
        if value is None:
            raise ValueError(f"monitor {self.policy.monitor!r} has no value: the loss "
                             f"{loss_type!r} has no accuracy; monitor a loss instead")
        decision = self.policy.step(value)
        if decision.improved and self.restore_best:
            self.best = backend.snapshot(with_state=False)
        ctx.lr = decision.lr
        return decision.reason if decision.stop else None

    def finish(self, backend, result) -> None:
        """Put the best weights back (``restore_best``) and say which epoch they are from."""
        if self.restore_best and self.best is not None:
            backend.restore(self.best)
            self.restored = True
            result.weights_epoch = self.policy.best_epoch
