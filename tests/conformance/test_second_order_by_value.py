"""The long unary calls' exact second order, taken once per distinct value, against spec's own
entry-by-entry route (``spec.jvp`` / ``spec.hvp`` and the running-error rule on every entry)."""
import mpmath
import numpy as np
import pytest

import spec
from reports.conformance import second_order as so
from reports.conformance.second_order_bounds import running_error

UNARY = [name for name, op in spec.OPS.items() if op.category == "unary"]


def _call(name):
    """A call past ``BY_VALUE_FROM`` entries that repeats a few values (zeros on the kinks)."""
    rng = np.random.default_rng(7)
    base = rng.uniform(0.1, 3.0, 12) if spec.OPS[name].domains["x"] == "positive" else \
        np.concatenate([rng.uniform(-4.0, 4.0, 11), [0.0]])
    x = np.tile(base, 8)[: so.BY_VALUE_FROM + 20].reshape(4, -1)
    t = rng.standard_normal(x.shape)
    t[0, 0] = 0.0                       # a zero tangent scales to a zero product and bound
    g = rng.standard_normal(x.shape)
    return x, t, g


@pytest.mark.parametrize("name", UNARY)
def test_by_value_equals_entry_by_entry(name):
    x, t, g = _call(name)
    assert so._by_value(name, [x])
    fast = so._unary_by_value(name, x, g, t, {})
    _, jv = spec.jvp(name, [x], [t], None, dps=so.EXACT_DPS)
    (hv,) = spec.hvp(name, [x], g, [t], None, dps=so.EXACT_DPS)
    jvp_e, (hvp_e,) = running_error(name, [x], g, [t], {})
    for (hi, lo), exact in ((fast["jvp"], jv), (fast["hvp"][0], hv)):
        with mpmath.workdps(so.EXACT_DPS):
            for idx in np.ndindex(*x.shape):
                got = mpmath.mpf(float(hi[idx])) + mpmath.mpf(float(lo[idx]))
                # both routes carry 30 digits; one or two roundings more apart
                assert abs(got - exact[idx]) <= mpmath.mpf(10) ** -26 * (abs(exact[idx]) + 1e-300)
    np.testing.assert_allclose(fast["jvp_E"], jvp_e, rtol=1e-12, atol=0)
    np.testing.assert_allclose(fast["hvp_E"][0], hvp_e, rtol=1e-12, atol=0)


def test_short_or_non_finite_calls_stay_entry_by_entry():
    x = np.linspace(-1, 1, so.BY_VALUE_FROM)
    assert not so._by_value("exp", [x])
    assert not so._by_value("exp", [np.append(x, [np.inf])])
    assert not so._by_value("sum", [np.linspace(-1, 1, 500)])
