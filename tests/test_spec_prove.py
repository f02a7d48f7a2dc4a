"""spec.prove: every op proven; planted wrong VJPs rejected; the method is recorded."""
import dataclasses
import time

import numpy as np
import pytest

import spec
from spec.backends import sum_to_shape
from spec.opspec import Example


def _with_vjp(name, **vjps):
    op = spec.OPS[name]
    return dataclasses.replace(op, vjp={**op.vjp, **vjps})


def _mean_last(M, x):
    return M.sum(x, -1, True) / x.shape[-1]


# (broken entry, the input whose VJP is wrong). Each formula is a plausible slip.
PLANTED = {
    # the issue's two: tanh' written as 1 + tanh², matmul's grad_b without the transpose of a
    "tanh 1 + result²": (_with_vjp("tanh", x=lambda M, grad, result: grad * (1 + result**2)), "x"),
    "matmul grad_b without transpose": (dataclasses.replace(
        _with_vjp("matmul", b=lambda M, grad, a, b: sum_to_shape(M, np.matmul(a, grad), b.shape)),
        # square shapes, so the slip has the right shape and only the values are wrong
        examples=(Example([(2, 2), (2, 2)]), Example([(2, 2, 2), (2, 2, 2)]))), "b"),
    "sigmoid missing (1 - result)": (_with_vjp("sigmoid", x=lambda M, grad, result: grad * result),
                                     "x"),
    "gelu with the tanh approximation's derivative": (_with_vjp(
        "gelu", x=lambda M, grad, x: grad * (1 + M.tanh(M.sqrt(2 / M.pi) * (
            x + M.num(44715, 1000000) * x**3))) / 2), "x"),
    "div grad_b sign flipped": (_with_vjp(
        "div", b=lambda M, grad, a, b: sum_to_shape(M, grad * a / b**2, b.shape)), "b"),
    "sub grad_b not negated": (_with_vjp(
        "sub", b=lambda M, grad, b: sum_to_shape(M, grad, b.shape)), "b"),
    "mean without 1/n": (_with_vjp(
        "mean", x=lambda M, grad, x, axis, keepdims: spec.OPS["sum"].vjp["x"](
            M, grad, x, axis, keepdims)), "x"),
    "logsumexp missing the shift": (_with_vjp(
        "logsumexp", x=lambda M, grad, x, axis, keepdims: spec.OPS["sum"].vjp["x"](
            M, grad, x, axis, keepdims) * M.exp(x)), "x"),
    "softmax without the Σ grad·y term": (_with_vjp(
        "softmax", x=lambda M, grad, result: grad * result), "x"),
    "layer_norm without the mean(grad) term": (_with_vjp(
        "layer_norm", x=lambda M, grad, result, x, eps: (
            grad - result * _mean_last(M, grad * result))
        / M.sqrt(_mean_last(M, (x - _mean_last(M, x))**2) + M.param(eps))), "x"),
    "cross_entropy without 1/N": (_with_vjp(
        "cross_entropy", logits=lambda M, grad, logits, target: grad * (
            M.exp(logits) / M.sum(M.exp(logits), -1, True)
            - np.eye(logits.shape[1], dtype=int)[np.asarray(target).reshape(-1)])), "logits"),
    "bce_with_logits target sign": (_with_vjp(
        "binary_cross_entropy_with_logits",
        target=lambda M, grad, logits: grad * logits / logits.size), "target"),
    "add not summed back (broadcast shape)": (_with_vjp("add", b=lambda M, grad: grad + 0), "b"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_planted_wrong_vjp_is_rejected(case):
    broken, input_name = PLANTED[case]
    result = spec.prove(broken)
    assert not result.ok
    assert f"VJP for {input_name!r}" in result.detail, result.detail


def test_a_vjp_off_by_1e_30_is_rejected():
    """The sampled check works at 50 digits: a difference of 1e-30 (far below float64's
    resolution) is still caught, so the tolerance is really 1e-40."""
    off = _with_vjp("tanh", x=lambda M, grad, result: grad * (1 - result**2)
                    + grad * M.num(1, 10**30))
    result = spec.prove(off)
    assert not result.ok and result.method == "sampling" and "differs" in result.detail


def test_wrong_forward_shape_is_rejected():
    op = spec.OPS["sum"]
    broken = dataclasses.replace(op, forward=lambda M, x, axis, keepdims: M.sum(x))
    result = spec.prove(broken)
    assert not result.ok and "shape rule says" in result.detail


def test_a_formula_that_raises_is_a_failed_proof_not_a_crash():
    broken = _with_vjp("exp", x=lambda M, grad, result: grad * M.no_such_function(result))
    result = spec.prove(broken)
    assert not result.ok and "AttributeError" in result.detail


def test_method_is_recorded():
    tanh = spec.prove("tanh")
    assert tanh.ok and tanh.method == "symbolic" and tanh.sampled_entries == 0
    assert len(tanh.shapes) >= 2 and tanh.exact_entries > 0
    # maximum's derivative is a Heaviside that SymPy cannot cancel against the stated
    # Piecewise: decided by sampling, away from ties, at 50 digits.
    maximum = spec.prove("maximum")
    assert maximum.ok and maximum.method == "sampling" and maximum.sampled_entries > 0
    assert maximum.max_error < 1e-40


def test_prove_refuses_weaker_settings():
    with pytest.raises(ValueError, match="points >= 20"):
        spec.prove("tanh", points=5)
    with pytest.raises(ValueError, match="dps >= 50"):
        spec.prove("tanh", dps=30)
    with pytest.raises(spec.UnknownOpError):
        spec.prove("tanhh")


def test_prove_all_proves_every_op_quickly():
    seen = []
    start = time.perf_counter()
    results = spec.prove_all(progress=lambda i, n, name, r: seen.append((i, n, name, r)))
    elapsed = time.perf_counter() - start
    failed = [(r.op, r.detail) for r in results if not r.ok]
    assert not failed
    assert [r.op for r in results] == list(spec.OPS)
    assert all(r.method in ("symbolic", "sampling") and len(r.shapes) >= 2 for r in results)
    assert len(seen) == 2 * len(spec.OPS) and seen[0][3] is None and seen[1][3] is results[0]
    # The bound is 3 minutes; on this machine it takes well under one.
    assert elapsed < 180, f"prove_all took {elapsed:.0f} s"
