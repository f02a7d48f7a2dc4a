"""`verigrad bench ops`: the suite runs end to end on tiny sizes and prints every row.

No timing assertions (timings on a shared machine are noise at these sizes); these tests check
that every op row and every layer row is measured and rendered, that the JSON holds them, and
that the NumPy layer baselines really compute what the layers compute (the bench refuses to
compare otherwise).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import fastlib
from reports.bench import ops as bench_ops
from reports.cli import main

LAYER_ROWS = 7   # Dense fwd+bwd; LSTM, MHA, causal MHA forward and backward


def _layer_labels():
    _, _, _, _, (db, din, dout), (batch, seq, width), heads = bench_ops.SIZES["small"]
    dense = f"Dense {din}->{dout} relu, batch {db}"
    lstm = f"LSTM {width}->{width}, batch {batch} seq {seq}"
    mha = f"MHA d{width} h{heads}, batch {batch} seq {seq}"
    mha_causal = f"MHA d{width} h{heads} causal, batch {batch} seq {seq}"
    return [(dense, "fwd+bwd")] + [(label, d) for label in (lstm, mha, mha_causal)
                                   for d in ("forward", "backward")]


def test_small_run_prints_every_op_and_layer_row(capsys, tmp_path):
    path = tmp_path / "ops.json"
    code = main(["bench", "ops", "--small", "--repeats", "1", "--no-startup", "--json",
                 str(path)])
    out = capsys.readouterr().out
    assert code == 0
    table, _ = bench_ops.cases(np.random.default_rng(0), "small")
    expected = [(row[0], d) for row in table for d in ("forward", "vjp")] + _layer_labels()
    lines = out.splitlines()
    for label, direction in expected:
        assert any(line.startswith(f"{label:39s} {direction:8s}") for line in lines), \
            (label, direction)
    # every op of the table is benchmarked
    assert {row[1] for row in table} == set(fastlib.OPS)
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert len(rows) == 2 * len(table) + LAYER_ROWS
    assert [(r["case"], r["direction"]) for r in rows] == expected
    for r in rows:
        assert r["kernel_ms"] > 0 and r["numpy_ms"] > 0 and r["ratio"] > 0
        assert r["requirement"] == (1.5 if r["case"].startswith("Dense") else 1.0)
    assert data["meta"]["size"] == "small"
    assert f"{len(rows)} rows;" in out


def test_ops_selects_ops_and_layers(capsys):
    code = main(["bench", "ops", "--small", "--repeats", "1", "--no-startup", "--ops",
                 "transpose", "lstm"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("BLAS: ") and "\ncores this process may use: " in out
    table = out[out.index("\ncase "):out.rindex("\n---")]
    body = [line for line in table.splitlines() if line[:1].isalpha() and " ms" not in line
            and not line.startswith("case")]
    cases = {line.split()[0] for line in body if not line[0].isdigit()}
    assert cases == {"transpose", "LSTM"}


def test_layer_baselines_match_the_layers_in_float64():
    """The NumPy LSTM and attention of the bench compute the layers' math: in float64 they
    agree with fastlib to rounding (the bench's own float32 check is looser)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 6, 5))
    dy = rng.standard_normal((3, 6, 7))
    lstm = fastlib.LSTM(5, 7, return_sequences=True, dtype=np.float64, seed=2)
    p = lstm.parameters()
    p["b"][:] = rng.standard_normal(p["b"].shape)
    y, cache = bench_ops.LSTM_NUMPY.forward(x, p["w_ih"], p["w_hh"], p["b"])
    dx, grads = bench_ops.LSTM_NUMPY.backward(dy, p["w_ih"], p["w_hh"], cache)
    np.testing.assert_allclose(lstm.forward(x), y, rtol=1e-12, atol=1e-13)
    fdx, fgrads = lstm.backward(dy)
    np.testing.assert_allclose(fdx, dx, rtol=1e-11, atol=1e-13)
    for key, value in grads.items():
        np.testing.assert_allclose(fgrads[key], value, rtol=1e-11, atol=1e-13)
    x = rng.standard_normal((2, 5, 8))
    for causal in (False, True):
        mha = fastlib.MultiHeadAttention(8, 2, causal=causal, dtype=np.float64, seed=3)
        mp = mha.parameters()
        for key in mp:
            if key.startswith("b_"):
                mp[key][:] = rng.standard_normal(8)
        y, cache = bench_ops.MHA_NUMPY.forward(x, mp, 2, causal)
        dx, grads = bench_ops.MHA_NUMPY.backward(x, mp, 2, cache)
        np.testing.assert_allclose(mha.forward(x), y, rtol=1e-12, atol=1e-13)
        fdx, fgrads = mha.backward(x)
        np.testing.assert_allclose(fdx, dx, rtol=1e-11, atol=1e-12)
        for key, value in grads.items():
            np.testing.assert_allclose(fgrads[key], value, rtol=1e-10, atol=1e-12)


def test_a_baseline_that_computes_something_else_is_refused(monkeypatch):
    original = bench_ops.LSTM_NUMPY.forward

    def off_by_a_little(*args):
        y, cache = original(*args)
        return y * 1.01, cache

    monkeypatch.setattr(bench_ops.LSTM_NUMPY, "forward", staticmethod(off_by_a_little))
    with pytest.raises(AssertionError, match="LSTM .* forward: the NumPy baseline and the "
                                             "layer differ in y"):
        bench_ops.layer_cases(np.random.default_rng(0), "small")


def test_render_flags_missed_requirements_and_prints_the_start_up():
    def row(case, ratio, requirement, api=True):
        return {"case": case, "op": "x", "direction": "forward", "shapes": "", "dtype": "float32",
                "kernel_ms": ratio, "api_ms": ratio if api else None, "numpy_ms": 1.0,
                "ratio": ratio, "api_ratio": ratio if api else None, "requirement": requirement}

    startup = {label: {"import_s": 0.1, "dense_step_s": 2.0, "op_step_s": 0.5}
               for label in ("cold", "warm")}
    text = bench_ops.render([row("fast", 0.5, 1.0), row("slow", 1.2, 1.0),
                             row("dense", 1.4, 1.5, api=False)], startup)
    lines = text.splitlines()
    assert lines[2].startswith("fast") and not lines[2].endswith("FAILS")
    assert lines[3].endswith("FAILS")
    assert not lines[4].endswith("FAILS") and "<=1.5" in lines[4] and " - " in lines[4]
    assert "3 rows; 1 miss their requirement" in text
    assert "cold start: import fastlib 0.100 s, first Dense layer step" in text
    assert "warm start:" in text
