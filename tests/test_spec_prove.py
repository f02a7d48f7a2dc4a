"""spec.prove: every op proven; planted wrong VJPs rejected; the method is recorded."""
import dataclasses
import importlib
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
    # Piecewise: proven on each side of every tie instead, and the tie convention at it.
    maximum = spec.prove("maximum")
    assert maximum.ok and maximum.method == "piecewise" and maximum.sampled_entries == 0
    assert maximum.piecewise_entries > 0 and maximum.verdict == "proven on each piece"
    assert "ties go to the first argument" in maximum.detail and "subdifferential" in maximum.detail
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
    assert all(r.method in ("symbolic", "piecewise") and len(r.shapes) >= 2 for r in results)
    # every op with a kink is proven piece by piece (with its convention), none only sampled
    assert {r.op for r in results if r.method == "piecewise"} >= {
        name for name, op in spec.OPS.items() if op.kinks}
    assert len(seen) == 2 * len(spec.OPS) and seen[0][3] is None and seen[1][3] is results[0]
    # The bound is 3 minutes; on this machine it takes well under one.
    assert elapsed < 180, f"prove_all took {elapsed:.0f} s"


# -- ops with branches: each piece, and the convention at the kink ------------------------------

PROVE = importlib.import_module("spec.prove")


@pytest.mark.parametrize("name", ["relu", "leaky_relu", "abs", "maximum",
                                  "binary_cross_entropy_with_logits"])
def test_branchy_ops_are_proven_on_each_piece(name):
    result = spec.prove(name)
    assert result.ok and result.method == "piecewise" and result.sampled_entries == 0, result
    assert result.verdict == "proven on each piece"
    if spec.OPS[name].kinks:
        assert "at the kink" in result.detail and "in the subdifferential" in result.detail


def _kinked(name, vjp=None, slopes=None):
    op = spec.OPS[name]
    kinks = op.kinks if slopes is None else (dataclasses.replace(op.kinks[0], slopes=slopes),)
    return dataclasses.replace(op, vjp={**op.vjp, **(vjp or {})}, kinks=kinks)


def test_a_wrong_convention_at_the_kink_fails():
    """relu'(0) = 1 (x >= 0): right on both sides, so only the kink tells; the sampled check
    never lands on 0 and would pass it."""
    broken = _kinked("relu", {"x": lambda M, grad, x: M.where(M.ge(x, 0), grad, 0 * grad)})
    result = spec.prove(broken)
    assert not result.ok and "at the kink" in result.detail and "'x'" in result.detail, result


def test_a_doubled_tie_gradient_fails_even_when_declared():
    """maximum sending the whole gradient to both tied arguments: against the registry's
    convention it fails at the kink; declared as the convention itself, (1, 1) is outside the
    subdifferential (the segment between (1, 0) and (0, 1)) and fails too."""
    both = {"b": lambda M, grad, a, b: spec.backends.sum_to_shape(
        M, M.where(M.gt(a, b), 0 * grad, grad), b.shape)}
    result = spec.prove(_kinked("maximum", both))
    assert not result.ok and "stated VJP for 'b'" in result.detail, result
    declared = _kinked("maximum", both, slopes=lambda: {"a": 1, "b": 1})
    result = spec.prove(declared)
    assert not result.ok and "outside the subdifferential" in result.detail, result


def test_a_convention_outside_the_one_sided_slopes_fails():
    """relu'(0) = 2, stated and declared alike: not between the one-sided slopes 0 and 1."""
    broken = _kinked("relu", {"x": lambda M, grad, x: M.where(
        M.gt(x, 0), grad, M.where(M.gt(0, x), 0 * grad, 2 * grad))}, slopes=lambda: {"x": 2})
    result = spec.prove(broken)
    assert not result.ok and "outside the subdifferential" in result.detail, result


def test_a_wrong_piece_fails():
    """leaky_relu with the slope applied on the positive side."""
    broken = _kinked("leaky_relu", {"x": lambda M, grad, x, negative_slope: M.where(
        M.gt(x, 0), M.param(negative_slope) * grad, grad)})
    result = spec.prove(broken)
    assert not result.ok and "VJP for 'x'" in result.detail


def test_an_entry_sympy_cannot_decide_is_labelled_checked_not_proven(monkeypatch, capsys):
    """When no entry can be reduced to 0, the result is the sampled check, and every output
    (the result, `verigrad spec --prove`, the proof table of `verigrad conform`) says "checked
    at 20 points", never "proven"."""
    from reports.cli import main
    from reports.commands.conform import proof_count, proof_rows

    exp = spec.prove("exp")                 # proven, before the patch
    monkeypatch.setattr(PROVE, "_prove_entry", lambda expr, boundaries: None)
    result = spec.prove("tanh")
    assert result.ok and result.method == "sampling" and result.verdict == "checked at 20 points"
    assert "NOT proven" in result.detail
    assert proof_rows([result], "op")[0][-1] == "checked at 20 points"
    assert proof_count([result, exp]) == (
        "proved 1/2, 1 only checked at sampled points")
    assert main(["spec", "--no-progress", "--prove", "tanh"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| op "))
    assert "checked at 20 points" in row and "proven" not in row
    assert "0 of 3 proven, 3 only checked at sampled points (tanh, tanh jvp, tanh hvp)" in out


def test_an_optimizer_sympy_cannot_decide_is_labelled_checked(monkeypatch):
    proofs = importlib.import_module("spec.optimizer_proofs")
    monkeypatch.setattr(proofs, "_is_zero", lambda diff: False)
    (result,) = spec.prove_optimizers(["Adam"])
    assert result.ok and result.method == "sampling"
    assert result.verdict == "checked at 20 points" and "only checked" in result.detail
