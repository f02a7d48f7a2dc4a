"""The kink policy (``reports.conformance.kinks``): conventions inside the Clarke
subdifferential pass under ``subgradient`` and are reported; values outside fail in both modes.

Oracles: the subdifferentials written out by hand (relu: [0, 1] g; abs: [-1, 1] g; maximum at
a tie: θ g and (1 - θ) g), and the registry's conventions through ``spec.evaluate``.
"""
from __future__ import annotations

import numpy as np
import pytest

from reports.conformance import engines, properties
from reports.conformance.strategies import OpExample


class Convention(engines.FastlibEngine):
    """fastlib with a chosen derivative at relu / abs kinks and a chosen tie split."""

    name = "convention"
    slope = 0.0          # relu'(0) or abs'(0)
    share = (1.0, 0.0)   # the tie's cotangent to a and to b

    def _vjp(self, name, inputs, grad, **params):
        out = list(super()._vjp(name, inputs, grad, **params))
        if name in ("relu", "abs"):
            x = inputs[0]
            out[0] = np.where(x == 0, self.slope * grad, out[0]).astype(grad.dtype)
        if name == "maximum":
            a, b = inputs       # same shapes here
            tie = a == b
            out[0] = np.where(tie, self.share[0] * grad, out[0]).astype(grad.dtype)
            out[1] = np.where(tie, self.share[1] * grad, out[1]).astype(grad.dtype)
        return tuple(out)


def _engine(**kw):
    e = Convention()
    for k, v in kw.items():
        setattr(e, k, v)
    return e


RELU = OpExample("relu", (np.array([0.0, 1.5, -2.0, 0.0]),), np.array([0.7, -1.0, 2.0, -0.3]))
ABS = OpExample("abs", (np.array([0.0, -1.5]),), np.array([0.8, 1.0]))
TIE = OpExample("maximum", (np.array([1.0, 2.0, 0.5]), np.array([1.0, 3.0, 0.5])),
                np.array([0.6, -1.0, 2.0]))


@pytest.mark.parametrize("ex, kw, convention", [
    (RELU, {"slope": 0.5}, "relu'(0) = 0.5"),
    (ABS, {"slope": -0.25}, "abs'(0) = -0.25"),
    (TIE, {"share": (0.5, 0.5)}, "maximum ties: d/da = 0.5 g, d/db = 0.5 g"),
])
def test_a_convention_inside_the_subdifferential(ex, kw, convention):
    engine = _engine(**kw)
    strict = properties.check_call(engine, ex, "strict")
    assert not strict.ok and "valid subgradient" in strict.describe()
    loose = properties.check_call(engine, ex, "subgradient")
    assert loose.ok, loose.describe()
    assert loose.conventions == [convention]


@pytest.mark.parametrize("ex, kw", [
    (RELU, {"slope": 2.0}), (ABS, {"slope": 1.5}),
    (TIE, {"share": (1.0, 1.0)}),   # doubled
    (TIE, {"share": (0.0, 0.0)}),   # lost
])
def test_outside_the_subdifferential_fails_in_both_modes(ex, kw):
    engine = _engine(**kw)
    for mode in ("strict", "subgradient"):
        result = properties.check_call(engine, ex, mode)
        assert not result.ok
        assert "outside the Clarke subdifferential" in result.describe()


def test_the_registry_convention_passes_strict_and_reports_nothing():
    engine = _engine()
    for ex in (RELU, ABS, TIE):
        for mode in ("strict", "subgradient"):
            result = properties.check_call(engine, ex, mode)
            assert result.ok and not result.conventions, result.describe()
