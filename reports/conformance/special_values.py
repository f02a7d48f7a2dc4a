"""The special-values table: inputs where engines usually go wrong, per op and dtype.

Each case is a labelled, deterministic op call (an ``OpExample``) checked like a random one:
forward and every VJP against the exact values, under the bounds of ``bounds``. Categories:

- ``saturation``: the activations at ±10, ±25, ±30, ±80 (and ±700 in float64), where exp
  overflows if unguarded and 1 - tanh² or σ(1 - σ) cancel;
- ``logits ±1e4``: softmax, log_softmax, logsumexp and the losses on logits so far apart that
  every unshifted exp overflows or underflows; rows of ties and a shifted row (1000, 1001, 1002);
- ``tiny`` / ``huge``: magnitudes 1e-15 / 1e15 (float32) and 1e-150 / 1e150 (float64), chosen
  so that squares stay in range: scale-invariant ops must keep their relative accuracy;
- ``zeros``: 0 and -0 inputs, constant and all-zero rows in the normalisations, a zero
  cotangent (every VJP must then be exactly 0);
- ``kinks`` and ``ties``: relu, abs, leaky_relu at exactly 0, ``maximum`` with a == b
  (broadcast too): the conventions of docs/CONTRACTS.md, which the exact oracle follows;
- ``broadcast``: the binary ops on (2, 3) with (3,) and (2, 1) with (1, 3); matmul of a batch
  against a shared (k, n) matrix and of two batches (the VJPs sum over what was broadcast);
- ``long reduction``: sums over 4096 entries, one 1 and the rest half an ulp of 1
  (2**-25 in float32, 2**-54 in float64): recursive accumulation in the dtype loses every
  half ulp (error ~2000 eps), pairwise or wider accumulation loses none; rows and columns
  layouts, ``sum`` ``mean`` and ``mse``.

Cases whose exact output or gradient is not representable in the dtype (exp(80) in float32
overflows) are left out by ``special_cases``, which evaluates the oracle to decide.
"""
from __future__ import annotations

import numpy as np

from reports.conformance.strategies import OpExample

__all__ = ["special_cases", "CATEGORIES"]

CATEGORIES = ("saturation", "logits ±1e4", "tiny", "huge", "zeros", "kinks", "ties",
              "long reduction", "broadcast", "zero cotangent")

SATURATING = ("exp", "tanh", "sigmoid", "softplus", "silu", "gelu", "gelu_tanh")
SCALE_FREE = ("neg", "abs", "relu", "leaky_relu", "identity", "square", "sqrt", "log")
LONG = 4096


def _magnitudes(dtype):
    return (1e-15, 1e15) if np.dtype(dtype) == np.float32 else (1e-150, 1e150)


def _half_ulp(dtype):
    return 2.0 ** -25 if np.dtype(dtype) == np.float32 else 2.0 ** -54


def _grad_for(name, inputs, params, rng, dtype):
    import spec

    shape = spec.OPS[name].check_shapes([np.shape(x) for x in inputs], params)
    return rng.standard_normal(shape).astype(dtype)


def _raw_cases(name, dtype):
    """(label, inputs as float64/int arrays, params) before casting and filtering."""
    tiny, huge = _magnitudes(dtype)
    f64 = np.dtype(dtype) == np.float64
    a = np.array
    cases = []
    if name in SATURATING:
        sat = [-80.0, -30.0, -25.0, -10.0, 10.0, 25.0, 30.0, 80.0]
        sat += [-700.0, 700.0] if f64 else []
        cases += [("saturation", [a(sat)], {}), ("zeros", [a([0.0, -0.0])], {}),
                  ("tiny", [a([tiny, -tiny])], {}), ("huge", [a([huge, -huge])], {})]
    if name in SCALE_FREE:
        positive = name in ("sqrt", "log")
        cases += [("tiny", [a([tiny, 3 * tiny] if positive else [tiny, -tiny])], {}),
                  ("huge", [a([huge, 3 * huge] if positive else [huge, -huge])], {})]
        if positive:
            cases.append(("near 1", [a([1.0, 1.0 + 2.0 ** -20, 1.0 - 2.0 ** -20])], {}))
        else:
            cases.append(("zeros", [a([0.0, -0.0, 1.0])], {}))
        if name in ("relu", "abs", "leaky_relu"):
            cases.append(("kinks", [a([0.0, -0.0, 0.5, -0.5])],
                          {"negative_slope": 0.2} if name == "leaky_relu" else {}))
    if name in ("add", "sub", "mul", "div", "maximum"):
        x = a([[1.5, -2.0, 0.25], [3.0, -0.5, 1.0]])
        cases += [("huge & tiny", [a([huge, -huge, 1.0]), a([tiny, 1.0, -tiny])], {}),
                  ("zeros", [a([0.0, -0.0, 2.0]), a([1.0, 2.0, -1.0]) if name == "div"
                             else a([0.0, 0.0, -0.0])], {})]
        cases += [("broadcast", [x, a([0.5, -1.5, 2.0])], {}),
                  ("broadcast", [a([[1.5], [-0.75]]), a([[0.5, 2.0, -1.25]])], {})]
        if name == "maximum":
            cases += [("ties", [x, x.copy()], {}), ("ties", [x, x[0].copy()], {}),
                      ("ties", [a(2.0), a([2.0, 1.0, 3.0])], {})]
        if name in ("add", "sub"):
            cases.append(("cancellation", [x, -x if name == "add" else x.copy()], {}))
    if name in ("sum", "mean"):
        v = np.full(LONG, _half_ulp(dtype))
        v[0] = 1.0
        # NOTE: in float64 the strided (columns) case has 128 rows only: NumPy (so reflib's
        # float64 mode) adds a strided axis recursively, whose error over 4096 rows (~1000 eps)
        # is within the classical bound but not the blocked-pairwise one. In float32 both
        # columns carry the pattern, so recursive float32 accumulation cannot hide in the norm.
        cols = np.stack([v, v], axis=1) if not f64 else np.stack([v[:128], v[127::-1]], axis=1)
        cases += [("long reduction", [v], {}),
                  ("long reduction", [cols], {"axis": 0}),
                  ("long reduction", [np.stack([v, -v])], {"axis": 1, "keepdims": True}),
                  ("cancellation", [a([huge, 1.0, -huge])], {}),
                  ("tiny", [a([[tiny, 2 * tiny], [-tiny, tiny]])], {"axis": 0})]
    if name == "mse":
        v = np.full(LONG, np.sqrt(_half_ulp(dtype)))
        v[0] = 1.0
        cases += [("long reduction", [v, np.zeros(LONG)], {}),
                  ("huge", [a([huge, -huge]) * 1e-1, a([-huge, 1.0]) * 1e-1], {}),
                  ("zeros", [a([0.0, 1.0]), a([0.0, 1.0])], {})]
    if name in ("logsumexp", "softmax", "log_softmax"):
        rows = a([[1e4, -1e4, 0.0, 1e4], [-1e4, -1e4, -1e4, -1e4], [1000.0, 1001.0, 1002.0, 0.0]])
        axis = {"axis": -1} if name != "logsumexp" else {"axis": 1}
        cases += [("logits ±1e4", [rows], axis), ("logits ±1e4", [rows.T.copy()],
                                                   {"axis": 0}),
                  ("ties", [a([[2.0, 2.0, 2.0]])], axis)]
    if name in ("cross_entropy", "categorical_cross_entropy"):
        z = a([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1000.0, 1001.0, 1002.0]])
        if name == "cross_entropy":
            cases += [("logits ±1e4", [z, a([[1], [0], [0]])], {}),
                      ("logits ±1e4", [z, a([0, 2, 2])], {})]
        else:
            t = a([[0.0, 1.0, 0.0], [0.5, 0.25, 0.25], [0.0, 0.0, 1.0]])
            cases.append(("logits ±1e4", [z, t], {}))
    if name == "binary_cross_entropy_with_logits":
        cases.append(("logits ±1e4", [a([1e4, -1e4, 1e4, -1e4, 0.0]),
                                      a([1.0, 0.0, 0.0, 1.0, 0.5])], {}))
    if name == "binary_cross_entropy":
        cases.append(("saturation", [a([1e-7, 1 - 2.0 ** -20, 1e-30, 0.5]),
                                     a([0.0, 1.0, 1.0, 0.0])], {}))
    if name in ("layer_norm", "rms_norm"):
        cases += [("zeros", [a([[0.0, 0.0, 0.0], [3.0, 3.0, 3.0]])], {}),
                  ("huge", [a([[1.0, 2.0, 4.0]]) * huge], {}),
                  ("tiny", [a([[1.0, -2.0, 4.0]]) * tiny], {"eps": 1e-5})]
    if name == "matmul":
        batch = np.arange(12.0).reshape(2, 2, 3) / 4 - 1
        shared = a([[1.0, -0.5], [0.25, 2.0], [-1.5, 0.75]])
        cases += [("broadcast", [batch, shared], {}),
                  ("broadcast", [batch, np.stack([shared, 2 * shared[::-1]])], {}),
                  ("huge & tiny", [a([[huge, tiny], [1.0, -1.0]]), a([[tiny, 1.0], [huge, 2.0]])],
                   {}),
                  ("zeros", [np.zeros((2, 3)), a([[1.0], [2.0], [3.0]])], {})]
    return cases


def special_cases(name, dtype):
    """The special-value calls of op ``name`` in ``dtype`` (``OpExample`` with a ``label``).

    Every op also gets a ``zero cotangent`` case (random inputs from its domain, grad 0).
    Cases whose exact results overflow the dtype are left out.
    """
    import spec

    from reports.conformance.oracle import exact_vjp
    from reports.conformance.strategies import make_example

    dtype = np.dtype(dtype)
    op = spec.OPS[name]
    rng = np.random.default_rng(0)
    out = []
    for label, inputs, params in _raw_cases(name, dtype):
        cast = tuple(x if op.domains[n] == "class_index"
                     else np.asarray(x, np.float64).astype(dtype)
                     for n, x in zip(op.inputs, inputs))
        grad = _grad_for(name, cast, params, rng, dtype)
        out.append(OpExample(name, cast, grad, dict(params), 0, False, label))
    example = op.examples[0]
    base = make_example(name, example.shapes, dict(example.params), 0, dtype)
    out.append(OpExample(name, base.inputs, np.zeros_like(base.grad), base.params, 0, False,
                         "zero cotangent"))
    big = float(np.finfo(dtype).max)
    kept = []
    for ex in out:
        exact = exact_vjp(name, ex.inputs, ex.grad, ex.params)
        arrays = [exact.out[0]] + [g[0] for g in exact.grads if g is not None]
        if all(np.all(np.abs(v) <= big) for v in arrays):
            kept.append(ex)
    return kept
