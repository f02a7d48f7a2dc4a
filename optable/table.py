"""The op table: every op's signature, and the activations with their kernel codes.

One entry per op, in registry order. Adding an op starts here (docs/optable.md); spec adds its
formulas, each engine its implementation, and the harness reads everything else from here.
Codes are stable: give a new op or activation the next free number, never reuse one.
"""
from __future__ import annotations

import math

from optable.signature import REQUIRED, Activation, OpSignature, Param

_X = {"x": "real"}
_AB = {"a": "real", "b": "real"}
_REDUCE = (Param("axis", None, "axis"), Param("keepdims", False, "bool"))


def _unary(name, code, family, *, domain="real", params=(), kinks=(), saturating=False,
           scale_free=False, single_rounding=False, edge="full"):
    return OpSignature(name, code, "unary", "same_shape", ("x",), {"x": domain}, params, kinks,
                       family, saturating, scale_free, single_rounding, edge)


def _binary(name, code, family, *, domains=_AB, kinks=(), edge="full"):
    return OpSignature(name, code, "binary", "broadcast", ("a", "b"), domains, (), kinks, family,
                       edge=edge)


def _op(name, code, category, shape, inputs, domains, family, params=(), **flags):
    return OpSignature(name, code, category, shape, inputs, domains, params, family=family,
                       **flags)


SIGNATURES = (
    _unary("neg", 0, "copy", scale_free=True, single_rounding=True),
    _unary("exp", 1, "transcendental", saturating=True, edge="exp"),
    _unary("log", 2, "transcendental", domain="positive", scale_free=True),
    _unary("sqrt", 3, "rounded", domain="positive", scale_free=True),
    _unary("square", 4, "rounded", scale_free=True, single_rounding=True, edge="square"),
    _unary("abs", 5, "copy", kinks=("zero",), scale_free=True, single_rounding=True),
    _unary("relu", 6, "copy", kinks=("zero",), scale_free=True, single_rounding=True),
    # NOTE: not single-rounding: the float64 slope 0.01 is not a float32 number
    _unary("leaky_relu", 7, "rounded", params=(Param("negative_slope", 0.01, "real"),),
           kinks=("zero",), scale_free=True),
    _unary("silu", 8, "transcendental", saturating=True),
    _unary("gelu", 9, "transcendental", saturating=True),
    _unary("gelu_tanh", 10, "transcendental", saturating=True, edge="cube"),
    _unary("tanh", 11, "transcendental", saturating=True),
    _unary("sigmoid", 12, "transcendental", saturating=True),
    _unary("softplus", 13, "transcendental", saturating=True),
    _unary("identity", 14, "copy", scale_free=True, single_rounding=True),
    _binary("add", 100, "arithmetic", edge="sum"),
    _binary("sub", 101, "arithmetic", edge="sum"),
    _binary("mul", 102, "arithmetic", edge="square"),
    _binary("div", 103, "arithmetic", domains={"a": "real", "b": "nonzero"}, edge="square"),
    _binary("maximum", 104, "arithmetic", kinks=("tie",)),
    _op("sum", 200, "reduction", "reduction", ("x",), _X, "reduction", _REDUCE,
        single_rounding=True, edge="sum"),
    _op("mean", 201, "reduction", "reduction", ("x",), _X, "reduction", _REDUCE,
        single_rounding=True, edge="sum"),
    _op("logsumexp", 202, "reduction", "reduction", ("x",), _X, "log-sum-exp", _REDUCE,
        edge="sum"),
    _op("matmul", 300, "structure", "matmul", ("a", "b"), _AB, "matmul", edge="square"),
    _op("transpose", 301, "structure", "transpose", ("x",), _X, "copy",
        (Param("axes", None, "axes"),), single_rounding=True),
    _op("reshape", 302, "structure", "reshape", ("x",), _X, "copy",
        (Param("shape", REQUIRED, "shape"),), single_rounding=True),
    _op("concat", 303, "structure", "concat", ("a", "b"), _AB, "copy",
        (Param("axis", -1, "int"),), single_rounding=True),
    _op("slice", 304, "structure", "slice", ("x",), _X, "copy",
        (Param("axis", 0, "int"), Param("start", 0, "optional_int"),
         Param("stop", None, "optional_int"), Param("step", 1, "int")), single_rounding=True),
    _op("softmax", 400, "normalisation", "along_axis", ("x",), _X, "log-sum-exp",
        (Param("axis", -1, "int"),)),
    _op("log_softmax", 401, "normalisation", "along_axis", ("x",), _X, "log-sum-exp",
        (Param("axis", -1, "int"),)),
    _op("layer_norm", 402, "normalisation", "last_axis", ("x",), _X, "normalisation",
        (Param("eps", 1e-5, "positive"),), edge="square"),
    _op("rms_norm", 403, "normalisation", "last_axis", ("x",), _X, "normalisation",
        (Param("eps", 1e-6, "positive"),), edge="square"),
    _op("mse", 500, "loss", "same_shape_loss", ("pred", "target"),
        {"pred": "real", "target": "real"}, "loss", edge="square"),
    _op("cross_entropy", 501, "loss", "class_index_loss", ("logits", "target"),
        {"logits": "real", "target": "class_index"}, "log-sum-exp", edge="sum"),
    _op("categorical_cross_entropy", 502, "loss", "distribution_loss", ("logits", "target"),
        {"logits": "real", "target": "distribution"}, "log-sum-exp", edge="sum"),
    _op("binary_cross_entropy", 503, "loss", "same_shape_loss", ("p", "target"),
        {"p": "unit_open", "target": "unit_closed"}, "loss"),
    _op("binary_cross_entropy_with_logits", 504, "loss", "same_shape_loss", ("logits", "target"),
        {"logits": "real", "target": "unit_closed"}, "loss"),
)

#: The activations of the layers, with the codes the fused kernels switch on.
ACTIVATION_LIST = (
    Activation("linear", 0, "identity"),
    Activation("relu", 1, "relu", (0.0, math.inf)),
    Activation("leaky_relu", 2, "leaky_relu"),
    Activation("tanh", 3, "tanh", (-1.0, 1.0)),
    Activation("sigmoid", 4, "sigmoid", (0.0, 1.0)),
    Activation("silu", 5, "silu"),
    Activation("gelu", 6, "gelu"),
    Activation("gelu_tanh", 7, "gelu_tanh"),
    Activation("softplus", 8, "softplus", (0.0, math.inf)),
    Activation("softmax", 9, "softmax", (0.0, 1.0)),
)
