"""``train`` and ``train_sh``: the epoch loop shared by both, and their results.

One loop serves both entry points; ``train_sh`` adds the plateau policy of
``fastlib.training.early_stopping``. Per epoch the loop draws the sample order from the run's
Generator, hands the batches to the selected algorithm (or the algorithm's whole-epoch fast
path), evaluates the validation data, calls the callbacks, applies the policy and writes the
checkpoint.

The long story: docs/fastlib.md, section ``fastlib/training/loop.py``.
"""
from __future__ import annotations

import math
import numbers
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from fastlib import optim
from fastlib.training import checkpoint as ckpt_mod
from fastlib.training.arguments import MISSING, normalise
from fastlib.training.algorithms import (EpochStats, StepContext, TrainConfig, evaluate_model,
                                         get_algorithm)
from fastlib.training.clipping import check_clip
from fastlib.training.early_stopping import DivergenceRules, PlateauPolicy, check_divergence

__all__ = ["train", "train_sh", "TrainingResult", "TrainingHistorySH"]


@dataclass
class TrainingResult:
    """What ``train`` returns (Loom's TrainingResult plus DataCode's histories).

    Epochs are numbered from 1; every history has one entry per epoch run, the epoch a
    divergence stopped included (its weights are not kept: see ``diverged``). It unpacks
    like DataCode's return value, ``loss_history, accuracy_history = train(...)``, and keeps
    every field below.

    Attributes
    ----------
    loss_history, accuracy_history : list
        Training loss (sample-weighted mean of the batch losses, each taken before its update)
        and accuracy (None entries when the loss has no accuracy, e.g. mse).
    val_loss_history, val_accuracy_history : list
        The same on the validation data after each epoch (empty without validation data).
    final_loss : float
        The training loss of the last epoch whose weights were kept (NaN when none was).
    total_time : float
        Seconds for the whole call; ``epoch_times`` seconds per epoch.
    lr_history : list of float
        The learning rate each epoch ran with.
    epochs_run : int
        Epochs completed, counting those done before a resume.
    stopped, stop_reason :
        Whether training ended before ``epochs`` and why (callback, policy, divergence).
    diverged : bool
        A non-finite loss, or a rule of ``divergence`` (:class:`DivergenceRules`), stopped
        training; ``restored_epoch`` is the epoch whose end-of-epoch weights were put back (0:
        the initial weights). The stopped epoch is the histories' last entry (its loss the
        one that tripped the rule, inf for a non-finite one; its validation entries NaN, not
        evaluated).
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
        ``"mlp"`` (the MLP's column epoch) or ``"general"`` (the program's interpreter); None
        when it did not run in the program.
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

    def __iter__(self):
        """``(loss_history, accuracy_history)``: DataCode's ``model.train`` returns this pair."""
        return iter((self.loss_history, self.accuracy_history))


@dataclass
class TrainingHistorySH:
    """What ``train_sh`` returns (DataCode's TrainingHistorySH, epochs numbered from 1).

    Attributes
    ----------
    loss, val_loss, acc, val_acc : list
        Per-epoch training and validation loss and accuracy.
    lr : list of float
        The learning rate each epoch ran with.
    best_metric : float or None
        The best value of the monitored metric; ``best_epoch`` the epoch it came from.
    stopped_epoch : int
        The last epoch that ran.
    lr_reductions : int
        How many times the plateau policy reduced the rate.
    stop_reason : str or None
        Why training stopped before ``epochs`` (None when it ran them all).
    restored_best : bool
        The best epoch's weights were put back at the end.
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


def train(model, x, y, epochs=MISSING, batch_size=MISSING, learning_rate=None,
          loss_type=MISSING, x_val=None, y_val=None, optimizer="SGD", *, lr=None, loss=None,
          validation_data=None, gradient_clip=0.0, clip_mode="value", shuffle=True, seed=0,
          device="cpu", algorithm="bp", callbacks=(), verbose=True, checkpoint=None,
          checkpoint_every=1, resume=None, resume_mismatch="warn", divergence=None,
          distributed=False,
          **algorithm_options) -> TrainingResult:
    """Train ``model`` on ``(x, y)`` with mini-batches (DataCode's order, Loom's result).

    DataCode's positional order works, and so do the keywords of Keras and PyTorch:
    ``train(model, x, y, 10, 32, 1e-3, "cross_entropy")`` is
    ``train(model, x, y, epochs=10, batch_size=32, lr=1e-3, loss="cross_entropy")``;
    ``validation_data=(x_val, y_val)`` is ``x_val, y_val``. One thing given twice (``lr=`` and
    ``learning_rate``) is a ``TypeError`` naming both (:mod:`fastlib.training.arguments`).

    Parameters
    ----------
    model : fastlib.Layer
        Trained in place (its ``parameters()`` are updated).
    x : array_like
        Inputs ``[N, ...]``; converted once to the model's dtype; NaN/Inf is an error.
    y : array_like or None
        Targets in the format ``loss_type`` requires (``cross_entropy``: class indices
        ``[N, 1]`` or ``[N]``; ``categorical_cross_entropy``: one-hot ``[N, C]``;
        ``binary_cross_entropy``: values in [0, 1]; ``mse``: the output's shape). None only for
        algorithms that need no targets (``"cd"``).
    epochs : int
        Total number of epochs (with ``resume``, the total including those already done).
    batch_size : int
        1 to N; the last, incomplete batch is used; a size above N means one full batch.
    learning_rate : float or None
        The rate (alias ``lr``); None takes the optimizer object's ``lr`` (or the name's
        default). With an optimizer object, a rate that differs from its own ``lr`` is a
        ``ValueError``: the object's settings are never silently replaced.
    loss_type : str
        (alias ``loss``) ``mse cross_entropy categorical_cross_entropy binary_cross_entropy
        binary_cross_entropy_with_logits`` (case-insensitive; ``sparse_cross_entropy`` warns).
    x_val, y_val : array_like, optional
        Validation data, evaluated after every epoch (or ``validation_data=(x_val, y_val)``).
    optimizer : str or fastlib.optim.Optimizer
        ``SGD Momentum NAG Adagrad RMSprop Adam AdamW`` or an instance with hyperparameters.
        The default is SGD, DataCode's (``verigrad train``'s is Adam).
    lr, loss, validation_data :
        Keyword aliases of ``learning_rate``, ``loss_type`` and ``(x_val, y_val)``.
    gradient_clip : float
        0 (off) or the clipping threshold c.
    clip_mode : {"value", "norm"}
        ``"value"`` (default): clamp every gradient element to [-c, c], what Loom's engine
        does. ``"norm"``: when the global L2 norm of all gradients together exceeds c, scale
        them all by c / norm, what Loom's training document describes ("clips gradient
        norms") and what ``torch.nn.utils.clip_grad_norm_`` does. Either mode keeps the
        non-finite guard (a NaN/Inf gradient skips the step).
    shuffle : bool
        Draw a new sample order every epoch from ``numpy.random.default_rng(seed)``.
    seed : int
        Seeds the run's Generator (shuffling and stochastic algorithms).
    device : {"cpu", "cuda"}
        ``"cuda"`` runs every step on the device (``fastlib.cuda.training``: weights, optimizer
        state and data resident there, one small readback per epoch; the host weights are
        synchronised when read). Without a usable GPU (or numba's simulator) it raises
        ``RuntimeError`` with the reason; a model or algorithm the device cannot run raises
        ``ValueError`` naming it before training starts. Never falls back to the CPU.
    algorithm : str
        A registered algorithm: ``"bp"``, ``"targetprop"``, ``"cd"`` or your own (see
        :func:`fastlib.register_algorithm`); SINGA's ``"kBP"`` / ``"kCD"`` are aliases.
    callbacks : iterable
        Objects with ``on_epoch_end(epoch, logs)`` (or callables ``f(epoch, logs)``); ``logs``
        has ``loss acc val_loss val_acc lr epoch_time``. Returning True stops training.
        Optional ``on_train_begin(logs)`` and ``on_train_end(logs)``.
    verbose : bool
        A tqdm progress bar over epochs (on stderr) with the latest metrics.
    checkpoint : path, optional
        Write a checkpoint every ``checkpoint_every`` epochs and after the last one. The run
        holds ``<checkpoint>.lock`` while it trains: a second run writing the same path fails at
        once with :class:`~fastlib.errors.CheckpointLockedError` naming the holder (pid, host);
        temporary files a killed run left beside the checkpoint are removed.
    resume : path, optional
        Continue from a checkpoint (model weights, optimizer state, RNG, epoch, histories).
    resume_mismatch : {"warn", "error"}
        What to do when a setting that decides the trajectory differs from the checkpoint's
        (seed, batch size, loss, optimizer and its hyperparameters, learning rate, clipping,
        shuffling, algorithm and its options, divergence rules, the plateau policy, the data):
        ``"warn"`` continues with a ``RuntimeWarning`` listing them (e.g. to fine-tune at
        another rate); ``"error"`` refuses with a ``ValueError``.
    divergence : None, False, dict or DivergenceRules
        When a finite but exploding run stops (checked after every epoch): None applies the
        default rules of :class:`~fastlib.training.early_stopping.DivergenceRules` (loss above
        1e8, loss 100x its best and above the untrained loss, a weight beyond 1e6, a probe
        gradient beyond 1e8); a dict overrides some (``{"max_weight": 1e9}``, a rule set to None
        is off); False turns them all off (a non-finite loss still stops training).
    distributed : bool or fastlib.training.distributed.DataParallel
        Data-parallel over MPI when launched with ``mpiexec -n K``
        (:mod:`fastlib.training.distributed`): rank 0's state is broadcast, each rank trains on
        its share of every global batch, gradients are summed across ranks, only rank 0
        prints and writes checkpoints. Needs ``verigrad[mpi]``.
    **algorithm_options
        Options for the algorithm, in ``ctx.config.extra`` (e.g. ``cd_k=1``; ``"targetprop"``
        takes the fields of ``fastlib.TargetPropConfig``, e.g. ``use_chain_rule=False,
        update="loom", normalisation="column"``). ``"bp"`` takes
        ``fused`` (default True): False turns off the whole-epoch compiled paths (for
        Sequential-of-Dense MLPs, and for RNN / LSTM / Embedding / Dense chains) and trains
        batch by batch through the layers; and ``pieces`` (default None: chosen from the
        machine's cores), the compiled paths' piece plan (``fastlib.training.piece_plan``).

    Returns
    -------
    TrainingResult
        Unpacks as ``(loss_history, accuracy_history)``, DataCode's pair.
    """
    a = normalise("train", epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                  lr=lr, loss_type=loss_type, loss=loss, x_val=x_val, y_val=y_val,
                  validation_data=validation_data, optimizer=optimizer)
    loop = _Loop(model, x, y, a.epochs, a.batch_size, a.learning_rate, a.loss_type, a.x_val,
                 a.y_val, optimizer, gradient_clip, clip_mode, shuffle, seed, device, algorithm,
                 callbacks, verbose, checkpoint, checkpoint_every, resume, algorithm_options,
                 policy=None,
                 restore_best=False, divergence=divergence, resume_mismatch=resume_mismatch,
                 distributed=distributed)
    return loop.run() if loop.dist is None else loop.dist.guard(loop.run)


def train_sh(model, x, y, epochs=MISSING, batch_size=MISSING, learning_rate=None,
             loss_type=MISSING, optimizer="SGD", monitor="val_loss", patience=10, min_delta=1.0,
             restore_best=True, x_val=None, y_val=None, *, lr=None, loss=None,
             validation_data=None, lr_factor=0.5, stop_patience=None, min_lr=1e-6, gradient_clip=0.0,
             clip_mode="value", shuffle=True, seed=0, device="cpu", algorithm="bp",
             callbacks=(), verbose=True, checkpoint=None, checkpoint_every=1, resume=None,
             resume_mismatch="warn", divergence=None, distributed=False,
             **algorithm_options) -> TrainingHistorySH:
    """Train with early stopping and learning-rate reduction on a plateau (DataCode's train_sh).

    The policy (epochs numbered from 1):

    - ``monitor``: ``loss`` or ``val_loss`` (lower is better), ``acc`` or ``val_acc`` (higher is
      better); a ``val_`` monitor needs ``x_val`` and ``y_val``.
    - An epoch *improves* when its value beats the best so far by at least ``min_delta``
      percent of the best value's magnitude (``min_delta=1.0`` means 1%; 0 means any strict
      improvement). The first epoch always sets the best.
    - After ``patience`` epochs without improvement the learning rate is multiplied by
      ``lr_factor`` (default 0.5) and the patience count restarts.
    - Training stops after ``stop_patience`` epochs without improvement (default
      ``2 * patience``), or when a reduction takes the rate below ``min_lr`` (default 1e-6).
    - ``restore_best=True`` puts back the weights of the best epoch at the end.

    Other parameters are those of :func:`train` (``lr=``, ``loss=`` and ``validation_data=``
    too). Returns :class:`TrainingHistorySH`.
    """
    a = normalise("train_sh", epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                  lr=lr, loss_type=loss_type, loss=loss, x_val=x_val, y_val=y_val,
                  validation_data=validation_data, optimizer=optimizer)
    epochs, batch_size, learning_rate, loss_type, x_val, y_val = (
        a.epochs, a.batch_size, a.learning_rate, a.loss_type, a.x_val, a.y_val)
    policy = PlateauPolicy(lr=1.0, monitor=monitor, patience=patience, min_delta=min_delta,
                           lr_factor=lr_factor, stop_patience=stop_patience, min_lr=min_lr)
    if monitor.startswith("val_") and (x_val is None or y_val is None):
        raise ValueError(f"monitor={monitor!r} needs validation data: pass x_val and y_val, or "
                         f"monitor {monitor[4:]!r} on the training data")
    loop = _Loop(model, x, y, epochs, batch_size, learning_rate, loss_type, x_val, y_val,
                 optimizer, gradient_clip, clip_mode, shuffle, seed, device, algorithm, callbacks,
                 verbose, checkpoint, checkpoint_every, resume, algorithm_options, policy=policy,
                 restore_best=bool(restore_best), divergence=divergence,
                 resume_mismatch=resume_mismatch, distributed=distributed)
    result = loop.run() if loop.dist is None else loop.dist.guard(loop.run)
    policy = loop.policy
    return TrainingHistorySH(
        loss=result.loss_history, val_loss=result.val_loss_history,
        acc=result.accuracy_history, val_acc=result.val_accuracy_history, lr=result.lr_history,
        best_metric=policy.best, best_epoch=policy.best_epoch, stopped_epoch=result.epochs_run,
        lr_reductions=policy.reductions, stop_reason=result.stop_reason,
        restored_best=loop.restored_best, result=result)


# ---------------------------------------------------------------------------------------------

def _check_int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_device(device):
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        from fastlib.cuda import device as cuda_device

        reason = cuda_device.unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"device='cuda' is not available: {reason}; train with "
                               "device='cpu'")


def _as_inputs(model, x, what):
    if x is None:
        raise ValueError(f"{what} is None; pass an array of inputs")
    arr = model.check_input(x) if hasattr(model, "check_input") else np.asarray(x)
    return np.ascontiguousarray(arr)


def _check_targets(loss_type, model, x, y, what):
    """Validate the whole target array once; batches then skip the per-call checks."""
    from fastlib import losses

    y = np.asarray(y)
    if y.ndim == 0 or y.shape[0] != x.shape[0]:
        raise ValueError(f"{what}: {x.shape[0]} inputs but targets of shape {y.shape}; x and y "
                         "need the same number of rows")
    out_shape = tuple(model.infer_shape(x.shape))
    # A zero "prediction" of the model's output shape (a broadcast view, no memory) lets the
    # loss module check the target format, class ranges and batch size before training starts.
    pred_like = np.broadcast_to(np.zeros((), dtype=x.dtype), out_shape)
    return np.ascontiguousarray(losses.validate_targets(loss_type, pred_like, y))


def _max_abs(arrays, finite_only=False):
    """The largest magnitude over ``arrays``: inf when any entry is NaN or Inf, or with
    ``finite_only`` the largest finite one."""
    largest = 0.0
    for a in arrays:
        if a.size:
            m = float(np.max(np.abs(a)))
            if not math.isfinite(m):
                if not finite_only:
                    return math.inf
                finite = np.abs(a[np.isfinite(a)])
                m = float(finite.max()) if finite.size else 0.0
            largest = max(largest, m)
    return largest


def _jsonable(value):
    """``value`` when JSON can hold it, else its repr (settings are compared as JSON)."""
    import json

    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _fingerprint(a):
    import hashlib

    a = np.ascontiguousarray(a)
    digest = hashlib.blake2b(memoryview(a).cast("B"), digest_size=8).hexdigest()
    return f"{a.dtype.str}{list(a.shape)}:{digest}"


def _snapshot(params):
    return {k: v.copy() for k, v in params.items()}


def _restore(params, saved):
    for k, v in params.items():
        np.copyto(v, saved[k])


class _Loop:
    """One training run: validated inputs, the context, histories, and the epoch loop."""

    def __init__(self, model, x, y, epochs, batch_size, learning_rate, loss_type, x_val, y_val,
                 optimizer, gradient_clip, clip_mode, shuffle, seed, device, algorithm,
                 callbacks, verbose, checkpoint, checkpoint_every, resume, options, policy,
                 restore_best, divergence=None, resume_mismatch="warn", distributed=False):
        self.t_start = time.perf_counter()
        self.algo = get_algorithm(algorithm)
        allowed = self.algo.options
        unknown = [k for k in options if allowed is not None and k not in allowed]
        if unknown:
            raise TypeError(f"unexpected option(s) {unknown} for algorithm {self.algo.name!r}; "
                            f"it takes {list(allowed) or 'no options'}")
        _check_device(device)
        self.epochs = _check_int(epochs, "epochs", 0)
        batch_size = _check_int(batch_size, "batch_size", 1)
        self.checkpoint_every = _check_int(checkpoint_every, "checkpoint_every", 1)
        seed = _check_int(seed, "seed", 0)
        clip, clip_mode = check_clip(gradient_clip, clip_mode)
        self.model = model
        self.opt = optim.get(optimizer)
        lr = self.opt.lr if learning_rate is None else learning_rate
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not (
                math.isfinite(lr) and lr > 0):
            raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate!r}")
        lr = float(lr)

        if self.algo.needs_targets:
            from fastlib import losses

            loss_type = losses.resolve_loss(loss_type)
        self.loss_type = loss_type
        self.x = _as_inputs(model, x, "x")
        if x_val is None and y_val is not None:
            raise ValueError("y_val was given without x_val: pass both for validation, or neither")
        if x_val is not None and y_val is None and self.algo.needs_targets:
            raise ValueError("x_val was given without y_val: pass both for validation, or "
                             f"neither (only an algorithm without targets, like 'cd', "
                             f"validates on x_val alone)")
        self.x_val = None if x_val is None else _as_inputs(model, x_val, "x_val")
        if self.algo.needs_targets:
            if y is None:
                raise ValueError(f"algorithm {self.algo.name!r} needs targets y")
            self.y = _check_targets(loss_type, model, self.x, y, "y")
            self.y_val = (None if y_val is None
                          else _check_targets(loss_type, model, self.x_val, y_val, "y_val"))
        else:
            self.y = None if y is None else np.asarray(y)
            self.y_val = None if y_val is None else np.asarray(y_val)
        if self.x.shape[0] == 0:
            raise ValueError("x has no samples")

        self.config = TrainConfig(loss_type, min(batch_size, self.x.shape[0]), clip, clip_mode,
                                  bool(shuffle), seed, device, self.algo.name, dict(options))
        self.callbacks = tuple(callbacks or ())
        self.verbose = bool(verbose)
        self.checkpoint = checkpoint
        self.policy = policy
        if policy is not None:
            policy.lr = lr
        self.restore_best = restore_best
        self.restored_best = False
        self.best_params = None
        self.divergence = DivergenceRules.from_option(divergence)
        self.initial_loss = None   # the untrained model's loss on the probe batch
        if resume_mismatch not in ("warn", "error"):
            raise ValueError(f"resume_mismatch must be 'warn' or 'error', got {resume_mismatch!r}")
        self.resume_mismatch = resume_mismatch

        params = model.parameters()
        self.ctx = StepContext(model, params, loss_type, self.opt, self.opt.init(params), lr,
                               self.config, np.random.default_rng(seed))
        self.result = TrainingResult()
        self.start_epoch = 0
        if resume is not None:
            self._resume(resume)
        elif self.algo.init is not None:
            self.algo.init(self.ctx)
        if device == "cuda" and distributed:
            raise ValueError("device='cuda' with distributed=True is not supported: data-parallel "
                             "training runs on the CPU engine; train on one GPU with "
                             "distributed=False, or across ranks with device='cpu'")
        self.device_run = None
        if device == "cuda":  # the device step (fastlib.cuda.training); raises before training
            from fastlib.cuda.training import DeviceRun

            self.device_run = DeviceRun(self.ctx, self.x, self.y)
            if self.best_params is not None:
                self.best_params = self.device_run.snapshot_from_host(self.best_params)
        self.dist = None
        if distributed:  # data-parallel over MPI: wraps the algorithm, broadcasts rank 0's state
            from fastlib.training import distributed as dist_mod

            self.dist = dist_mod.attach(self, distributed)

    # -- checkpoints --------------------------------------------------------------------------
    def _settings(self):
        """Every setting that decides the trajectory (compared on resume; JSON-able)."""
        settings = {"loss_type": self.loss_type, "batch_size": self.config.batch_size,
                    "gradient_clip": self.config.gradient_clip, "clip_mode": self.config.clip_mode,
                    "shuffle": self.config.shuffle, "algorithm": self.algo.name,
                    "optimizer": self.opt.get_config(), "seed": self.config.seed,
                    "options": {k: _jsonable(v) for k, v in sorted(self.config.extra.items())},
                    "divergence": (None if self.divergence is None
                                   else self.divergence.state_dict()),
                    "data": self._data_fingerprint()}
        if self.policy is not None:
            settings["policy"] = {k: getattr(self.policy, k) for k in (
                "monitor", "patience", "min_delta", "lr_factor", "stop_patience", "min_lr")}
        return settings

    def _data_fingerprint(self):
        """Shape, dtype and a hash of each data array (computed once per run)."""
        if getattr(self, "_fingerprint", None) is None:
            self._fingerprint = {name: _fingerprint(a) for name, a in (
                ("x", self.x), ("y", self.y), ("x_val", self.x_val), ("y_val", self.y_val))
                if a is not None}
        return self._fingerprint

    def _mismatch(self, message):
        if self.resume_mismatch == "error":
            raise ValueError(f"{message}; pass resume_mismatch='warn' to continue anyway")
        warnings.warn(message, RuntimeWarning, stacklevel=5)

    def _histories(self):
        r = self.result
        return {"loss": r.loss_history, "acc": r.accuracy_history, "val_loss":
                r.val_loss_history, "val_acc": r.val_accuracy_history, "epoch_times":
                r.epoch_times, "lr": r.lr_history, "skipped": r.skipped_steps,
                "fused": r.fused, "stopped": r.stopped, "stop_reason": r.stop_reason,
                "initial_loss": self.initial_loss}

    def _save_checkpoint(self, epoch):
        opt_state, best = self.ctx.opt_state, self.best_params
        if self.device_run is not None:  # host copies of the device's state
            opt_state = self.device_run.opt_state_to_host()
            best = None if best is None else self.device_run.snapshot_to_host(best)
        c = ckpt_mod.Checkpoint(
            epoch=epoch, params={}, optimizer=self.opt.get_config(),
            opt_state=opt_state, rng_state=self.ctx.rng.bit_generator.state,
            history=self._histories(), lr=self.ctx.lr, step=self.ctx.step,
            config=self._settings(), algo_state=self.ctx.state,
            policy=None if self.policy is None else self.policy.state_dict(),
            best_params=best)
        ckpt_mod.save_checkpoint(self.checkpoint, self.model, c)

    def _resume(self, path):
        c = ckpt_mod.load_checkpoint(path)
        if c.architecture != self.model.get_config() or c.dtype != np.dtype(self.model.dtype).name:
            raise ValueError(f"resume: {path} holds a {c.dtype} model {c.architecture}, which is "
                             f"not this {np.dtype(self.model.dtype).name} model "
                             f"{self.model.get_config()}; build the same model to resume")
        saved_opt = optim.from_config(c.optimizer)
        if type(saved_opt) is not type(self.opt):
            raise ValueError(f"resume: {path} was trained with {saved_opt.name}, but optimizer="
                             f"{self.opt.name}; resume with the same optimizer")
        changed = {k: (c.config.get(k), v) for k, v in self._settings().items()
                   if c.config.get(k) != v}
        if self.policy is None and c.lr != self.ctx.lr:
            changed["learning_rate"] = (c.lr, self.ctx.lr)
        if changed:
            self._mismatch(f"resume: settings differ from the checkpoint's {changed} (saved, "
                           "now); the run will not reproduce an uninterrupted one")
        self.model.load_parameters(c.params)
        self.ctx.opt_state = optim.OptState(c.opt_state.t, {
            s: {k: np.ascontiguousarray(v, dtype=self.model.dtype) for k, v in d.items()}
            for s, d in c.opt_state.slots.items()})
        self.ctx.rng = ckpt_mod.restore_generator(c.rng_state)
        if self.policy is not None:
            self.ctx.lr = c.lr  # train_sh: the rate its policy had reached
        # train: the rate passed now is used (e.g. fine-tuning at another rate), after the
        # mismatch warning above
        self.ctx.step = c.step
        self.ctx.state = dict(c.algo_state)
        h = c.history
        r = self.result
        r.loss_history, r.accuracy_history = list(h["loss"]), list(h["acc"])
        r.val_loss_history, r.val_accuracy_history = list(h["val_loss"]), list(h["val_acc"])
        r.epoch_times, r.lr_history = list(h["epoch_times"]), list(h["lr"])
        r.skipped_steps, r.fused = int(h["skipped"]), bool(h["fused"])
        r.epochs_run = c.epoch
        self.initial_loss = h.get("initial_loss")
        if h.get("stopped"):
            # the saved run had already stopped (policy or callback): resuming adds nothing, so
            # the result is that of the uninterrupted run
            r.stopped, r.stop_reason = True, h.get("stop_reason")
            self.epochs = c.epoch
            warnings.warn(f"resume: the run in {path} already stopped after epoch {c.epoch} "
                          f"({r.stop_reason}); nothing to train", RuntimeWarning, stacklevel=4)
        if self.policy is not None and c.policy is not None:
            self.policy = PlateauPolicy.from_state_dict(c.policy)
        self.best_params = c.best_params
        self.start_epoch = c.epoch
        if c.epoch >= self.epochs and not r.stopped:
            warnings.warn(f"resume: the checkpoint already has {c.epoch} epochs and epochs="
                          f"{self.epochs}; nothing to train", RuntimeWarning, stacklevel=4)

    # -- the loop -----------------------------------------------------------------------------
    def _run_batches(self, order):
        stats = EpochStats()
        # NOTE: NaN/Inf are detected and reported by the loop (skipped steps, divergence); the
        # raw NumPy overflow warnings on the way there would only repeat it less clearly.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            self._batches(order, stats)
        return stats

    def _batches(self, order, stats):
        ctx, algo, x, y = self.ctx, self.algo, self.x, self.y
        bs, n = self.config.batch_size, x.shape[0]
        for b, start in enumerate(range(0, n, bs)):
            if order is None:
                xb = x[start:start + bs]
                yb = None if y is None else y[start:start + bs]
            else:
                idx = order[start:start + bs]
                xb = x[idx]
                yb = None if y is None else y[idx]
            res = algo.train_one_batch(ctx, xb, yb)
            ctx.step += 1
            if not math.isfinite(res.loss):
                stats.diverged_batch, stats.diverged_loss = b, float(res.loss)
                break
            stats.add(res, xb.shape[0])

    def _evaluate(self):
        if self.x_val is None:
            return None, None
        evaluate = self.algo.evaluate or evaluate_model
        return evaluate(self.model, self.x_val, self.y_val, self.loss_type)

    def _call_callbacks(self, epoch, logs):
        stop = None
        for cb in self.callbacks:
            fn = getattr(cb, "on_epoch_end", None)
            if fn is None and callable(cb):
                fn = cb
            if fn is None:
                raise TypeError(f"callback {cb!r} has no on_epoch_end(epoch, logs) method and is "
                                "not callable")
            if fn(epoch, logs) is True and stop is None:
                stop = f"callback {getattr(cb, '__name__', type(cb).__name__)} asked to stop"
        return stop

    def _hook(self, name, logs):
        for cb in self.callbacks:
            fn = getattr(cb, name, None)
            if fn is not None:
                fn(logs)

    def run(self) -> TrainingResult:
        r, ctx = self.result, self.ctx
        lock = None
        if self.checkpoint is not None and self.start_epoch < self.epochs:
            # one writer per checkpoint; also clears temporaries of killed earlier writers
            lock = ckpt_mod.CheckpointLock(self.checkpoint).acquire()
        bar = None
        if self.verbose and self.start_epoch < self.epochs:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.epochs, initial=self.start_epoch, unit="epoch",
                       desc=f"train {self.algo.name}", leave=True)
        try:
            self._hook("on_train_begin", {"epochs": self.epochs,
                                          "start_epoch": self.start_epoch})
            last_good = self._good_state(self.start_epoch)
            if self.divergence is not None and self.start_epoch == 0:
                self.initial_loss = self._probe_loss()
        except BaseException:
            if bar is not None:
                bar.close()
            if lock is not None:
                lock.release()
            raise
        try:
            for epoch in range(self.start_epoch + 1, self.epochs + 1):
                t0 = time.perf_counter()
                order = ctx.rng.permutation(self.x.shape[0]) if self.config.shuffle else None
                stats = None
                if self.device_run is not None:
                    stats = self.device_run.run_epoch(order, EpochStats())
                elif self.algo.run_epoch is not None:
                    stats = self.algo.run_epoch(ctx, self.x, self.y, order)
                if stats is None:
                    stats = self._run_batches(order)
                if stats.skipped:
                    r.skipped_steps += stats.skipped
                    warnings.warn(f"epoch {epoch}: skipped {stats.skipped} optimizer step(s) "
                                  "whose gradient held NaN/Inf; consider gradient_clip or a lower "
                                  "learning rate", RuntimeWarning, stacklevel=3)
                if stats.diverged_batch >= 0:
                    self._diverged(epoch, stats, last_good)
                    # recorded as inf, whichever non-finite value it was (the stop reason
                    # names it): histories compare equal across paths that overflow alike
                    self._record_stopped_epoch(math.inf, stats, t0)
                    break
                r.fused = r.fused or stats.fused
                r.path = "cuda" if self.device_run is not None else stats.path
                r.schedule = stats.schedule
                r.piece_plan = stats.piece_plan or r.piece_plan
                if self._check_divergence(epoch, stats.loss, last_good):
                    self._record_stopped_epoch(stats.loss, stats, t0)
                    break
                val_loss, val_acc = self._evaluate()
                dt = time.perf_counter() - t0
                r.loss_history.append(stats.loss)
                r.accuracy_history.append(stats.accuracy)
                if self.x_val is not None:
                    r.val_loss_history.append(val_loss)
                    r.val_accuracy_history.append(val_acc)
                r.epoch_times.append(dt)
                r.lr_history.append(ctx.lr)
                r.epochs_run = epoch
                logs = {"loss": stats.loss, "acc": stats.accuracy, "val_loss": val_loss,
                        "val_acc": val_acc, "lr": ctx.lr, "epoch_time": dt}
                stop = self._apply_policy(epoch, logs)
                stop = self._call_callbacks(epoch, logs) or stop
                if self.dist is not None:
                    stop = self.dist.agree_stop(stop)
                last_good = self._good_state(epoch)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix({k: f"{v:.4g}" for k, v in logs.items()
                                     if v is not None and k != "epoch_time"})
                if stop:
                    r.stopped, r.stop_reason = True, stop
                if self.checkpoint is not None and (epoch % self.checkpoint_every == 0 or
                                                    epoch == self.epochs or stop):
                    self._save_checkpoint(epoch)
                if stop:
                    break
        finally:
            if bar is not None:
                bar.close()
            if lock is not None:
                lock.release()
        if self.restore_best and self.best_params is not None:
            if self.device_run is not None:
                self.device_run.restore(self.best_params, with_state=False)
            else:
                _restore(ctx.params, self.best_params)
            self.restored_best = True
        if self.device_run is not None:  # keep only the weights on the device (for the sync)
            r.cuda_mode = self.device_run.mode
            r.cuda_graph_reason = self.device_run.graph_reason
            r.device_counts = self.device_run.device_counts
            self.device_run.finish()
        kept = r.loss_history[:-1] if r.diverged else r.loss_history
        r.final_loss = kept[-1] if kept else math.nan
        r.total_time = time.perf_counter() - self.t_start
        self._hook("on_train_end", {"epochs_run": r.epochs_run, "stop_reason": r.stop_reason})
        return r

    def _apply_policy(self, epoch, logs):
        if self.policy is None:
            return None
        value = logs[self.policy.monitor]
        if value is None:
            raise ValueError(f"monitor {self.policy.monitor!r} has no value: the loss "
                             f"{self.loss_type!r} has no accuracy; monitor a loss instead")
        decision = self.policy.step(value)
        if decision.improved and self.restore_best:
            self.best_params = (_snapshot(self.ctx.params) if self.device_run is None
                                else self.device_run.snapshot())
        self.ctx.lr = decision.lr
        return decision.reason if decision.stop else None

    def _good_state(self, epoch):
        """What a divergence puts back: weights, optimizer state, and their epoch."""
        if self.device_run is not None:  # device copies: no readback per epoch
            return self.device_run.snapshot(), None, epoch
        return _snapshot(self.ctx.params), self.ctx.opt_state.copy(), epoch

    def _record_stopped_epoch(self, loss, stats, t0):
        """The epoch a divergence stopped joins the histories (``loss_history[-1]`` is the loss
        that tripped the rule, inf for a non-finite one, even in the first epoch); its
        validation is not evaluated (NaN), and ``epochs_run`` still counts only the epochs whose
        weights were kept."""
        r = self.result
        r.loss_history.append(float(loss))
        r.accuracy_history.append(stats.accuracy)
        if self.x_val is not None:
            r.val_loss_history.append(math.nan)
            r.val_accuracy_history.append(None if stats.accuracy is None else math.nan)
        r.epoch_times.append(time.perf_counter() - t0)
        r.lr_history.append(self.ctx.lr)

    def _diverged(self, epoch, stats, last_good):
        self._stop_diverged(f"non-finite loss ({stats.diverged_loss}) at epoch {epoch}, batch "
                            f"{stats.diverged_batch + 1}", "non_finite_loss", last_good)

    def _stop_diverged(self, what, rule, last_good):
        params, opt_state, good_epoch = last_good
        if self.device_run is not None:
            self.device_run.restore(params)
        else:
            _restore(self.ctx.params, params)
            self.ctx.opt_state = opt_state
        r = self.result
        r.diverged = r.stopped = True
        r.restored_epoch = good_epoch
        r.divergence_rule = rule
        where = "the initial weights" if good_epoch == 0 else f"the weights after epoch {good_epoch}"
        r.stop_reason = (f"{what}: training stopped and {where} were restored;"
                         " lower the learning rate, clip gradients or check the data")
        warnings.warn(r.stop_reason, RuntimeWarning, stacklevel=5)

    # -- divergence while the loss is finite (DivergenceRules) -------------------------------
    def _probe(self):
        """The probe batch: the first ``PROBE_ROWS`` training samples, in order."""
        k = min(self.x.shape[0], DivergenceRules.PROBE_ROWS)
        return self.x[:k], None if self.y is None else self.y[:k]

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
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                loss, _ = evaluate(self.model, x, y, self.loss_type)
            loss = float(loss)
        except (ValueError, TypeError, AttributeError, NotImplementedError):
            return None
        return loss if math.isfinite(loss) else None

    def _probe_grad_max(self):
        """The largest magnitude in the loss gradient on the probe batch (None: no loss)."""
        if not self.algo.needs_targets or self.loss_type is None:
            return None
        from fastlib.grad import value_and_grad

        x, y = self._probe()
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                _, grads = value_and_grad(self.model, x, y, self.loss_type)
        except (ValueError, TypeError, NotImplementedError, AttributeError) as exc:
            # a model the loss gradient cannot be taken of (a custom layer or algorithm): the
            # other rules still apply; say so once instead of failing a healthy run
            self.probe_grad_failed = True
            warnings.warn(f"divergence rule max_grad is off for this run: the loss gradient "
                          f"on the probe batch cannot be computed ({exc})", RuntimeWarning,
                          stacklevel=6)
            return None
        return _max_abs(grads.values(), finite_only=True)

    def _target_scale(self):
        """``max(1, RMS(y))`` for mse (its loss and gradients scale with the targets), else 1."""
        if getattr(self, "_scale", None) is None:
            self._scale = 1.0
            if self.loss_type == "mse" and self.y is not None and self.y.size:
                with np.errstate(over="ignore"):
                    rms = float(np.sqrt(np.mean(np.square(self.y, dtype=np.float64))))
                self._scale = max(1.0, rms) if math.isfinite(rms) else 1.0
        return self._scale

    def _check_divergence(self, epoch, loss, last_good):
        """Apply the divergence rules after ``epoch``; stop and restore when one fires."""
        rules = self.divergence
        if rules is None:
            return False
        earlier = [v for v in self.result.loss_history if v is not None and math.isfinite(v)]
        if self.initial_loss is not None:
            earlier.append(self.initial_loss)
        best = min(earlier) if earlier else None
        if self.device_run is not None:
            # on the device only the loss rules apply: the weight and probe-gradient rules
            # would copy every weight to the host each epoch, which the frame exists to avoid
            weight = grad = None
        else:
            weight = _max_abs(self.ctx.params.values())
            grad = (self._probe_grad_max() if rules.max_grad is not None
                    and not getattr(self, "probe_grad_failed", False) else None)
        fired = check_divergence(rules, loss, best, self.initial_loss, weight, grad,
                                 self._target_scale())
        if fired is None:
            return False
        rule, why = fired
        self._stop_diverged(f"divergence rule {rule!r} fired after epoch {epoch}: {why}", rule,
                            last_good)
        return True
