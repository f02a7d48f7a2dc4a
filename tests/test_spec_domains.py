"""Domain samplers and example inputs: shapes, ranges, exactness, and clear errors."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import spec
from spec import domains

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@given(shape=shapes, seed=st.integers(0, 2**32 - 1))
def test_every_domain_sampler_stays_in_its_domain(shape, seed):
    rng = np.random.default_rng(seed)
    for name in ("real", "positive", "nonzero", "unit_open", "unit_closed"):
        x = domains.sample(name, shape, rng)
        assert x.shape == shape and x.dtype == np.float64
        assert np.isfinite(x).all()
        assert not domains.out_of_domain(name, x).any()
    x = domains.sample("positive", shape, rng)
    assert (x > 0).all()
    x = domains.sample("unit_open", shape, rng)
    assert ((0 < x) & (x < 1)).all()
    x = domains.sample("nonzero", shape, rng)
    assert (x != 0).all()


@given(n=st.integers(1, 5), c=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_class_index_and_distribution(n, c, seed):
    rng = np.random.default_rng(seed)
    idx = domains.sample("class_index", (n, 1), rng, num_classes=c)
    assert idx.dtype == np.int64 and ((0 <= idx) & (idx < c)).all()
    t = domains.sample("distribution", (n, c), rng)
    assert (t >= 0).all()
    for row in t:
        # Exactly 1 in exact arithmetic (not just within rounding), and in float32 as well.
        assert sum(Fraction(float(v)) for v in row) == 1
        assert np.float32(row.astype(np.float32).sum(dtype=np.float32)) == 1


def test_unit_closed_hits_the_ends():
    x = domains.sample("unit_closed", (2000,), np.random.default_rng(0))
    assert (x == 0).any() and (x == 1).any() and ((x > 0) & (x < 1)).any()


def test_out_of_domain_masks():
    assert domains.out_of_domain("positive", [1.0, 0.0, -1.0]).tolist() == [False, True, True]
    assert domains.out_of_domain("unit_closed", [0.0, 1.0, 1.5]).tolist() == [False, False, True]
    assert domains.out_of_domain("class_index", [0.0, 1.5, -1.0]).tolist() == [False, True, True]
    bad_rows = domains.out_of_domain("distribution", [[0.5, 0.5], [0.5, 0.6], [1.5, -0.5]])
    assert bad_rows.any(axis=1).tolist() == [False, True, True]


def test_sampler_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"unknown domain 'postive'; did you mean 'positive'"):
        domains.sample("postive", (2,), rng)
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        domains.sample("real", (2,), 0)
    with pytest.raises(ValueError, match="num_classes"):
        domains.sample("class_index", (2,), rng)


@pytest.mark.parametrize("name", list(spec.OPS))
def test_sample_inputs_fit_every_example(name):
    op = spec.OPS[name]
    rng = np.random.default_rng(0)
    for ex in op.examples:
        xs = spec.sample_inputs(name, rng, ex.shapes, dict(ex.params))
        assert [x.shape for x in xs] == list(ex.shapes)
        for n, x in zip(op.inputs, xs):
            if op.domains[n] == "class_index":
                assert x.dtype == np.int64 and (x < ex.shapes[0][-1]).all()
            else:
                assert not domains.out_of_domain(op.domains[n], x).any()
    inputs, params = spec.sample_case(name, rng)
    out_shape = op.check_shapes([x.shape for x in inputs], params)
    out, _ = spec.evaluate(name, inputs, np.ones(out_shape), params)
    assert out.shape == out_shape


def test_sample_inputs_picks_examples_that_fit_params():
    rng = np.random.default_rng(0)
    for _ in range(10):
        (x,) = spec.sample_inputs("sum", rng, params={"axis": 0})
        spec.OPS["sum"].check_shapes([x.shape], {"axis": 0})
        (x,) = spec.sample_inputs("reshape", rng, params={"shape": (-1,)})
        assert x.ndim >= 1
    with pytest.raises(ValueError, match="pass shapes="):
        spec.sample_inputs("reshape", rng)
    with pytest.raises(ValueError, match="do not broadcast"):
        spec.sample_inputs("add", rng, [(2, 3), (4,)])
    with pytest.raises(spec.UnknownOpError):
        spec.sample_inputs("ad", rng)
    with pytest.raises(TypeError, match="Generator"):
        spec.sample_inputs("add", 0)


def test_sample_inputs_is_reproducible():
    a = spec.sample_inputs("layer_norm", np.random.default_rng(7), [(3, 4)])
    b = spec.sample_inputs("layer_norm", np.random.default_rng(7), [(3, 4)])
    assert np.array_equal(a[0], b[0])
