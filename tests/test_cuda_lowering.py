"""Tests of the device's lowering of the compiled program (fastlib/cuda/lowering.py), in this
process: no device is touched before a model is refused.

The dispatch table covers the instruction set, a kind missing from it is refused naming the kind
and the fix, a model the program does not express is refused naming the layer, and the program
the device lowers is the CPU's (the same builder, rows and parameter layout). The GPU's losses
against the CPU program's, per model kind, run under the simulator (tests/test_cuda_train.py,
checks ``program:*``).
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib import layers as L
from fastlib.cuda import layers as device_layers
from fastlib.cuda.layers import DeviceUnsupportedError
from fastlib.cuda.lowering import check_lowerable, compile_program
from fastlib.kernels import instructions as ins
from fastlib.training.program import Program


def _transformer():
    return fastlib.Sequential([
        L.Embedding(5, 4),
        L.Parallel([L.Dense(4, 4), L.Sequential([L.LayerNorm(4),
                                                 L.MultiHeadAttention(4, 2, causal=True)])],
                   combine="add"),
        L.Parallel([L.Dense(4, 4), L.Sequential([L.RMSNorm(4), L.SwiGLU(4, 3, 4)])],
                   combine="add"),
        L.Dense(4, 5)], dtype=np.float64, seed=1)


def test_every_instruction_kind_has_device_kernels():
    assert set(device_layers.KERNELS) == set(ins.INSTRUCTIONS)


def test_the_device_lowers_the_cpus_program():
    model = _transformer()
    x = np.zeros((2, 3), np.int64)
    program = compile_program(model, x)
    cpu = Program(model, np.dtype(np.float64), 3, 1, 0, True, False)
    assert np.array_equal(program.tables.rows, cpu.tables.rows)
    assert np.array_equal(program.tables.blocks, cpu.tables.blocks)
    assert program.layout == cpu.layout
    # an Add join per residual, so the Parallel rows are in the program the device runs
    assert {ins.ADD, ins.ATTENTION, ins.SWIGLU, ins.EMBEDDING} <= program.kinds()


def test_softmax_layers_are_a_softmax_after_the_row_before_them():
    model = fastlib.Sequential([L.Dense(3, 4, "tanh"), L.Softmax(),
                                L.Parallel([L.Dense(4, 2, "softmax"), L.Dense(4, 3)]),
                                L.Softmax(), L.Softmax()], seed=1)
    program = compile_program(model, np.zeros((2, 3), np.float32))
    # the CPU's rows of the same model with the softmax layers left out and the softmax Dense
    # linear: Dense, Dense, Columns, Dense, Columns
    head = fastlib.Sequential([L.Dense(3, 4, "tanh"),
                               L.Parallel([L.Dense(4, 2), L.Dense(4, 3)])], seed=1)
    cpu = Program(head, np.dtype(np.float32), 1, 1, 3, False, False)
    assert np.array_equal(program.tables.rows, cpu.tables.rows)
    assert program.layout == {k.replace("1.", "2.", 1) if k.startswith("1.") else k: v
                              for k, v in cpu.layout.items()}
    assert program.softmax_after == [0, 1, 4, 4]


def test_a_kind_without_device_kernels_is_refused_by_name(monkeypatch):
    model = fastlib.Sequential([L.Dense(3, 4), L.LayerNorm(4), L.Dense(4, 2)], seed=1)
    program = Program(model, np.dtype(np.float32), 1, 1, 3, False, False)
    monkeypatch.delitem(device_layers.KERNELS, ins.LAYER_NORM)
    with pytest.raises(DeviceUnsupportedError) as err:
        check_lowerable(program)
    msg = str(err.value)
    assert "program row 1 is a LayerNorm" in msg and "KERNELS" in msg and "device='cpu'" in msg
    with pytest.raises(DeviceUnsupportedError, match="LayerNorm"):
        compile_program(model, np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("layers, where, words", [
    ([L.Softmax(), L.Dense(3, 2)], "model.layers[0]",
     ("Softmax", "no layer before it", "device='cpu'")),
    ([L.Dense(3, 4), L.Softmax(axis=0)], "model.layers[1]", ("axis 0", "device='cpu'")),
    ([L.Dense(3, 4), L.Parallel([L.Dense(4, 2), L.Softmax()])], "model.layers[1].layers[1]",
     ("Softmax", "no layer before it")),
])
def test_a_model_the_program_cannot_hold_is_refused_naming_the_layer(layers, where, words):
    model = fastlib.Sequential(layers, seed=1)
    with pytest.raises(DeviceUnsupportedError) as err:
        compile_program(model, np.zeros((2, 3), np.float32))
    msg = str(err.value)
    assert where in msg and all(w in msg for w in words), msg
