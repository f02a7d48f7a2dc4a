"""The step cost model of docs/performance.md: its FLOP and parameter counts against counts
made by hand (and against the fastlib models' own parameters), and the shape of its
predictions (never slower with more pieces; a batch of B rows uses at most B pieces)."""
from __future__ import annotations

import numpy as np
import pytest

from reports.bench import costmodel
from reports.bench.models import load


def test_the_mlps_flops_are_the_hand_count():
    # x@W1, h@W2 forward; x^T@dh, h^T@dz weight gradients; dz@W2^T; 2 FLOPs per multiply-add
    by_hand = 2 * (784 * 128 + 128 * 10) * 2 + 2 * 10 * 128
    assert costmodel.flops_per_sample("mlp") == by_hand == 409_088


def test_the_lstms_flops_are_the_hand_count():
    # per sequence of 64 steps: x@W_ih and W_ih's gradient (2 x 2*32*512*64); h@W_hh,
    # dh@W_hh^T and W_hh's gradient (3 x 2*128*512*64); the Dense on the last state (3 GEMMs)
    by_hand = 2 * (2 * 32 * 512 * 64) + 3 * (2 * 128 * 512 * 64) + 3 * (2 * 128 * 10)
    assert costmodel.flops_per_sample("lstm") == by_hand


def test_the_attention_blocks_flops_are_the_hand_count():
    # forward: QKV 2*64*64*192, output 2*64*64*64, scores and weighted sums 2 * 2*64*64*16*4,
    # SwiGLU gate/up 2*64*64*256 and down 2*64*128*64; backward twice that, less the data's
    # input gradient through the QKV projection
    fwd = (2 * 64 * 64 * 192 + 2 * 64 * 64 * 64 + 2 * (2 * 64 * 64 * 16 * 4)
           + 2 * 64 * 64 * 256 + 2 * 64 * 128 * 64)
    assert costmodel.flops_per_sample("attention") == 3 * fwd - 2 * 64 * 64 * 192


@pytest.mark.parametrize("name", list(costmodel.MODELS))
def test_parameter_counts_are_the_fastlib_models(name):
    model = load(name).build(0)
    assert costmodel.MODELS[name]().parameters == sum(
        int(np.size(v)) for v in model.parameters().values())


@pytest.mark.parametrize("name, batch", [("mlp", 64), ("lstm", 32), ("attention", 32),
                                         ("transformer", 128)])
def test_predictions_never_slow_down_with_more_pieces_and_idle_pieces_cost_nothing(name, batch):
    pred = costmodel.prediction(name, batch, threads=(1, 2, 4, 8, 16, 32))
    times = [pred[t][0] for t in sorted(pred)]
    assert all(b <= a for a, b in zip(times, times[1:]))
    assert pred[1][1] == 1.0
    assert costmodel.step_seconds(name, 4, 16) == costmodel.step_seconds(name, 4, 4)


def test_the_documented_prediction_table_is_the_models_output():
    """docs/performance.md's prediction table is what ``costmodel.prediction`` computes, cell by
    cell, so the page cannot drift from the model (edit the constants, then the table)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "performance.md").read_text(
        encoding="utf-8")
    rows = re.findall(r"^\| (mlp|lstm|attention|transformer) \| (\d+) \|(.*)\|$", text, re.M)
    assert len(rows) == 8, rows
    for name, batch, cells in rows:
        predicted = costmodel.prediction(name, int(batch))
        written = [c.strip() for c in cells.split("|")]
        expected = [f"{s:.3f} s ({x:.1f}x)" for s, x in
                    (predicted[t] for t in (1, 2, 4, 8, 16))]
        assert written == expected, (name, batch, written, expected)
