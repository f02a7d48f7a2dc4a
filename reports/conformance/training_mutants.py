"""Plausible training bugs, planted in a running fastlib by monkeypatching: the ``train`` rows
(``training_rows``) must fail under each.

The long story: docs/reports-training-checks.md,
section ``reports/conformance/training_mutants.py``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["TrainingMutant", "MUTANTS"]


@dataclass(frozen=True)
class TrainingMutant:
    """A named bug: ``apply()`` is a context manager that plants it."""

    name: str
    description: str
    apply: Callable


@contextlib.contextmanager
def _patched(owner, attr, replacement):
    original = getattr(owner, attr)
    setattr(owner, attr, replacement(original))
    try:
        yield
    finally:
        setattr(owner, attr, original)


def step_off_on_one_tensor():
    """The update of the last parameter tensor goes 1e-7 (of the step) too far."""
    from fastlib import optim

    def wrap(update):
        def update_off(self, params, grads, state, *, lr=None):
            key = list(params)[-1]
            before = np.array(params[key], copy=True)
            out = update(self, params, grads, state, lr=lr)
            params[key][...] += 1e-7 * (params[key] - before)
            return out
        return update_off
    return _patched(optim.Optimizer, "update", wrap)


def gradient_off_1e10():
    """Entry [0, 0] of every Dense weight gradient is multiplied by 1 + 1e-10."""
    from fastlib.layers import dense

    def wrap(backward):
        def backward_off(self, grad_out, need_input_grad=True):
            gin, grads = backward(self, grad_out, need_input_grad)
            grads["weight"].reshape(-1)[0] *= 1 + 1e-10
            return gin, grads
        return backward_off
    return _patched(dense.Dense, "backward", wrap)


def small_term_1e7():
    """Every Dense bias gradient loses a term of 1e-7 of itself."""
    from fastlib.layers import dense

    def wrap(backward):
        def backward_off(self, grad_out, need_input_grad=True):
            gin, grads = backward(self, grad_out, need_input_grad)
            grads["bias"] *= 1 - 1e-7
            return gin, grads
        return backward_off
    return _patched(dense.Dense, "backward", wrap)


def fused_float32_leak():
    """The fused epoch's flat parameter buffer goes through float32 (a float64 run)."""
    from fastlib.training import mlp_schedule

    def wrap(flatten):
        def flatten_leak(self, arrays):
            flat = flatten(self, arrays)
            if flat.dtype == np.float64:
                flat = flat.astype(np.float32).astype(np.float64)
            return flat
        return flatten_leak
    return _patched(mlp_schedule._Plan, "flatten", wrap)


def clipping_disabled():
    """``train`` validates ``gradient_clip`` and then trains as if it were 0."""
    from fastlib.training import options

    def wrap(check_clip):
        def check_clip_off(gradient_clip, clip_mode):
            _, mode = check_clip(gradient_clip, clip_mode)
            return 0.0, mode
        return check_clip_off
    return _patched(options, "check_clip", wrap)


class _RepeatingRng:
    """A Generator whose permutations repeat their first entry in place of their last."""

    def __init__(self, rng):
        self._rng = rng

    def permutation(self, n):
        order = self._rng.permutation(n)
        if len(order) > 1:
            order[-1] = order[0]
        return order

    def __getattr__(self, attr):
        return getattr(self._rng, attr)


def shuffle_repeats_sample():
    """Each epoch's shuffled order holds one sample twice and misses another."""
    from fastlib.training import loop

    def wrap(init):
        def init_repeating(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.ctx.rng = _RepeatingRng(self.ctx.rng)
        return init_repeating
    return _patched(loop._Run, "__init__", wrap)


def partial_batch_dropped():
    """Batches are ``n // batch_size`` full ones: the incomplete last batch is dropped."""
    from fastlib.training import loop

    def wrap(init):
        def init_dropping(self, *args, **kwargs):
            init(self, *args, **kwargs)
            data, bs = self.data, self.ctx.config.batch_size
            n = data.x.shape[0]
            keep = n - n % bs
            if 0 < keep < n:
                data.x = data.x[:keep]
                data.y = None if data.y is None else data.y[:keep]
        return init_dropping
    return _patched(loop._Run, "__init__", wrap)


def compiled_attention_unmasked():
    """The compiled program drops every attention row's causal flag."""
    from fastlib.kernels import instructions as ins
    from fastlib.training import program

    def wrap(grad_modes):
        def grad_modes_unmasked(self):
            grad_modes(self)
            for row in self._rows:
                if row["op"] == ins.ATTENTION:
                    row["causal"] = 0
        return grad_modes_unmasked
    return _patched(program.Program, "_grad_modes", wrap)


def layer_norm_term_ulps():
    """The LayerNorm layer's input gradient takes its ``x̂ · mean(g · x̂)`` term ``2**-45``
    (256 float64 ulps) too large: rounding-sized where the layer is well conditioned, the
    whole error budget behind a two-wide LayerNorm, whose terms cancel to ``eps / var``."""
    from fastlib.kernels import dense

    def wrap(backward):
        def backward_off(dy, xhat, rstd, weight, dx, mode, dweight, dbias, acc):
            backward(dy, xhat, rstd, weight, dx, mode, dweight, dbias, acc)
            if dx.shape[0]:   # an input cotangent was asked for
                third = np.mean(dy * weight * xhat, axis=1, keepdims=True) * xhat
                dx -= 2.0 ** -45 * rstd[:, None] * third
        return backward_off
    return _patched(dense, "layer_norm_backward", wrap)


MUTANTS = {m.name: m for m in (
    TrainingMutant("step-1e-7-one-tensor", "an optimizer step 1e-7 off on one tensor",
                   step_off_on_one_tensor),
    TrainingMutant("gradient-1e-10", "one Dense weight-gradient entry 1e-10 off",
                   gradient_off_1e10),
    TrainingMutant("small-term-1e-7", "bias gradients lose a 1e-7-relative term",
                   small_term_1e7),
    TrainingMutant("fused-float32-leak", "a float64 fused epoch rounds parameters to float32",
                   fused_float32_leak),
    TrainingMutant("clipping-disabled", "gradient_clip ignored", clipping_disabled),
    TrainingMutant("shuffle-repeats-sample", "a shuffled epoch repeats a sample",
                   shuffle_repeats_sample),
    TrainingMutant("partial-batch-dropped", "the last partial batch is dropped",
                   partial_batch_dropped),
    TrainingMutant("layer-norm-term-256-ulps",
                   "the LayerNorm layer's x̂·mean(g·x̂) input-gradient term 256 ulps off",
                   layer_norm_term_ulps),
    TrainingMutant("compiled-attention-unmasked",
                   "the compiled attention path ignores the causal mask",
                   compiled_attention_unmasked),
)}
