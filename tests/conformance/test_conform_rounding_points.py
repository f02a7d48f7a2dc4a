"""The ``rounding points`` train rows: each mixed-precision step against a float64 replay.

Oracles: the replay (``rounding_points.replay_step``: reflib's layers in float64, ``ml_dtypes``
rounding at the documented points), itself held to a hand-derived exact SGD step on values
every format holds exactly; the planted bugs are the mutants' own source edits, applied to a
copy of the per-batch module (the compiled epochs' run under ``verigrad conform --mutants``).
"""
from __future__ import annotations

import numpy as np
import pytest

from reports.conformance import rounding_points as rp
from reports.conformance import training_rows as tr
from tests.conformance.test_conform_mixed_training import _mutant, _planted


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_every_case_passes_on_every_path(fmt):
    cases = rp.rounding_cases(fmt)
    assert {c.path for c in cases} == {"generic", "fused", "pieces", "general", "compiled"}
    assert {c.label.split()[0] for c in cases} >= {"MLP", "LSTM", "attention", "tokens",
                                                   "residual", "concat"}
    for case in cases:
        result = rp.check_rounding_points(case)
        assert result.ok, f"{case.label}: {result.describe()}"
        assert len(result.measures) == rp.EPOCHS


def test_the_replay_is_the_exact_step_where_every_value_is_representable():
    """A linear layer, mse, on dyadic values whose products and sums every format holds: no
    rounding point changes anything, so the replay is the hand-derived SGD step."""
    config = {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 2, "out_features": 1, "activation": "linear"}]}
    w = np.array([[0.5], [-0.25]])
    b = np.array([0.125])
    x = np.array([[1.0, 2.0], [-1.0, 0.5]])
    y = np.array([[0.25], [0.0]])
    lr, scale = 0.5, 4.0
    pred = x @ w + b                                  # [[0.125], [-0.5]], exact
    g = 2.0 * (pred - y) / pred.size                  # mse's cotangent, exact
    want = {"0.weight": w - lr * (x.T @ g), "0.bias": b - lr * g.sum(axis=0)}
    for fmt in ("bfloat16", "float16"):
        got, _ = rp.replay_step(config, {"0.weight": w, "0.bias": b}, x, y, "mse", fmt, scale,
                                lr)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_the_replay_rounds_a_value_the_format_cannot_hold():
    config = {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": 1, "out_features": 1, "activation": "linear"}]}
    w, b = np.array([[1.0 + 2.0 ** -12]]), np.array([0.0])     # in float32, in neither format
    x, y = np.array([[1.0]]), np.array([[0.0]])
    for fmt in ("bfloat16", "float16"):
        _, grads = rp.replay_step(config, {"0.weight": w, "0.bias": b}, x, y, "mse", fmt, 1.0,
                                  0.1)
        assert grads["0.weight"][0, 0] == 2.0     # the forward read w rounded to 1


@pytest.mark.parametrize("key", ["mixed-output-not-rounded", "mixed-cotangent-not-rounded",
                                 "mixed-masters-not-rounded"])
def test_a_skipped_rounding_fails_the_row_and_passes_the_trajectory_row(key, tmp_path,
                                                                         monkeypatch):
    """Each per-batch mutant, planted in a copy of the module, fails this row in both formats
    while the exact-trajectory row (its bound the format's roundoff) still passes it: what
    the row adds."""
    import fastlib.training.mixed_precision as module

    planted = _planted(module, _mutant(key), tmp_path, monkeypatch)
    monkeypatch.setattr(module, "_train_one_batch", planted._train_one_batch)
    for fmt in ("bfloat16", "float16"):
        cases = rp.rounding_cases(fmt, paths=("generic",), sequences=False)
        assert not all(rp.check_rounding_points(c).ok for c in cases), (key, fmt)
    trajectory = cases[0].with_(epochs=2, batch_size=6, shuffle=True)
    assert tr.check_epochs(trajectory).ok
