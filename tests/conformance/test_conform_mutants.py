"""The mutant run: every mutant applies to the current fastlib source, the harness patches a
copy (never the checkout) and refuses stale targets, and the suite catches the mutants.

The fast tests apply two source mutants (pure-Python ones, so no kernel recompiles) and plant
one training mutant, and check that the dev profile catches all three; the full run of every
mutant of both kinds is marked slow (``pytest -m slow tests/conformance/test_conform_mutants.py``:
about eleven minutes for 50; a mutant the suite misses runs the whole dev profile, so survivors
make it longer).
"""
from __future__ import annotations

import shutil
import sys
import types

import pytest

from reports.conformance import mutant_runner, mutants
from reports.conformance.mutants import (MUTANTS, HookMutant, Mutant, all_mutants, hook_mutants,
                                        run_all)
from reports.conformance import training_mutants
from reports.conformance.mutant_runner import MutantError, apply_mutant, check_targets

BY_KEY = {m.key: m for m in MUTANTS}


def test_every_mutant_applies_to_the_current_fastlib():
    # both kinds, one list: every key unique, every target present, every hook loadable
    assert check_targets(all_mutants()) == []
    assert len({m.key for m in all_mutants()}) == len(all_mutants())
    assert len(MUTANTS) >= 20
    # the classic accuracy bugs, each present
    for key in ("tanh-sign", "silu-term", "concat-off-by-one", "softmax-axis",
                "broadcast-not-summed", "f32-accumulation", "adam-bias-correction",
                "rmsprop-eps-outside", "relu-kink", "dense-transposed-weight-grad",
                "dense-stale-cache"):
        assert key in BY_KEY
    # the accuracy kind: right in norm, wrong in one small entry or in the wrong type
    for key in ("sigmoid-cancel", "softplus-no-log1p", "tanh-flush-tiny", "large-vjp-entry",
                "f32-leak-elementwise", "f32-leak-fused", "softmax-lse-f32",
                "maximum-tie-doubled"):
        assert key in BY_KEY


def test_mutants_of_other_modules_join_through_mutant_modules(monkeypatch):
    """A module named in MUTANT_MODULES contributes its MUTANTS to every run; a key used twice
    across modules is refused."""
    extra = types.ModuleType("fake_training_mutants")
    extra.MUTANTS = (Mutant("fake-train", "a planted training bug", "tape.py",
                            BY_KEY["tape-overwrite"].old, "else np.asarray(0.0, self.dtype))"),)
    monkeypatch.setitem(sys.modules, "fake_training_mutants", extra)
    monkeypatch.setattr(mutants, "MUTANT_MODULES", ("fake_training_mutants",))
    assert all_mutants() == MUTANTS + extra.MUTANTS + hook_mutants()
    assert check_targets(all_mutants()) == []
    extra.MUTANTS += (Mutant("relu-kink", "a clash", "tape.py", "return", "yield"),)
    assert "mutant key 'relu-kink' is used twice" in check_targets(all_mutants())


def test_training_mutants_join_as_hook_mutants():
    """Every training mutant is in the one list, after the source mutants, with its rows first;
    a key it shares with a source mutant, or a name its module lacks, is refused."""
    from reports.conformance import lowp_mutants, program_mutants

    hooks = [m for m in all_mutants() if isinstance(m, HookMutant)]
    assert [m.key for m in hooks] == list(training_mutants.MUTANTS) + list(
        program_mutants.MUTANTS) + list(lowp_mutants.MUTANTS)
    assert all(m.first == ("sum", "mean", "softmax") for m in hooks
               if m.key in lowp_mutants.MUTANTS)
    assert all(m.first == ("train",) for m in hooks if m.key in training_mutants.MUTANTS)
    assert all(m.first == ("program",) for m in hooks if m.key in program_mutants.MUTANTS)
    assert all_mutants()[:len(MUTANTS)] == MUTANTS
    clash = HookMutant("relu-kink", "a clash", "reports.conformance.training_mutants")
    assert "mutant key 'relu-kink' is used twice" in check_targets(MUTANTS + (clash,))
    missing = HookMutant("no-such-bug", "absent", "reports.conformance.training_mutants")
    assert check_targets((missing,)) == [
        "mutant no-such-bug: reports.conformance.training_mutants.MUTANTS has no such mutant "
        "with apply()"]
    with pytest.raises(MutantError, match="no such mutant"):
        mutant_runner.run_mutant(missing, "dev", 0)


def test_stale_or_ambiguous_targets_are_refused(tmp_path):
    package = tmp_path / "fastlib"
    shutil.copytree(mutant_runner.fastlib_source(), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    missing = Mutant("gone", "text that is not there", "tape.py", "no such text", "x")
    with pytest.raises(MutantError, match="occurs 0 times"):
        apply_mutant(missing, package)
    twice = Mutant("twice", "text that occurs twice", "tape.py", "return", "yield")
    with pytest.raises(MutantError, match="exactly once"):
        apply_mutant(twice, package)
    assert check_targets([missing], package) == [
        "mutant gone: target text occurs 0 times in fastlib/tape.py"]
    patched = apply_mutant(BY_KEY["tape-overwrite"], package)
    assert "np.asarray(contribution, self.dtype))" in patched.read_text()
    # the checkout itself is untouched
    assert check_targets([BY_KEY["tape-overwrite"]]) == []


def test_numba_cache_of_dependents_is_dropped(tmp_path):
    package = tmp_path / "fastlib"
    shutil.copytree(mutant_runner.fastlib_source(), package)
    kernels = package / "kernels"
    patched = apply_mutant(BY_KEY["relu-kink"], package)       # kernels/scalar.py
    mutant_runner._drop_numba_cache(package, patched)
    cache = kernels / "__pycache__"
    for stem in ("scalar", "elementwise", "dense"):              # scalar and its importers
        assert not list(cache.glob(f"{stem}.*.nb[ic]")), stem


def test_two_mutants_are_caught_by_the_dev_profile():
    for key in ("tape-overwrite", "adam-bias-correction"):
        result = mutant_runner.run_mutant(BY_KEY[key], "dev", 0)
        assert result.caught, result
        assert result.failed_row.split()[0] in ("tape", "optimizer"), result


def test_a_training_mutant_is_planted_in_the_subprocess_and_caught():
    """The hook kind: apply() runs in the suite's process (the gradient entry 1e-10 off must
    fail a train row); this process's fastlib keeps the correct Dense.backward."""
    from fastlib.layers import dense

    backward = dense.Dense.backward
    hook = {m.key: m for m in hook_mutants()}["gradient-1e-10"]
    result = mutant_runner.run_mutant(hook, "dev", 0)
    assert result.caught, result
    assert result.failed_row.startswith("train "), result
    assert "1e-10 relative" in result.detail, result
    assert dense.Dense.backward is backward


@pytest.mark.slow
def test_every_mutant_is_caught_by_the_dev_profile():
    control, results = run_all(None, "dev", 0)         # every mutant, registered ones too
    assert not control.caught, control
    survivors = [r for r in results if not r.caught]
    assert not survivors, survivors
