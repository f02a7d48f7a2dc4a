"""One compiled program, its schedule chosen from its rows (fastlib.training.schedules).

Independent sources: the layers' own attributes (widths, activations, parameter names) for
what a schedule's plan reads from the rows; the generic per-batch loop (``fused=False``) for
what a schedule computes on a model it newly takes; hand-corrupted rows for the refusals.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib.kernels import instructions as ins
from fastlib.layers import (LSTM, RNN, Dense, Embedding, LayerNorm, MultiHeadAttention,
                            Sequential)
from fastlib.layers.activations import ACTIVATIONS
from fastlib.training import mlp_schedule, schedules
from fastlib.training.program import Program
from fastlib.training.schedules import ScheduleError

# float64, two epochs of SGD on O(1) data: the schedules and the generic loop differ by
# summation order only (a few ulps per product); 1e-10 relative leaves margin, while any slip
# in the math (a wrong width, activation or parameter) is O(1e-3) or more
RTOL = 1e-10


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), rng.integers(0, 3, (shape[0], 1))


def _train(model, x, y, loss="cross_entropy", fused=True):
    return fastlib.train(model, x, y, 2, 4, 0.05, loss, seed=1, fused=fused, verbose=False)


def _family(name):
    x2, y = _data((11, 5))
    x3, _ = _data((11, 4, 5))
    tokens = np.random.default_rng(1).integers(0, 6, (11, 4))
    return {
        "mlp": (Sequential([Dense(5, 7, "tanh"), Dense(7, 3)], dtype=np.float64, seed=0), x2, y),
        "recurrent": (Sequential([LSTM(5, 4), Dense(4, 3)], dtype=np.float64, seed=0), x3, y),
        "recurrent_tokens": (Sequential([Embedding(6, 5), RNN(5, 4), Dense(4, 3)],
                                        dtype=np.float64, seed=0), tokens, y),
        "general": (Sequential([MultiHeadAttention(5, 1), LSTM(5, 4), Dense(4, 3)],
                               dtype=np.float64, seed=0), x3, y),
    }[name]


@pytest.mark.parametrize("name, schedule", [("mlp", "mlp"), ("recurrent", "general"),
                                            ("recurrent_tokens", "general"),
                                            ("general", "general")])
def test_every_family_runs_in_the_program_under_its_schedule(name, schedule):
    model, x, y = _family(name)
    r = _train(model, x, y)
    assert (r.path, r.schedule, r.fused) == ("program", schedule, True)
    r = _train(_family(name)[0], x, y, fused=False)
    assert (r.path, r.schedule, r.fused) == ("generic", None, False)


def test_a_model_built_by_hand_of_dense_rows_only_gets_the_mlp_schedule():
    """Nested Sequentials of Dense layers compile to the same Dense rows as a flat chain: the
    mlp schedule runs them, and it computes what the generic loop computes."""
    x, y = _data((13, 5))
    runs = []
    for fused in (True, False):
        model = Sequential([Sequential([Dense(5, 6, "relu"), Sequential([Dense(6, 4, "gelu")])]),
                            Dense(4, 3)], dtype=np.float64, seed=3)
        r = _train(model, x, y, fused=fused)
        assert r.schedule == ("mlp" if fused else None)
        runs.append((r.loss_history, model.parameters()))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=RTOL)
    for k, v in runs[1][1].items():
        np.testing.assert_allclose(runs[0][1][k], v, rtol=RTOL, atol=RTOL * np.abs(v).max())


def test_dense_rows_on_positions_run_in_the_program():
    """A Dense chain on (N, T, d) data: the MLP schedule declines it (it runs (N, d) data), and
    the general schedule's loss reads the output per position, as the generic loop does."""
    x, _ = _data((9, 3, 5))
    y = np.random.default_rng(2).standard_normal((9, 3, 2))
    runs = []
    for fused in (True, False):
        model = Sequential([Dense(5, 4, "tanh"), Dense(4, 2)], dtype=np.float64, seed=0)
        r = _train(model, x, y, "mse", fused=fused)
        assert r.schedule == ("general" if fused else None)
        runs.append((r.loss_history, model.parameters()))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=RTOL)
    for k, v in runs[1][1].items():
        np.testing.assert_allclose(runs[0][1][k], v, rtol=RTOL, atol=RTOL * np.abs(v).max())


def _program(model, x, tokens=False):
    steps = x.shape[1] if x.ndim == 3 or tokens else 1
    d_in = 0 if tokens else x.shape[-1]
    return Program(model, np.dtype(np.float64), steps, 1, d_in, tokens, x.ndim == 3)


def test_the_mlp_plan_is_read_from_the_rows():
    model = Sequential([Dense(5, 7, "leaky_relu"), Sequential([Dense(7, 2, "sigmoid")])],
                       dtype=np.float64, seed=0)
    prog = _program(model, np.zeros((1, 5)))
    assert mlp_schedule.takes(prog) is not None
    plan = mlp_schedule.plan_from_rows(prog.tables, prog.row_names, prog.dtype, 0, 2)
    assert plan.dims.tolist() == [5, 7, 2]
    assert plan.codes.tolist() == [ACTIVATIONS["leaky_relu"], ACTIVATIONS["sigmoid"]]
    assert plan.names == [("0.weight", "0.bias"), ("1.0.weight", "1.0.bias")]
    assert plan.size == sum(v.size for v in model.parameters().values())


def test_rows_of_another_kind_are_refused_by_the_mlp_schedule():
    """Handed rows it does not run, the MLP schedule's plan builder raises instead of reading
    the fields as its own."""
    x, _ = _data((1, 4, 3))
    prog = _program(Sequential([LSTM(3, 3), LayerNorm(3), Dense(3, 2)], dtype=np.float64), x)
    assert mlp_schedule.takes(prog) is None
    with pytest.raises(ScheduleError, match=f"row 0 is op {ins.LSTM}"):
        mlp_schedule.plan_from_rows(prog.tables, prog.row_names, prog.dtype, 0, 1)
    # a Dense row whose activation code the kernels do not apply
    dense = _program(Sequential([Dense(3, 2)], dtype=np.float64), np.zeros((1, 3)))
    bad = ins.ProgramTables(dense.tables.rows.copy(), dense.tables.slots, dense.tables.blocks)
    bad.rows[0]["activation"] = ACTIVATIONS["softmax"]
    with pytest.raises(ScheduleError, match="row 0 is op"):
        mlp_schedule.plan_from_rows(bad, dense.row_names, dense.dtype, 0, 1)


def test_the_schedules_are_one_registry_tried_most_specialised_first():
    assert [s.name for s in schedules.schedules()] == ["mlp", "general"]
