"""Losses: ``mse cross_entropy categorical_cross_entropy binary_cross_entropy
binary_cross_entropy_with_logits``. Each returns a 0-d array and takes a 0-d ``grad``.

Target formats follow DataCode's documented losses: ``cross_entropy`` class indices (N, 1) or (N,), not
differentiable; ``categorical_cross_entropy`` one-hot (any distribution) (N, C); the binary
losses targets in [0, 1]. Every target that is a real number is differentiable.
"""
from __future__ import annotations

import numpy as np

from spec.opspec import Example, declare


def _log_softmax_rows(M, z):
    return z - M.log(M.sum(M.exp(z), -1, True))


def _softmax_rows(M, z):
    return M.exp(_log_softmax_rows(M, z))


def _onehot(target, shape):
    """The (N, C) one-hot matrix of class indices ``target`` (exact 0s and 1s)."""
    out = np.zeros(shape, dtype=np.int64)
    out[np.arange(shape[0]), np.asarray(target, dtype=np.int64).reshape(-1)] = 1
    return out.astype(object)


def _picked(z, target):
    """z[n, target[n]] for every row n."""
    return z[np.arange(z.shape[0]), np.asarray(target, dtype=np.int64).reshape(-1)]


def _sigmoid(M, x):
    return 1 / (1 + M.exp(-x))


OPS = (
    declare(
        "mse",
        forward=lambda M, pred, target: M.sum((pred - target)**2) / pred.size,
        vjp={"pred": lambda M, grad, pred, target: grad * 2 * (pred - target) / pred.size,
             "target": lambda M, grad, pred, target: -grad * 2 * (pred - target) / pred.size},
        examples=(Example([(3,), (3,)]), Example([(2, 2), (2, 2)])),
        math="mean((pred - target)²) over all elements"),
    declare(
        "cross_entropy",
        forward=lambda M, logits, target:
            -M.sum(_picked(_log_softmax_rows(M, logits), target)) / logits.shape[0],
        vjp={"logits": lambda M, grad, logits, target:
             grad * (_softmax_rows(M, logits) - _onehot(target, logits.shape)) / logits.shape[0],
             "target": None},
        examples=(Example([(2, 3), (2, 1)]), Example([(3, 2), (3,)])),
        math="mean over rows of -log_softmax(logits)[n, target[n]]"),
    # NOTE: the logits' VJP is stated as (softmax · Σ_c t - t) / N, the derivative for any
    # target; on the domain (rows summing to 1) it is the familiar (softmax - t) / N.
    declare(
        "categorical_cross_entropy",
        forward=lambda M, logits, target:
            -M.sum(target * _log_softmax_rows(M, logits)) / logits.shape[0],
        vjp={"logits": lambda M, grad, logits, target:
             grad * (_softmax_rows(M, logits) * M.sum(target, -1, True) - target)
             / logits.shape[0],
             "target": lambda M, grad, logits:
             -grad * _log_softmax_rows(M, logits) / logits.shape[0]},
        examples=(Example([(2, 3), (2, 3)]), Example([(1, 4), (1, 4)])),
        math="-(1/N) Σ target · log_softmax(logits)"),
    declare(
        "binary_cross_entropy",
        forward=lambda M, p, target:
            -M.sum(target * M.log(p) + (1 - target) * M.log(1 - p)) / p.size,
        vjp={"p": lambda M, grad, p, target: grad * (p - target) / (p * (1 - p)) / p.size,
             "target": lambda M, grad, p: grad * (M.log(1 - p) - M.log(p)) / p.size},
        examples=(Example([(3,), (3,)]), Example([(2, 2), (2, 2)])),
        math="mean of -(t·log p + (1 - t)·log(1 - p))"),
    declare(
        "binary_cross_entropy_with_logits",
        forward=lambda M, logits, target: M.sum(
            M.maximum(logits, M.num(0)) - logits * target + M.log(1 + M.exp(-M.abs(logits)))
        ) / logits.size,
        vjp={"logits": lambda M, grad, logits, target:
             grad * (_sigmoid(M, logits) - target) / logits.size,
             "target": lambda M, grad, logits: -grad * logits / logits.size},
        examples=(Example([(3,), (3,)]), Example([(2, 2), (2, 2)])),
        math="mean of max(z, 0) - z·t + log(1 + exp(-|z|))"),
)
