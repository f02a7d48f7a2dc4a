"""The 16-bit train rows: mixed-precision runs against exact trajectories, float16's loss scale
replayed by the referee, and the mixed-precision mutants they must catch.

Oracles: reflib's tape at 30 digits with the spec's optimizer updates (the exact trajectory),
the referee's own replay of the scale (``mixed_training.ScaleReplay``) decided from a float64
backward; the planted bugs are the mutants' own source edits.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports.conformance import mixed_training as mt
from reports.conformance import training_cases as tc
from reports.conformance import training_rows as tr

LOSS_SCALE_CASES = tc.loss_scale_cases()


@pytest.mark.parametrize("case", LOSS_SCALE_CASES, ids=lambda c: c.label)
def test_the_loss_scale_cases_skip_back_off_and_grow(case):
    import fastlib

    params0 = {k: v.copy() for k, v in fastlib.layers.from_config(
        case.config, dtype=np.float32, seed=case.seed).parameters().items()}
    ref = tr.reference_run(case, params0, exact=False)
    skipped = [s["skipped"] for s in ref.steps]
    # 2**3.5 above the threshold: four halvings to 2**-0.5; then every third step grows to
    # 2**0.5 (after two clean steps) and overflows
    assert skipped == [True] * 4 + [False, False, True] + [False, False, True]
    result = tr.check_epochs(case)
    assert result.ok, result.describe()


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(["bfloat16", "float16"]).flatmap(tc.mixed_cases))
def test_drawn_mixed_runs_pass(case):
    result = tr.check_epochs(case)
    assert result.ok, result.describe()


def test_a_step_near_the_threshold_is_refused_not_guessed():
    case = LOSS_SCALE_CASES[0]
    replay = mt.ScaleReplay(case.loss_scale)
    import fastlib

    params = {k: np.asarray(v, np.float64) for k, v in fastlib.layers.from_config(
        case.config, dtype=np.float32, seed=case.seed).parameters().items()}
    peak = mt.scaled_peak(case.config, params, np.asarray(case.x), case.y, case.loss)
    replay.scale = replay.threshold / peak * 1.05
    with pytest.raises(mt.Undecided, match="within"):
        replay.skips_step(case.config, params, np.asarray(case.x), case.y, case.loss, 1)


def test_the_reproduction_carries_the_precision():
    text = tr.reproduction(LOSS_SCALE_CASES[0])
    assert "mixed='float16'" in text and "'growth_interval': 2" in text


def _planted(module, mutant, tmp_path, monkeypatch):
    """A copy of ``module`` with the mutant's source edit, imported under its own name."""
    import importlib

    source = open(module.__file__).read()
    assert source.count(mutant.old) == 1
    name = module.__name__.rsplit(".", 1)[-1] + "_mutant"
    mutated = tmp_path / f"{name}.py"
    mutated.write_text(source.replace(mutant.old, mutant.new))
    spec = importlib.util.spec_from_file_location(name, mutated)
    planted = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, planted)    # its dataclasses look it up
    spec.loader.exec_module(planted)
    return planted


def _mutant(key):
    from reports.conformance.mutants import all_mutants

    return next(m for m in all_mutants() if m.key == key)


@pytest.mark.parametrize("key", ["loss-scale-not-undone", "skipped-step-not-skipped"])
def test_the_mixed_precision_mutants_fail_the_loss_scale_row(key, tmp_path, monkeypatch):
    """Each mutant's source edit, applied to a copy of the module, fails the SGD case."""
    import fastlib.training.mixed_precision as module

    planted = _planted(module, _mutant(key), tmp_path, monkeypatch)
    monkeypatch.setattr(module, "_train_one_batch", planted._train_one_batch)
    case = next(c for c in LOSS_SCALE_CASES if c.path == "generic")
    assert not tr.check_epochs(case).ok


@pytest.mark.slow       # compiles the mutated column epoch (about a minute each)
@pytest.mark.parametrize("key", ["compiled-loss-scale-not-undone",
                                 "compiled-skipped-step-not-skipped"])
def test_the_compiled_mixed_mutants_fail_the_loss_scale_row(key, tmp_path, monkeypatch):
    """The compiled MLP epoch's mutants, planted in a copy of its kernel module, fail the
    compiled SGD case."""
    import fastlib.kernels.dense_columns as module
    import fastlib.training.mlp_schedule as schedule

    planted = _planted(module, _mutant(key), tmp_path, monkeypatch)
    monkeypatch.setattr(schedule, "kc", planted)
    case = next(c for c in LOSS_SCALE_CASES if c.path == "fused")
    assert not tr.check_epochs(case).ok
