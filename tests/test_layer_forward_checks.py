"""A direct ``layer.forward(x)`` refuses what it cannot take, with model(x)'s messages.

``forward`` is what training loops call per batch (docs/algorithms.md: ``ctx.model.forward``):
it makes O(1) checks only (type, dtype, rank, shape; no NaN scan) and raises the error
``model(x)`` raises for the same rule, naming the layer, what it expects and what it got.
Before, these inputs returned silent garbage (a zero column, uninitialised memory) or failed
deep in a kernel with a message about something else.
"""
import re

import numpy as np
import pytest

import fastlib
from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention,
                            Parallel, RMSNorm, Sequential, Softmax, SwiGLU)

F32 = np.float32


def _raises_like_call(make, x, error, pattern):
    """``forward(x)`` raises ``error`` matching ``pattern``, as ``model(x)`` does for a rule
    both make (the same text, but for how the layer is named at the start)."""
    with pytest.raises(error, match=pattern) as direct:
        make().forward(x)
    return str(direct.value)


# -- shapes: the rule of infer_shape, the message of model(x) -----------------------------------

@pytest.mark.parametrize("kind", [LayerNorm, RMSNorm])
def test_norm_with_the_wrong_width_is_refused(kind):
    x = np.ones((2, 5), F32)
    msg = _raises_like_call(lambda: kind(4), x, ValueError,
                            re.escape(f"{kind.__name__}(4): input's last axis must have 4 "
                                      "features, got shape (2, 5)"))
    with pytest.raises(ValueError) as called:
        kind(4)(x)
    assert str(called.value) == msg


@pytest.mark.parametrize("kind", [LSTM, RNN])
def test_recurrent_sequence_of_zero_steps_is_refused(kind):
    x = np.zeros((2, 0, 4), F32)
    msg = _raises_like_call(lambda: kind(4, 3), x, ValueError,
                            re.escape(f"{kind.__name__}(4, 3): the sequence is empty (shape "
                                      "(2, 0, 4)); pass at least one time step"))
    with pytest.raises(ValueError) as called:
        kind(4, 3)(x)
    assert str(called.value) == msg


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4)])
def test_lstm_with_the_wrong_features_or_rank_is_refused(shape):
    _raises_like_call(lambda: LSTM(4, 3), np.zeros(shape, F32), ValueError,
                      re.escape("LSTM(4, 3): expected input (batch, seq, features) = (batch, "
                                f"seq, 4), got shape {shape}"))


@pytest.mark.parametrize("make, label, x", [
    (lambda: Dense(4, 3), "Dense(4, 3)", np.zeros((2, 5), F32)),
    (lambda: SwiGLU(4, 6, 3), "SwiGLU(4, 6, 3)", np.zeros((2, 5), F32)),
])
def test_feed_forward_with_the_wrong_width_is_refused(make, label, x):
    msg = _raises_like_call(make, x, ValueError,
                            re.escape(f"{label}: input's last axis must have 4 features, got "
                                      "shape (2, 5)"))
    assert "dot_into" not in msg


def test_attention_with_the_wrong_width_is_refused():
    _raises_like_call(lambda: MultiHeadAttention(4, 2), np.zeros((2, 3, 5), F32), ValueError,
                      re.escape("MultiHeadAttention(4, 2): expected input (batch, seq, d_model) "
                                "= (batch, seq, 4), got shape (2, 3, 5)"))


def test_parallel_branch_with_the_wrong_width_is_refused():
    _raises_like_call(lambda: Parallel([Dense(4, 3), Dense(4, 2)]), np.zeros((2, 5), F32),
                      ValueError, re.escape("Parallel layer 0: Dense(4, 3): input's last axis "
                                            "must have 4 features"))


def test_parallel_branches_of_different_ranks_are_refused():
    _raises_like_call(lambda: Parallel([LSTM(4, 3), Dense(4, 3)]), np.zeros((2, 3, 4), F32),
                      ValueError, re.escape("Parallel(combine='concat'): branch 1 gives shape "
                                            "(2, 3, 3), the branches before it (2, 3)"))


def test_softmax_axis_out_of_range_is_refused_at_forward():
    # the rank is unknown at construction (Dense takes any rank), so forward refuses it
    _raises_like_call(lambda: Sequential([Dense(4, 3), Softmax(axis=5)]), np.zeros((2, 4), F32),
                      ValueError, re.escape("Sequential layer 1: Softmax: axis 5 out of range "
                                            "for input of 2 dimensions (shape (2, 3))"))
    with pytest.raises(ValueError, match="Softmax: axis -3 out of range"):
        Softmax(axis=-3).forward(np.zeros((2, 4), F32))
    with pytest.raises(TypeError, match="Softmax: axis must be an int"):
        Softmax(axis=1.5)


@pytest.mark.parametrize("x", [np.zeros((0, 4), F32), np.array(1.0, F32)])
def test_an_empty_batch_or_a_scalar_is_refused(x):
    _raises_like_call(lambda: Dense(4, 3), x, ValueError, r"Dense\(4, 3\): input of shape "
                      r"\(.*\) is empty or a scalar")


# -- dtypes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, label, x", [
    (lambda: Dense(4, 3), "Dense(4, 3)", np.zeros((2, 4))),
    (lambda: SwiGLU(4, 6, 3), "SwiGLU(4, 6, 3)", np.zeros((2, 4))),
    (lambda: MultiHeadAttention(4, 2), "MultiHeadAttention(4, 2)", np.zeros((2, 3, 4))),
    (lambda: Parallel([Dense(4, 3), Dense(4, 2)]), "Parallel", np.zeros((2, 4))),
    (lambda: LayerNorm(4, dtype=np.float64), "LayerNorm(4)", np.zeros((2, 4), F32)),
])
def test_the_other_float_precision_is_refused_not_misread(make, label, x):
    want = make().dtype.name
    msg = _raises_like_call(make, x, TypeError,
                            re.escape(f"{label}: input dtype {x.dtype} differs from the layer's "
                                      f"{want}; convert with x.astype(np.{want})"))
    assert "dot_into" not in msg
    np.testing.assert_array_equal(make()(x), make().forward(x.astype(want)))  # model(x) converts


@pytest.mark.parametrize("make, label", [(lambda: Dense(4, 3), "Dense(4, 3)"),
                                         (lambda: SwiGLU(4, 6, 3), "SwiGLU(4, 6, 3)")])
def test_an_integer_input_is_refused_with_model_calls_rule(make, label):
    x = np.zeros((2, 4), np.int64)
    _raises_like_call(make, x, TypeError,
                      re.escape(f"{label}: expects a floating-point input of dtype float32, got "
                                "int64 with shape (2, 4); cast it with x.astype(np.float32)"))
    with pytest.raises(TypeError, match=r"expects a floating-point input of dtype float32, got "
                                        r"int64 with shape \(2, 4\)"):
        make()(x)


def test_a_list_is_refused():
    with pytest.raises(TypeError, match=r"Dense\(2, 1\)\.forward: expects a numpy array, got "
                                        r"list; call the model"):
        Dense(2, 1).forward([[1.0, 2.0]])


def test_embedding_models_still_take_integer_indices():
    model = Sequential([Embedding(5, 3), Dense(3, 2)])
    idx = np.array([[0, 4, 2]])
    np.testing.assert_array_equal(model.forward(idx), model(idx))
    with pytest.raises(TypeError, match="Sequential: expects integer indices, got dtype bool"):
        model.forward(np.zeros((1, 3), bool))


# -- valid inputs: unchanged values, the same as model(x) -----------------------------------------

def _valid_cases():
    rng = np.random.default_rng(0)
    flat = rng.standard_normal((3, 4)).astype(F32)
    seq = rng.standard_normal((2, 3, 4)).astype(F32)
    return [
        ("Dense", lambda: Dense(4, 3, "tanh", seed=1), flat),
        ("Dense 3-D", lambda: Dense(4, 3, seed=1), seq),
        ("LayerNorm", lambda: LayerNorm(4), seq),
        ("RMSNorm", lambda: RMSNorm(4), flat),
        ("Softmax axis 1", lambda: Softmax(axis=1), seq),
        ("SwiGLU", lambda: SwiGLU(4, 6, 3, seed=2), flat),
        ("LSTM", lambda: LSTM(4, 3, seed=3), seq),
        ("RNN sequences", lambda: RNN(4, 3, return_sequences=True, seed=3), seq),
        ("MultiHeadAttention", lambda: MultiHeadAttention(4, 2, causal=True, seed=4), seq),
        ("Sequential", lambda: Sequential([Dense(4, 5, "relu"), LayerNorm(5), Dense(5, 2),
                                           Softmax()], seed=5), flat),
        ("Parallel concat", lambda: Parallel([Dense(4, 3), Dense(4, 2, "relu")], seed=6), flat),
        ("Parallel add", lambda: Parallel([LSTM(4, 3), RNN(4, 3)], combine="add", seed=6), seq),
        ("float64", lambda: Sequential([Dense(4, 3), RMSNorm(3)], dtype=np.float64, seed=7),
         flat.astype(np.float64)),
    ]


@pytest.mark.parametrize("name, make, x", _valid_cases(), ids=[c[0] for c in _valid_cases()])
def test_valid_inputs_give_the_values_of_model_call(name, make, x):
    direct, called = make().forward(x), make()(x)
    assert direct.dtype == x.dtype
    np.testing.assert_array_equal(direct, called)
    # and the history a backward needs is recorded, as before
    model = make()
    out = model.forward(x)
    grad_in, grads = model.backward(np.ones_like(out))
    assert grad_in.shape == x.shape and set(grads) == set(model.parameters())


def test_a_non_contiguous_input_of_the_right_dtype_is_still_taken():
    x = np.asfortranarray(np.random.default_rng(0).standard_normal((3, 4)).astype(F32))
    model = Sequential([Dense(4, 3), LayerNorm(3)])
    np.testing.assert_array_equal(model.forward(x), model(x))


@pytest.mark.parametrize("make", [
    lambda: fastlib.Dense(3, 2, dtype=None),
    lambda: fastlib.Sequential([fastlib.Dense(3, 2)], dtype=None),
    lambda: fastlib.LSTM(3, 2, dtype=None),
    lambda: fastlib.Tape(dtype=None)], ids=["Dense", "Sequential", "LSTM", "Tape"])
def test_dtype_none_is_refused_not_read_as_float64(make):
    # np.dtype(None) is float64: a layer built with dtype=None used to switch silently from
    # the float32 default to float64
    with pytest.raises(TypeError, match=r"dtype must be float32 or float64, got None"):
        make()
