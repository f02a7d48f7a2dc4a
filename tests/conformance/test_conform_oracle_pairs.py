"""The oracle evaluates a long unary call once per distinct (x, cotangent) pair: the scattered
values must be exactly those of evaluating every element."""
import numpy as np

import spec
from reports.conformance import oracle


def test_unique_pairs_equal_the_elementwise_evaluation():
    rng = np.random.default_rng(3)
    x = np.resize(rng.standard_normal(7), 40)
    g = np.resize(rng.standard_normal(5), 40)   # periods 7 and 5: 35 distinct pairs
    fast = oracle._unary_by_unique_pairs("tanh", x, g, None)
    out, grads = spec.evaluate("tanh", [x], g, dps=oracle.DPS)
    full_out, full_grad = oracle._split(out), oracle._split(grads[0])
    for got, want in zip(fast.out + fast.grads[0], full_out + full_grad):
        np.testing.assert_array_equal(got, want)
