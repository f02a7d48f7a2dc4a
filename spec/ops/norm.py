"""Normalisation: ``softmax log_softmax`` (along ``axis``), ``layer_norm rms_norm`` (last axis).

``layer_norm`` and ``rms_norm`` have no affine part: a weight and a bias are separate ``mul`` and
``add`` ops. ``eps`` is a parameter. Softmax and log-softmax go through log-sum-exp.
"""
from __future__ import annotations

from spec.opspec import Example, declare


def _lse(M, x, axis):
    """log Σ exp(x) along ``axis``, kept as a length-1 axis."""
    return M.log(M.sum(M.exp(x), axis, True))


def _mean_last(M, x):
    return M.sum(x, -1, True) / x.shape[-1]


def _layer_norm_sigma(M, x, eps):
    """sqrt(var + eps), var the biased variance over the last axis."""
    centred = x - _mean_last(M, x)
    return M.sqrt(_mean_last(M, centred**2) + M.param(eps))


def _rms(M, x, eps):
    return M.sqrt(_mean_last(M, x**2) + M.param(eps))


AXIS_EXAMPLES = (Example([(2, 3)]), Example([(2, 3)], {"axis": 0}), Example([(4,)]))
LAST_AXIS_EXAMPLES = (Example([(2, 3)]), Example([(3,)]), Example([(2, 1, 2)]))

OPS = (
    declare(
        "softmax",
        forward=lambda M, x, axis: M.exp(x - _lse(M, x, axis)),
        vjp={"x": lambda M, grad, result, axis:
             result * (grad - M.sum(grad * result, axis, True))},
        examples=AXIS_EXAMPLES, math="exp(x - logsumexp(x, axis))"),
    declare(
        "log_softmax",
        forward=lambda M, x, axis: x - _lse(M, x, axis),
        vjp={"x": lambda M, grad, result, axis:
             grad - M.exp(result) * M.sum(grad, axis, True)},
        examples=AXIS_EXAMPLES, math="x - logsumexp(x, axis)"),
    declare(
        "layer_norm",
        forward=lambda M, x, eps: (x - _mean_last(M, x)) / _layer_norm_sigma(M, x, eps),
        vjp={"x": lambda M, grad, result, x, eps:
             (grad - _mean_last(M, grad) - result * _mean_last(M, grad * result))
             / _layer_norm_sigma(M, x, eps)},
        examples=LAST_AXIS_EXAMPLES,
        math="(x - mean(x)) / sqrt(var(x) + eps) over the last axis (biased var, no affine)"),
    declare(
        "rms_norm",
        forward=lambda M, x, eps: x / _rms(M, x, eps),
        vjp={"x": lambda M, grad, result, x, eps:
             (grad - result * _mean_last(M, grad * result)) / _rms(M, x, eps)},
        examples=LAST_AXIS_EXAMPLES,
        math="x / sqrt(mean(x²) + eps) over the last axis (no affine)"),
)
