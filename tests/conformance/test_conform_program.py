"""The ``program`` rows: random networks' Paddle-style backward programs held to the exact tape,
and the planted program-builder bugs (``program_mutants``) failing them while the clean builder
passes."""
from __future__ import annotations

import numpy as np
import pytest

from reports.conformance import program_check as pc
from reports.conformance.program_mutants import MUTANTS
from reports.conformance.rows import PROFILES


def test_the_clean_builder_passes_the_fixed_networks():
    for case in pc.fixed_networks():
        result = pc.check_network(case)
        assert result.ok, result.describe()
        assert len(result.measures) >= 4   # exact and float64 measures of several gradients


def test_the_program_row_passes_and_draws_networks():
    (row,) = pc.program_rows("reflib")
    out = row.run(PROFILES["dev"], 0)
    assert out.status == "pass", out.detail
    assert out.examples >= len(pc.fixed_networks()) + 1


def test_the_tape_referee_is_exact_against_a_hand_derivative():
    """loss = sum(tanh(x W) * tanh(x W)) with W shared: d loss / dW = x^T (2 t (1 - t^2))."""
    from reflib.program import NetOp

    rng = np.random.default_rng(1)
    x, w = rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (3, 3))
    prog = NetOp([pc._op("matmul", ["x0", "W"], "v0"), pc._op("tanh", ["v0"], "v1"),
                  pc._op("mul", ["v1", "v1"], "v2"), pc._op("sum", ["v2"], "loss")])
    truth, _ = pc.tape_gradients(prog, {"x0": x, "W": w}, frozenset(), 1.0)
    t = np.tanh(x @ w)
    np.testing.assert_allclose(pc._f(truth["W"]), x.T @ (2 * t * (1 - t * t)), rtol=1e-13)


@pytest.mark.parametrize("key", sorted(MUTANTS))
def test_each_planted_program_bug_fails_a_fixed_network(key):
    with MUTANTS[key].apply():
        results = [pc.check_network(case) for case in pc.fixed_networks()]
    assert any(not r.ok for r in results), f"{key} survived every fixed network"
    # and the builder is whole again once the mutant is gone
    assert all(pc.check_network(case).ok for case in pc.fixed_networks())


def test_the_program_mutants_join_the_mutant_run():
    from reports.conformance.mutants import all_mutants, check_targets

    keys = {m.key for m in all_mutants()}
    assert set(MUTANTS) <= keys
    assert check_targets([m for m in all_mutants() if m.key in MUTANTS]) == []


def test_the_row_names_its_command():
    from reports.conformance.runner import _command

    (row,) = pc.program_rows("fastlib")
    row.engine_ref = "fastlib"
    # the row's own name, shell-quoted: the command reruns exactly this row
    assert "--ops 'program random networks'" in _command(row, PROFILES["dev"], 3)
