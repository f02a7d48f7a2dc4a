"""The special-values table: inputs where engines usually go wrong, per op and dtype.

Labelled, deterministic op calls (saturation, logits far apart, tiny and huge magnitudes,
zeros, kinks and ties, broadcasting, long reductions), each checked like a random call:
forward and every VJP against exact values, under the bounds of ``bounds``.

The long story: docs/reports-accuracy.md, section ``reports/conformance/special_values.py``.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import optable

from reports.conformance.strategies import OpExample, representable

__all__ = ["special_cases", "CATEGORIES"]

CATEGORIES = ("saturation", "logits ±1e4", "tiny", "huge", "zeros", "kinks", "ties",
              "long reduction", "long row", "long elementwise", "broadcast", "broadcast sum",
              "zero cotangent", "dominant logit", "targets at the domain's edge",
              "confident negatives", "offset rows", "divisor squared out of range",
              "near targets")

SATURATING = optable.names(saturating=True)       # the op table's flags
SCALE_FREE = optable.names(scale_free=True)
LONG = 4096
LONG_PERIOD = 64   # distinct (x, cotangent) pairs of the long elementwise case
BROADCAST_ROWS, BROADCAST_COLS = 130, 24   # the "broadcast sum" case of the binary ops


def _parallel_min_size():
    """fastlib's threshold for splitting an elementwise kernel across threads (read from the
    engine, so a change of the constant moves the case with it)."""
    from fastlib.config import PARALLEL_MIN_SIZE

    return int(PARALLEL_MIN_SIZE)


def _sum_block():
    """fastlib's pairwise-summation block (read from the engine, so the "long row" case
    crosses the block boundary whatever the constant becomes)."""
    from fastlib.kernels.reduce import _BLOCK

    return int(_BLOCK)


# tiny and huge magnitudes per format: squares (and products of two) stay normal numbers. float16
# has only four decades either side of 1 for that (sqrt of 6.1e-5 is 7.8e-3, of 65504 is 256).
_MAGNITUDES = {"float64": (1e-150, 1e150), "float32": (1e-15, 1e15),
               "bfloat16": (1e-15, 1e15), "float16": (1e-2, 1e2)}


def _magnitudes(dtype):
    return _MAGNITUDES[np.dtype(dtype).name]


def _half_ulp(dtype):
    """Half of half an ulp of 1 (eps / 4 = 2**-(p + 1)): below the dtype's rounding of 1 + it."""
    return 2.0 ** -(optable.formats.format_of(dtype).precision + 1)


def _grad_for(name, inputs, params, rng, dtype):
    import spec

    shape = spec.OPS[name].check_shapes([np.shape(x) for x in inputs], params)
    return rng.standard_normal(shape).astype(dtype)


def _raw_cases(name, dtype):
    """(label, inputs as float64/int arrays, params) before casting and filtering."""
    tiny, huge = _magnitudes(dtype)
    f64 = np.dtype(dtype) == np.float64
    fmt = optable.formats.format_of(dtype)
    a = np.array
    cases = []
    subnormal = 3 * fmt.smallest_subnormal
    if name in SATURATING:
        # NOTE: one case per magnitude: a result at -80 is never judged beside one at +80
        sat = [-80.0, -30.0, -25.0, -17.0, -10.0, 10.0, 25.0, 30.0, 80.0]
        sat += [-700.0, 700.0] if f64 else []
        cases += [("saturation", [a(v)], {}) for v in sat]
        cases += [("zeros", [a(v)], {}) for v in (0.0, -0.0)]
        cases += [("tiny", [a(v)], {}) for v in (tiny, -tiny, 1e-5, -1e-5, subnormal,
                                                 -subnormal)]
        cases += [("huge", [a(v)], {}) for v in (huge, -huge)]
    if name in SCALE_FREE:
        positive = name in ("sqrt", "log")
        small = [tiny, 3 * tiny, subnormal] if positive else [tiny, -tiny, subnormal, -subnormal]
        cases += [("tiny", [a(v)], {}) for v in small]
        cases += [("huge", [a(v)], {}) for v in ([huge, 3 * huge] if positive
                                                 else [huge, -huge])]
        if positive:
            cases.append(("near 1", [a([1.0, 1.0 + 2.0 ** -20, 1.0 - 2.0 ** -20])], {}))
        else:
            cases.append(("zeros", [a([0.0, -0.0, 1.0])], {}))
        if "zero" in optable.OPS[name].kinks:
            cases.append(("kinks", [a([0.0, -0.0, 0.5, -0.5])],
                          {"negative_slope": 0.2} if name == "leaky_relu" else {}))
    if name in SATURATING or name in SCALE_FREE:
        # past the size where fastlib's elementwise kernels split the work across threads, with
        # a ragged tail: one wrong entry among tens of thousands must fail on its own bound
        n = _parallel_min_size() + 37
        top = 20.0 if fmt.max > 1e9 else 10.0      # float16: exp(20) is past its 65504
        period = (np.geomspace(1e-3, top, LONG_PERIOD) if name in ("sqrt", "log") else
                  np.concatenate([np.geomspace(1e-3, top, LONG_PERIOD - 21),
                                  -np.geomspace(1e-3, top, 21)]))
        cases.append(("long elementwise", [np.resize(period, n)], {}))
    if optable.OPS[name].category == "binary":
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
        # long broadcast sums: a column against a row, each VJP summed over the other's length
        # (BROADCAST_ROWS terms past the bounds' summation block): random signs cancel, so a
        # VJP an engine promises rounded once cannot hide a float32 accumulation in the slack
        rng = np.random.default_rng(7)
        cases.append(("broadcast sum", [rng.standard_normal((BROADCAST_ROWS, 1)),
                                        rng.standard_normal((1, BROADCAST_COLS))], {}))
        if name == "div":
            # divisors whose square underflows or overflows the format (b is representable,
            # b * b is not): d/db = -g a / b² formed as -g a / (b * b) is inf or 0 there, and
            # -g (a / b) / b is not
            small, big = np.sqrt(fmt.tiny) / 256, np.sqrt(fmt.max) * 256
            cases.append(("divisor squared out of range", [a([small, big, 2.0]),
                                                           a([small, big, big])], {}))
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
    if name in ("sum", "mean", "logsumexp", "softmax", "log_softmax", "layer_norm",
                "rms_norm"):
        # random rows one summation block and a ragged tail long (fastlib's own block size):
        # every entry matters, so a block that drops, repeats or misplaces one entry fails
        rng = np.random.default_rng(11)
        row = {"axis": 1} if name in ("sum", "mean", "logsumexp") else {}
        cases.append(("long row", [rng.standard_normal((2, _sum_block() + 37))], row))
    if name == "mse":
        v = np.full(LONG, np.sqrt(_half_ulp(dtype)))
        v[0] = 1.0
        cases += [("long reduction", [v, np.zeros(LONG)], {}),
                  ("huge", [a([huge, -huge]) * 1e-1, a([-huge, 1.0]) * 1e-1], {}),
                  ("zeros", [a([0.0, 1.0]), a([0.0, 1.0])], {})]
        # predictions within a few ulp of their targets, far from 0: the loss is the square
        # of a tiny difference; p² - 2pt + t² cancels to noise (or below 0) there
        rng = np.random.default_rng(17)
        p = 3 + rng.standard_normal(8)
        cases.append(("near targets", [p, p * (1 + 2.0 ** -(fmt.precision - 4))], {}))
    if name in ("logsumexp", "softmax", "log_softmax"):
        rows = a([[1e4, -1e4, 0.0, 1e4], [-1e4, -1e4, -1e4, -1e4], [1000.0, 1001.0, 1002.0, 0.0]])
        axis = {"axis": -1} if name != "logsumexp" else {"axis": 1}
        cases += [("logits ±1e4", [rows], axis), ("logits ±1e4", [rows.T.copy()],
                                                   {"axis": 0}),
                  ("ties", [a([[2.0, 2.0, 2.0]])], axis)]
    if name in ("cross_entropy", "categorical_cross_entropy"):
        z = a([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1000.0, 1001.0, 1002.0]])
        # a strongly dominant logit: the loss is about 8.5e-18 (float64) / 1.8e-7 (float32)
        # and one so dominant that the others' probabilities underflow (0 · log 0 must not
        # turn into NaN)
        dom = a([[40.0, 0.0, 0.0], [800.0, 0.0, -1.0]]) if f64 else \
            a([[16.0, 0.0, 0.0], [120.0, 0.0, -1.0]])
        if name == "cross_entropy":
            cases += [("logits ±1e4", [z, a([[1], [0], [0]])], {}),
                      ("logits ±1e4", [z, a([0, 2, 2])], {}),
                      ("dominant logit", [dom, a([0, 0])], {})]
        else:
            t = a([[0.0, 1.0, 0.0], [0.5, 0.25, 0.25], [0.0, 0.0, 1.0]])
            # rows that miss 1 by up to the validator's tolerance (1e-3), in the dtype
            off = a([[0.2, 0.3, 0.4995], [0.0, 0.0, 1.0009]])
            cases += [("logits ±1e4", [z, t], {}),
                      ("dominant logit", [dom, a([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])], {}),
                      ("targets at the domain's edge", [a([[0.5, -1.0, 2.0], [3.0, 0.0, -2.0]]),
                                                        off], {})]
    if name == "binary_cross_entropy_with_logits":
        cases.append(("logits ±1e4", [a([1e4, -1e4, 1e4, -1e4, 0.0]),
                                      a([1.0, 0.0, 0.0, 1.0, 0.5])], {}))
    if name == "binary_cross_entropy":
        below = 1.0 - fmt.unit_roundoff       # the largest number below 1
        # in the 16-bit formats 1 - 2**-20 is 1 and (float16) 1e-30 is 0: the nearest numbers
        # the format has inside (0, 1) stand for them
        near_one = 1 - 2.0 ** -20 if fmt.precision > 21 else below
        small = 1e-30 if fmt.tiny < 1e-30 else subnormal
        cases.append(("saturation", [a([1e-7, near_one, small, 0.5]),
                                     a([0.0, 1.0, 1.0, 0.0])], {}))
        # probabilities exactly 0 and 1 as targets, predictions one ulp inside (0, 1)
        cases.append(("targets at the domain's edge",
                      [a([below, below, subnormal, subnormal]), a([1.0, 0.0, 0.0, 1.0])], {}))
        # a loss of tiny terms only (about 1e-20): log(1 - p) instead of log1p(-p) returns 0
        cases.append(("tiny", [a([1e-20, 3e-21, below]), a([0.0, 0.0, 1.0])], {}))
        # confident negatives, every term -log(1 - p) for small p (a classifier's usual
        # state): 1 - p rounds away p's last digits, so log(1 - p) is off by about eps / p
        # relative where log1p(-p) is not (float16 has normal numbers only from 6.1e-5)
        confident = ([1e-4, 2e-4, 5e-4, 1e-3, 3e-4] if fmt.tiny > 1e-6 else
                     [1e-4, 2e-4, 3e-5, 5e-4, 1e-6, 1e-7])
        cases.append(("confident negatives", [a(confident), np.zeros(len(confident))], {}))
    if name == "binary_cross_entropy_with_logits":
        cases.append(("dominant logit", [a([40.0 if f64 else 16.0, -40.0 if f64 else -16.0]),
                                         a([1.0, 0.0])], {}))
    if name in ("layer_norm", "rms_norm"):
        cases += [("zeros", [a([[0.0, 0.0, 0.0], [3.0, 3.0, 3.0]])], {}),
                  ("huge", [a([[1.0, 2.0, 4.0]]) * huge], {}),
                  ("tiny", [a([[1.0, -2.0, 4.0]]) * tiny], {"eps": 1e-5})]
        # rows whose mean is large against their spread (2**(p/2) + N(0, 1)): a one-pass
        # variance E[x²] - E[x]² cancels there to about its own size. (Cases are only ever
        # appended: recorded findings name a case by its place in the list.)
        rng = np.random.default_rng(13)
        offset = 2.0 ** (fmt.precision // 2)
        cases.append(("offset rows", [offset + rng.standard_normal((3, 64))], {}))
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

    from reports.conformance.oracle import representable as results_representable
    from reports.conformance.strategies import make_example

    dtype = np.dtype(dtype)
    op = spec.OPS[name]
    rng = np.random.default_rng(0)
    out = []
    for label, inputs, params in _raw_cases(name, dtype):
        inputs = [representable(x, op.domains[n], dtype) if op.domains[n] != "class_index"
                  else x for n, x in zip(op.inputs, inputs)]
        cast = tuple(x if op.domains[n] == "class_index"
                     else np.asarray(x, np.float64).astype(dtype)
                     for n, x in zip(op.inputs, inputs))
        grad = _grad_for(name, cast, params, rng, dtype)
        if label == "long elementwise":   # a short cotangent period: the oracle's cost stays small
            grad = np.resize(grad.reshape(-1)[:LONG_PERIOD], grad.shape).astype(dtype)
        out.append(OpExample(name, cast, grad, dict(params), 0, False, label))
    example = op.examples[0]
    base = make_example(name, example.shapes, dict(example.params), 0, dtype)
    out.append(OpExample(name, base.inputs, np.zeros_like(base.grad), base.params, 0, False,
                         "zero cotangent"))
    return results_representable(out, dtype)


# ---------------------------------------------------------------------------------------------
# non-finite inputs (docs/CONTRACTS.md, "Non-finite inputs")

def _limits_at_infinity(name):
    """``(f(+inf), f(-inf))`` of unary op ``name`` from spec's formula, by SymPy's ``limit``
    (x = ±t with t > 0, so piecewise formulas pick their branch; a max or min is written with
    absolute values first); ``None`` for -inf when the
    op's domain is not the whole real line."""
    import sympy

    import spec
    from spec.backends import SYMPY

    op = spec.OPS[name]
    x, t = sympy.Symbol("x", real=True), sympy.Symbol("t", positive=True)
    f = op.run_forward(SYMPY, [np.array([x], dtype=object)], op.resolve_params({}))[0]

    def limit(expr):
        if expr.has(sympy.Max, sympy.Min):   # SymPy's series of a max at infinity can fail
            expr = expr.rewrite(sympy.Abs)
        return float(sympy.limit(expr, t, sympy.oo))

    up = limit(f.subs(x, t))
    if op.domains["x"] != "real":
        return up, None
    return up, limit(f.subs(x, -t))


class _Limits(Mapping):
    """Unary op name -> ``(f(+inf), f(-inf))``, each derived once, when first asked."""

    def __init__(self):
        self._names = optable.names(category="unary")
        self._found = {}

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        if name not in self._found:
            self._found[name] = _limits_at_infinity(name)
        return self._found[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


#: f(+inf), f(-inf) of the elementwise ops (None: outside the domain, not asked). An engine
#: that propagates non-finite values must return these limits. They are not written here:
#: spec's formulas know them, so a new unary op gets its limits with no edit (a zero limit
#: is any zero: the check does not ask for its sign).
LIMITS = _Limits()
#: Where NaN is accepted instead of the limit: the op's formula, evaluated as written in
#: floating point, is an indeterminate form there (x·σ(x) at -inf is -inf · 0). This is a fact
#: about the floating-point formula, not the mathematical limit, so it is listed by hand.
NAN_ALLOWED = {("silu", -1), ("gelu", -1), ("gelu_tanh", -1)}


def nonfinite_cases(name, dtype):
    """Calls of elementwise op ``name`` with NaN and ±inf among finite entries (label
    ``non-finite``), or [] for other ops. Checked by ``properties.check_nonfinite``."""
    if name not in LIMITS:
        return []
    dtype = np.dtype(dtype)
    positive = LIMITS[name][1] is None
    x = np.array([np.nan, 0.5, np.inf, 2.0] if positive else [np.nan, 0.5, np.inf, -np.inf, -1.5])
    rng = np.random.default_rng(1)
    grad = rng.standard_normal(x.shape).astype(dtype)
    return [OpExample(name, (x.astype(dtype),), grad, {}, 0, False, "non-finite")]
