"""A run's side of checkpoints: what it writes and when, and what a resume puts back.

The file format, its validation and the one-writer lock are ``fastlib.training.checkpoint``'s;
this part decides the content (the model, the optimizer's state, the Generator, the histories,
the algorithm's state, the plateau policy and its best weights, and every setting that decides
the trajectory) and compares those settings when a run resumes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from fastlib import optim
from fastlib.io import short_repr
from fastlib.training import checkpoint as ckpt_mod
from fastlib.training.early_stopping import PlateauPolicy
from fastlib.training.notices import warn
from fastlib.training.result import histories, load_histories

__all__ = ["CheckpointWriter", "Resumed", "resume", "run_settings"]


def run_settings(ctx, rules, plateau, data, mixed=None) -> dict:
    """Every setting that decides the trajectory (compared on resume; JSON-able); ``mixed``
    the run's ``MixedPrecision`` (None: the model's dtype)."""
    c = ctx.config
    settings = {"loss_type": ctx.loss_type, "batch_size": c.batch_size,
                "gradient_clip": c.gradient_clip, "clip_mode": c.clip_mode,
                "shuffle": c.shuffle, "algorithm": c.algorithm,
                "optimizer": ctx.optimizer.get_config(), "seed": c.seed,
                "options": {k: _jsonable(v) for k, v in sorted(c.extra.items())},
                "divergence": None if rules is None else rules.state_dict(),
                "data": data.fingerprint}
    if plateau is not None:
        settings["policy"] = plateau.settings()
    if mixed is not None:
        settings["precision"] = mixed.settings()
    return settings


class CheckpointWriter:
    """Writes ``path`` every ``every`` epochs, after the last one and at a stop, holding the
    checkpoint's lock for the whole run (one writer per checkpoint)."""

    def __init__(self, path, every, epochs):
        if path is not None:
            ckpt_mod.check_checkpoint_path(path)
        self.path, self.every, self.epochs = path, every, epochs
        self.lock = None

    def open(self, start_epoch) -> "CheckpointWriter":
        """Take the lock when epochs remain (also clears temporaries of killed writers)."""
        if self.path is not None and start_epoch < self.epochs:
            self.lock = ckpt_mod.CheckpointLock(self.path).acquire()
        return self

    def close(self) -> None:
        """Let go of the lock (idempotent)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def due(self, epoch, stop) -> bool:
        """Whether the end of ``epoch`` (``stop``: a stop was asked) writes the checkpoint."""
        return self.path is not None and (
            epoch % self.every == 0 or epoch == self.epochs or bool(stop))

    def write(self, epoch, *, model, ctx, backend, result, initial_loss, settings, plateau):
        """Write the state after ``epoch`` (atomically; see ``checkpoint.save_checkpoint``)."""
        opt_state, best = backend.checkpoint_state(None if plateau is None else plateau.best)
        c = ckpt_mod.Checkpoint(
            epoch=epoch, params={}, optimizer=ctx.optimizer.get_config(), opt_state=opt_state,
            rng_state=ctx.rng.bit_generator.state, history=histories(result, initial_loss),
            lr=ctx.lr, step=ctx.step, config=settings, algo_state=ctx.state,
            policy=None if plateau is None else plateau.policy.state_dict(), best_params=best)
        ckpt_mod.save_checkpoint(self.path, model, c)


@dataclass
class Resumed:
    """What a resume hands the run besides the state it restored in place."""

    epoch: int                   # epochs done in the checkpoint
    epochs: int                  # the run's total (the checkpoint's epoch when it had stopped)
    initial_loss: float | None
    best_params: dict | None     # host arrays of train_sh's best weights


def resume(path, *, model, ctx, result, settings, plateau, epochs, mismatch) -> Resumed:
    """Restore the run's state from the checkpoint ``path`` into ``model``, ``ctx``,
    ``result`` and ``plateau``.

    Raises
    ------
    ValueError
        Another model or optimizer, or (``mismatch="error"``) other settings.
    fastlib.errors.CorruptFileError
        A checkpoint that cannot be read.
    """
    c = ckpt_mod.load_checkpoint(path)
    dtype = np.dtype(model.dtype).name
    if c.architecture != model.get_config() or c.dtype != dtype:
        where = (f"dtype: {c.dtype!r} saved, {dtype!r} now" if c.dtype != dtype else
                 _first_difference(c.architecture, model.get_config()))
        raise ValueError(f"resume: {path} holds another model than this one ({where}); build "
                         f"the same model to resume (saved: {short_repr(c.architecture)})")
    saved_opt = optim.from_config(c.optimizer)
    if type(saved_opt) is not type(ctx.optimizer):
        raise ValueError(f"resume: {path} was trained with {saved_opt.name}, but optimizer="
                         f"{ctx.optimizer.name}; resume with the same optimizer")
    changed = {k: (c.config.get(k), v) for k, v in settings.items() if c.config.get(k) != v}
    if plateau is None and c.lr != ctx.lr:
        changed["learning_rate"] = (c.lr, ctx.lr)
    if changed:
        message = (f"resume: settings differ from the checkpoint's {changed} (saved, now); the "
                   "run will not reproduce an uninterrupted one")
        if mismatch == "error":
            raise ValueError(f"{message}; pass resume_mismatch='warn' to continue anyway")
        warn(message)
    _restore_state(c, model, ctx, plateau)
    load_histories(result, c.history)
    if c.history.get("stopped"):
        # the saved run had already stopped (policy or callback): resuming adds nothing, so the
        # result is that of the uninterrupted run
        result.stopped, result.stop_reason = True, c.history.get("stop_reason")
        warn(f"resume: the run in {path} already stopped after epoch {c.epoch} "
             f"({result.stop_reason}); nothing to train")
        epochs = c.epoch
    elif c.epoch >= epochs:
        warn(f"resume: the checkpoint already has {c.epoch} epochs and epochs={epochs}; "
             "nothing to train")
    return Resumed(c.epoch, epochs, c.history.get("initial_loss"), c.best_params)


def _first_difference(saved, now, where="model"):
    """Where two layer configs first differ, as ``path: saved value, value now``."""
    if isinstance(saved, dict) and isinstance(now, dict):
        for key in list(saved) + [k for k in now if k not in saved]:
            if saved.get(key, _ABSENT) != now.get(key, _ABSENT):
                return _first_difference(saved.get(key, _ABSENT), now.get(key, _ABSENT),
                                         f"{where}.{key}")
    if isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now):
        for i, (a, b) in enumerate(zip(saved, now)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
    if isinstance(saved, list) and isinstance(now, list):
        return f"{where}: {len(saved)} entries saved, {len(now)} now"
    return f"{where}: {short_repr(saved)} saved, {short_repr(now)} now"


_ABSENT = "(absent)"


def _restore_state(c, model, ctx, plateau):
    """Weights, optimizer state, Generator, rate, step, algorithm state and policy."""
    model.load_parameters(c.params)
    ctx.opt_state = optim.OptState(c.opt_state.t, {
        s: {k: np.ascontiguousarray(v, dtype=model.dtype) for k, v in d.items()}
        for s, d in c.opt_state.slots.items()})
    ctx.rng = ckpt_mod.restore_generator(c.rng_state)
    if plateau is not None:
        ctx.lr = c.lr  # train_sh: the rate its policy had reached
        if c.policy is not None:
            plateau.policy = PlateauPolicy.from_state_dict(c.policy)
    # train: the rate passed now is used (e.g. fine-tuning at another rate), after the
    # mismatch warning
    ctx.step = c.step
    ctx.state = dict(c.algo_state)


def _jsonable(value):
    """``value`` when JSON can hold it, else its repr (settings are compared as JSON)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)
