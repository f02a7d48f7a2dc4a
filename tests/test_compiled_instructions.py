"""The compiled program's records (fastlib.kernels.instructions), checked at build time.

Independent sources: the layers' own ``parameters()`` shapes for the declared shapes; hand-made
corruptions of a built program for the checks (each must be refused, naming the field).
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib.kernels import instructions as ins
from fastlib.kernels.instructions import INSTRUCTIONS, ProgramError, check_program
from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention, Parallel,
                            RMSNorm, Sequential, SwiGLU)
from fastlib.training.program import Program, Unsupported


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


def _check(prog, tables):
    check_program(tables, act_size=prog.act_size, param_size=prog.param_size,
                  samples=prog.max_samples, input_slot=prog.input_slot)


def _copy(prog):
    return ins.ProgramTables(*(t.copy() for t in prog.tables))


def _row_of(tables, op):
    return int(np.flatnonzero(tables.rows["op"] == op)[0])


def test_a_model_of_every_kind_builds_a_program_that_passes_the_check():
    prog = _program(_every_kind())
    assert {INSTRUCTIONS[int(op)].name for op in prog.tables.rows["op"]} == \
        {i.name for i in INSTRUCTIONS.values()}
    assert set(ins.ROW.names) == {"op"} | set(ins.SLOT_FIELDS + ins.BLOCK_FIELDS + ins.INT_FIELDS
                                              + ins.REAL_FIELDS)


@pytest.mark.parametrize("op, field, value, match", [
    (ins.DENSE, "weight", 10 ** 6, "field 'weight' = 1000000 names no entry"),
    (ins.LSTM, "cells", -1, "field 'cells' = -1 names no entry"),
    (ins.ATTENTION, "y", -1, "field 'y' = -1 names no entry"),
    (ins.DENSE, "activation", 10 ** 3, "activation code"),
    (ins.LAYER_NORM, "heads", 1, "not used by this kind"),
    (ins.LAYER_NORM, "qkv", 0, "'qkv' = 0 is not used by this kind"),
    (ins.COLUMNS, "col0", 99, "outside the output"),
    (ins.ADD, "grad_x2", 7, "cotangent mode"),
    (ins.SWIGLU, "op", 99, "unknown op code 99"),
    (ins.ATTENTION, "heads", 3, "declares 9 x 3|3 heads over 4 columns"),
    (ins.LAYER_NORM, "eps", 0.0, "eps must be > 0"),
])
def test_a_wrong_field_is_refused_at_build_time(op, field, value, match):
    prog = _program(_every_kind())
    tables = _copy(prog)
    tables.rows[_row_of(tables, op)][field] = value
    with pytest.raises(ProgramError, match=match):
        _check(prog, tables)


def test_an_in_bounds_swap_of_two_slot_fields_is_refused():
    """LayerNorm's x-hat and 1/std swapped: both slots exist and lie in the buffer, but each
    has the other's extent."""
    prog = _program(_every_kind())
    tables = _copy(prog)
    row = tables.rows[_row_of(tables, ins.LAYER_NORM)]
    row["xhat"], row["rstd"] = int(row["rstd"]), int(row["xhat"])
    with pytest.raises(ProgramError, match="slot 'xhat'.* holds 3 x 1 per sample; LayerNorm "
                                           "declares 3 x 4"):
        _check(prog, tables)


def test_swapped_slot_offsets_overlap_and_are_refused():
    """The same swap in the slot table: x-hat's 3 x 4 entries per sample placed where the
    1/std's 3 x 1 were run into the next slot."""
    prog = _program(_every_kind())
    tables = _copy(prog)
    row = tables.rows[_row_of(tables, ins.LAYER_NORM)]
    xhat, rstd = tables.slots[row["xhat"]], tables.slots[row["rstd"]]
    xhat["offset"], rstd["offset"] = int(rstd["offset"]), int(xhat["offset"])
    with pytest.raises(ProgramError, match="overlap"):
        _check(prog, tables)


@pytest.mark.parametrize("op, field, other", [(ins.LAYER_NORM, "xhat", "y"),
                                              (ins.LSTM, "cells", "states"),
                                              (ins.LSTM, "cell_tanh", "cells"),
                                              (ins.ATTENTION, "att", "y")])
def test_two_fields_of_a_row_naming_one_slot_are_refused(op, field, other):
    """Two live slots aliased: a row's field pointed at a slot of the same extent that another
    of its fields uses (in bounds, the right extent: only the aliasing is wrong)."""
    prog = _program(_every_kind())
    tables = _copy(prog)
    row = tables.rows[_row_of(tables, op)]
    row[field] = row[other]
    with pytest.raises(ProgramError, match=f"fields '.*' and '.*' name one slot"):
        _check(prog, tables)


def test_a_slot_private_to_two_rows_is_refused():
    prog = _program(_every_kind())
    tables = _copy(prog)
    ln, rms = _row_of(tables, ins.LAYER_NORM), _row_of(tables, ins.RMS_NORM)
    tables.rows[rms]["rrms"] = tables.rows[ln]["rstd"]
    with pytest.raises(ProgramError, match="also used by row"):
        _check(prog, tables)


def test_a_row_reading_an_unwritten_slot_and_a_shared_block_are_refused():
    prog = _program(_every_kind())
    tables = _copy(prog)
    first_dense, last = _row_of(tables, ins.DENSE), len(tables.rows) - 1
    tables.rows[first_dense]["x"] = tables.rows[last]["y"]
    with pytest.raises(ProgramError, match="before any row writes it|declares"):
        _check(prog, tables)
    tables = _copy(prog)
    tables.rows[last]["weight"] = tables.rows[first_dense]["weight"]
    tables.rows[last]["bias"] = tables.rows[first_dense]["bias"]
    with pytest.raises(ProgramError, match="block 'weight'"):
        _check(prog, tables)


def test_the_softmax_code_is_the_tables():
    """A softmax Dense stays off the program: its code is read from the op table."""
    import optable

    m = Sequential([LayerNorm(3), Dense(3, 2, "softmax")], seed=0)
    with pytest.raises(Unsupported):
        Program(m, np.dtype(np.float64), 1, 2, 3, False, False)
    assert fastlib.layers.activations.SOFTMAX == optable.ACTIVATIONS["softmax"].code
    assert optable.ACTIVATIONS["softmax"].code not in ins.ELEMENTWISE_CODES


def test_the_builder_reads_each_kinds_declared_shapes():
    model = _every_kind()
    prog = _program(model)
    params = model.parameters()
    assert set(prog.layout) == set(params)
    for name, (_, _, _, shape) in prog.layout.items():
        assert shape == params[name].shape, name
    flat = prog.flatten(params)
    back = {k: np.zeros_like(v) for k, v in params.items()}
    prog.unflatten(flat, back)
    for k, v in params.items():
        np.testing.assert_array_equal(back[k], v)


def test_every_loss_of_the_table_has_a_kernel_branch():
    """The training loss reads optable's loss codes, and its module's import check names every
    one (a code with no branch fails the import)."""
    from fastlib.kernels import batch_loss
    from optable.losses import LOSS_CODES, LOSSES

    assert set(LOSS_CODES) == set(LOSSES)
    assert sorted(batch_loss.BRANCHES) == sorted(LOSS_CODES.values())
