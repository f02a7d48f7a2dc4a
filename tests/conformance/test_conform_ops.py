"""pytest entry points over the suite's op properties (``reports.conformance.properties``).

The same checks ``verigrad conform`` runs, for reflib (float64) and fastlib (float32, float64)
on every registry op: forward and every VJP against exact values (spec.evaluate at 50 digits)
under the bounds of ``reports.conformance.bounds``, with broadcasting and kink values drawn by
``reports.conformance.strategies``; the VJP/JVP inner-product identity against central
differences of the exact forward; and the special-values table. Examples per test come from
the Hypothesis profile (tests/conftest.py).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spec
from reports.conformance import engines, properties
from reports.conformance.special_values import nonfinite_cases, special_cases
from reports.conformance.strategies import op_examples

OPS = sorted(spec.OPS)
ENGINE_DTYPES = [("reflib", np.float64), ("fastlib", np.float32), ("fastlib", np.float64)]
IDS = [f"{e}-{np.dtype(d).name}" for e, d in ENGINE_DTYPES]


def _engine(name):
    return engines.get_engine(name)


@pytest.mark.parametrize("engine, dtype", ENGINE_DTYPES, ids=IDS)
@pytest.mark.parametrize("name", OPS)
@given(data=st.data())
def test_forward_and_vjps_within_bounds_of_exact(name, engine, dtype, data):
    near = bool(spec.OPS[name].kinks) and data.draw(st.booleans(), label="near_kinks")
    ex = data.draw(op_examples(name, dtype, near_kinks=near, edges=False), label="example")
    result = properties.check_call(_engine(engine), ex)
    assert result.ok, result.describe()


# NOTE: magnitudes across the dtype's range cost more at 50 digits (extreme logits, 1e-300
# beside 1e300); the default run draws a few per op and engine, `verigrad conform` half of
# its examples, `-m slow` / the thorough Hypothesis profile as many as the profile says.
@pytest.mark.parametrize("engine, dtype", ENGINE_DTYPES[1:], ids=IDS[1:])
@pytest.mark.parametrize("name", OPS)
@settings(max_examples=3)
@given(data=st.data())
def test_edge_magnitudes_within_bounds_of_exact(name, engine, dtype, data):
    ex = data.draw(op_examples(name, dtype, edges=True), label="example")
    result = properties.check_call(_engine(engine), ex)
    assert result.ok, result.describe()


@pytest.mark.parametrize("engine, dtype", ENGINE_DTYPES, ids=IDS)
@pytest.mark.parametrize("name", OPS)
@given(data=st.data())
def test_vjp_is_the_derivative_of_the_forward(name, engine, dtype, data):
    ex = data.draw(op_examples(name, dtype, edges=False), label="example")
    result = properties.check_jvp(_engine(engine), ex, data.draw(st.integers(0, 2**31 - 1)))
    assert result.ok, result.describe()


@pytest.mark.parametrize("engine, dtype", ENGINE_DTYPES, ids=IDS)
@pytest.mark.parametrize("name", OPS)
def test_special_values(name, engine, dtype):
    cases = special_cases(name, dtype)
    assert cases, name
    failures = []
    for ex in cases:
        result = properties.check_call(_engine(engine), ex)
        if not result.ok:
            failures.append(f"[{ex.label}] {result.describe()}")
    for ex in nonfinite_cases(name, dtype):
        result = properties.check_nonfinite(_engine(engine), ex)
        if not result.ok:
            failures.append(f"[{ex.label}] {result.describe()}")
    assert not failures, failures
