"""``train`` and ``train_sh``: the entry points, and the epoch loop that joins the run's parts.

Each part has one job: ``arguments`` and ``options`` (the call), ``run_data`` (the data, checked
once), ``backends`` and ``epochs`` (where and how an epoch runs), ``divergence`` (the monitor
that stops a run blowing up), ``checkpointing`` (writes and resumes), ``plateau`` (``train_sh``'s
policy), ``callbacks`` and ``progress`` (who hears about each epoch), ``result`` (what the call
returns). This module builds them in order, then runs the epochs.

The long story: docs/training.md, section "Inside the loop".
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from fastlib import optim
from fastlib.errors import DivergenceWarning
from fastlib.training import backends, checkpointing, epochs, mixed_precision, run_data
from fastlib.training.algorithms import StepContext, TrainConfig, evaluate_model, get_algorithm
from fastlib.training.arguments import MISSING, check_lr, check_parameters, normalise
from fastlib.training.callbacks import Callbacks, epoch_logs
from fastlib.training.divergence import DivergenceMonitor
from fastlib.training.early_stopping import PlateauPolicy
from fastlib.training.epoch_state import single_threaded_blas
from fastlib.training.notices import warn
from fastlib.training.plateau import PlateauRun
from fastlib.training.progress import Progress, progress_mode
from fastlib.training.result import TrainingHistorySH, TrainingResult, record_epoch
from fastlib.training.values import check_flag, check_int

__all__ = ["train", "train_sh", "TrainingResult", "TrainingHistorySH"]


def train(model, x, y, epochs=MISSING, batch_size=MISSING, learning_rate=None,
          loss_type=MISSING, x_val=None, y_val=None, optimizer="SGD", *, lr=None, loss=None,
          validation_data=None, seed=0, device="cpu", algorithm="bp", callbacks=(),
          verbose=True, checkpoint=None, resume=None, options=None,
          **keywords) -> TrainingResult:
    """Train ``model`` on ``(x, y)`` with mini-batches (DataCode's order, Loom's result).

    DataCode's positional order works, and so do the keywords of Keras and PyTorch:
    ``train(model, x, y, 10, 32, 1e-3, "cross_entropy")`` is
    ``train(model, x, y, epochs=10, batch_size=32, lr=1e-3, loss="cross_entropy")``;
    ``validation_data=(x_val, y_val)`` is ``x_val, y_val``. One thing given twice (``lr=`` and
    ``learning_rate``) is a ``TypeError`` naming both, a misspelt keyword (``epoch=3``) a
    ``TypeError`` with a did-you-mean (:mod:`fastlib.training.arguments`).

    Parameters
    ----------
    model : fastlib.Layer
        Trained in place (its ``parameters()`` are updated). Anything else (a list of layers,
        a layer class) is a ``TypeError`` saying what to pass.
    x : array_like
        Inputs ``[N, ...]``; converted once to the model's dtype; NaN/Inf is an error.
    y : array_like or None
        Targets in the format ``loss_type`` requires (``cross_entropy``: class indices
        ``[N, 1]`` or ``[N]``; ``categorical_cross_entropy``: one-hot ``[N, C]``;
        ``binary_cross_entropy``: values in [0, 1], and a model whose last layer gives
        probabilities, a sigmoid or a softmax; ``mse``: the output's shape). None only for
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
        A name of ``fastlib.optim.OPTIMIZERS`` (the registry ``optable.optimizers``
        declares) or an instance with hyperparameters.
        The default is SGD, DataCode's (``verigrad train``'s is Adam).
    lr, loss, validation_data :
        Keyword aliases of ``learning_rate``, ``loss_type`` and ``(x_val, y_val)``.
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
    callbacks : callback or iterable of them
        Objects with ``on_epoch_end(epoch, logs)`` (or callables ``f(epoch, logs)``); one on
        its own counts as a list of one, as in Keras and PyTorch Lightning. ``logs``
        has ``loss acc val_loss val_acc lr epoch_time``, the epoch's history entries. Returning
        True stops training. Optional ``on_train_begin(logs)`` and ``on_train_end(logs)``. An
        epoch a divergence stopped is reported too (its validation entries NaN), as Keras
        reports the epoch ``TerminateOnNaN`` ends.
    verbose : bool or int
        Progress on stderr: True (1) draws a tqdm bar when stderr is a terminal (or in a
        notebook) and writes one line per epoch otherwise, never carriage returns into a log;
        2 writes the lines everywhere; False (0) nothing.
    checkpoint : path, optional
        Write a checkpoint every ``checkpoint_every`` epochs and after the last one (a folder,
        or a path whose folder does not exist, is refused before training). The run
        holds ``<checkpoint>.lock`` while it trains: a second run writing the same path fails at
        once with :class:`~fastlib.errors.CheckpointLockedError` naming the holder (pid, host);
        temporary files a killed run left beside the checkpoint are removed.
    resume : path, optional
        Continue from a checkpoint (model weights, optimizer state, RNG, epoch, histories).
    options : fastlib.TrainOptions, optional
        The rarely used options in one object: ``gradient_clip``, ``clip_mode``, ``shuffle``,
        ``checkpoint_every``, ``resume_mismatch``, ``divergence``, ``distributed``, ``dtype``
        (``"bfloat16"`` / ``"float16"``: mixed precision over the float32 model's master
        weights, :mod:`fastlib.training.mixed_precision`), ``loss_scale``
        (:class:`~fastlib.training.options.TrainOptions` documents each).
    **keywords
        Each field of ``TrainOptions`` as a keyword (``gradient_clip=1.0``; not together with
        ``options=``), and the algorithm's options, in ``ctx.config.extra`` (e.g. ``cd_k=1``;
        ``"targetprop"`` takes the fields of ``fastlib.TargetPropConfig``, e.g.
        ``use_chain_rule=False, update="loom", normalisation="column"``). ``"bp"`` takes
        ``fused`` (default True): False turns off the whole-epoch compiled paths and trains
        batch by batch through the layers; and ``pieces`` (default None: chosen from the
        machine's cores), the compiled paths' piece plan (``fastlib.training.piece_plan``).

    Returns
    -------
    TrainingResult
        Unpacks as ``(loss_history, accuracy_history)``, DataCode's pair; its docstring says
        how its fields agree with its histories after any stop.
    """
    algo = get_algorithm(algorithm)
    call = normalise(train, model=model, epochs=epochs, batch_size=batch_size,
                     learning_rate=learning_rate, lr=lr, loss_type=loss_type, loss=loss,
                     x_val=x_val, y_val=y_val, validation_data=validation_data,
                     optimizer=optimizer, algorithm=algo, options=options, keywords=keywords)
    return _Run(model, x, y, call, optimizer=optimizer, seed=seed, device=device, algo=algo,
                callbacks=callbacks, verbose=verbose, checkpoint=checkpoint, resume=resume,
                plateau=None).go()


def train_sh(model, x, y, epochs=MISSING, batch_size=MISSING, learning_rate=None,
             loss_type=MISSING, optimizer="SGD", monitor="val_loss", patience=10, min_delta=1.0,
             restore_best=True, x_val=None, y_val=None, *, lr=None, loss=None,
             validation_data=None, seed=0, device="cpu", algorithm="bp", callbacks=(),
             verbose=True, checkpoint=None, resume=None, options=None,
             **keywords) -> TrainingHistorySH:
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

    ``lr_factor``, ``stop_patience`` and ``min_lr`` are fields of ``TrainOptions`` (or
    keywords). Other parameters are those of :func:`train` (``lr=``, ``loss=`` and
    ``validation_data=`` too). Returns :class:`TrainingHistorySH`.
    """
    algo = get_algorithm(algorithm)
    call = normalise(train_sh, model=model, epochs=epochs, batch_size=batch_size,
                     learning_rate=learning_rate, lr=lr, loss_type=loss_type, loss=loss,
                     x_val=x_val, y_val=y_val, validation_data=validation_data,
                     optimizer=optimizer, algorithm=algo, options=options, keywords=keywords)
    o = call.options
    policy = PlateauPolicy(lr=1.0, monitor=monitor, patience=patience, min_delta=min_delta,
                           lr_factor=o.lr_factor, stop_patience=o.stop_patience,
                           min_lr=o.min_lr)
    if monitor.startswith("val_") and (call.x_val is None or call.y_val is None):
        raise ValueError(f"monitor={monitor!r} needs validation data: pass x_val and y_val, or "
                         f"monitor {monitor[4:]!r} on the training data")
    plateau = PlateauRun(policy, check_flag(restore_best, "restore_best"))
    result = _Run(model, x, y, call, optimizer=optimizer, seed=seed, device=device, algo=algo,
                  callbacks=callbacks, verbose=verbose, checkpoint=checkpoint, resume=resume,
                  plateau=plateau).go()
    policy = plateau.policy
    return TrainingHistorySH(
        loss=result.loss_history, val_loss=result.val_loss_history,
        acc=result.accuracy_history, val_acc=result.val_accuracy_history, lr=result.lr_history,
        best_metric=policy.best, best_epoch=policy.best_epoch, stopped_epoch=result.epochs_run,
        lr_reductions=policy.reductions, stop_reason=result.stop_reason,
        restored_best=plateau.restored, result=result)


class _Run:
    """One training run: its parts, built and checked before any epoch, and the epoch loop."""

    def __init__(self, model, x, y, call, *, optimizer, seed, device, algo, callbacks, verbose,
                 checkpoint, resume, plateau):
        self.t_start = time.perf_counter()
        self.model, self.algo, self.plateau, self.options = model, algo, plateau, call.options
        backends.check_device(device)
        self.epochs = check_int(call.epochs, "epochs", 0)
        batch_size = check_int(call.batch_size, "batch_size", 1)
        seed = check_int(seed, "seed", 0)
        opt = optim.get(optimizer)
        lr = check_lr(opt, call.lr)
        loss_type = call.loss_type
        if algo.needs_targets:
            from fastlib import losses

            loss_type = losses.resolve_loss(loss_type)
        self.data = run_data.check_data(model, algo, loss_type, x, y, call.x_val, call.y_val)
        o = self.options
        self.mixed = mixed_precision.resolve(o.dtype, o.loss_scale, model.dtype)
        if self.mixed is not None:     # the inputs as the 16-bit format holds them
            self.data = run_data.in_format(self.data, self.mixed.fmt)
        config = TrainConfig(loss_type, min(batch_size, self.data.x.shape[0]), o.gradient_clip,
                             o.clip_mode, o.shuffle, seed, device, algo.name,
                             dict(call.algorithm_options))
        self.callbacks = Callbacks(callbacks)
        progress_mode(verbose, None)     # a bad value is refused now, not after an epoch
        self.verbose = verbose
        params = model.parameters()
        if resume is None:   # resumed weights come from the checkpoint, which is checked
            check_parameters(params)
        self.ctx = StepContext(model, params, loss_type, opt, opt.init(params), lr, config,
                               np.random.default_rng(seed))
        self.result = TrainingResult()
        self.rules = o.divergence_rules
        if self.mixed is not None:
            self.algo = mixed_precision.attach(self.ctx, algo, self.mixed, o.data_parallel)
        self.settings = checkpointing.run_settings(self.ctx, self.rules, plateau, self.data,
                                                   self.mixed)
        best = self._resume_or_init(resume, lr)
        self.writer = checkpointing.CheckpointWriter(checkpoint, o.checkpoint_every, self.epochs)
        self.backend = backends.open_backend(self.ctx, self.algo, self.data, device,
                                             o.data_parallel)
        if plateau is not None and best is not None:
            plateau.best = self.backend.from_host(best)
        self.session = None
        if o.data_parallel is not None:
            self._attach()
        self.divergence = DivergenceMonitor(self.rules, model, self.algo, loss_type,
                                            self.data, self.backend)

    def _resume_or_init(self, resume, lr):
        """Continue from ``resume``, or start fresh; the checkpoint's best weights or None."""
        if self.plateau is not None:
            self.plateau.start(lr)
        self.start_epoch, self.initial_loss = 0, None
        if resume is None:
            if self.algo.init is not None:
                self.algo.init(self.ctx)
            return None
        resumed = checkpointing.resume(
            resume, model=self.model, ctx=self.ctx, result=self.result, settings=self.settings,
            plateau=self.plateau, epochs=self.epochs, mismatch=self.options.resume_mismatch)
        self.epochs, self.start_epoch = resumed.epochs, resumed.epoch
        self.initial_loss = resumed.initial_loss
        return resumed.best_params

    def _attach(self):
        """Data-parallel over MPI: rank 0's state everywhere; only rank 0 speaks and writes."""
        from fastlib.training import distributed

        self.session = distributed.attach(self.ctx, self.algo, self.data.x,
                                          self.options.distributed, self.verbose)
        self.algo = self.backend.algo = self.session.algo
        if self.session.rank != 0:
            self.verbose = False
            self.writer.path = None

    def go(self) -> TrainingResult:
        """Run, under the data-parallel session's guard when there is one."""
        return self._run() if self.session is None else self.session.guard(self._run)

    def _run(self) -> TrainingResult:
        with contextlib.ExitStack() as stack:
            self.writer.open(self.start_epoch)
            stack.callback(self.writer.close)
            progress = Progress(self.verbose, self.epochs, self.start_epoch,
                                f"train {self.algo.name}")
            stack.callback(progress.close)
            # the last batch's saved arrays (a per-batch run's) are no use once training ends
            stack.callback(_drop_history, self.ctx.model)
            self.callbacks.begin({"epochs": self.epochs, "start_epoch": self.start_epoch})
            self.divergence.start(self.start_epoch, self.initial_loss)
            for epoch in range(self.start_epoch + 1, self.epochs + 1):
                if self._epoch(epoch, progress):
                    break
        r = self.result
        r.weights_epoch = r.restored_epoch if r.diverged else r.epochs_run
        if self.plateau is not None:
            self.plateau.finish(self.backend, r)
        self.backend.finish(r)
        r.total_time = time.perf_counter() - self.t_start
        self.callbacks.end({"epochs_run": r.epochs_run, "stop_reason": r.stop_reason})
        return r

    def _epoch(self, epoch, progress) -> bool:
        """Run ``epoch`` and hand it to everyone who hears of it; True when training stops."""
        t0 = time.perf_counter()
        ctx = self.ctx
        order = epochs.draw_order(ctx.rng, self.data.x.shape[0], ctx.config.shuffle)
        stats = self.backend.run_epoch(order)
        self._account(epoch, stats)
        verdict = self.divergence.check(epoch, stats, self.result.loss_history)
        if verdict is not None:
            self.divergence.stop(verdict, self.result)
            acc = stats.accuracy
            logs = self._record(verdict.loss, acc, math.nan, None if acc is None else math.nan,
                                t0)
            self.callbacks.epoch_end(epoch, logs)    # the run stops whatever they answer
            progress.update(epoch, logs)
            warn(self.result.stop_reason, DivergenceWarning)
            return True
        val_loss, val_acc = self._evaluate()
        logs = self._record(stats.loss, stats.accuracy, val_loss, val_acc, t0)
        stop = None
        if self.plateau is not None:
            stop = self.plateau.after_epoch(ctx, self.backend, logs, ctx.loss_type)
        stop = self.callbacks.epoch_end(epoch, logs) or stop
        if self.session is not None:
            stop = self.session.agree_stop(stop)
        self.divergence.accept(epoch)
        progress.update(epoch, logs)
        if stop:
            self.result.stopped, self.result.stop_reason = True, stop
        if self.writer.due(epoch, stop):
            self.writer.write(epoch, model=self.model, ctx=ctx, backend=self.backend,
                              result=self.result, initial_loss=self.divergence.initial_loss,
                              settings=self.settings, plateau=self.plateau)
        return bool(stop)

    def _account(self, epoch, stats):
        """Which path ran the epoch, and the steps it skipped (a warning says how many)."""
        r = self.result
        r.fused = r.fused or stats.fused
        r.path = self.backend.path(stats)
        r.schedule = stats.schedule
        r.piece_plan = stats.piece_plan or r.piece_plan
        r.skipped_steps += stats.skipped
        unexpected = stats.skipped - stats.scaler_skips   # the loss scale's skips are its work
        if unexpected:
            warn(f"epoch {epoch}: skipped {unexpected} optimizer step(s) whose gradient "
                 "held NaN/Inf; consider gradient_clip or a lower learning rate")
        if self.mixed is not None:
            r.precision = self.mixed.fmt
            if self.mixed.scale is not None:
                r.loss_scale = float(self.ctx.state["loss_scale"])
                r.loss_scale_skips = int(self.ctx.state["loss_scale_skips"])

    def _record(self, loss, acc, val_loss, val_acc, t0) -> dict:
        """Write the epoch into the result; its logs for the callbacks and the progress."""
        validated = self.data.validated
        val_loss, val_acc = (val_loss, val_acc) if validated else (None, None)
        seconds = time.perf_counter() - t0
        record_epoch(self.result, loss=loss, accuracy=acc, val_loss=val_loss,
                     val_accuracy=val_acc, lr=self.ctx.lr, seconds=seconds, validated=validated)
        return epoch_logs(self.result.loss_history[-1], acc, val_loss, val_acc, self.ctx.lr,
                          seconds)

    def _evaluate(self):
        if not self.data.validated:
            return None, None
        evaluate = self.algo.evaluate or evaluate_model
        # the compiled epochs' threads run the pieces: BLAS workers woken here would still be
        # spinning when the next epoch starts (the NOTE in fastlib.training.divergence)
        compiled = self.result.path == "program"
        with single_threaded_blas() if compiled else contextlib.nullcontext():
            return evaluate(self.model, self.data.x_val, self.data.y_val, self.ctx.loss_type)


def _drop_history(model):
    """Free what ``model``'s layers saved for a backward pass (a model without any: nothing)."""
    clear = getattr(model, "clear_history", None)
    if clear is not None:
        clear()
