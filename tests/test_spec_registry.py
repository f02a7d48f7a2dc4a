"""The registry: the contract's names, inputs and params; validation of broken entries; shape
rules against NumPy."""
import ast
import dataclasses
import doctest
import importlib
import pathlib
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import optable
import spec
from spec.opspec import Example, Kink, Param

CONTRACTS_MD = pathlib.Path(__file__).resolve().parents[1] / "docs" / "CONTRACTS.md"


def _contract():
    """docs/CONTRACTS.md's op table, read from the document: op -> (inputs, {param: default}).

    The document is written by hand, apart from the code, so the registry is held to it."""
    text = CONTRACTS_MD.read_text(encoding="utf-8")
    section = text.split("## The op table", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[0] in ("op", "---"):
            continue
        inputs = tuple(tok.split()[0] for tok in re.findall(r"`([^`]+)`", cells[1]))
        params = {}
        for tok in re.findall(r"`([^`]+)`", cells[2]):
            name, _, default = tok.partition("=")
            params[name] = ast.literal_eval(default) if default else spec.REQUIRED
        for name in cells[0].split():
            table[name] = (inputs, params)
    return table


CONTRACT = _contract()


def test_registry_holds_exactly_the_contract_ops():
    assert len(CONTRACT) == len(optable.OPS) > 30
    assert set(spec.OPS) == set(CONTRACT) == set(optable.OPS)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_inputs_and_params_follow_the_contract(name):
    op = spec.OPS[name]
    inputs, params = CONTRACT[name]
    assert op.inputs == inputs
    assert op.defaults == params
    assert len(op.examples) >= 2


def test_only_class_indices_are_not_differentiable():
    for op in spec.OPS.values():
        for n in op.inputs:
            assert (op.vjp[n] is None) == (op.domains[n] == "class_index"), (op.name, n)
    assert spec.OPS["cross_entropy"].differentiable == ("logits",)
    assert spec.OPS["mse"].differentiable == ("pred", "target")


def test_domains_follow_the_contract():
    assert spec.OPS["log"].domains["x"] == "positive"
    assert spec.OPS["sqrt"].domains["x"] == "positive"
    assert spec.OPS["div"].domains["b"] == "nonzero"
    assert dict(spec.OPS["binary_cross_entropy"].domains) == {"p": "unit_open",
                                                              "target": "unit_closed"}
    assert spec.OPS["categorical_cross_entropy"].domains["target"] == "distribution"


def test_examples_cover_broadcasting_axes_and_batched_matmul():
    for name in "add sub mul div maximum".split():
        shapes = [ex.shapes for ex in spec.OPS[name].examples]
        assert any(a != b for a, b in shapes), name              # a broadcasting case
    for name in "sum mean logsumexp".split():
        axes = {ex.params.get("axis") for ex in spec.OPS[name].examples
                if ex.shapes[0] == (2, 3)}
        assert {None, 0, 1} <= axes, name                       # each axis of a 2-D input
    mm = [ex.shapes for ex in spec.OPS["matmul"].examples]
    assert any(len(a) == 3 and len(b) == 3 for a, b in mm)     # batched
    assert any(len(a) == 3 and len(b) == 2 for a, b in mm)     # shared b


def test_opspec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.OPS["tanh"].name = "other"
    with pytest.raises(TypeError):
        spec.OPS["tanh"].vjp["x"] = None
    with pytest.raises(TypeError):
        spec.OPS["tanh2"] = spec.OPS["tanh"]


def test_kinks_are_declared_where_the_contract_fixes_a_convention():
    kinked = {name for name, op in spec.OPS.items() if op.kinks}
    assert kinked == {"abs", "relu", "leaky_relu", "maximum"}


# ---------------------------------------------------------------------------------------------
# Validation: broken entries fail with a message that says what to fix

TANH = spec.OPS["tanh"]


@pytest.mark.parametrize("change, pattern", [
    (dict(vjp={}), r"input 'x' has no VJP entry"),
    (dict(vjp={"x": None}), r"differentiable \(domain 'real'\) but its VJP is None"),
    (dict(domains={"x": "reals"}), r"unknown domain 'reals'; did you mean 'real'"),
    (dict(domains={}), r"input 'x' has no domain"),
    (dict(vjp={"x": lambda M, grad, reslt: grad}), r"asks for 'reslt'.*did you mean 'result'"),
    (dict(forward=lambda M, x, grad: x), r"forward asks for 'grad'"),
    (dict(vjp={"x": lambda M, *args: args[0]}), r"arguments must be named"),
    (dict(examples=(Example([(3,)]),)), r"at least two examples"),
    (dict(examples=(Example([(3,)]), Example([(2,), (2,)]))), r"rejected by its own shape rule"),
    (dict(examples=(Example([(3,)]), Example([(3,)], {"axis": 0}))),
     r"rejected.*unknown param 'axis'"),
    (dict(name="Tanh"), r"lower_snake_case"),
    (dict(inputs=("x", "x")), r"distinct names"),
    (dict(params=(Param("eps", 1.0, "positve"),)), r"unknown kind 'positve'; did you mean"),
    (dict(params=(Param("grad", 1.0, "real"),)), r"reserved formula words"),
    (dict(kinks=(Kink("zero", ["y"], "at 0", lambda: {"y": 0}),)), r"kink names inputs"),
    (dict(kinks=(Kink("edge", ["x"], "at 0", lambda: {"x": 0}),)), r"Kink\(kind in"),
    (dict(kinks=(Kink("zero", ["x"], " ", lambda: {"x": 0}),)), r"state its convention"),
])
def test_validate_op_rejects_broken_entries(change, pattern):
    broken = dataclasses.replace(TANH, **change)
    with pytest.raises(spec.RegistryError, match=pattern):
        spec.validate_op(broken)


def test_class_index_input_must_not_have_a_vjp():
    ce = spec.OPS["cross_entropy"]
    broken = dataclasses.replace(ce, vjp={**ce.vjp, "target": lambda M, grad: grad})
    with pytest.raises(spec.RegistryError, match="not differentiable; set its VJP to None"):
        spec.validate_op(broken)


def test_validate_registry_rejects_duplicates_and_accepts_the_real_table():
    with pytest.raises(spec.RegistryError, match="'tanh' is declared twice"):
        spec.validate_registry([TANH, spec.OPS["exp"], TANH])
    table = spec.validate_registry(list(spec.OPS.values()))
    assert list(table) == list(spec.OPS)


def test_registry_error_is_a_value_error():
    assert issubclass(spec.RegistryError, ValueError)


@pytest.mark.parametrize("module", ["spec", "spec.domains", "spec.evaluate", "spec.optimizers"])
def test_docstring_examples_run(module):
    # ``spec.evaluate`` is also the function's name, so fetch the module itself.
    failures, tried = doctest.testmod(importlib.import_module(module))
    assert tried > 0 and failures == 0


# ---------------------------------------------------------------------------------------------
# Shape rules against NumPy (the contract says NumPy semantics)


@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4))
def test_binary_shape_rule_is_numpy_broadcasting(shapes):
    a, b = shapes.input_shapes
    for name in "add sub mul div maximum".split():
        assert spec.OPS[name].check_shapes([a, b]) == shapes.result_shape


@st.composite
def reduction_cases(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3))
    nd = len(shape)
    axis = draw(st.one_of(
        st.none(),
        st.integers(-nd, nd - 1) if nd else st.none(),
        st.lists(st.integers(0, nd - 1), unique=True, max_size=nd).map(tuple) if nd else st.none(),
    ))
    return shape, axis, draw(st.booleans())


@given(reduction_cases())
def test_reduction_shape_rule_is_numpy(case):
    shape, axis, keepdims = case
    expected = np.sum(np.zeros(shape), axis=axis, keepdims=keepdims).shape
    for name in "sum mean logsumexp".split():
        assert spec.OPS[name].check_shapes([shape], {"axis": axis, "keepdims": keepdims}) == expected


@given(st.lists(st.integers(1, 3), max_size=2), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 3), st.booleans())
def test_matmul_shape_rule_is_numpy(batch, m, k, n, shared):
    a = tuple(batch) + (m, k)
    b = (k, n) if shared else tuple(batch) + (k, n)
    assert spec.OPS["matmul"].check_shapes([a, b]) == np.matmul(np.zeros(a), np.zeros(b)).shape


@given(hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), st.data())
def test_slice_transpose_concat_shape_rules_are_numpy(shape, data):
    nd = len(shape)
    axis = data.draw(st.integers(-nd, nd - 1))
    start = data.draw(st.one_of(st.none(), st.integers(-5, 5)))
    stop = data.draw(st.one_of(st.none(), st.integers(-5, 5)))
    step = data.draw(st.integers(1, 3))
    index = [slice(None)] * nd
    index[axis] = slice(start, stop, step)
    x = np.zeros(shape)
    assert spec.OPS["slice"].check_shapes(
        [shape], {"axis": axis, "start": start, "stop": stop, "step": step}) == x[tuple(index)].shape
    perm = tuple(data.draw(st.permutations(range(nd))))
    assert spec.OPS["transpose"].check_shapes([shape], {"axes": perm}) == np.transpose(x, perm).shape
    other = list(shape)
    other[axis] = data.draw(st.integers(0, 3))
    assert (spec.OPS["concat"].check_shapes([shape, tuple(other)], {"axis": axis})
            == np.concatenate([x, np.zeros(other)], axis=axis).shape)


@pytest.mark.parametrize("name, shapes, params, pattern", [
    ("matmul", [(2, 2, 3), (3, 3, 2)], {}, r"batch shapes differ"),
    ("matmul", [(3,), (3, 2)], {}, r"at least 2 dimensions"),
    ("transpose", [(2, 3)], {"axes": (0, 0)}, r"not a permutation"),
    ("transpose", [(2, 3)], {"axes": (0, 1, 2)}, r"not a permutation"),
    ("reshape", [(2, 3)], {"shape": (-1, -1)}, r"at most one -1"),
    ("reshape", [(2, 3)], {"shape": (4, -1)}, r"cannot infer -1"),
    ("concat", [(2, 3), (3, 2)], {"axis": 0}, r"differ on axis 1"),
    ("concat", [(2, 3), (2,)], {}, r"same number"),
    ("slice", [(4,)], {"step": 0}, r"step must be >= 1"),
    ("slice", [()], {}, r"0-d"),
    ("sum", [(2, 3)], {"axis": (0, -2)}, r"repeats an axis"),
    ("sum", [(2, 3)], {"axis": 1.5}, r"None, an int or a tuple"),
    ("sum", [(2, 3)], {"keepdims": 1}, r"True or False"),
    ("mean", [(2, 0)], {"axis": 1}, r"empty axis"),
    ("softmax", [()], {}, r"at least one dimension"),
    ("layer_norm", [(3, 0)], {}, r"empty axis"),
    ("layer_norm", [(3,)], {"eps": -1.0}, r"eps must be > 0"),
    ("leaky_relu", [(3,)], {"negative_slope": float("nan")}, r"finite real"),
    ("cross_entropy", [(3,), (3,)], {}, r"logits must be 2-D \(N, C\)"),
    ("cross_entropy", [(2, 3), (3, 1)], {}, r"\(2, 1\) or \(2,\)"),
    ("binary_cross_entropy", [(0,), (0,)], {}, r"zero elements"),
    ("tanh", [(2, -1)], {}, r"negative length"),
    ("tanh", [(2,), (2,)], {}, r"takes 1 input"),
])
def test_shape_rule_errors_name_the_problem(name, shapes, params, pattern):
    with pytest.raises(ValueError, match=pattern):
        spec.OPS[name].check_shapes(shapes, params)
