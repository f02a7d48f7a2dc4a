"""The float64 accuracy bar for logsumexp's VJP (double-double in fastlib.kernels.reduce).

g * exp(x - lse) with lse rounded to float64 carries u |lse| into every entry (7 ULPs at
lse ~ 16 on the report's sample); fastlib forms g e_i / S with e = exp(x - max), S = sum e, in
double-double (``fastlib.kernels.vecmath``) and rounds once: within 0.5 + 0.01 ULP (dd errors of
a few u^2, dd_exp's 1e-20 relative; nothing cancels). Asserted <= 1 ULP. Oracle: spec.evaluate
at 50 digits through reports.accuracy.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from reports import accuracy as A


def _errors(table):
    values = np.full(table.size, np.nan)
    for ci, case in enumerate(table.cases):
        table.flatten(ci, fastlib.vjp("logsumexp", case.inputs, case.grad, **case.params),
                      values)
    return A.element_errors(values, table, "float64")


@pytest.mark.parametrize("shift", [0.0, 16.0, 1e3, -2.5e4])
def test_float64_logsumexp_vjp_within_one_ulp_at_any_shift(shift):
    rng = np.random.default_rng(12)
    cases = []
    for axis, shape in ((None, (2, 3)), (1, (3, 5)), (0, (4, 3)), ((0, 2), (2, 3, 4))):
        x = shift + rng.uniform(-8, 8, shape).astype(np.float32).astype(np.float64)
        out = fastlib.forward("logsumexp", [x], axis=axis)
        g = rng.uniform(-1, 1, np.shape(out)).astype(np.float32).astype(np.float64)
        cases.append(A.Case("special", [x], {"axis": axis}, np.asarray(g)))
    err = _errors(A.exact_table("logsumexp", cases))
    assert np.max(err["ulp"][err["included"]]) <= 1.0


def test_float64_logsumexp_bar_on_the_reports_sources():
    cases = A.draw_cases("logsumexp", 30, A.op_rng(1, "logsumexp")) \
        + A.special_cases("logsumexp")
    table = A.exact_table("logsumexp", cases)
    err = _errors(table)
    well = err["included"] & (table.kappa <= A.KAPPA_WELL)
    assert np.max(err["ulp"][well]) <= 1.0
    assert not np.any(err["nonfinite"])
