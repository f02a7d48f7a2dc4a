"""Normalisation: ``softmax log_softmax`` (along ``axis``), ``layer_norm rms_norm`` (last axis).

``layer_norm`` and ``rms_norm`` have no affine part: a weight and a bias are separate ``mul`` and
``add`` ops. ``eps`` is a parameter. Softmax and log-softmax go through log-sum-exp.
"""
from __future__ import annotations

from spec import shapes
from spec.opspec import Example, OpSpec, Param


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
    OpSpec(
        name="softmax", category="normalisation", inputs=("x",), domains={"x": "real"},
        forward=lambda M, x, axis: M.exp(x - _lse(M, x, axis)),
        vjp={"x": lambda M, grad, result, axis:
             result * (grad - M.sum(grad * result, axis, True))},
        shape_rule=shapes.along_axis, params=[Param("axis", -1, "int")],
        examples=AXIS_EXAMPLES, math="exp(x - logsumexp(x, axis))"),
    OpSpec(
        name="log_softmax", category="normalisation", inputs=("x",), domains={"x": "real"},
        forward=lambda M, x, axis: x - _lse(M, x, axis),
        vjp={"x": lambda M, grad, result, axis:
             grad - M.exp(result) * M.sum(grad, axis, True)},
        shape_rule=shapes.along_axis, params=[Param("axis", -1, "int")],
        examples=AXIS_EXAMPLES, math="x - logsumexp(x, axis)"),
    OpSpec(
        name="layer_norm", category="normalisation", inputs=("x",), domains={"x": "real"},
        forward=lambda M, x, eps: (x - _mean_last(M, x)) / _layer_norm_sigma(M, x, eps),
        vjp={"x": lambda M, grad, result, x, eps:
             (grad - _mean_last(M, grad) - result * _mean_last(M, grad * result))
             / _layer_norm_sigma(M, x, eps)},
        shape_rule=shapes.last_axis, params=[Param("eps", 1e-5, "positive")],
        examples=LAST_AXIS_EXAMPLES,
        math="(x - mean(x)) / sqrt(var(x) + eps) over the last axis (biased var, no affine)"),
    OpSpec(
        name="rms_norm", category="normalisation", inputs=("x",), domains={"x": "real"},
        forward=lambda M, x, eps: x / _rms(M, x, eps),
        vjp={"x": lambda M, grad, result, x, eps:
             (grad - result * _mean_last(M, grad * result)) / _rms(M, x, eps)},
        shape_rule=shapes.last_axis, params=[Param("eps", 1e-6, "positive")],
        examples=LAST_AXIS_EXAMPLES,
        math="x / sqrt(mean(x²) + eps) over the last axis (no affine)"),
)
