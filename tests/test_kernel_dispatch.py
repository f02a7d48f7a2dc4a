"""fastlib's CPU kernels dispatch on the op table's codes and fail loudly on any other code.

Each kernel that branches over unary, binary or activation codes raises ``ValueError`` naming
the code and the table, never falls back to the identity; and none of them restates a code as
a literal (the codes are read from ``optable``).
"""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import optable
from fastlib.kernels import binary, dense, elementwise

KERNELS = pathlib.Path(__file__).resolve().parents[1] / "fastlib" / "kernels"
# the kernels that branch over the table's codes; attention, recurrent and transformer are the
# compiled program's (held by its own tests)
DISPATCHING = ("elementwise.py", "binary.py", "dense.py", "vecmath.py", "scalar.py",
               "reduce.py", "structure.py", "loss.py", "norm.py", "linalg.py")


def _unused_code(codes):
    return max(codes) + 1000


def test_unary_launchers_name_the_unknown_op_and_the_table():
    x = np.ones(3, np.float32)
    for launch in (lambda: elementwise.unary_forward("expp", x),
                   lambda: elementwise.unary_vjp("expp", x, x)):
        with pytest.raises(ValueError, match=r"unknown unary op 'expp'.*optable"):
            launch()


@pytest.mark.parametrize("kernel", ["forward", "vjp"])
def test_unary_kernel_raises_on_an_unknown_code(kernel):
    code = _unused_code(elementwise.CODES.values())
    x = np.ones(4)
    out = np.zeros(4)
    with pytest.raises(ValueError) as info:
        if kernel == "forward":
            elementwise._forward_chunk(code, x, out, 0.01)
        else:
            elementwise._vjp_chunk(code, x, x, out, 0.01)
    assert "unary op code" in str(info.value) and "optable" in str(info.value)
    assert str(code) in str(info.value)
    assert not out.any()                    # nothing written: no identity fallback


def test_binary_launchers_and_kernels_raise_on_unknown_ops():
    a = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"unknown binary op 'mull'.*optable"):
        binary.binary_forward("mull", a, a)
    with pytest.raises(ValueError, match=r"unknown binary op 'mull'.*optable"):
        binary.binary_vjp("mull", a, a, a)
    code = _unused_code(binary.CODES.values())
    strides = np.array([3, 1], np.int64)
    out = np.zeros((2, 3))
    with pytest.raises(ValueError) as info:
        binary._forward_tasks(code, a.reshape(-1), strides, a.reshape(-1), strides, out, 1, 0, 2)
    assert str(code) in str(info.value) and "optable" in str(info.value)
    with pytest.raises(ValueError) as info:   # add's code is not one the product kernel knows
        binary._vjp_tasks(binary.CODES["add"], a.reshape(-1), strides, a.reshape(-1), strides,
                          a, out, out.copy(), 1, 0, 2)
    assert str(binary.CODES["add"]) in str(info.value)


def test_dense_epilogues_raise_on_an_unknown_activation_code():
    code = _unused_code(optable.activation_codes().values())
    pre = np.ones((2, 3))
    post = np.zeros((2, 3))
    with pytest.raises(ValueError) as info:
        dense.bias_activation(pre, np.zeros(3), post, code, 0.01)
    assert str(code) in str(info.value) and "activation code" in str(info.value)
    assert not post.any()
    with pytest.raises(ValueError):
        dense.activation_backward(pre, pre, post, np.zeros((2, 3)), np.zeros(3), code, 0.01)
    # the elementwise activation answers an unknown code with NaN, never the identity
    assert np.isnan(dense.activate(0.5, code, 0.01))
    assert np.isnan(dense.activate_derivative(0.5, code, 0.01))
    assert dense.activate(0.5, optable.activation_codes()["linear"], 0.01) == 0.5


def _restated_literals(path):
    """(line, source) of each comparison of an int literal with a name that holds a code."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = [s.id for s in sides if isinstance(s, ast.Name)]
        ints = [s for s in sides if isinstance(s, ast.Constant) and type(s.value) is int]
        if ints and any(n in ("op", "code", "act", "kind_code") or n.endswith("_code")
                        for n in names):
            found.append((node.lineno, ast.unparse(node)))
    return found


@pytest.mark.parametrize("filename", DISPATCHING)
def test_no_kernel_restates_a_code_as_a_literal(filename):
    assert _restated_literals(KERNELS / filename) == []


def test_the_literal_scan_finds_a_restated_code(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(code, x):\n    if code == 3:\n        return x\n")
    assert _restated_literals(probe) == [(2, "code == 3")]


def test_dispatching_kernels_read_their_codes_from_the_table():
    assert elementwise.CODES == optable.codes(optable.names(category="unary"))
    assert binary.CODES == optable.codes(optable.names(category="binary"))
    assert dense._CODE == optable.activation_codes()
