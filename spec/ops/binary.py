"""Binary elementwise ops with NumPy broadcasting: ``add sub mul div maximum``.

Every VJP is the pointwise derivative times ``grad``, summed back to its input's shape
(``sum_to_shape``: the inverse of broadcasting).
"""
from __future__ import annotations

from spec.backends import sum_to_shape
from spec.opspec import Example, Kink, declare

# Same shapes, a trailing-axis broadcast, an outer broadcast, a 0-d operand.
EXAMPLES = (
    Example([(3,), (3,)]),
    Example([(2, 3), (3,)]),
    Example([(2, 1), (1, 3)]),
    Example([(), (2,)]),
)


def _binary(name, math, forward, vjp_a, vjp_b, *, kinks=()):
    # inputs and domains come from the op table (optable)
    return declare(name, forward=forward, vjp={"a": vjp_a, "b": vjp_b}, examples=EXAMPLES,
                   kinks=kinks, math=math)


OPS = (
    _binary("add", "a + b",
            lambda M, a, b: a + b,
            lambda M, grad, a: sum_to_shape(M, grad, a.shape),
            lambda M, grad, b: sum_to_shape(M, grad, b.shape)),
    _binary("sub", "a - b",
            lambda M, a, b: a - b,
            lambda M, grad, a: sum_to_shape(M, grad, a.shape),
            lambda M, grad, b: sum_to_shape(M, -grad, b.shape)),
    _binary("mul", "a · b",
            lambda M, a, b: a * b,
            lambda M, grad, a, b: sum_to_shape(M, grad * b, a.shape),
            lambda M, grad, a, b: sum_to_shape(M, grad * a, b.shape)),
    _binary("div", "a / b",
            lambda M, a, b: a / b,
            lambda M, grad, a, b: sum_to_shape(M, grad / b, a.shape),
            lambda M, grad, a, b: sum_to_shape(M, -grad * a / b**2, b.shape)),
    # NOTE: a tie (a == b) sends the whole gradient to the first argument a.
    _binary("maximum", "max(a, b)",
            lambda M, a, b: M.maximum(a, b),
            lambda M, grad, a, b: sum_to_shape(M, M.where(M.ge(a, b), grad, 0 * grad), a.shape),
            lambda M, grad, a, b: sum_to_shape(M, M.where(M.ge(a, b), 0 * grad, grad), b.shape),
            kinks=[Kink("tie", ["a", "b"], "ties go to the first argument: d/da = 1 and "
                        "d/db = 0 where a >= b", lambda: {"a": 1, "b": 0})]),
)
