"""Two holes a round of bugs written apart from the suite found, and the checks that close them.

A relu Dense whose backward took leaky_relu's derivative passed every row (the random train
cases use smooth activations only): the ``kinked Dense`` rows hold relu and leaky_relu layers
on every CPU path, on inputs that keep every pre-activation away from the kink. A loss value
computed with its gradient (what training reads) was never checked, only the forward's: the
op rows now hold an engine's optional ``value_and_vjp`` value to the forward's bound.
"""
from __future__ import annotations

import numpy as np
import pytest

from reports.conformance import engines, properties
from reports.conformance import training_cases as tc
from reports.conformance.special_values import special_cases
from reports.conformance.training_rows import check_epochs


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_kinked_cases_keep_every_pre_activation_away_from_the_kink_on_both_sides(dtype):
    from reflib.models import from_config

    cases = tc.kinked_cases(dtype)
    assert {c.config["layers"][0]["activation"] for c in cases} == set(tc.KINKED)
    assert {c.path for c in cases} == {"generic", "fused", "pieces", "general"}
    for case in cases:
        # one step from the seed's weights: the gradient is taken where the margin was measured
        assert case.epochs == 1 and case.batch_size == len(case.x) and case.optimizer == "SGD"
        params = from_config(case.config, seed=case.seed).parameters()
        pre = case.x @ np.asarray(params["0.weight"]) + np.asarray(params["0.bias"])
        assert np.abs(pre).min() >= tc.KINK_MARGIN
        assert (pre < 0).any() and (pre > 0).any()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fastlib_passes_the_kinked_cases_on_every_path(dtype):
    for case in tc.kinked_cases(dtype):
        result = check_epochs(case)
        assert result.ok, (case.label, result.describe())


class HalfValue(engines.FastlibEngine):
    """fastlib with the value its VJP computes halved (the forward alone is right)."""

    name = "half-value"

    def _value_and_vjp(self, name, inputs, grad, **params):
        value, grads = super()._value_and_vjp(name, inputs, grad, **params)
        return np.asarray(value) * 0.5, grads


def test_the_value_computed_with_the_vjp_is_held_to_the_forwards_bound():
    (ex,) = [c for c in special_cases("binary_cross_entropy_with_logits", np.float64)
             if c.label == "logits ±1e4"]
    clean = properties.check_call(engines.get_engine("fastlib"), ex)
    assert clean.ok and any(m.what == "output with the vjp" for m in clean.measures)
    planted = properties.check_call(HalfValue(), ex)
    assert not planted.ok and "output with the vjp" in planted.describe()
    assert engines.get_engine("fastlib").fused_value
    assert not engines.get_engine("reflib").fused_value   # optional: an engine may omit it
