"""Divergence as a monitor of a run: it watches every epoch and, when one blows up, puts back
the last good epoch's weights and optimizer state and says why.

Two things stop a run: a batch whose loss is not finite (the epoch ends there) and, after an
epoch whose loss is finite, a rule of :class:`~fastlib.training.early_stopping.DivergenceRules`
(:func:`~fastlib.training.early_stopping.check_divergence` decides). The probe batch (the first
``PROBE_ROWS`` training samples) gives the untrained loss. The gradient rule reads the loss
gradient of the epoch's last step, which every back-propagation path keeps (no extra pass);
an algorithm whose steps take none (Target Propagation) has it computed on the probe batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fastlib.training import early_stopping
from fastlib.training.algorithms import evaluate_model
from fastlib.training.backends import max_abs
from fastlib.training.early_stopping import DivergenceRules
from fastlib.training.epoch_state import single_threaded_blas
from fastlib.training.notices import warn

__all__ = ["DivergenceMonitor", "Verdict"]

#: the advice when the run's first batch already gives a non-finite loss
_NO_STEP_YET = ("it came before any update, so the learning rate is not the cause: the "
                "starting weights give a non-finite loss on this batch. Check the data's scale "
                "(in a float16 run, any layer output beyond 65504 overflows: scale the data or "
                "train in bfloat16) and the starting weights")


@dataclass(frozen=True)
class Verdict:
    """Why an epoch stops the run: the rule, the words, and the loss its history records."""

    rule: str
    what: str
    loss: float
    advice: str = "lower the learning rate, clip gradients or check the data"


class DivergenceMonitor:
    """Watches one run for divergence (see the module docstring).

    Parameters
    ----------
    rules : DivergenceRules or None
        The rules for a finite loss (None: off; a non-finite loss still stops the run).
    model, algo, loss_type :
        The run's model, algorithm and loss (the probe's loss and gradient).
    data : fastlib.training.run_data.RunData
    backend : HostBackend or DeviceBackend
        Where the weights live (snapshots of the last good epoch, the largest weight).
    """

    def __init__(self, rules, model, algo, loss_type, data, backend):
        self.rules = rules
        self.model, self.algo, self.loss_type = model, algo, loss_type
        self.data, self.backend = data, backend
        self.initial_loss = None    # the untrained model's loss on the probe batch
        self.last_good = None       # (snapshot, epoch) to put back
        self._grad_off = False
        self._scale = None

    def start(self, epoch, initial_loss=None) -> None:
        """Before the first epoch to run: remember the weights after ``epoch`` and measure the
        untrained loss (a fresh run) or take the one a checkpoint kept."""
        self.initial_loss = initial_loss
        self._first_epoch = epoch + 1
        if self.rules is not None and epoch == 0:
            self.initial_loss = self._probe_loss()
        self.accept(epoch)

    def accept(self, epoch) -> None:
        """``epoch`` ended well: its weights are the ones a later divergence puts back."""
        self.last_good = (self.backend.snapshot(), epoch)

    def check(self, epoch, stats, earlier) -> Verdict | None:
        """The verdict on ``epoch`` (its :class:`EpochStats`; ``earlier``: the loss history
        before it), or None when it may stand."""
        if stats.diverged_batch >= 0:
            # recorded as inf, whichever non-finite value it was (the stop reason names it):
            # histories compare equal across paths that overflow alike
            what = (f"non-finite loss ({stats.diverged_loss}) at epoch {epoch}, batch "
                    f"{stats.diverged_batch + 1}")
            if epoch == self._first_epoch and stats.diverged_batch == 0:
                # no step has been taken: the learning rate cannot be the cause
                return Verdict("non_finite_loss", what, math.inf, _NO_STEP_YET)
            return Verdict("non_finite_loss", what, math.inf)
        if self.rules is None:
            return None
        losses = [v for v in earlier if v is not None and math.isfinite(v)]
        if self.initial_loss is not None:
            losses.append(self.initial_loss)
        weight = self.backend.largest_weight()
        grad = None
        if weight is not None and self.rules.max_grad is not None and not self._grad_off:
            # NOTE (speed): the last step's gradient costs nothing; a probe pass cost 30% of
            # a 1024-sequence LSTM epoch (docs/training.md, "Divergence is caught")
            grad = (max_abs(stats.gradient, finite_only=True) if stats.gradient is not None
                    else self._probe_grad_max())
        fired = early_stopping.check_divergence(
            self.rules, stats.loss, min(losses) if losses else None, self.initial_loss, weight,
            grad, self._target_scale())
        if fired is None:
            return None
        rule, why = fired
        return Verdict(rule, f"divergence rule {rule!r} fired after epoch {epoch}: {why}",
                       stats.loss)

    def stop(self, verdict, result) -> None:
        """Put back the last good epoch and record the divergence in ``result`` (the caller
        warns with ``result.stop_reason`` once the epoch is reported)."""
        snap, good_epoch = self.last_good
        self.backend.restore(snap)
        where = ("the initial weights" if good_epoch == 0
                 else f"the weights after epoch {good_epoch}")
        result.diverged = result.stopped = True
        result.restored_epoch = good_epoch
        result.divergence_rule = verdict.rule
        result.stop_reason = (f"{verdict.what}: training stopped and {where} were restored;"
                              f" {verdict.advice}")

    # -- the probe batch -------------------------------------------------------------------------
    # NOTE (speed): the probe's products run on the calling thread. A product of NumPy's
    # multi-threaded OpenBLAS leaves its workers spinning for a while after it returns, and a
    # compiled epoch starting then ran its second piece on a core they held: the MNIST MLP's
    # two-piece epoch took 0.14-0.16 s of 19,200 samples after the untrained-loss probe
    # against 0.08 s without it (docs/performance.md, "What an epoch spends outside its steps")
    def _probe(self):
        k = min(self.data.x.shape[0], DivergenceRules.PROBE_ROWS)
        x = self.data.x[:k]
        if self.data.fmt is not None:     # a mixed run's inputs, as its steps read them
            from fastlib.training.mixed_precision import round_batch

            x = round_batch(x, self.data.fmt)
        return x, None if self.data.y is None else self.data.y[:k]

    def _probe_loss(self):
        """The model's loss on the probe batch (no RNG drawn, no weight changed), or None.

        None when there is no loss to take (an algorithm without targets and without its own
        ``evaluate``) or the evaluation refuses this model: the algorithm's first step then
        reports what is wrong in its own words, and ``loss_growth`` stays off for the run.
        """
        x, y = self._probe()
        if self.algo.evaluate is None and (y is None or self.loss_type is None):
            return None
        evaluate = self.algo.evaluate or evaluate_model
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"), \
                    single_threaded_blas():
                loss = float(evaluate(self.model, x, y, self.loss_type)[0])
        except (ValueError, TypeError, AttributeError, NotImplementedError):
            return None
        return loss if math.isfinite(loss) else None

    def _probe_grad_max(self):
        """The largest magnitude in the loss gradient on the probe batch (None: no loss), for
        an algorithm whose steps report no gradient."""
        if not self.algo.needs_targets or self.loss_type is None:
            return None
        from fastlib.grad import value_and_grad

        x, y = self._probe()
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"), \
                    single_threaded_blas():
                _, grads = value_and_grad(self.model, x, y, self.loss_type)
        except (ValueError, TypeError, NotImplementedError, AttributeError) as exc:
            # a model the loss gradient cannot be taken of (a custom layer or algorithm): the
            # other rules still apply; say so once instead of failing a healthy run
            self._grad_off = True
            warn(f"divergence rule max_grad is off for this run: the loss gradient on the "
                 f"probe batch cannot be computed ({exc})")
            return None
        clear = getattr(self.model, "clear_history", None)
        if clear is not None:   # the probe's saved arrays are not the run's to keep
            clear()
        return max_abs(grads.values(), finite_only=True)

    def _target_scale(self):
        """``max(1, RMS(y))`` for mse (its loss and gradients scale with the targets), else 1."""
        if self._scale is None:
            self._scale = 1.0
            y = self.data.y
            if self.loss_type == "mse" and y is not None and y.size:
                with np.errstate(over="ignore"):
                    rms = float(np.sqrt(np.mean(np.square(y, dtype=np.float64))))
                self._scale = max(1.0, rms) if math.isfinite(rms) else 1.0
        return self._scale
