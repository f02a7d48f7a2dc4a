"""The policy of ``train_sh``: early stopping and learning-rate reduction on a plateau.

A pure object: it sees one monitored value per epoch and answers what to do, so it is tested on
constructed metric sequences without training anything.

The long story: docs/fastlib.md, section ``fastlib/training/early_stopping.py``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fastlib.training.values import check_int, check_number

MONITORS = {"loss": "min", "val_loss": "min", "acc": "max", "val_acc": "max"}


@dataclass
class Decision:
    """The policy's answer for one epoch."""

    improved: bool
    lr: float           # the learning rate for the next epoch
    reduced: bool       # the rate was reduced at this epoch
    stop: bool
    reason: str | None  # why training stops, or None


@dataclass
class PlateauPolicy:
    """Early stopping with learning-rate reduction; see the module docstring for the rules.

    Parameters
    ----------
    lr : float
        The initial learning rate.
    monitor : {"loss", "val_loss", "acc", "val_acc"}
    patience : int
        Epochs without improvement before the rate is reduced (>= 1).
    min_delta : float
        Minimum improvement, in percent of the best value's magnitude (>= 0; 1.0 means 1%).
    lr_factor : float
        Multiplier applied to the rate on a plateau, in (0, 1].
    stop_patience : int or None
        Epochs without improvement before stopping; None means ``2 * patience``.
    min_lr : float
        Training stops when a reduction takes the rate below this (>= 0).
    """

    lr: float
    monitor: str = "val_loss"
    patience: int = 10
    min_delta: float = 1.0
    lr_factor: float = 0.5
    stop_patience: int | None = None
    min_lr: float = 1e-6
    # running state (saved in checkpoints through state_dict)
    best: float | None = None
    best_epoch: int = 0
    wait: int = 0
    since_best: int = 0
    reductions: int = 0
    epoch: int = 0

    def __post_init__(self):
        if not isinstance(self.monitor, str) or self.monitor not in MONITORS:
            error = ValueError if isinstance(self.monitor, str) else TypeError
            raise error(f"monitor must be one of {', '.join(MONITORS)}, got {self.monitor!r}")
        # the values are stored as Python numbers: the policy's state is saved as JSON
        self.patience = check_int(self.patience, "patience", 1)
        if self.stop_patience is None:
            self.stop_patience = 2 * self.patience
        self.stop_patience = check_int(self.stop_patience, "stop_patience", 1)
        self.min_delta = check_number(self.min_delta, "min_delta",
                                      "a percentage >= 0 (1.0 means 1%)")
        if not (math.isfinite(self.min_delta) and self.min_delta >= 0):
            raise ValueError(f"min_delta is a percentage >= 0 (1.0 means 1%), got {self.min_delta}")
        self.lr_factor = check_number(self.lr_factor, "lr_factor", "a number in (0, 1]")
        if not 0 < self.lr_factor <= 1:
            raise ValueError(f"lr_factor must be in (0, 1], got {self.lr_factor}")
        self.min_lr = check_number(self.min_lr, "min_lr", "a finite number >= 0")
        if not (math.isfinite(self.min_lr) and self.min_lr >= 0):
            raise ValueError(f"min_lr must be finite and >= 0, got {self.min_lr}")
        self.lr = check_number(self.lr, "the learning rate", "a finite number > 0")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"the learning rate must be finite and > 0, got {self.lr}")

    @property
    def mode(self) -> str:
        """``"min"`` for losses, ``"max"`` for accuracies."""
        return MONITORS[self.monitor]

    def is_improvement(self, value: float) -> bool:
        """Whether ``value`` improves on the best so far (rule 2)."""
        if value is None or not math.isfinite(value):
            return False
        if self.best is None:
            return True
        gain = (self.best - value) if self.mode == "min" else (value - self.best)
        return gain > 0 and gain >= abs(self.best) * self.min_delta / 100.0

    def step(self, value: float) -> Decision:
        """Feed the monitored value of the next epoch; return what to do."""
        self.epoch += 1
        if self.is_improvement(value):
            self.best, self.best_epoch = float(value), self.epoch
            self.wait = self.since_best = 0
            return Decision(True, self.lr, False, False, None)
        self.wait += 1
        self.since_best += 1
        if self.since_best >= self.stop_patience:
            return Decision(False, self.lr, False, True,
                            f"no improvement of {self.monitor} by {self.min_delta}% for "
                            f"{self.since_best} epochs (stop_patience={self.stop_patience})")
        if self.wait >= self.patience:
            self.lr *= self.lr_factor
            self.reductions += 1
            self.wait = 0
            if self.lr < self.min_lr:
                return Decision(False, self.lr, True, True,
                                f"learning rate {self.lr:.3g} fell below min_lr={self.min_lr:g}")
            return Decision(False, self.lr, True, False, None)
        return Decision(False, self.lr, False, False, None)

    def state_dict(self) -> dict:
        """Everything needed to resume the policy (JSON-able)."""
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict) -> "PlateauPolicy":
        """Rebuild a policy saved with :meth:`state_dict`."""
        return cls(**state)


# ---------------------------------------------------------------------------------------------
# Divergence: stop a run that is blowing up while its loss is still finite.

@dataclass(frozen=True)
class DivergenceRules:
    """When a finite but exploding run stops (checked after every epoch, on every path).

    Like PyTorch Lightning's ``EarlyStopping(divergence_threshold=...)``, but with three more
    rules. After each epoch, in this order, the first rule that holds stops training, the
    weights of the last good epoch are put back, and the result says which rule fired
    (``TrainingResult.diverged``, ``stop_reason``, ``divergence_rule``). ``None`` turns a rule
    off.

    Parameters
    ----------
    max_loss : float or None, default 1e8
        ``"max_loss"``: the epoch's training loss is above this. For ``mse``, whose loss has the
        units of the targets squared, the threshold is ``max_loss * max(1, mean(y**2))``.
    loss_growth : float or None, default 100
        ``"loss_growth"``: the epoch's training loss is more than this factor above the best loss
        so far (the untrained model's loss on the probe batch counts as the first) *and* above
        the untrained loss, so a run that improved a thousandfold and then slips back a little is
        not a divergence.
    max_weight : float or None, default 1e6
        ``"max_weight"``: some parameter's magnitude is above this (or not finite).
    max_grad : float or None, default 1e8
        ``"max_grad"``: some finite entry of the loss gradient of the epoch's last step (as
        clipped; for an algorithm whose steps take no loss gradient, such as ``"targetprop"``,
        the gradient on the probe batch, the first ``PROBE_ROWS`` training samples) is above
        this in magnitude (non-finite gradients are the skipped steps' business). For ``mse``
        the threshold is ``max_grad * max(1, RMS(y))``. Only for algorithms trained on a loss
        (not ``"cd"``), and not on the device (the weights stay there).

    Notes
    -----
    The defaults are far from any healthy run: in the documented MNIST, digits, TargetProp and CD
    runs the epoch loss never exceeds 2.4 nor its best so far, weights stay below 2.1 and the
    digits runs' last-step gradients below 0.75 (tests hold these runs to the defaults), while a
    cross-entropy run at SGD rate 1e3 has a first-epoch loss of 4.5e8.
    """

    max_loss: float | None = 1e8
    loss_growth: float | None = 100.0
    max_weight: float | None = 1e6
    max_grad: float | None = 1e8

    RULES = ("max_loss", "loss_growth", "max_weight", "max_grad")
    PROBE_ROWS = 256

    def __post_init__(self):
        for name in self.RULES:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"divergence rule {name} must be a finite number > 0 or None "
                                 f"(off), got {value!r}")
        if self.loss_growth is not None and self.loss_growth <= 1:
            raise ValueError(f"loss_growth is a factor > 1, got {self.loss_growth}")

    @classmethod
    def from_option(cls, option) -> "DivergenceRules | None":
        """``train``'s ``divergence=`` option: None (defaults), False (off), a dict or an instance."""
        if option is None or option is True:
            return cls()
        if option is False:
            return None
        if isinstance(option, cls):
            return option
        if isinstance(option, dict):
            unknown = [k for k in option if k not in cls.RULES]
            if unknown:
                raise ValueError(f"divergence: unknown rule(s) {unknown}; the rules are "
                                 f"{list(cls.RULES)}")
            return cls(**option)
        raise TypeError(f"divergence must be None (the default rules), False (off), a dict of "
                        f"rules or a DivergenceRules, got {type(option).__name__}")

    def state_dict(self) -> dict:
        """The rules as a JSON-able dict (saved in checkpoints, compared on resume)."""
        return {name: getattr(self, name) for name in self.RULES}


def check_divergence(rules: DivergenceRules, loss: float, best: float | None,
                     initial: float | None, max_weight: float | None,
                     max_grad: float | None, target_scale: float = 1.0) -> tuple[str, str] | None:
    """Which rule of ``rules`` the end of an epoch breaks, or None.

    Parameters
    ----------
    rules : DivergenceRules
    loss : float
        The epoch's training loss.
    best : float or None
        The lowest loss before this epoch (the initial probe loss and earlier epochs).
    initial : float or None
        The untrained model's loss on the probe batch (None when it could not be measured).
    max_weight, max_grad : float or None
        The largest parameter magnitude, and the largest finite probe-gradient magnitude (None:
        not measured).
    target_scale : float
        ``max(1, RMS(y))`` for ``mse`` (1 otherwise): ``max_loss`` is multiplied by its square
        and ``max_grad`` by it.

    Returns
    -------
    (rule, explanation) or None
    """
    if rules.max_loss is not None and loss > rules.max_loss * target_scale ** 2:
        scaled = "" if target_scale == 1 else f" times the targets' mean square {target_scale ** 2:.4g}"
        return "max_loss", (f"training loss {loss:.4g} is above max_loss={rules.max_loss:g}"
                            f"{scaled}")
    if (rules.loss_growth is not None and best is not None and initial is not None
            and loss > rules.loss_growth * best and loss > initial):
        return "loss_growth", (f"training loss {loss:.4g} is more than loss_growth="
                               f"{rules.loss_growth:g} times its best {best:.4g} and above the "
                               f"untrained loss {initial:.4g}")
    if rules.max_weight is not None and max_weight is not None and not (
            max_weight <= rules.max_weight):
        return "max_weight", (f"a weight of magnitude {max_weight:.4g} is beyond max_weight="
                              f"{rules.max_weight:g}")
    if rules.max_grad is not None and max_grad is not None and (
            max_grad > rules.max_grad * target_scale):
        scaled = "" if target_scale == 1 else f" times the targets' RMS {target_scale:.4g}"
        return "max_grad", (f"a gradient entry of magnitude {max_grad:.4g} on the probe batch is "
                            f"beyond max_grad={rules.max_grad:g}{scaled}")
    return None
