"""The op table and the engine boundary: one table read by every engine, one set of checks and
messages, one UnknownOpError, one REQUIRED, one TargetPropConfig."""
import subprocess
import sys

import numpy as np
import pytest

import fastlib
import fastlib.cuda.ops as cuda_ops
import fastlib.ops as fastlib_ops
import optable
import reflib
import reflib.ops as reflib_ops
import spec
from optable.signature import Activation, OpSignature


def test_optable_imports_numpy_only():
    code = ("import sys, optable; bad = [m for m in ('sympy', 'mpmath', 'numba', 'scipy', 'spec', "
            "'reflib', 'fastlib') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_codes_are_unique_and_duplicates_are_refused():
    codes = [s.code for s in optable.OPS.values()]
    assert len(set(codes)) == len(codes)
    acts = [a.code for a in optable.ACTIVATIONS.values()]
    assert len(set(acts)) == len(acts)
    twin = OpSignature("twin", optable.OPS["tanh"].code, "unary", "same_shape", ("x",),
                       {"x": "real"})
    with pytest.raises(ValueError, match="share a code"):
        optable._index(tuple(optable.OPS.values()) + (twin,), "op")
    with pytest.raises(ValueError, match="listed twice"):
        optable._index((Activation("relu", 1, "relu"), Activation("relu", 2, "relu")),
                       "activation")


@pytest.mark.parametrize("change, message", [
    (dict(domains={"y": "real"}), "give each input one domain"),
    (dict(category="elementwise"), "category 'elementwise' is not one of"),
    (dict(kinks=("corner",)), r"kink kinds \['corner'\] are not among"),
])
def test_a_broken_signature_is_refused(change, message):
    import dataclasses

    broken = dataclasses.replace(optable.OPS["relu"], **change)
    with pytest.raises(ValueError, match=message):
        optable._index((broken,), "op")


def test_every_activation_applies_an_op_of_the_table():
    assert set(a.op for a in optable.ACTIVATIONS.values()) <= set(optable.OPS)


def test_kernel_codes_are_the_tables():
    from fastlib.cuda import dense as cuda_dense
    from fastlib.cuda import elementwise as cuda_elementwise
    from fastlib.kernels import binary, dense, elementwise
    from fastlib.layers.activations import ACTIVATIONS

    assert elementwise.CODES == {n: optable.OPS[n].code for n in optable.names(category="unary")}
    assert binary.CODES == {n: optable.OPS[n].code for n in optable.names(category="binary")}
    assert cuda_elementwise.BINARY == binary.CODES
    assert ACTIVATIONS == {a.name: a.code for a in optable.ACTIVATIONS.values()}
    assert (dense._RELU, dense._SOFTMAX, dense._LINEAR) == (
        ACTIVATIONS["relu"], ACTIVATIONS["softmax"], ACTIVATIONS["linear"])
    assert set(cuda_dense.DENSE_ACTIVATIONS) == set(ACTIVATIONS)


@pytest.mark.parametrize("table", [spec.OPS, reflib_ops.OPS, fastlib_ops.OPS, cuda_ops.OPS],
                         ids=["spec", "reflib", "fastlib", "fastlib.cuda"])
def test_every_engine_names_exactly_the_tables_ops(table):
    assert list(table) == list(optable.OPS) or set(table) == set(optable.OPS)


@pytest.mark.parametrize("name", list(optable.OPS))
def test_engines_take_the_tables_inputs_and_defaults(name):
    sig = optable.OPS[name]
    assert spec.OPS[name].inputs == reflib_ops.OPS[name].inputs == sig.inputs
    assert fastlib_ops.OPS[name].inputs == cuda_ops.OPS[name].inputs == sig.inputs
    assert spec.OPS[name].defaults == dict(reflib_ops.OPS[name].params) == sig.defaults
    assert dict(fastlib_ops.OPS[name].params) == dict(cuda_ops.OPS[name].params) == sig.defaults
    assert [k.kind for k in spec.OPS[name].kinks] == list(sig.kinks)


def test_one_error_class_one_required_one_config():
    assert spec.UnknownOpError is reflib_ops.UnknownOpError is fastlib.UnknownOpError \
        is cuda_ops.UnknownOpError is optable.UnknownOpError
    assert spec.REQUIRED is optable.REQUIRED is fastlib_ops.REQUIRED is cuda_ops.REQUIRED
    from reflib._ops_common import REQUIRED
    assert REQUIRED is optable.REQUIRED
    from fastlib.targetprop import TargetPropConfig as FastConfig
    from reflib.targetprop import TargetPropConfig as RefConfig
    assert FastConfig is RefConfig is optable.TargetPropConfig


ENGINES = {"reflib": (reflib_ops.forward, reflib_ops.vjp),
           "fastlib": (fastlib_ops.forward, fastlib_ops.vjp),
           "fastlib.cuda": (cuda_ops.forward, cuda_ops.vjp)}
X = np.array([0.5, -1.5])
BAD_CALLS = [
    # (call, error, message every engine gives, written out here)
    (lambda f, v: f("tanhh", [X]), KeyError, "unknown op 'tanhh'; did you mean 'tanh', "),
    (lambda f, v: f("sum", [X], axes=0), ValueError,
     "sum: unknown param 'axes'; did you mean 'axis'? its params are: axis, keepdims"),
    (lambda f, v: f("tanh", [X], eps=1.0), ValueError,
     "tanh: unknown param 'eps'; its params are: none"),
    (lambda f, v: f("reshape", [X]), ValueError,
     "reshape: param 'shape' is required (e.g. shape=(2, 3))"),
    (lambda f, v: f("add", [X]), ValueError, "add: takes 2 input(s) ('a', 'b'); got 1"),
    (lambda f, v: v("tanh", [X], np.ones(3)), ValueError,
     "tanh: grad has shape (3,) but the output has shape (2,); pass a cotangent shaped like "
     "the output"),
]


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("call, error, message", BAD_CALLS)
def test_every_engine_gives_the_same_message(engine, call, error, message):
    forward, vjp = ENGINES[engine]
    with pytest.raises(error) as info:
        call(forward, vjp)
    assert message in str(info.value)


def test_resolve_params_and_check_grad_directly():
    assert optable.resolve_params("leaky_relu", optable.OPS["leaky_relu"].defaults, {}) == \
        {"negative_slope": 0.01}
    assert optable.resolve_params("slice", optable.OPS["slice"].defaults, {"stop": 2})["stop"] == 2
    with pytest.raises(TypeError, match="mixed dtypes"):
        optable.common_dtype("add", [("a", np.zeros(1, np.float32)), ("b", np.zeros(1))])
    with pytest.raises(TypeError, match="grad has dtype float32 but the inputs are float64"):
        optable.check_grad("tanh", (2,), np.dtype(np.float32), (2,), np.dtype(np.float64))
    with pytest.raises(TypeError, match="inputs must be a list or tuple"):
        optable.check_input_list("tanh", ("x",), np.zeros(2), container=(list, tuple))


def test_spec_refuses_formulas_that_disagree_with_the_table():
    import dataclasses

    relu = spec.OPS["relu"]
    with pytest.raises(spec.RegistryError, match="the op table says"):
        spec.validate_op(dataclasses.replace(relu, kinks=()))
    from spec.registry import check_covers_table
    with pytest.raises(spec.RegistryError, match="spec declares no formulas"):
        check_covers_table({k: v for k, v in spec.OPS.items() if k != "tanh"})
    with pytest.raises(optable.UnknownOpError, match="unknown op 'hardtanh'"):
        from spec.opspec import declare
        declare("hardtanh", forward=lambda M, x: x, vjp={"x": lambda M, grad: grad},
                examples=())


# --- the optimizer registry ------------------------------------------------------------------

def test_every_engine_reads_the_optimizer_registry():
    from fastlib import optim
    from fastlib.kernels import optim_rules

    names = list(optable.OPTIMIZERS)
    assert list(spec.OPTIMIZERS) == names == [r.name for r in optim_rules.RULES]
    for name, sig in optable.OPTIMIZERS.items():
        assert dict(spec.OPTIMIZERS[name].hyper) == sig.defaults
        assert tuple(spec.OPTIMIZERS[name].state) == sig.state
        cls = optim.get(name.upper())
        assert type(cls).__name__ == name and cls.hyperparameters() == sig.defaults
        assert cls.kind == names.index(name) and cls.state_names == sig.state
        assert reflib.optim.hyperparameters(name.lower()) == sig.defaults


@pytest.mark.parametrize("call", [
    lambda h: spec.step("Momentum", [1.0], [1.0], None, 1, **h),
    lambda h: reflib.optim.hyperparameters("Momentum", **h),
    lambda h: fastlib.optim.get("Momentum", **h),
])
def test_one_hyperparameter_check_and_message_for_every_engine(call):
    with pytest.raises(ValueError, match=r"Momentum: beta must be in \[0, 1\), got 1.0"):
        call({"beta": 1.0})
    with pytest.raises(ValueError, match=r"lr must be > 0, got 0.0"):
        call({"lr": 0.0})
    for error in (TypeError, ValueError):       # a keyword the optimizer does not take
        with pytest.raises(error, match=r"unknown hyperparameter 'betta'; did you mean 'beta'"):
            call({"betta": 0.5})


def test_adamw_is_adam_chained_with_decoupled_decay():
    from fastlib.kernels import optim_rules

    adam, adamw = optim_rules.SOURCES["adam"], optim_rules.SOURCES["adamw"]
    # both take Adam's direction from the one scale_by_adam; AdamW adds the decay only
    assert "scale_by_adam" in adam.__code__.co_names
    assert {"scale_by_adam", "add_decayed_weights"} <= set(adamw.__code__.co_names)
    assert "sqrt" not in adam.__code__.co_names + adamw.__code__.co_names
    c = dict(lr=0.1, beta1=0.9, one_minus_beta1=0.1, beta2=0.99, one_minus_beta2=0.01,
             inv_bias_beta1=10.0, inv_bias_beta2=100.0, eps=1e-8)
    w, m, v = adamw(2.0, 0.5, 0.0, 0.0, weight_decay=0.25, **c)
    # by hand: m = 0.05, v = 0.0025, m^ = 0.5, v^ = 0.25, direction 0.5 / (0.5 + 1e-8)
    assert (m, v) == pytest.approx((0.05, 0.0025), rel=1e-15)
    assert w == pytest.approx(2.0 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.25 * 2.0), rel=1e-15)


def test_kernels_read_the_coefficient_record_by_name():
    import re

    from fastlib.cuda import optim as cuda_optim
    from fastlib.kernels import optim as cpu_optim
    from fastlib.kernels import optim_rules

    for source in (cpu_optim.UPDATE_SOURCE, cuda_optim.STEP_SOURCE):
        read = set(re.findall(r"c(?:\[0\])?\['(\w+)'\]", source))
        assert read == set(optim_rules.FIELDS)
        assert not re.search(r"c(\[0\])?\[[1-9]", source)      # no field read by position
    record = fastlib.optim.Adam(lr=0.5).coefficients(3, dtype=np.float32)
    assert record.dtype.names == optim_rules.FIELDS and record["lr"][0] == np.float32(0.5)
    assert record["inv_bias_beta2"][0] == np.float32(1.0 / (1.0 - 0.999 ** 3))


# --- the import-time check of kernel branches ------------------------------------------------

_ONE, _TWO = 11, 12


def _switch(code, x):
    if code == _ONE:
        return x
    elif _TWO == code:
        return -x
    return 0


def test_require_branches_names_a_claimed_code_without_a_branch():
    optable.require_branches(_switch, "code", {"one": _ONE, "two": _TWO}, "a test kernel")
    with pytest.raises(ImportError, match=r"a test kernel: _switch has no branch on 'code' for "
                                          r"\{'three': 13\}"):
        optable.require_branches(_switch, "code", {"one": _ONE, "three": 13}, "a test kernel")


def test_loss_codes_are_the_tables_in_every_kernel_module():
    from fastlib.cuda import loss as cuda_loss
    from fastlib.cuda import train_kernels
    from fastlib.kernels import batch_loss
    from optable.losses import LOSS_CODES

    codes = optable.loss_codes()
    assert codes == {n: optable.OPS[n].code for n in optable.names(category="loss")}
    assert train_kernels.LOSS_CODES == codes == LOSS_CODES
    assert set(batch_loss.BRANCHES) == set(codes.values())
    for module in (cuda_loss.ELEMENTWISE,):
        assert all(codes[n] == c for n, c in module.items())
