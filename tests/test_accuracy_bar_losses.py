"""The accuracy bar for the losses: categorical_cross_entropy's float64 VJP (double-double), and
the binary cross-entropies after their speed-up (one division per element, a division-free
float32 log1p on [0, 1], p in {0, 1} fixed up after the main loop).

Oracles: ``spec.evaluate`` at 50 digits through ``reports.accuracy`` (the report's exact
tables and its componentwise condition numbers kappa), float64 ``log1p`` for the float32
primitive, hand-derived one-sided limits at p = 0 and 1. Never fastlib's own output.
"""
from __future__ import annotations

import numba
import numpy as np
import pytest

import fastlib
from fastlib.kernels import loss as L
from reports import accuracy as A


def _engine_errors(name, table, dtype):
    values = np.full(table.size, np.nan)
    for ci, case in enumerate(table.cases):
        inputs = [a.astype(dtype) if a.dtype.kind == "f" else a for a in case.inputs]
        grads = fastlib.vjp(name, inputs, case.grad.astype(dtype), **case.params)
        table.flatten(ci, grads, values)
    return A.element_errors(values, table, dtype)


def test_float64_categorical_cross_entropy_vjp_within_one_ulp():
    # The report's worst well-conditioned element (seed 0: 236 ULPs): softmax * sum(t) - t
    # cancels where p is near t; fastlib forms (e_j sum(t) - t_j S) / S in double-double and
    # rounds once (``_categorical_cross_entropy_grad64``). dd errors are a few u^2 and dd_exp's
    # 1e-20 relative, amplified at most ~kappa <= 8: the result is within 0.5 + 0.01 ULP;
    # asserted <= 1 ULP on every element of the case, and on the report's random sources.
    z = np.array([[0.03464177995920181, 0.0007461710483767092, -0.000541492598131299],
                  [6.393023490905762, 4.502870797296055e-05, 0.005443286150693893]])
    t = np.array([[0.0, 1.0, 0.0], [0.23046875, 0.2900390625, 0.4794921875]])
    case = A.Case("special", [z, t], {}, np.array(-0.5479193925857544))
    table = A.exact_table("categorical_cross_entropy", [case])
    err = _engine_errors("categorical_cross_entropy", table, "float64")
    assert np.max(table.kappa[:6]) <= A.KAPPA_WELL          # the logits' VJP: well conditioned
    assert np.max(err["ulp"]) <= 1.0, err["ulp"]

    name = "categorical_cross_entropy"
    cases = A.draw_cases(name, 30, A.op_rng(1, name)) + A.special_cases(name)
    table = A.exact_table(name, cases)
    err = _engine_errors(name, table, "float64")
    well = err["included"] & (table.kappa <= A.KAPPA_WELL)
    assert well.sum() > 200
    assert np.max(err["ulp"][well]) <= 1.0, np.max(err["ulp"][well])
    assert not np.any(err["nonfinite"])


def test_float32_log1p_on_the_unit_interval_within_2_ulp():
    # The binary cross-entropy's log1p(exp(-|z|)): a degree-9 Chebyshev interpolant of
    # log1p(e) / e (5.4e-9 relative, 0.1 ulp) evaluated by float32 Horner (ten roundings damped
    # by the small higher coefficients): the vecmath primitives' contract, 2 ulp, holds; dense
    # grid plus log-spaced small values down to the subnormals.
    @numba.njit
    def run(e, out):
        for i in range(e.size):
            out[i] = L._log1p_unit(e[i])

    e = np.concatenate([np.linspace(0, 1, 200001), np.logspace(-45, 0, 20001)]).astype(np.float32)
    out = np.empty_like(e)
    run(e, out)
    ref = np.log1p(e.astype(np.float64))
    ulps = np.abs(out - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert np.max(ulps) <= 2.0, np.max(ulps)
    assert out[0] == 0.0 and np.all(out[e > 0] > 0)


@pytest.mark.parametrize("name", ["binary_cross_entropy", "binary_cross_entropy_with_logits"])
def test_binary_cross_entropies_keep_their_accuracy(name):
    # float32: the terms and gradients are float64 arithmetic on float32 logs / exps (within 2
    # ulp), rounded once: median 0.29 / 0.28 ULP on this sample, PyTorch float32's 0.42 / 0.33 on
    # the report's; asserted <= 0.35. float64: libm exp / log, float64 arithmetic, one more
    # rounding: within 4 ULPs (the bar) where kappa <= 8.
    cases = A.draw_cases(name, 30, A.op_rng(1, name)) + A.special_cases(name)
    table = A.exact_table(name, cases)
    err32 = _engine_errors(name, table, "float32")
    assert np.median(err32["ulp"][err32["included"]]) <= 0.35
    err64 = _engine_errors(name, table, "float64")
    well = err64["included"] & (table.kappa <= A.KAPPA_WELL)
    assert np.max(err64["ulp"][well]) <= 4.0, np.max(err64["ulp"][well])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_cross_entropy_edges_fixed_after_the_main_loop(dtype):
    # p = 0 or 1 make the main loop's (p - t) / (p (1 - p)) 0/0 or +-inf; the fix-up writes the
    # one-sided limits d/dp = -t/p + (1 - t)/(1 - p) without the zero-coefficient term: at p = 0,
    # (1 - t) (and -inf when t > 0); at p = 1, -t (and +inf when t < 1). Positions spread over
    # a 37-long array, so the vectorised body and the remainder loop both meet them.
    n = 37
    rng = np.random.default_rng(4)
    p = rng.uniform(0.05, 0.95, n)
    t = rng.uniform(0, 1, n).round(2)
    spots = {0: (0.0, 0.0), 5: (1.0, 1.0), 17: (0.0, 0.25), 33: (1.0, 0.5), 36: (0.0, 1.0)}
    for i, (pi, ti) in spots.items():
        p[i], t[i] = pi, ti
    p, t = p.astype(dtype), t.astype(dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        gp, gt = fastlib.vjp("binary_cross_entropy", [p, t], np.array(1.0, dtype))
    scale = 1.0 / n
    expect = {0: 1.0, 5: -1.0, 17: -np.inf, 33: np.inf, 36: -np.inf}
    for i, lim in expect.items():
        want = dtype(lim * scale) if np.isfinite(lim) else lim
        assert gp[i] == want, (i, gp[i], want)
    inner = [i for i in range(n) if i not in spots]
    pv, tv = p[inner].astype(np.float64), t[inner].astype(np.float64)
    want = (pv - tv) / (pv * (1 - pv)) * scale
    np.testing.assert_allclose(gp[inner], want, rtol=4 * np.finfo(dtype).eps)
    assert np.all(np.isfinite(gt[inner]))
