"""Unary elementwise ops: ``neg exp log sqrt square abs relu leaky_relu silu gelu gelu_tanh tanh
sigmoid softplus identity``.

Each entry: forward, then the VJP for ``x`` in terms of ``x``, ``result`` and ``grad``. The
activation derivatives are those of Loom's documented activation table:
ReLU 1 if x > 0 else 0; SiLU σ(x)(1 + x(1 − σ(x))); GELU Φ(x) + x φ(x) (exact, no tanh);
Tanh 1 − tanh(x)²; Sigmoid σ(x)(1 − σ(x)); Linear 1.
"""
from __future__ import annotations

from spec.opspec import Example, Kink, declare

EXAMPLES = (Example([(3,)]), Example([(2, 2)]), Example([()]))


def _sigmoid(M, x):
    return 1 / (1 + M.exp(-x))


def _Phi(M, x):
    """Standard normal CDF."""
    return (1 + M.erf(x / M.sqrt(M.num(2)))) / 2


def _phi(M, x):
    """Standard normal density."""
    return M.exp(-x**2 / 2) / M.sqrt(2 * M.pi)


def _gelu_tanh_inner(M, x):
    """√(2/π)(x + 0.044715 x³): the tanh approximation's argument."""
    return M.sqrt(2 / M.pi) * (x + M.num(44715, 1000000) * x**3)


def _gelu_tanh_dinner(M, x):
    return M.sqrt(2 / M.pi) * (1 + 3 * M.num(44715, 1000000) * x**2)


def _unary(name, math, forward, vjp, *, kinks=()):
    # inputs, domain and params come from the op table (optable)
    return declare(name, forward=forward, vjp={"x": vjp}, examples=EXAMPLES, kinks=kinks,
                   math=math)


OPS = (
    _unary("neg", "-x",
           lambda M, x: -x,
           lambda M, grad: -grad),
    _unary("exp", "exp(x)",
           lambda M, x: M.exp(x),
           lambda M, grad, result: grad * result),
    _unary("log", "log(x)",
           lambda M, x: M.log(x),
           lambda M, grad, x: grad / x),
    _unary("sqrt", "sqrt(x)",
           lambda M, x: M.sqrt(x),
           lambda M, grad, result: grad / (2 * result)),
    _unary("square", "x²",
           lambda M, x: x**2,
           lambda M, grad, x: 2 * grad * x),
    # NOTE: abs'(0) = 0, i.e. the derivative is sign(x) with sign(0) = 0.
    _unary("abs", "|x|",
           lambda M, x: M.abs(x),
           lambda M, grad, x: grad * M.sign(x),
           kinks=[Kink("zero", ["x"], "abs'(0) = 0 (sign(0) = 0)", lambda: {"x": 0})]),
    # NOTE: relu'(x) = 1 if x > 0 else 0, so relu'(0) = 0 (Loom's table).
    _unary("relu", "max(x, 0)",
           lambda M, x: M.maximum(x, M.num(0)),
           lambda M, grad, x: M.where(M.gt(x, 0), grad, 0 * grad),
           kinks=[Kink("zero", ["x"], "relu'(0) = 0 (1 if x > 0 else 0)", lambda: {"x": 0})]),
    # NOTE: leaky_relu'(x) = 1 if x > 0 else negative_slope, so the slope applies at 0.
    _unary("leaky_relu", "x if x > 0 else negative_slope·x",
           lambda M, x, negative_slope: M.where(M.gt(x, 0), x, M.param(negative_slope) * x),
           lambda M, grad, x, negative_slope:
               M.where(M.gt(x, 0), grad, M.param(negative_slope) * grad),
           kinks=[Kink("zero", ["x"], "leaky_relu'(0) = negative_slope (1 if x > 0 else "
                       "negative_slope)", lambda negative_slope: {"x": negative_slope})]),
    _unary("silu", "x·σ(x)",
           lambda M, x: x * _sigmoid(M, x),
           lambda M, grad, x: grad * _sigmoid(M, x) * (1 + x * (1 - _sigmoid(M, x)))),
    _unary("gelu", "x·Φ(x) (exact, erf)",
           lambda M, x: x * _Phi(M, x),
           lambda M, grad, x: grad * (_Phi(M, x) + x * _phi(M, x))),
    _unary("gelu_tanh", "x/2·(1 + tanh(√(2/π)(x + 0.044715x³)))",
           lambda M, x: x * (1 + M.tanh(_gelu_tanh_inner(M, x))) / 2,
           lambda M, grad, x: grad * (
               (1 + M.tanh(_gelu_tanh_inner(M, x))) / 2
               + x * (1 - M.tanh(_gelu_tanh_inner(M, x))**2) * _gelu_tanh_dinner(M, x) / 2)),
    _unary("tanh", "tanh(x)",
           lambda M, x: M.tanh(x),
           lambda M, grad, result: grad * (1 - result**2)),
    _unary("sigmoid", "σ(x) = 1/(1 + exp(-x))",
           lambda M, x: _sigmoid(M, x),
           lambda M, grad, result: grad * result * (1 - result)),
    _unary("softplus", "log(1 + exp(x))",
           lambda M, x: M.log(1 + M.exp(x)),
           lambda M, grad, x: grad * _sigmoid(M, x)),
    _unary("identity", "x",
           lambda M, x: x + 0,
           lambda M, grad: grad + 0),
)
