"""fastlib.forward / fastlib.vjp for every op and dtype, against independent references.

References (none of them fastlib):
- float64: reflib.forward / reflib.vjp (NumPy, float64), normwise relative error <= 1e-12 away
  from kinks, and bit-for-bit equality where both compute the same single IEEE operation.
- float32: spec.evaluate (the SymPy-declared forward and VJPs, mpmath at 30 digits), evaluated
  at the float32 inputs themselves (exactly representable in float64), so the only error
  measured is fastlib's own. The cotangent is a float32 array too.

float32 bound. ``||fast - exact||_2 <= K * eps32 * max(||exact||_2, ||S||_2)`` per output and
per input gradient, ``eps32 = 2**-23``. ``S`` is the magnitude of the terms the result sums
(``_term_scales``: e.g. ``|a| |b|`` for matmul, ``y (|g| + sum |g| y)`` for softmax's VJP): where
they cancel, every algorithm that rounds them errs relative to them, not to the small result;
elsewhere the bound is the plain normwise relative error. ``K`` per op, from how many roundings
the kernel makes and how the op amplifies them on the sampled domain (``spec.domains``:
|x| <= 3):

- 0     copies and sign flips (structure ops, neg, abs, relu, identity): exact.
- 2     one or two IEEE operations, or float64 internals rounded once (add sub mul div square
        sqrt maximum leaky_relu sum mean layer_norm rms_norm mse): each rounding is at most
        eps/2 relative.
- 8     transcendental activations (exp log tanh sigmoid softplus silu gelu gelu_tanh) and the
        binary cross-entropies (their logs / exps are the float32 primitives): the vecmath
        primitives are within 2 ulp, tanh within 7 ulp = 3.5 eps (tests/
        test_fastlib_ops_vecmath.py), composed with at most 4 more roundings, none amplified
        by more than ~2 on |x| <= 3.
- 4 + s the log-sum-exp family (logsumexp softmax log_softmax cross_entropy
        categorical_cross_entropy), s = max |x - rowmax|: the shift x - max is rounded (eps/2 of
        |x - max|) and exp turns an absolute error d in its argument into a relative error d.
- matmul (k + 2) * || |a| |b| ||_F / ||a b||_F: float32 GEMM's error bound (Higham, Accuracy and
        Stability, eq. 3.13) with the data's own conditioning.

Shapes (including broadcasting via ``mutually_broadcastable_shapes`` and size-1 axes) and params
are drawn by Hypothesis; values come from the op's domains through ``spec.sample_inputs`` with
a Hypothesis-drawn seed.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlib
import reflib
import spec
from fastlib import config
from fastlib.ops import value_and_vjp
# The per-op shapes-and-params strategy (and the op families) live in the conformance
# suite, shared with `verigrad conform`.
from reports.conformance.strategies import STRUCTURE, op_case

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(spec.OPS)
EPS32 = float(np.finfo(np.float32).eps)


# float64: identical IEEE operations in fastlib and reflib -> equal bits
EXACT64_FORWARD = {"neg", "abs", "relu", "identity", "leaky_relu", "square", "add", "sub", "mul",
                   "div", "maximum"} | STRUCTURE
EXACT64_VJP = {"neg", "abs", "relu", "identity", "leaky_relu"} | STRUCTURE
TOL64 = 1e-12

K32 = {**{n: 0 for n in ("neg", "abs", "relu", "identity") + tuple(STRUCTURE)},
       **{n: 2 for n in ("add", "sub", "mul", "div", "square", "sqrt", "maximum", "leaky_relu",
                         "sum", "mean", "layer_norm", "rms_norm", "mse")},
       **{n: 8 for n in ("exp", "log", "tanh", "sigmoid", "softplus", "silu", "gelu",
                         "gelu_tanh", "binary_cross_entropy",
                         "binary_cross_entropy_with_logits")}}
LSE_FAMILY = {"logsumexp", "softmax", "log_softmax", "cross_entropy", "categorical_cross_entropy"}


# --- inputs: shapes and params from op_case; values from spec's domains --------------------------

def _inputs(name, shapes, params, seed, dtype):
    rng = np.random.default_rng(seed)
    raw = spec.sample_inputs(name, rng, shapes=shapes, params=params)
    out = []
    for iname, x in zip(spec.OPS[name].inputs, raw):
        out.append(x if spec.OPS[name].domains[iname] == "class_index" else x.astype(dtype))
    return out, rng


# Exact values below this are evaluation residue of the mpmath reference (a one-class
# cross-entropy is 0 but evaluates to ~1e-51 at 30 digits): far below float32's smallest
# subnormal (1.4e-45) and any value these tests produce, so differences this small are zero.
ABS_FLOOR = 1e-45


def _relerr(got, want):
    got = np.asarray(got, dtype=np.float64).ravel()
    want = np.asarray(want, dtype=np.float64).ravel()
    scale = np.linalg.norm(want)
    diff = max(np.linalg.norm(got - want) - ABS_FLOOR * np.sqrt(got.size), 0.0)
    return diff / scale if scale > ABS_FLOOR else diff


# --- the table ------------------------------------------------------------------------------------

def test_op_names_equal_spec_registry():
    assert set(fastlib.OPS) == set(spec.OPS)


def test_op_inputs_and_params_match_spec():
    for name, op in spec.OPS.items():
        entry = fastlib.OPS[name]
        assert entry.inputs == op.inputs, name
        assert set(entry.params) == set(op.defaults), name
        for p, default in op.defaults.items():
            if default is not spec.REQUIRED:
                assert entry.params[p] == default, (name, p)


def test_import_pulls_neither_sympy_nor_spec():
    code = ("import fastlib, fastlib.ops; import sys; "
            "assert 'sympy' not in sys.modules and 'spec' not in sys.modules "
            "and 'reflib' not in sys.modules, sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('sympy', 'spec', 'reflib'))")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# --- float64 against reflib -------------------------------------------------------------------

def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _term_scales(name, inputs, grad, params):
    """(output scale, [grad scales]): the magnitude of the terms each result entry adds up.

    A float64 kernel that is backward stable errs by a few eps of this magnitude however much
    the terms cancel; the float64 test measures the error against it where the op's result is
    much smaller than its terms (a layer_norm VJP over two entries, a matmul whose products
    cancel). Computed with NumPy and reflib on absolute values; None: the result itself.
    """
    g = np.abs(grad)
    if name == "matmul":
        a, b = (np.abs(v) for v in inputs)
        gb = np.swapaxes(a, -1, -2) @ g
        if gb.ndim > b.ndim:
            gb = gb.reshape(-1, *b.shape).sum(axis=0)
        return a @ b, [g @ np.swapaxes(b, -1, -2), gb]
    if name in ("sum", "mean"):
        return reflib.forward(name, [np.abs(inputs[0])], **params), [None]
    if name == "logsumexp":
        x = inputs[0]
        return np.abs(reflib.forward("logsumexp", [x], **params)) + np.max(np.abs(x)) + \
            np.log(x.size), [None]
    if name in ("add", "sub", "maximum"):
        return None, list(reflib.vjp("add", inputs, g))
    if name in ("mul", "div"):
        return None, [np.abs(v) for v in reflib.vjp(name, [np.abs(v) for v in inputs], g)]
    if name in ("layer_norm", "rms_norm", "softmax", "log_softmax"):
        x = inputs[0]
        y = reflib.forward(name, [x], **params)
        if name in ("layer_norm", "rms_norm"):
            xc = x - x.mean(-1, keepdims=True) if name == "layer_norm" else x
            r = 1 / np.sqrt((xc**2).mean(-1, keepdims=True) + params.get("eps", 1e-5))
            gm = np.abs(g.mean(-1, keepdims=True)) if name == "layer_norm" else 0
            return None, [r * (g + gm + np.abs(y) * (g * np.abs(y)).mean(-1, keepdims=True))]
        axis = params.get("axis", -1)
        p = _softmax(x, axis)
        if name == "softmax":
            return None, [p * (g + (g * p).sum(axis=axis, keepdims=True))]
        return None, [g + p * g.sum(axis=axis, keepdims=True)]
    if name == "cross_entropy":
        z, t = inputs
        onehot = np.eye(z.shape[1])[np.asarray(t).reshape(-1).astype(int)]
        return None, [g * (_softmax(z, -1) + onehot) / z.shape[0], None]
    if name == "categorical_cross_entropy":
        z, t = inputs
        tt = np.abs(t)
        return None, [g * (_softmax(z, -1) * tt.sum(-1, keepdims=True) + tt) / z.shape[0], None]
    return None, [None] * len(inputs)


def _within(got, exact, bound, scale):
    """``||got - exact|| <= bound * max(||exact||, ||scale||)``: relative to the result, or to
    the magnitude of the terms it sums where they cancel (``_term_scales``)."""
    exact = np.asarray(exact, dtype=np.float64).ravel()
    ref = np.linalg.norm(exact)
    if scale is not None:
        ref = max(ref, np.linalg.norm(np.asarray(scale, dtype=np.float64).ravel()))
    diff = np.linalg.norm(np.asarray(got, np.float64).ravel() - exact)
    return diff <= bound * ref + ABS_FLOOR * np.sqrt(exact.size)


def _fast_call(name, data, dtype):
    """Draw one call of op ``name`` in ``dtype`` and a cotangent; run fastlib's forward and
    VJP on it. Returns ``(inputs, params, out, grad, grads)``."""
    shapes, params, seed = data.draw(op_case(name))
    inputs, rng = _inputs(name, shapes, params, seed, dtype)
    out = fastlib.forward(name, inputs, **params)
    assert out.dtype == dtype
    grad = rng.standard_normal(out.shape).astype(dtype)
    return inputs, params, out, grad, fastlib.vjp(name, inputs, grad, **params)


def _close64(got, want, exact, scale):
    """fastlib within TOL64 (normwise, relative) of reflib; where the result is much smaller
    than the terms it sums, reflib's own error can exceed that, and then fastlib must be within
    TOL64 of the exact value, relative to the terms' magnitude ``scale``."""
    return _relerr(got, want) <= TOL64 or _within(got, exact(), TOL64, scale)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_float64_matches_reflib(name, data):
    inputs, params, out, grad, grads = _fast_call(name, data, np.float64)
    want = reflib.forward(name, inputs, **params)
    assert out.shape == want.shape
    want_grads = reflib.vjp(name, inputs, grad, **params)
    cache = {}

    def exact(i):
        if "v" not in cache:
            cache["v"] = spec.evaluate(name, inputs, grad, params=params, dps=50)
        return cache["v"][0] if i < 0 else cache["v"][1][i]

    scale_out, scale_grads = _term_scales(name, inputs, grad, params)
    if name in EXACT64_FORWARD:
        np.testing.assert_array_equal(out, want)
    else:
        assert _close64(out, want, lambda: exact(-1), scale_out), name
    assert len(grads) == len(want_grads)
    for i, (g, w, x) in enumerate(zip(grads, want_grads, inputs)):
        if w is None:
            assert g is None
            continue
        assert g.shape == x.shape and g.dtype == np.float64
        if name in EXACT64_VJP:
            np.testing.assert_array_equal(g, w)
        else:
            assert _close64(g, w, lambda: exact(i), scale_grads[i]), name


# --- float32 against the exact values ------------------------------------------------------------

def _k32(name, inputs, params):
    """The float32 bound K (module docstring) for these inputs."""
    if name in K32:
        return K32[name]
    if name in LSE_FAMILY:
        x = inputs[0].astype(np.float64)
        if name in ("softmax", "log_softmax"):
            axes = params.get("axis", -1)
        elif name == "logsumexp":
            axis = params.get("axis")
            axes = tuple(range(x.ndim)) if axis is None else axis
        else:
            axes = -1
        spread = np.max(x.max(axis=axes, keepdims=True) - x) if x.size else 0.0
        return 4 + float(spread)
    if name == "matmul":
        a, b = (v.astype(np.float64) for v in inputs)
        k = a.shape[-1]
        return (k + 2) * np.linalg.norm(np.abs(a) @ np.abs(b)) / max(np.linalg.norm(a @ b),
                                                                       1e-300)
    raise AssertionError(f"no float32 bound for {name}")  # pragma: no cover


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_float32_within_eps_bound_of_exact(name, data):
    inputs, params, out, grad, grads = _fast_call(name, data, np.float32)
    exact_inputs = [x.astype(np.float64) if x.dtype == np.float32 else x for x in inputs]
    exact_out, exact_grads = spec.evaluate(name, exact_inputs, grad.astype(np.float64),
                                           params=params, dps=30)
    bound = _k32(name, inputs, params) * EPS32
    scale_out, scale_grads = _term_scales(name, exact_inputs, grad.astype(np.float64), params)
    assert out.shape == np.shape(exact_out)
    assert _within(out, exact_out, bound, scale_out), (name, _relerr(out, exact_out) / EPS32)
    for g, w, scale in zip(grads, exact_grads, scale_grads):
        if w is None:
            assert g is None
            continue
        assert g.dtype == np.float32
        assert _within(g, w, bound, scale), (name, _relerr(g, w) / EPS32)


# --- the fused entry point, fresh outputs, parallel chunks ---------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_value_and_vjp_equals_forward_then_vjp(dtype):
    rng = np.random.default_rng(7)
    for name in NAMES:
        inputs, params = spec.sample_case(name, rng)
        inputs = [x if spec.OPS[name].domains[n] == "class_index" else x.astype(dtype)
                  for n, x in zip(spec.OPS[name].inputs, inputs)]
        out = fastlib.forward(name, inputs, **params)
        grad = rng.standard_normal(out.shape).astype(dtype)
        value, grads = value_and_vjp(name, inputs, grad, **params)
        np.testing.assert_array_equal(value, out)
        for g, w in zip(grads, fastlib.vjp(name, inputs, grad, **params)):
            if w is None:
                assert g is None
            else:
                np.testing.assert_array_equal(g, w)


def test_outputs_never_alias_inputs():
    rng = np.random.default_rng(3)
    for name in NAMES:
        inputs, params = spec.sample_case(name, rng)
        out = fastlib.forward(name, inputs, **params)
        grad = np.ones(out.shape)
        grads = fastlib.vjp(name, inputs, grad, **params)
        for x in inputs:
            assert not np.shares_memory(out, x), name
            for g in grads:
                assert g is None or not (np.shares_memory(g, x) or np.shares_memory(g, grad)), name


# One case per parallel driver family in the default run (compiling a prange driver costs
# seconds: it re-optimises the inlined serial kernel); the other drivers under -m slow.
_SLOW = pytest.mark.slow
PARALLEL_CASES = [
    ("tanh", [(1000,)], {}), ("mul", [(40, 50), (50,)], {}), ("sum", [(5000,)], {}),
    pytest.param("sum", [(300, 7)], {"axis": 0}, marks=_SLOW),
    pytest.param("softmax", [(64, 33)], {}, marks=_SLOW),
    pytest.param("gelu", [(37, 29)], {}, marks=_SLOW),
    pytest.param("maximum", [(40, 1), (1, 50)], {}, marks=_SLOW),
    pytest.param("mean", [(6, 700)], {"axis": -1}, marks=_SLOW),
    pytest.param("logsumexp", [(50, 40)], {"axis": 1}, marks=_SLOW),
    pytest.param("log_softmax", [(33, 64)], {"axis": 0}, marks=_SLOW),
    pytest.param("layer_norm", [(70, 16)], {}, marks=_SLOW),
    pytest.param("rms_norm", [(70, 16)], {}, marks=_SLOW),
]


@pytest.mark.parametrize("name, shapes, params", PARALLEL_CASES)
def test_parallel_chunks_agree_with_one_chunk(name, shapes, params, monkeypatch):
    rng = np.random.default_rng(11)
    # every op here takes any real input; which values does not matter for this comparison
    inputs = [rng.uniform(-3, 3, s).astype(np.float32) for s in shapes]
    out1 = fastlib.forward(name, inputs, **params)
    grad = rng.standard_normal(out1.shape).astype(np.float32)
    grads1 = fastlib.vjp(name, inputs, grad, **params)
    # Three chunks even on a two-core machine (uneven splits, more chunks than threads).
    monkeypatch.setattr(config, "PARALLEL_MIN_SIZE", 0)
    monkeypatch.setattr(config, "PARALLEL_MIN_CHUNK", 1)
    monkeypatch.setattr(config, "THREADS", 3)
    assert config.num_chunks(inputs[0].size) > 1
    out3 = fastlib.forward(name, inputs, **params)
    grads3 = fastlib.vjp(name, inputs, grad, **params)
    # Elementwise and row kernels compute each entry the same way in any chunk: equal bits.
    # Sums split across chunks change the pairwise tree: float64 accumulation keeps the
    # float32 result within one rounding (reduce.py's NOTE).
    tol = 0.0 if name not in ("sum", "mean") else EPS32
    assert _relerr(out3, out1) <= tol
    for a, b in zip(grads3, grads1):
        assert _relerr(a, b) <= tol


@settings(max_examples=10)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**32 - 1))
def test_sum_is_correctly_rounded_for_float32(n, seed):
    """float64 pairwise accumulation: the float32 sum equals the exact sum rounded once
    (to within one float32 ulp), whatever n."""
    x = np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)
    exact = float(np.sum(x.astype(np.longdouble)))  # independent: NumPy long double sum
    got = float(fastlib.forward("sum", [x]))
    assert abs(got - exact) <= np.spacing(np.float32(abs(exact))) + 1e-12 * np.abs(x).sum()


def test_bound_op_matches_forward_and_vjp_and_checks_grad():
    from fastlib.ops import bind
    rng = np.random.default_rng(5)
    for name in ("tanh", "matmul", "softmax", "cross_entropy", "sum"):
        inputs, params = spec.sample_case(name, rng)
        bound = bind(name, inputs, **params)
        out = fastlib.forward(name, inputs, **params)
        np.testing.assert_array_equal(bound.forward(), out)
        grad = rng.standard_normal(out.shape)
        for got, want in zip(bound.vjp(grad), fastlib.vjp(name, inputs, grad, **params)):
            if want is None:
                assert got is None
            else:
                np.testing.assert_array_equal(got, want)
        with pytest.raises(ValueError, match=rf"{name}: grad has shape"):
            bound.vjp(np.ones(out.shape + (2,)))


def test_long_sums_do_not_depend_on_the_thread_count(monkeypatch):
    """The summation order of a long row is fixed by the shape, not by the idle cores: the same
    float64 input sums to the same bits with one thread and with many."""
    from fastlib import config
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 200_000)) * 10.0 ** rng.integers(-8, 8, (2, 200_000))
    results = []
    for threads in (1, 2, 8):
        monkeypatch.setattr(config, "num_threads", lambda threads=threads: threads)
        results.append(fastlib.forward("sum", [x], axis=1))
    assert all(np.array_equal(results[0], r) for r in results[1:])
