"""What ``train`` and ``train_sh`` return, and the one way an epoch is written into it.

Every epoch that ran, the one a stop cut short included, enters the histories through
:func:`record_epoch`, which also keeps ``epochs_run`` and ``final_loss`` equal to what the
histories say; the rules are in :class:`TrainingResult`'s docstring.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["TrainingResult", "TrainingHistorySH", "record_epoch", "load_histories",
           "histories"]


@dataclass
class TrainingResult:
    """What ``train`` returns (Loom's TrainingResult plus DataCode's histories).

    It unpacks like DataCode's return value, ``loss_history, accuracy_history = train(...)``.

    How the fields agree, after a full run and after any stop (a divergence in the first epoch
    or a later one, a non-finite loss part-way through an epoch, ``train_sh``'s early stopping,
    a callback asking to stop):

    - Every history has one entry per epoch that ran, epoch k at index k - 1 (a resumed run's
      include the epochs before the resume). An epoch a stop cut short or rejected is an epoch
      that ran: it is the last entry, as in Keras's ``History`` after ``TerminateOnNaN``.
    - ``epochs_run == len(loss_history)`` (also ``len(accuracy_history)``, ``len(lr_history)``,
      ``len(epoch_times)``, and the validation histories' lengths when there is validation
      data) and ``final_loss == loss_history[-1]`` (NaN when no epoch ran).
    - Which weights the model holds afterwards is ``weights_epoch``: those at the end of that
      epoch (0: the initial weights).

    Attributes
    ----------
    loss_history, accuracy_history : list
        Training loss (sample-weighted mean of the batch losses, each taken before its update)
        and accuracy (None entries when the loss has no accuracy, e.g. mse). An epoch stopped
        by a non-finite loss records ``inf`` (``stop_reason`` names the value) and the
        accuracy of its batches before that one; one stopped by a divergence rule records the
        loss that tripped the rule.
    val_loss_history, val_accuracy_history : list
        The same on the validation data after each epoch (empty without validation data); NaN
        for an epoch a divergence stopped (its weights were thrown away, so not evaluated).
    final_loss : float
        ``loss_history[-1]``: the last epoch's training loss (NaN when no epoch ran).
    total_time : float
        Seconds for the whole call; ``epoch_times`` seconds per epoch.
    lr_history : list of float
        The learning rate each epoch ran with.
    epochs_run : int
        Epochs that ran, ``len(loss_history)``, counting those before a resume and the one a
        stop cut short.
    weights_epoch : int
        The epoch whose end-of-epoch weights the model holds on return: ``epochs_run`` unless
        a divergence put back ``restored_epoch`` or ``train_sh`` restored its best epoch.
    stopped, stop_reason :
        Whether something asked training to stop (a callback, the plateau policy, a
        divergence), even at the last epoch, and why (None when nothing did).
    diverged : bool
        A non-finite loss, or a rule of ``divergence`` (:class:`DivergenceRules`), stopped
        training; ``restored_epoch`` is the epoch whose end-of-epoch weights were put back (0:
        the initial weights), always below ``epochs_run``.
    divergence_rule : str or None
        The rule that stopped a diverging run: ``"non_finite_loss"``, ``"max_loss"``,
        ``"loss_growth"``, ``"max_weight"`` or ``"max_grad"``.
    skipped_steps : int
        Optimizer steps skipped because the gradient was not finite.
    fused : bool
        At least one epoch ran in the whole-epoch compiled program
        (``fastlib.training.schedules``).
    cuda_mode : {"graph", "launches"} or None
        ``device="cuda"``: each step one CUDA graph replay, or its kernels launched one by
        one (docs/gpu.md); None on the CPU.
    cuda_graph_reason : str or None
        ``device="cuda"`` in ``"launches"`` mode: why the steps were not CUDA graphs (the
        simulator, ``FASTLIB_CUDA_GRAPHS=0``, a stack without graph builders, a recording
        that failed); None otherwise.
    device_counts : dict or None
        ``device="cuda"``: the last epoch's per-step kernel launches, graph launches,
        allocations, copies and synchronisations (``fastlib.cuda.counters`` keys, mean over
        its steps) and ``"per_epoch"``, its boundary traffic; None on the CPU.
    path : str
        Which path ran the last epoch: ``"program"`` (the model's compiled program,
        ``fastlib.training.program``), ``"generic"`` (the per-batch loop) or ``"cuda"``.
    schedule : str or None
        The schedule that ran the program in the last epoch (``fastlib.training.schedules``):
        ``"mlp"`` (the MLP's column epoch) or ``"general"`` (the interpreter); None when it
        did not run in the program.
    precision : {"bfloat16", "float16"} or None
        The 16-bit format of a mixed-precision run (``train(..., dtype=)``), None otherwise.
    loss_scale : float or None
        A loss-scaled mixed-precision run: the scale after the last step; None otherwise.
    loss_scale_skips : int
        Of ``skipped_steps``, those the loss scale skipped (inf/NaN in the scaled gradient).
    piece_plan : dict or None
        The compiled program's piece plan, ``{"pieces": P, "source": ...}``
        (``fastlib.training.piece_plan``): pass ``pieces=P`` to reproduce the run bit for bit
        on another machine. None when no epoch ran in the compiled program.
    """

    loss_history: list = field(default_factory=list)
    accuracy_history: list = field(default_factory=list)
    val_loss_history: list = field(default_factory=list)
    val_accuracy_history: list = field(default_factory=list)
    final_loss: float = math.nan
    total_time: float = 0.0
    epoch_times: list = field(default_factory=list)
    lr_history: list = field(default_factory=list)
    epochs_run: int = 0
    stopped: bool = False
    stop_reason: str | None = None
    diverged: bool = False
    restored_epoch: int | None = None
    divergence_rule: str | None = None
    skipped_steps: int = 0
    fused: bool = False
    cuda_mode: str | None = None
    cuda_graph_reason: str | None = None
    device_counts: dict | None = None
    path: str = "generic"
    schedule: str | None = None
    piece_plan: dict | None = None
    weights_epoch: int = 0
    precision: str | None = None
    loss_scale: float | None = None
    loss_scale_skips: int = 0

    def __iter__(self):
        """``(loss_history, accuracy_history)``: DataCode's ``model.train`` returns this pair."""
        return iter((self.loss_history, self.accuracy_history))


@dataclass
class TrainingHistorySH:
    """What ``train_sh`` returns (DataCode's TrainingHistorySH, epochs numbered from 1).

    Attributes
    ----------
    loss, val_loss, acc, val_acc : list
        Per-epoch training and validation loss and accuracy (``result``'s histories).
    lr : list of float
        The learning rate each epoch ran with.
    best_metric : float or None
        The best value of the monitored metric (None when no epoch completed); ``best_epoch``
        the epoch it came from (0: none).
    stopped_epoch : int
        The last epoch that ran (``result.epochs_run``).
    lr_reductions : int
        How many times the plateau policy reduced the rate.
    stop_reason : str or None
        Why training stopped before ``epochs`` (None when it ran them all).
    restored_best : bool
        The best epoch's weights were put back at the end (``result.weights_epoch`` is then
        ``best_epoch``).
    result : TrainingResult
        The full result of the underlying loop (times, divergence, skipped steps).
    """

    loss: list
    val_loss: list
    acc: list
    val_acc: list
    lr: list
    best_metric: float | None
    best_epoch: int
    stopped_epoch: int
    lr_reductions: int = 0
    stop_reason: str | None = None
    restored_best: bool = False
    result: TrainingResult | None = None


def record_epoch(result, *, loss, accuracy, val_loss, val_accuracy, lr, seconds,
                 validated) -> None:
    """Append one epoch to every history of ``result`` and keep its summary fields in step.

    ``validated``: the run has validation data (then the validation histories get an entry,
    NaN ones for an epoch that was not evaluated).
    """
    result.loss_history.append(float(loss))
    result.accuracy_history.append(accuracy)
    if validated:
        result.val_loss_history.append(val_loss)
        result.val_accuracy_history.append(val_accuracy)
    result.epoch_times.append(seconds)
    result.lr_history.append(lr)
    _summarise(result)


def _summarise(result):
    result.epochs_run = len(result.loss_history)
    result.final_loss = result.loss_history[-1] if result.loss_history else math.nan


def histories(result, initial_loss) -> dict:
    """The histories and counters a checkpoint keeps (JSON-able)."""
    r = result
    return {"loss": r.loss_history, "acc": r.accuracy_history, "val_loss": r.val_loss_history,
            "val_acc": r.val_accuracy_history, "epoch_times": r.epoch_times,
            "lr": r.lr_history, "skipped": r.skipped_steps, "fused": r.fused,
            "stopped": r.stopped, "stop_reason": r.stop_reason,
            "initial_loss": initial_loss}


def load_histories(result, saved: dict) -> None:
    """Put a checkpoint's :func:`histories` back into ``result``."""
    r = result
    r.loss_history, r.accuracy_history = list(saved["loss"]), list(saved["acc"])
    r.val_loss_history, r.val_accuracy_history = list(saved["val_loss"]), list(saved["val_acc"])
    r.epoch_times, r.lr_history = list(saved["epoch_times"]), list(saved["lr"])
    r.skipped_steps, r.fused = int(saved["skipped"]), bool(saved["fused"])
    _summarise(r)
    r.weights_epoch = r.epochs_run
