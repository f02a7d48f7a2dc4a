"""The compiled program's named fields (fastlib.training.instructions), checked at build time.

Independent sources: the layers' own ``parameters()`` shapes for the declared shapes; hand-made
corruptions of a built program for the checks (each must be refused, naming the field).
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib.kernels import transformer as kt
from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention, Parallel,
                            RMSNorm, Sequential, SwiGLU)
from fastlib.training.program import Program, Unsupported
from fastlib.training.instructions import FIELDS, INSTRUCTIONS, ProgramError, check_program


def _every_kind():
    """A model holding every instruction kind: Embedding, RNN, LSTM, Dense, the norms,
    SwiGLU, attention, and a Parallel that adds (Add) and one that concatenates (Columns)."""
    return Sequential([
        Embedding(5, 4), RNN(4, 4, True), LSTM(4, 4, True), LayerNorm(4),
        Parallel([Dense(4, 4, "tanh"), MultiHeadAttention(4, 2, causal=True)], combine="add"),
        RMSNorm(4), Parallel([SwiGLU(4, 3, 2), Dense(4, 2, "sigmoid")], combine="concat"),
        Dense(4, 2)], dtype=np.float64, seed=0)


def _program(model, steps=3, samples=2):
    return Program(model, np.dtype(np.float64), steps, samples, 0, True, False)


def _check(prog, rows):
    check_program(rows, act_size=prog.act_size, param_size=prog.param_size,
                  samples=prog.max_samples, input_slot=prog.input_slot)


def test_a_model_of_every_kind_builds_a_program_that_passes_the_check():
    prog = _program(_every_kind())
    kinds = {INSTRUCTIONS[int(op)].name for op in prog.prog[:, kt.F_OP]}
    assert kinds == {i.name for i in INSTRUCTIONS.values()}
    assert set(FIELDS.values()) == set(range(kt.N_FIELDS))


def _corrupt(prog, op, field, value):
    rows = prog.prog.copy()
    k = int(np.flatnonzero(rows[:, kt.F_OP] == op)[0])
    rows[k, FIELDS[field]] = value
    return rows


@pytest.mark.parametrize("op, field, value, match", [
    (kt.OP_DENSE, "p0", 10 ** 6, "parameter block 'p0'"),
    (kt.OP_LSTM, "aux5", 10 ** 6, "slot 'aux5'"),
    (kt.OP_ATTENTION, "out", -1, "slot 'out'"),
    (kt.OP_DENSE, "int0", 10 ** 3, "activation code"),
    (kt.OP_LAYER_NORM, "int0", 1, "not used by this kind"),
    (kt.OP_COLUMNS, "int0", 99, "outside the output"),
    (kt.OP_ADD, "grad_b", 7, "cotangent mode"),
    (kt.OP_SWIGLU, "op", 99, "unknown op code 99"),
])
def test_a_wrong_field_is_refused_at_build_time(op, field, value, match):
    prog = _program(_every_kind())
    with pytest.raises(ProgramError, match=match):
        _check(prog, _corrupt(prog, op, field, value))


def test_the_softmax_code_is_the_tables():
    """A softmax Dense stays off the program: its code is read from the op table."""
    import optable

    m = Sequential([LayerNorm(3), Dense(3, 2, "softmax")], seed=0)
    with pytest.raises(Unsupported):
        Program(m, np.dtype(np.float64), 1, 2, 3, False, False)
    assert fastlib.layers.activations.SOFTMAX == optable.ACTIVATIONS["softmax"].code


def test_the_builder_reads_each_kinds_declared_shapes():
    model = _every_kind()
    prog = _program(model)
    params = model.parameters()
    assert set(prog.layout) == set(params)
    for name, (_, _, _, _, _, shape) in prog.layout.items():
        assert shape == params[name].shape, name
    flat = prog.flatten(params)
    back = {k: np.zeros_like(v) for k, v in params.items()}
    prog.unflatten(flat, back)
    for k, v in params.items():
        np.testing.assert_array_equal(back[k], v)
