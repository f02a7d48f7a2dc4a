"""A kernel called through its machine-code address (``fastlib.kernels.native_call``): it
runs on the caller's arrays, its exceptions reach the caller, and an entry compiled for other
argument types is refused instead of run."""
import numpy as np
import pytest
from numba import njit

from fastlib.compile_once import native_entry
from fastlib.kernels.native_call import call_compiled, types_key


@njit
def _add_scaled(out, x, k):
    if k < 0:
        raise ValueError("negative factor")
    for i in range(out.size):
        out[i] += x[i] * k


@njit
def _twice(entry, out, x, k):
    call_compiled(entry, (out, x, k))
    call_compiled(entry, (out, x, k))


@njit
def _returns_a_value(x):
    return x + 1.0


def test_a_kernel_called_by_address_writes_the_callers_arrays():
    out, x = np.ones(4), np.arange(4.0)
    _twice(native_entry(_add_scaled, out, x, 2.0), out, x, 2.0)
    assert out.tolist() == [1.0, 5.0, 9.0, 13.0]       # 1 + 2 * (2 * x)


def test_its_exception_reaches_the_caller():
    out, x = np.zeros(2), np.zeros(2)
    entry = native_entry(_add_scaled, out, x, 1.0)
    with pytest.raises(ValueError, match="negative factor"):
        _twice(entry, out, x, -1.0)


def test_an_entry_for_other_argument_types_is_refused_before_it_runs():
    out32 = np.zeros(3, np.float32)
    entry = native_entry(_add_scaled, out32, out32, 1.0)
    out = np.zeros(3)
    with pytest.raises(ValueError, match="other argument types"):
        _twice(entry, out, np.ones(3), 1.0)
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_the_key_names_the_types_and_only_them():
    from numba import typeof

    a, b = typeof(np.zeros(2)), typeof(np.zeros(2, np.float32))
    assert types_key((a, b)) == types_key((typeof(np.ones(5)), b))
    assert types_key((a, b)) != types_key((b, a))


def test_a_kernel_that_returns_a_value_has_no_entry():
    with pytest.raises(TypeError, match="returns float64"):
        native_entry(_returns_a_value, 1.0)


@pytest.mark.parametrize("kind", ["mlp", "lstm"])
def test_a_run_finds_its_epoch_s_entry_once(kind, monkeypatch):
    # typing the entry's arguments costs about a millisecond: a third of a small epoch when it
    # was done every epoch
    import fastlib
    from fastlib import compile_once

    calls = []
    real = compile_once.native_entry

    def counted(dispatcher, *args):
        calls.append(dispatcher.py_func.__name__)
        return real(dispatcher, *args)

    monkeypatch.setattr(compile_once, "native_entry", counted)
    rng = np.random.default_rng(0)
    if kind == "mlp":
        x = rng.standard_normal((24, 3))
        model = fastlib.Sequential([fastlib.Dense(3, 4, "relu"), fastlib.Dense(4, 2)],
                                   dtype=np.float64)
    else:
        x = rng.standard_normal((24, 3, 2))
        model = fastlib.Sequential([fastlib.LSTM(2, 3), fastlib.Dense(3, 2)], dtype=np.float64)
    result = fastlib.train(model, x, rng.integers(0, 2, 24), 3, 8, 0.01, "cross_entropy",
                           verbose=False)
    assert result.path == "program"
    if kind == "mlp":
        assert calls == ["_piece_work"]
    else:
        # the piece, and the row kernels of the program's kinds only (no attention, norm,
        # SwiGLU or embedding kernel is compiled for an LSTM model), each found once
        assert sorted(calls) == ["_piece", "dense_backward", "dense_forward",
                                 "recurrent_backward", "recurrent_forward"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_row_kind_calls_its_kernel_with_the_declared_arguments(dtype, monkeypatch):
    # interpreter.ROW_KERNELS says by letter what each row's call site passes; a letter that
    # disagrees (a float64 eps declared as the activation dtype, a vector as a matrix) gives an
    # entry for other types, and the call's key check raises. One program of every kind, in
    # both dtypes, calls every row kernel forward and backward.
    import fastlib
    from fastlib import compile_once
    from fastlib.kernels import interpreter

    found = []
    real = compile_once.native_entry

    def counted(dispatcher, *args):
        found.append(dispatcher)
        return real(dispatcher, *args)

    monkeypatch.setattr(compile_once, "native_entry", counted)
    rng = np.random.default_rng(0)
    model = fastlib.Sequential([
        fastlib.Embedding(7, 4), fastlib.LayerNorm(4), fastlib.RMSNorm(4),
        fastlib.SwiGLU(4, 6, 4), fastlib.MultiHeadAttention(4, 2), fastlib.LSTM(4, 3),
        fastlib.Dense(3, 2)], dtype=dtype, seed=0)
    result = fastlib.train(model, rng.integers(0, 7, (12, 3)), rng.integers(0, 2, 12), 1, 4,
                           0.01, "cross_entropy", verbose=False)
    assert result.path == "program"
    assert np.isfinite(result.loss_history[-1])
    assert {kernel for _, kernel, _ in interpreter.ROW_KERNELS} <= set(found)
