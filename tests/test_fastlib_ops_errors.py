"""Bad input to fastlib.forward / vjp / value_and_vjp: a clear ValueError, TypeError or
UnknownOpError raised by the wrapper (the message starts with the op's name and says what to
fix), never an error from inside Numba."""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib.ops import UnknownOpError, value_and_vjp

F32 = np.float32


def _x(*shape, dtype=np.float64):
    return np.linspace(-1, 1, int(np.prod(shape))).reshape(shape).astype(dtype)


def _raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    assert "numba" not in type(info.value).__module__
    return info.value


# --- names and params ------------------------------------------------------------------------

def test_unknown_op_lists_close_names():
    err = _raises(UnknownOpError, r"unknown op 'tanhh'.*did you mean 'tanh'", fastlib.forward,
                  "tanhh", [_x(3)])
    assert isinstance(err, KeyError)
    _raises(UnknownOpError, r"'logsoftmax'.*'log_softmax'", fastlib.vjp, "logsoftmax",
            [_x(3)], _x(3))
    _raises(UnknownOpError, "unknown op", value_and_vjp, 3, [_x(3)], _x(3))


def test_unknown_and_missing_params():
    _raises(ValueError, r"sum: unknown param 'axes'; did you mean 'axis'", fastlib.forward,
            "sum", [_x(2, 3)], axes=0)
    _raises(ValueError, r"tanh: unknown param 'eps'; its params are: none", fastlib.forward,
            "tanh", [_x(3)], eps=1.0)
    _raises(ValueError, r"reshape: param 'shape' is required", fastlib.forward, "reshape",
            [_x(2, 3)])


@pytest.mark.parametrize("name, params, match", [
    ("sum", {"axis": 2}, r"sum: axis 2 is out of range .* 2 dimension"),
    ("mean", {"axis": (0, 0)}, r"mean: axis \(0, 0\) repeats an axis"),
    ("sum", {"axis": 0.5}, r"sum: axis must be None, an int or a tuple"),
    ("sum", {"keepdims": "yes"}, r"sum: keepdims must be True or False"),
    ("softmax", {"axis": 5}, r"softmax: axis=5 is out of range"),
    ("layer_norm", {"eps": -1.0}, r"layer_norm: eps must be > 0"),
    ("rms_norm", {"eps": float("nan")}, r"rms_norm: eps must be a finite real"),
    ("leaky_relu", {"negative_slope": "x"}, r"leaky_relu: negative_slope must be a finite"),
    ("transpose", {"axes": (0, 0)}, r"transpose: axes \(0, 0\) is not a permutation"),
    ("reshape", {"shape": (4, 2)}, r"reshape: cannot reshape 6 elements into shape \(4, 2\)"),
    ("reshape", {"shape": (-1, -1)}, r"reshape: shape \(-1, -1\) may hold one -1"),
    ("reshape", {"shape": (4, -1)}, r"reshape: cannot infer -1"),
    ("slice", {"step": 0}, r"slice: step must be an int >= 1"),
    ("slice", {"axis": 3}, r"slice: axis must be an int in \[-2, 2\)"),
    ("slice", {"start": 1.5}, r"slice: start must be an int or None"),
])
def test_bad_params(name, params, match):
    _raises(ValueError, match, fastlib.forward, name, [_x(2, 3)], **params)
    _raises(ValueError, match, fastlib.vjp, name, [_x(2, 3)], _x(2, 3), **params)


# --- inputs: count, dtype, shapes ---------------------------------------------------------------

def test_inputs_must_be_a_sequence_of_the_right_length():
    _raises(TypeError, r"tanh: inputs must be a list or tuple", fastlib.forward, "tanh", _x(3))
    _raises(ValueError, r"add: takes 2 input\(s\) \('a', 'b'\); got 1", fastlib.forward, "add",
            [_x(3)])


@pytest.mark.parametrize("bad", [np.arange(3), np.ones(3, np.int8),
                                 np.ones(3, np.complex128), np.array(["a", "b", "c"])])
def test_non_float_dtypes_are_type_errors(bad):
    _raises(TypeError, rf"exp: input 'x' has dtype {bad.dtype}; fastlib computes in float32 "
                       r"or float64", fastlib.forward, "exp", [bad])


def test_mixed_dtypes_are_type_errors():
    _raises(TypeError, r"add: inputs have mixed dtypes \(a float32, b float64\)",
            fastlib.forward, "add", [_x(3, dtype=F32), _x(3)])
    _raises(TypeError, r"matmul: inputs have mixed dtypes", fastlib.vjp, "matmul",
            [_x(2, 2), _x(2, 2, dtype=F32)], _x(2, 2))


def test_lists_and_non_native_byte_order_are_accepted():
    np.testing.assert_array_equal(fastlib.forward("neg", [[1.0, 2.0]]), [-1.0, -2.0])
    big_endian = np.array([1.0, 4.0], dtype=">f4")
    out = fastlib.forward("sqrt", [big_endian])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.0, 2.0])


@pytest.mark.parametrize("name, shapes, match", [
    ("add", [(2, 3), (4,)], r"add: shapes \(2, 3\) and \(4,\) do not broadcast"),
    ("maximum", [(2,), (3,)], r"maximum: shapes \(2,\) and \(3,\) do not broadcast"),
    ("matmul", [(2, 3), (4, 5)], r"matmul: inner dimensions differ"),
    ("matmul", [(3,), (3, 2)], r"matmul: both inputs need at least 2 dimensions"),
    ("matmul", [(2, 2, 3), (3, 3, 2)], r"matmul: batch shapes differ"),
    ("concat", [(2, 3), (3, 2)], r"concat: shapes \(2, 3\) and \(3, 2\) differ on axis 0"),
    ("concat", [(2, 3), (3,)], r"concat: inputs need the same number"),
    ("mse", [(2, 3), (3, 2)], r"mse: pred has shape \(2, 3\) but target has shape \(3, 2\)"),
    ("categorical_cross_entropy", [(4, 10), (4, 1)],
     r"categorical_cross_entropy: expects one-hot targets \[4, 10\], got \[4, 1\]"),
    ("cross_entropy", [(4,), (4,)], r"cross_entropy: logits must be 2-D"),
    ("layer_norm", [()], r"layer_norm: the input is 0-d"),
    ("mean", [(0, 3)], r"mean: reducing over an empty axis"),
])
def test_bad_shapes(name, shapes, match):
    inputs = [_x(*s) for s in shapes]
    _raises(ValueError, match, fastlib.forward, name, inputs)


def test_cross_entropy_targets_follow_datacode_formats():
    z = _x(4, 10)
    _raises(ValueError, r"cross_entropy: expects class indices \[N, 1\] or \[N\] with N = 4, "
                        r"got \[4, 10\]; for one-hot targets use categorical_cross_entropy",
            fastlib.forward, "cross_entropy", [z, np.eye(10)[:4]])
    _raises(ValueError, r"class index target\[2\] = 10 is outside \[0, 10\)", fastlib.forward,
            "cross_entropy", [z, np.array([0, 1, 10, 2])])
    _raises(ValueError, r"class index target\[0\] = -1", fastlib.forward, "cross_entropy",
            [z, np.array([-1, 1, 1, 2])])
    _raises(ValueError, r"class indices must be whole numbers; target\[1\] = 1.5",
            fastlib.forward, "cross_entropy", [z, np.array([0, 1.5, 1, 2])])
    _raises(TypeError, r"cross_entropy: input 'target' has dtype bool", fastlib.forward,
            "cross_entropy", [z, np.ones(4, bool)])
    # floats holding whole numbers and (N, 1) columns are fine, in any int dtype
    want = fastlib.forward("cross_entropy", [z, np.array([0, 1, 2, 3])])
    for t in (np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([0, 1, 2, 3], np.uint8)):
        assert fastlib.forward("cross_entropy", [z, t]) == want


def test_binary_cross_entropy_needs_probabilities():
    p = np.array([0.2, 1.5])
    _raises(ValueError, r"binary_cross_entropy: p must lie in \[0, 1\] \(probabilities; apply "
                        r"sigmoid first", fastlib.forward, "binary_cross_entropy",
            [p, np.array([0.0, 1.0])])
    _raises(ValueError, r"binary_cross_entropy_with_logits: target must lie in \[0, 1\]",
            fastlib.forward, "binary_cross_entropy_with_logits",
            [np.array([3.0, -2.0]), np.array([0.0, 2.0])])


def test_binary_cross_entropy_at_the_ends_of_the_interval():
    """p in {0, 1} with a target that agrees: 0 log 0 = 0, finite loss and gradient."""
    p = np.array([0.0, 1.0, 0.5])
    t = np.array([0.0, 1.0, 1.0])
    loss = fastlib.forward("binary_cross_entropy", [p, t])
    assert loss == pytest.approx(np.log(2.0) / 3, rel=1e-15)       # only the last term
    gp, gt = fastlib.vjp("binary_cross_entropy", [p, t], 3.0)
    # d/dp of -log(1 - p) at p = 0 is 1; of -log p at p = 1 is -1; (p - t)/(p(1 - p)) = -2
    np.testing.assert_array_equal(gp, [1.0, -1.0, -2.0])
    assert gt[2] == 0.0 and gt[0] == np.inf and gt[1] == -np.inf   # -logit(p) at 0 and 1


# --- cotangents ---------------------------------------------------------------------------------

def test_grad_shape_and_dtype():
    _raises(ValueError, r"tanh: grad has shape \(3, 2\) but the output has shape \(2, 3\)",
            fastlib.vjp, "tanh", [_x(2, 3)], _x(3, 2))
    _raises(ValueError, r"mse: grad has shape \(1,\) but the output has shape \(\)",
            fastlib.vjp, "mse", [_x(3), _x(3)], np.ones(1))
    _raises(TypeError, r"tanh: grad has dtype float64 but the inputs are float32",
            fastlib.vjp, "tanh", [_x(3, dtype=F32)], _x(3))
    _raises(TypeError, r"sum: grad has dtype int64", fastlib.vjp, "sum", [_x(3)], 1)


# --- non-finite input -----------------------------------------------------------------------------

FINITE_ONLY = ["logsumexp", "softmax", "log_softmax", "layer_norm", "rms_norm"]


@pytest.mark.parametrize("name", FINITE_ONLY)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_row_ops_reject_non_finite_inputs(name, bad):
    x = _x(2, 3, dtype=F32)
    x[1, 2] = bad
    _raises(ValueError, rf"{name}: input 'x' holds a non-finite value .* at index \[1, 2\]",
            fastlib.forward, name, [x])
    grad = np.ones(np.shape(fastlib.forward(name, [_x(2, 3, dtype=F32)])), F32)
    _raises(ValueError, rf"{name}: input 'x' holds a non-finite", fastlib.vjp, name, [x], grad)
    grad.reshape(-1)[0] = bad
    _raises(ValueError, rf"{name}: grad holds a non-finite", fastlib.vjp, name,
            [_x(2, 3, dtype=F32)], grad)


@pytest.mark.parametrize("name, second", [
    ("mse", _x(2, 3)), ("cross_entropy", np.array([0, 1])),
    ("categorical_cross_entropy", np.eye(3)[:2]),
    ("binary_cross_entropy_with_logits", np.zeros((2, 3))),
])
def test_losses_reject_non_finite_inputs(name, second):
    z = _x(2, 3)
    z[0, 1] = np.nan
    _raises(ValueError, rf"{name}: input '\w+' holds a non-finite value nan at index \[0, 1\]",
            value_and_vjp, name, [z, second], 1.0)
    # the binary cross-entropy's range check rejects NaN and inf too
    _raises(ValueError, r"binary_cross_entropy: p must lie in \[0, 1\] .* p\[0\] = nan",
            fastlib.forward, "binary_cross_entropy",
            [np.array([np.nan, 0.5]), np.array([0.0, 1.0])])
    _raises(ValueError, r"binary_cross_entropy_with_logits: target must lie in \[0, 1\]",
            fastlib.forward, "binary_cross_entropy_with_logits",
            [np.array([1.0, 0.5]), np.array([0.0, np.inf])])
