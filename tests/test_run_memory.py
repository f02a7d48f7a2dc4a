"""What a training run keeps alive: no rounded copy of a mixed run's data set, no evaluation's
saved arrays.

A mixed-precision run rounds its inputs batch by batch; the expected parameters come from a run
on inputs rounded beforehand by ``ml_dtypes`` (an independent rounding), bit for bit. The memory
claims are allocation counts (``tracemalloc``), not timings: a copy of the data set is a
allocation of its size, which either happens or does not.
"""
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import fastlib
from fastlib.training import algorithms, run_data


def _mlp(seed=0):
    return fastlib.layers.Sequential([fastlib.layers.Dense(16, 5, "tanh"),
                                      fastlib.layers.Dense(5, 3)], seed=seed)


def _data(n, seed=3):
    rng = np.random.default_rng(seed)
    return (3 * rng.standard_normal((n, 16))).astype(np.float32), rng.integers(0, 3, n)


_ML = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _train(model, x, y, fmt, fused):
    return fastlib.train(model, x, y, 1, 256, 0.05, "cross_entropy", optimizer="Adam",
                         dtype=fmt, fused=fused, verbose=False, seed=2)


@pytest.mark.parametrize("fused", [True, False], ids=["compiled", "per-batch"])
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_a_mixed_run_rounds_batch_by_batch_without_copying_its_data(fmt, fused):
    x, y = _data(40_000)
    rounded = x.astype(_ML[fmt]).astype(np.float32)
    assert not np.array_equal(rounded, x)         # the rounding is not a no-op on these inputs
    expected = _mlp()
    _train(expected, rounded, y, fmt, fused)
    _train(_mlp(), x[:512], y[:512], fmt, fused)  # compiled outside the trace
    model = _mlp()
    tracemalloc.start()
    try:
        result = _train(model, x, y, fmt, fused)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.path == ("program" if fused else "generic")
    # a rounded float32 copy of the inputs alone would be x.nbytes (2.5 MB)
    assert peak < x.nbytes // 2, (peak, x.nbytes)
    for name, value in expected.parameters().items():
        np.testing.assert_array_equal(model.parameters()[name], value, err_msg=name)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_a_mixed_runs_data_fingerprint_is_that_of_its_rounded_inputs(fmt):
    # a checkpoint keeps the fingerprint of the inputs as the run reads them (the rounded
    # values, as float32); hashing them chunk by chunk must give the one-shot hash
    x, y = _data(3000)
    rounded = x.astype(_ML[fmt]).astype(np.float32)
    mixed = run_data.RunData(x, y, x[:7], y[:7], fmt)
    plain = run_data.RunData(rounded, y, rounded[:7], y[:7])
    assert mixed.fingerprint == plain.fingerprint
    assert mixed.fingerprint != run_data.RunData(x, y, x[:7], y[:7]).fingerprint


def test_evaluation_keeps_no_saved_arrays_and_backward_then_says_so():
    x, y = _data(64)
    model = _mlp()
    targets = fastlib.losses.validate_targets("cross_entropy", np.zeros((64, 3), np.float32), y)
    algorithms.evaluate_model(model, x, targets, "cross_entropy")
    for layer in model.layers:
        assert layer.hist_in is None and layer.hist_pre is None and layer.hist_post is None
    with pytest.raises(RuntimeError, match="backward called before forward"):
        model.backward(np.ones((64, 3), np.float32))
    model.forward(x)            # a forward keeps them again, for the backward
    assert model.layers[0].hist_in is not None
