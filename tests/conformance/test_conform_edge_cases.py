"""The edge cases of each special row: their shapes follow fastlib's constants, and each catches
the bug it is there for (planted in a wrapper engine) while fastlib passes."""
from __future__ import annotations

import numpy as np
import pytest

from reports.conformance import engines, properties
from reports.conformance.edge_cases import DOMINANT, SQUARE, edge_cases
from reports.conformance.engines import FastlibEngine


class _AxisEmptyAsNone(FastlibEngine):
    """sum over ``axis=()`` read as ``axis=None`` (every axis reduced)."""

    name = "planted-axis-empty-as-none"

    def _forward(self, name, inputs, **params):
        if params.get("axis", None) == ():
            params = {**params, "axis": None}
        return FastlibEngine._forward(self, name, inputs, **params)


class _ShiftBySecondLargest(FastlibEngine):
    """softmax shifted by a value below the row maximum (a maximum loop that skipped the lane
    holding it): the NumPy softmax of ``x - m'`` with ``m'`` the row's second-largest entry."""

    name = "planted-shift-below-max"

    def _forward(self, name, inputs, **params):
        if name != "softmax":
            return FastlibEngine._forward(self, name, inputs, **params)
        x = np.asarray(inputs[0])
        shift = np.sort(x, axis=-1)[..., -2:-1]
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(x - shift)
            return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


def _failing(engine, name, dtype, label):
    return [not properties.check_call(engine, ex, "strict").ok
            for ex in edge_cases(name, dtype) if ex.label == label]


def test_cases_follow_fastlibs_constants():
    from fastlib.config import PARALLEL_MIN_CHUNK

    (row,) = [ex for ex in edge_cases("sum", np.float64) if ex.label == "long row in pieces"]
    length = row.inputs[0].shape[1]
    assert length > 2 * PARALLEL_MIN_CHUNK          # at least two pieces and a remainder
    (block,) = [ex for ex in edge_cases("softmax", np.float32)
                if ex.label == "dominant at every position"]
    z = block.inputs[0].astype(np.float64)
    assert z.shape == (SQUARE, SQUARE)
    # the dominant entry of row i sits at column i: every column holds one
    assert np.array_equal(np.argmax(z, axis=1), np.arange(SQUARE))
    assert np.all(z.max(axis=1) - np.sort(z, axis=1)[:, -2] > DOMINANT - 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fastlib_passes_the_edge_cases(dtype):
    fast = engines.get_engine("fastlib")
    for name in ("sum", "mean", "softmax"):
        for ex in edge_cases(name, dtype):
            result = properties.check_call(fast, ex, "strict")
            assert result.ok, (name, ex.label, result.describe())


def test_axis_empty_read_as_none_fails():
    assert all(_failing(_AxisEmptyAsNone(), "sum", np.float32, "axis=()"))


def test_shift_below_the_maximum_fails():
    assert _failing(_ShiftBySecondLargest(), "softmax", np.float32,
                    "dominant at every position") == [True]
