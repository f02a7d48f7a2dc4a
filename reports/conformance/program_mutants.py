"""Plausible bugs in the Paddle-style backward-program builder (``reflib.program.backward``),
planted by monkeypatching: the ``program`` rows (``program_check``) must fail under each.

Each is a ``TrainingMutant`` (a name, a description and an ``apply()`` context manager), so the
mutant machinery runs them as ``HookMutant`` s (``mutants.HOOK_MODULES``).

The long story: docs/reports-conformance.md, section ``reports/conformance/program_check.py``.
"""
from __future__ import annotations

import importlib

from reports.conformance.training_mutants import TrainingMutant, _patched

__all__ = ["MUTANTS"]


def missing_rename():
    """The partial gradients of a shared variable are not renamed: every producer writes
    ``x@GRAD`` itself, the last one overwrites the others, and the inserted ``sum`` adds that
    last partial to itself once per producer."""
    b = importlib.import_module("reflib.program.backward")

    def wrap(rename):
        def no_rename(self, grad_name):
            rename(self, grad_name)   # keep the counter moving as before
            return grad_name
        return no_rename
    return _patched(b._Builder, "_rename", wrap)


def dropped_sum():
    """The ``sum`` of a shared variable's renamed partials keeps only the first partial (the
    other producers' contributions are dropped)."""
    b = importlib.import_module("reflib.program.backward")

    def wrap(sum_op):
        def first_only(parts, out):
            return sum_op(list(parts)[:1], out)
        return first_only
    return _patched(b, "_sum_op", wrap)


def nop_misapplied():
    """Paddle's NOP rules read "any" for "all": an op becomes a NOP as soon as one of its
    input gradients (or output gradients) is not computed."""
    b = importlib.import_module("reflib.program.backward")

    def wrap(_all_no_grad):
        def any_no_grad(self, grads):
            return any(g in self.no_grad for g in grads)
        return any_no_grad
    return _patched(b._Builder, "_all_no_grad", wrap)


MUTANTS = {m.name: m for m in (
    TrainingMutant("program-missing-rename", "a shared variable's partial gradients not "
                   "renamed (the last producer overwrites the others)", missing_rename),
    TrainingMutant("program-dropped-sum", "the sum of a shared variable's partial gradients "
                   "keeps only the first", dropped_sum),
    TrainingMutant("program-nop-misapplied", "an op NOP'd when any (not all) of its gradients "
                   "is not computed", nop_misapplied),
)}
