"""Training algorithms by name: the SINGA idea of registering a ``TrainOneBatch``.

An algorithm is a function ``train_one_batch(ctx, x_batch, y_batch) -> BatchResult`` plus
optional hooks, registered under a name with :func:`register_algorithm`. ``train`` looks the
name up, builds one :class:`StepContext` per run and calls the function once per mini-batch.
Back-propagation (``fastlib.training.backprop``), Target Propagation and contrastive divergence
register themselves from their own modules, exactly the way any other algorithm does.

The long story: docs/fastlib.md, section ``fastlib/training/algorithms.py``.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np


@dataclass(frozen=True)
class TrainConfig:
    """The options of one training run that stay fixed while it runs."""

    loss_type: str | None
    batch_size: int
    gradient_clip: float = 0.0
    clip_mode: str = "value"
    shuffle: bool = True
    seed: int = 0
    device: str = "cpu"
    algorithm: str = "bp"
    extra: dict = field(default_factory=dict)  # algorithm-specific options (cd_k=..., ...)


@dataclass
class StepContext:
    """Everything a ``train_one_batch`` receives besides the batch (see the module docstring)."""

    model: Any
    params: dict
    loss_type: str | None
    optimizer: Any
    opt_state: Any
    lr: float
    config: TrainConfig
    rng: np.random.Generator
    state: dict = field(default_factory=dict)
    step: int = 0  # mini-batches trained so far in this run (resumed runs continue the count)
    scratch: dict = field(default_factory=dict)  # per-run caches, never checkpointed


class BatchResult(NamedTuple):
    """What one mini-batch step reports.

    Attributes
    ----------
    loss : float
        Mean loss over the batch before the update. A non-finite value stops training.
    correct : float or None
        Number of correctly predicted samples in the batch, None when the loss has no
        accuracy (mse) or the algorithm has none.
    skipped : bool
        True when the update was skipped (non-finite gradient).
    gradient : mapping of str to ndarray, or None
        The step's loss gradient keyed like the parameters (after clipping; as computed when
        the step was skipped), or None when the algorithm takes none: the divergence rule
        ``max_grad`` reads the epoch's last one (``fastlib.training.divergence``).
    """

    loss: float
    correct: float | None = None
    skipped: bool = False
    gradient: Any = None


@dataclass
class EpochStats:
    """Sums over one epoch's batches, filled by the loop or by a ``run_epoch`` fast path."""

    loss_sum: float = 0.0      # sum over batches of batch loss * batch size
    correct: float | None = 0.0
    count: int = 0             # samples trained on
    skipped: int = 0           # steps skipped for non-finite gradients
    scaler_skips: int = 0      # of which the loss scale's (mixed precision): no warning
    diverged_batch: int = -1   # index of the batch whose loss was non-finite, or -1
    diverged_loss: float = 0.0
    fused: bool = False        # the epoch ran in the compiled program
    path: str = "generic"      # which path ran it: "program" (compiled) or "generic"
    schedule: str | None = None  # the program's schedule ("mlp" or "general")
    piece_plan: dict | None = None  # the program's piece plan (piece_plan.PiecePlan)
    # the arrays of the last step's loss gradient (BatchResult.gradient), None: no step gave one
    gradient: Any = None

    def add(self, result: BatchResult, n: int) -> None:
        self.loss_sum += float(result.loss) * n
        self.count += n
        if result.correct is None or self.correct is None:
            self.correct = None
        else:
            self.correct += float(result.correct)
        self.skipped += int(result.skipped)
        if result.gradient is not None:
            self.gradient = list(result.gradient.values())

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def accuracy(self) -> float | None:
        return None if self.correct is None or not self.count else self.correct / self.count


@dataclass(frozen=True)
class Algorithm:
    """A registered training algorithm (see :func:`register_algorithm`)."""

    name: str
    train_one_batch: Callable
    needs_targets: bool = True
    init: Callable | None = None
    evaluate: Callable | None = None
    run_epoch: Callable | None = None
    options: tuple | None = None


ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(name: str, train_one_batch: Callable, *, needs_targets: bool = True,
                       init: Callable | None = None, evaluate: Callable | None = None,
                       run_epoch: Callable | None = None, options: tuple | None = None,
                       overwrite: bool = False) -> Algorithm:
    """Register a training algorithm under ``name`` (case-insensitive) for ``train(algorithm=)``.

    Parameters
    ----------
    name : str
        The name ``train(..., algorithm=name)`` selects.
    train_one_batch : callable
        ``train_one_batch(ctx, x_batch, y_batch) -> BatchResult`` (``y_batch`` is None when the
        algorithm does not need targets). It updates the model's parameters itself, normally
        through ``ctx.optimizer.update(ctx.params, grads, ctx.opt_state, lr=ctx.lr)``, storing the
        returned state in ``ctx.opt_state``.
    needs_targets : bool
        False for unsupervised algorithms (contrastive divergence): ``y`` may then be None.
    init : callable, optional
        ``init(ctx)`` before the first epoch, e.g. to put arrays into ``ctx.state``.
    evaluate : callable, optional
        ``evaluate(model, x, y, loss_type) -> (loss, accuracy or None)`` for validation data and
        for ``train_sh``'s monitor; default :func:`evaluate_model`.
    run_epoch : callable, optional
        ``run_epoch(ctx, x, y, order) -> EpochStats or None``: a whole-epoch fast path that must
        compute what the batches would (``order`` is the epoch's sample order, None when not
        shuffled); None means not applicable.
    options : tuple of str, optional
        Names of the keyword options ``train(..., **options)`` may pass to this algorithm (they
        arrive in ``ctx.config.extra``); None accepts any.
    overwrite : bool
        Replace an existing registration of ``name`` (otherwise a ValueError).

    Returns
    -------
    Algorithm
    """
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"algorithm name must be a non-empty str, got {name!r}")
    if not callable(train_one_batch):
        raise TypeError(f"train_one_batch for {name!r} must be callable, got "
                        f"{type(train_one_batch).__name__}")
    key = name.strip().lower()
    if key in ALIASES:
        raise ValueError(f"{name!r} is an alias of the algorithm {ALIASES[key]!r} (SINGA's name); "
                         "register your algorithm under another name")
    if key in ALGORITHMS and not overwrite:
        raise ValueError(f"algorithm {key!r} is already registered; pass overwrite=True to "
                         "replace it")
    algo = Algorithm(key, train_one_batch, bool(needs_targets), init, evaluate, run_epoch,
                     None if options is None else tuple(options))
    ALGORITHMS[key] = algo
    return algo


# Algorithms registered by other modules on import (name -> module), so that
# train(algorithm="targetprop") works without importing fastlib.targetprop first.
_PROVIDERS = {"bp": "fastlib.training.backprop", "targetprop": "fastlib.targetprop",
              "cd": "fastlib.rbm"}

# Other systems' names for the same algorithms (SINGA's job.conf values ``alg: kBP`` and
# ``alg: kCD``), compared case-insensitively like every algorithm name.
ALIASES = {"kbp": "bp", "kcd": "cd"}


def algorithm_names() -> list[str]:
    """Every algorithm ``train(algorithm=...)`` accepts by name, sorted, each once: the
    registered ones and those that register themselves when first asked for (aliases apart)."""
    return sorted(set(ALGORITHMS) | set(_PROVIDERS))


def get_algorithm(name) -> Algorithm:
    """The algorithm ``name`` (case-insensitive; SINGA's ``kBP`` / ``kCD`` are aliases of
    ``bp`` / ``cd``), or a ValueError listing every known algorithm and the closest name."""
    if isinstance(name, Algorithm):
        return name
    if not isinstance(name, str):
        raise TypeError(f"algorithm must be a registered name, got {type(name).__name__}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in ALGORITHMS and key in _PROVIDERS:
        import importlib

        try:
            importlib.import_module(_PROVIDERS[key])
        except ImportError as exc:
            raise ValueError(f"algorithm {key!r} is provided by {_PROVIDERS[key]}, which could "
                             f"not be imported ({exc})") from None
    if key not in ALGORITHMS:
        known = algorithm_names()
        # NOTE: one suggestion, from the names and the aliases (an alias is shown as the name it
        # stands for, so no name can be suggested twice)
        close = difflib.get_close_matches(key, known + list(ALIASES), n=1)
        hint = f" (did you mean {ALIASES.get(close[0], close[0])!r}?)" if close else ""
        aliases = ", ".join(f"{a[0]}{a[1:].upper()} = {b}" for a, b in ALIASES.items())
        raise ValueError(f"unknown training algorithm {name!r}{hint}; known: "
                         f"{', '.join(known)} (aliases: {aliases}); add one with "
                         "register_algorithm()")
    return ALGORITHMS[key]


# ---------------------------------------------------------------------------------------------
# what every algorithm shares: losses, accuracy, evaluation

def _losses():
    from fastlib import losses

    return losses


def correct_count(loss_type: str, pred: np.ndarray, target: np.ndarray) -> float | None:
    """Number of correct predictions in a batch (None when the loss has no accuracy)."""
    acc = _losses().accuracy(loss_type, pred, target, check=False)
    return None if acc is None else float(acc) * pred.shape[0]


# Rows per forward chunk when evaluating: bounds memory on large validation sets.
EVAL_CHUNK = 4096


def evaluate_model(model, x: np.ndarray, y: np.ndarray, loss_type: str,
                   chunk: int = EVAL_CHUNK) -> tuple[float, float | None]:
    """Mean loss and accuracy of ``model`` on ``(x, y)``, forward in chunks of ``chunk`` rows.

    ``y`` must already be normalised by ``fastlib.losses.validate_targets`` (train does this
    once for the validation set).

    The loss is the sample-weighted mean of the chunk losses (every loss is a mean over its
    rows, or over rows times a fixed width), so it equals the loss over the whole set.
    """
    losses = _losses()
    n = x.shape[0]
    total, correct = 0.0, 0.0
    for start in range(0, n, chunk):
        xb, yb = x[start:start + chunk], y[start:start + chunk]
        pred = model.forward(xb)
        total += losses.loss_value(loss_type, pred, yb, check=False) * xb.shape[0]
        acc = losses.accuracy(loss_type, pred, yb, check=False)
        correct = None if acc is None or correct is None else correct + float(acc) * xb.shape[0]
    # NOTE: the layers' saved arrays of the last chunk would stay alive through the next epoch
    # (a compiled epoch never reads them): as large as a chunk's activations
    clear = getattr(model, "clear_history", None)
    if clear is not None:
        clear()
    return total / n, (None if correct is None else correct / n)
