"""Dense's float32 bias gradient is a column sum over the batch accumulated in float64: over a
long batch it is the exact sum rounded once, where a float32 running sum loses every term
below half an ulp of the total (the kernel's NOTE)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fastlib.layers import Dense

BATCH = 4096


@pytest.mark.parametrize("activation", ["linear", "relu"])
def test_float32_bias_gradient_is_the_exact_sum_rounded_once(activation):
    layer = Dense(3, 2, activation, dtype=np.float32, seed=0)
    # positive pre-activations so relu passes every entry through (relu'(x) = 1 there)
    x = np.ones((BATCH, 3), np.float32)
    layer.load_parameters({"weight": np.full((3, 2), 0.5, np.float32),
                           "bias": np.zeros(2, np.float32)})
    layer.forward(x)
    # one 1 and then half an ulp of 1 (2**-25) in every other row: a float32 running sum
    # rounds each 1 + 2**-25 back to 1 and returns 1.0, about 2047 ulps short
    g = np.full((BATCH, 2), 2.0 ** -25, np.float32)
    g[0] = 1.0
    g[:, 1] *= -3.0
    _, grads = layer.backward(g)
    for j in range(2):
        exact = math.fsum(float(v) for v in g[:, j])        # exact: fsum is correctly rounded
        assert grads["bias"][j] == np.float32(exact), (j, grads["bias"][j], exact)


def test_float32_column_sums_are_the_exact_sums_rounded_once():
    """The same promise for the column-sum kernel TargetProp's Loom update uses for biases."""
    from fastlib.kernels.dense import column_sums

    g = np.full((BATCH, 2), 2.0 ** -25, np.float32)
    g[0] = 1.0
    g[:, 1] *= -3.0
    out = np.empty(2, np.float32)
    column_sums(g, out)
    for j in range(2):
        assert out[j] == np.float32(math.fsum(float(v) for v in g[:, j])), (j, out[j])
