"""The TargetProp and contrastive-divergence rows of the suite (``targetprop``, ``cd``).

The long story: docs/reports-conformance.md, section ``reports/conformance/algorithms.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from hypothesis import strategies as st

from reports.conformance.properties import Result

__all__ = ["AlgorithmRow", "rows_for", "as_result", "examples_for", "EXAMPLES"]


@dataclass(frozen=True)
class AlgorithmRow:
    """One row: its kind and name, the strategy, a check returning ``Result``, a reproducer."""

    kind: str
    name: str
    dtype: str
    strategy: object
    check: Callable
    reproduce: Callable


def as_result(prop, *args, **kwargs):
    """Run an assert-style property; its AssertionError becomes a failed ``Result``."""
    result = Result()
    try:
        prop(*args, **kwargs)
    except AssertionError as exc:
        result.fail(str(exc) or "assertion failed")
    return result


def _repro(module, prop, case_expr):
    return (f"from reports.conformance import {module}\nimport numpy as np\n"
            f"# the shrunk case (rebuild it from the printed values):\ncase = {case_expr}\n"
            f"{module}.{prop}(*case)\n")


def _tp_rows(engine):
    from reports.conformance import targetprop as tp

    rows = []
    chain = st.sampled_from([True, False])
    for kind in tp.KINDS:
        if engine == "fastlib":
            rows.append(AlgorithmRow(
                "targetprop", f"targets {kind}", "float64",
                st.tuples(tp.tp_cases(kind), chain),
                lambda c: as_result(tp.prop_targets_fastlib_vs_reflib, *c),
                lambda c: _repro("targetprop", "prop_targets_fastlib_vs_reflib", repr(c))))
            rows.append(AlgorithmRow(
                "targetprop", f"apply {kind}", "float64",
                st.tuples(tp.tp_cases(kind), chain, st.sampled_from([0.01, 0.1])),
                lambda c: as_result(tp.prop_apply_fastlib_vs_reflib, *c),
                lambda c: _repro("targetprop", "prop_apply_fastlib_vs_reflib", repr(c))))
        else:
            rows.append(AlgorithmRow(
                "targetprop", f"targets {kind}", "float64",
                st.tuples(tp.tp_cases(kind, small=True), chain),
                lambda c: as_result(tp.prop_targets_reflib_vs_spec, *c),
                lambda c: _repro("targetprop", "prop_targets_reflib_vs_spec", repr(c))))
    if engine == "fastlib":   # at and around θ and τ (fastlib, reflib and spec together)
        rows.append(AlgorithmRow(
            "targetprop", "route at threshold", "float64", tp.route_threshold_cases(),
            lambda c: as_result(tp.prop_route_at_threshold, c),
            lambda c: _repro("targetprop", "prop_route_at_threshold", f"({c!r},)")))
        for kind in tp.KINDS:    # every kind's routes, row and column normalisation
            rows.append(AlgorithmRow(
                "targetprop", f"route at threshold {kind}", "float64",
                tp.route_threshold_kind_cases(kind),
                lambda c: as_result(tp.prop_route_kind_at_threshold, *c),
                lambda c: _repro("targetprop", "prop_route_kind_at_threshold", repr(c))))
        rows.append(AlgorithmRow(
            "targetprop", "gate at threshold", "float64", tp.gate_threshold_cases(),
            lambda c: as_result(tp.prop_gate_at_threshold, *c),
            lambda c: _repro("targetprop", "prop_gate_at_threshold", repr(c))))
    # Loom's switchable rules (update="loom", normalisation="column"), all layer kinds drawn
    if engine == "fastlib":
        rows.append(AlgorithmRow(
            "targetprop", "Loom's rules", "float64",
            st.tuples(tp.variant_cases(), st.sampled_from([0.01, 0.1])).map(
                lambda t: (*t[0], t[1])),
            lambda c: as_result(tp.prop_variant_fastlib_vs_reflib, *c),
            lambda c: _repro("targetprop", "prop_variant_fastlib_vs_reflib", repr(c))))
    else:
        rows.append(AlgorithmRow(
            "targetprop", "Loom's rules", "float64",
            tp.variant_cases(small=True).map(lambda t: (*t, 0.1)),
            lambda c: as_result(tp.prop_variant_reflib_vs_spec, *c),
            lambda c: _repro("targetprop", "prop_variant_reflib_vs_spec", repr(c))))
    if engine == "reflib":
        rows.append(AlgorithmRow(
            "targetprop", "link budgets", "float64", tp.budget_pairs(),
            lambda c: as_result(tp.prop_link_budget_three_ways, *c),
            lambda c: _repro("targetprop", "prop_link_budget_three_ways", repr(c))))
    return rows


def _cd_rows(engine):
    from reports.conformance import cd

    ks = st.sampled_from([1, 3])
    if engine == "fastlib":
        return [
            AlgorithmRow("cd", "CD-k gradients", "float64", ks.flatmap(cd.rbm_cases),
                         lambda c: as_result(cd.prop_cd_fastlib_vs_reflib, c),
                         lambda c: _repro("cd", "prop_cd_fastlib_vs_reflib", f"({c!r},)")),
            AlgorithmRow("cd", "CD-k gradients", "float32", ks.flatmap(cd.rbm_cases),
                         lambda c: as_result(cd.prop_cd_fastlib_vs_reflib, c, np.float32),
                         lambda c: _repro("cd", "prop_cd_fastlib_vs_reflib",
                                          f"({c!r}, np.float32)")),
            AlgorithmRow("cd", "CD at threshold", "float64",
                         ks.flatmap(cd.threshold_rbm_cases),
                         lambda c: as_result(cd.prop_cd_at_threshold, c),
                         lambda c: _repro("cd", "prop_cd_at_threshold", f"({c!r},)")),
            AlgorithmRow("cd", "CD at threshold", "float32",
                         ks.flatmap(cd.threshold_rbm_cases),
                         lambda c: as_result(cd.prop_cd_at_threshold, c, np.float32),
                         lambda c: _repro("cd", "prop_cd_at_threshold",
                                          f"({c!r}, np.float32)")),
            AlgorithmRow("cd", "CD step + optimizer", "float64",
                         st.tuples(ks.flatmap(cd.rbm_cases),
                                   st.sampled_from(["SGD", "Momentum", "Adam"]),
                                   st.sampled_from([0.01, 0.1])),
                         lambda c: as_result(cd.prop_cd_optimizer_step, *c),
                         lambda c: _repro("cd", "prop_cd_optimizer_step", repr(c))),
        ]
    return [AlgorithmRow("cd", "CD-k gradients", "float64",
                         ks.flatmap(lambda k: cd.rbm_cases(k, max_units=3)),
                         lambda c: as_result(cd.prop_cd_reflib_vs_spec, c),
                         lambda c: _repro("cd", "prop_cd_reflib_vs_spec", f"({c!r},)"))]


# cases per row and profile (at least the profile's own ``algorithms`` count)
EXAMPLES = {"dev": 4, "ci": 6, "thorough": 25}


def examples_for(profile):
    """How many cases each TargetProp / CD row draws under ``profile``."""
    return max(profile.algorithms, EXAMPLES.get(profile.name, 0))


def rows_for(engine):
    """The TargetProp and CD rows of ``engine`` ("fastlib" or "reflib")."""
    if engine not in ("fastlib", "reflib"):
        return []
    return _tp_rows(engine) + _cd_rows(engine)
