"""Back-propagation (``"bp"``, SINGA's kBP), registered like any other training algorithm.

One batch: forward, loss, backward, clip, optimizer step. A whole epoch may instead run on a
compiled program under one of its schedules (``fastlib.training.schedules``). Kept apart from
the registry so that the schedules may import the registry's types without a cycle.
"""
from __future__ import annotations

import numpy as np

from fastlib import losses
from fastlib.training.algorithms import (BatchResult, StepContext, correct_count, evaluate_model,
                                         register_algorithm)
from fastlib.training.clipping import clip_gradients
from fastlib.training.program import fused_option
from fastlib.training.schedules import run_compiled_epoch
from fastlib.training.piece_plan import requested_plan


def bp_train_one_batch(ctx: StepContext, x: np.ndarray, y: np.ndarray) -> BatchResult:
    """Back-propagation: forward, loss, backward, clip, optimizer step (SINGA's kBP).

    A non-finite loss is returned without touching the parameters (the loop stops); a
    non-finite gradient skips the update and reports ``skipped=True``.
    """
    pred = ctx.model.forward(x)
    # Targets were validated and normalised once for the whole data set (train's setup).
    loss, dpred = losses.loss_value_and_grad(ctx.loss_type, pred, y, check=False)
    loss = float(loss)
    correct = correct_count(ctx.loss_type, pred, y)
    if not np.isfinite(loss):
        return BatchResult(loss, correct, False)
    _, grads = ctx.model.backward(dpred, need_input_grad=False)
    grads = {k: np.ascontiguousarray(grads[k]) for k in ctx.params}
    info = clip_gradients(grads, ctx.config.gradient_clip, ctx.config.clip_mode)
    if not info.finite:
        return BatchResult(loss, correct, True, grads)
    ctx.opt_state = ctx.optimizer.update(ctx.params, grads, ctx.opt_state, lr=ctx.lr)
    return BatchResult(loss, correct, False, grads)


def _bp_run_epoch(ctx, x, y, order):
    # a plan given by the user is checked before any epoch, whichever path takes the model
    requested_plan(ctx)
    return run_compiled_epoch(ctx, x, y, order)


def _bp_init(ctx):
    # the first epoch reads fused; a bad value is refused now, before any training work
    fused_option(ctx.config)


# options: fused=False turns off the whole-epoch compiled program
# (fastlib.training.schedules); pieces=P fixes its piece plan
# (fastlib.training.piece_plan)
register_algorithm("bp", bp_train_one_batch, init=_bp_init, evaluate=evaluate_model,
                   run_epoch=_bp_run_epoch, options=("fused", "pieces"))
