"""Exact values of one element of an op's output or VJP, written here from the definitions
with mpmath and nothing else from the project (not spec, not the suite's oracle), so the peer
findings are checked against a second, independent source.

An output element is the forward formula at 80 digits; a VJP element ``d/dx_k[j]`` is the
derivative of ``<g, f(x)>`` in the single entry ``x_k[j]``, by mpmath's numerical
differentiation with a step 1e-30 relative to that entry (truncation ~1e-60), at 80 digits
plus those the step cancels.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np

DPS = 80


def _v(fn):
    return np.frompyfunc(fn, 1, 1)


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in ((axis,) if isinstance(axis, int) else axis))


def _sum(x, axis=None, keepdims=False):
    axes = _axes(axis, x.ndim)
    out = x
    for a in sorted(axes, reverse=True):
        out = np.add.reduce(out, axis=a, keepdims=True) if out.shape[a] else out
    if not keepdims:
        out = out.reshape([n for i, n in enumerate(x.shape) if i not in axes])
    return np.asarray(out, dtype=object)


def _count(x, axis):
    return math.prod(x.shape[a] for a in _axes(axis, x.ndim))


def _log_softmax(x, axis=-1):
    return x - _v(mpmath.log)(_sum(_v(mpmath.exp)(x), axis, keepdims=True))


def _maximum(a, b):
    return np.frompyfunc(lambda u, v: u if u >= v else v, 2, 1)(a, b)


def _slice(x, axis=0, start=0, stop=None, step=1):
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop, step)
    return x[tuple(index)]


def _layer_norm(x, eps=1e-5):
    mu = _sum(x, -1, True) / x.shape[-1]
    c = x - mu
    return c / _v(mpmath.sqrt)(_sum(c * c, -1, True) / x.shape[-1] + mpmath.mpf(eps))


def _cross_entropy(z, t):
    logp = _log_softmax(z)
    rows = np.asarray(t).reshape(-1).astype(int)
    return -mpmath.fsum(logp[n, rows[n]] for n in range(z.shape[0])) / z.shape[0]


SQRT2 = lambda: mpmath.sqrt(2)  # noqa: E731 - evaluated at the working precision
# NOTE: softplus as log1p(exp(v)): log(1 + exp(-700)) would round 1 + 1e-304 to 1 at any
# precision short of 300 digits and give 0
FORMULAS = {
    "neg": lambda x: -x,
    "exp": lambda x: _v(mpmath.exp)(x),
    "log": lambda x: _v(mpmath.log)(x),
    "sqrt": lambda x: _v(mpmath.sqrt)(x),
    "square": lambda x: x * x,
    "abs": lambda x: _v(abs)(x),
    "relu": lambda x: _v(lambda v: v if v > 0 else 0 * v)(x),
    "leaky_relu": lambda x, negative_slope=0.01: _v(
        lambda v: v if v > 0 else mpmath.mpf(negative_slope) * v)(x),
    "silu": lambda x: _v(lambda v: v / (1 + mpmath.exp(-v)))(x),
    # the lower tails without cancellation (1 + erf(-30 / sqrt 2) is 1e-197: 80 digits of
    # 1 + erf keep none of it): erfc, and (1 + tanh u) / 2 as 1 / (1 + exp(-2u))
    "gelu": lambda x: _v(lambda v: v / 2 * mpmath.erfc(-v / SQRT2()))(x),
    "gelu_tanh": lambda x: _v(lambda v: v / (1 + mpmath.exp(  # constant: the decimal
        -2 * mpmath.sqrt(2 / mpmath.pi) * (v + mpmath.mpf("0.044715") * v ** 3))))(x),
    "tanh": lambda x: _v(mpmath.tanh)(x),
    "sigmoid": lambda x: _v(lambda v: 1 / (1 + mpmath.exp(-v)))(x),
    "softplus": lambda x: _v(lambda v: mpmath.log1p(mpmath.exp(v)))(x),
    "identity": lambda x: x,
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "maximum": _maximum,
    "sum": _sum,
    "mean": lambda x, axis=None, keepdims=False: _sum(x, axis, keepdims) / _count(x, axis),
    "logsumexp": lambda x, axis=None, keepdims=False: _v(mpmath.log)(
        _sum(_v(mpmath.exp)(x), axis, keepdims)),
    "matmul": lambda a, b: np.asarray(np.matmul(a, b), dtype=object),
    "transpose": lambda x, axes=None: np.transpose(x, axes),
    "reshape": lambda x, shape: np.reshape(x, shape),
    "concat": lambda a, b, axis=-1: np.concatenate([a, b], axis=axis),
    "slice": _slice,
    "softmax": lambda x, axis=-1: _v(mpmath.exp)(_log_softmax(x, axis)),
    "log_softmax": _log_softmax,
    "layer_norm": _layer_norm,
    "rms_norm": lambda x, eps=1e-6: x / _v(mpmath.sqrt)(_sum(x * x, -1, True) / x.shape[-1]
                                                        + mpmath.mpf(eps)),
    "mse": lambda p, t: _sum((p - t) * (p - t)) / p.size,
    "cross_entropy": _cross_entropy,
    "categorical_cross_entropy": lambda z, t: -_sum(t * _log_softmax(z)) / z.shape[0],
    "binary_cross_entropy": lambda p, t: -_sum(
        t * _v(mpmath.log)(p) + (1 - t) * _v(mpmath.log)(1 - p)) / p.size,
    "binary_cross_entropy_with_logits": lambda z, t: _sum(
        _v(lambda v: mpmath.log1p(mpmath.exp(v)))(z) - z * t) / z.size,
}
CLASS_INDEX = {"cross_entropy": (1,)}


def _mp(x):
    arr = np.asarray(x)
    if arr.dtype.kind in "iu":
        return arr
    out = np.empty(arr.shape, dtype=object)
    out.reshape(-1)[:] = [mpmath.mpf(float(v)) for v in arr.astype(np.float64).reshape(-1)]
    return out


def exact_element(op, inputs, grad, params, what, index):
    """The exact value (an mpf) of one element of op ``op`` at ``inputs``.

    ``what`` is ``"output"`` or ``("grad", k)`` for the VJP of input ``k`` (cotangent
    ``grad``); ``index`` is the element's index (``()`` for a 0-d array).
    """
    fn = FORMULAS[op]
    index = tuple(index)
    args = [_mp(x) for x in inputs]
    if what == "output":
        with mpmath.workdps(DPS):
            return np.asarray(fn(*args, **params), dtype=object)[index]
    k = what[1]
    g = np.asarray(_mp(grad), dtype=object).reshape(-1)
    base = args[k][index]
    # NOTE: a step relative to the entry (1e-30 of it; 1e-30 at 0), and enough digits that
    # f(x + h) - f(x - h) keeps 50 of them after cancelling against f's own size
    h = (abs(base) if base else mpmath.mpf(1)) * mpmath.mpf(10) ** -30
    digits = DPS + max(0, int(-mpmath.log10(h)))

    def phi(e):
        moved = list(args)
        moved[k] = args[k].copy()
        moved[k][index] = base + e
        out = np.asarray(fn(*moved, **params), dtype=object).reshape(-1)
        return mpmath.fsum(gi * oi for gi, oi in zip(g, out))

    # NOTE: a slope far below the function's own size (sigmoid'(700) = 1e-304 beside 1) loses
    # that many digits to the difference: the precision grows until two rounds agree
    return _until_settled(lambda: mpmath.diff(phi, 0, h=h), lambda: phi(0), digits)


# ---------------------------------------------------------------------------------------------
# second order: an element of J t or H t, by finite differences of the forward formula at high
# precision (nothing from spec's dual numbers or the suite's running-error bounds)

#: the ops whose every piece is linear: their H t is 0 (by hand: a piecewise-linear function
#: has no curvature off its kinks, and at a kink the registry takes the piece's, 0)
PIECEWISE_LINEAR = ("neg", "identity", "add", "sub", "sum", "mean", "transpose", "reshape",
                    "concat", "slice", "relu", "leaky_relu", "abs", "maximum")
STEP = 30          # a finite-difference step of 1e-30 of the scale it moves


def _scale(arrays):
    """The smallest nonzero magnitude among ``arrays``' entries (1 when all are 0): a step
    far below it moves no entry across 0, where the kinks are."""
    mags = [abs(v) for a in arrays for v in np.asarray(a, dtype=object).reshape(-1) if v != 0]
    return min(mags) if mags else mpmath.mpf(1)


def _moved(args, tans, e):
    # NOTE: object arrays throughout (a 0-d one would collapse to a bare mpf)
    return [a if t is None else np.asarray(a + e * t, dtype=object)
            for a, t in zip(args, tans)]


def exact_jvp_element(op, inputs, tangents, params, index):
    """``(J t)[index]`` of op ``op`` at ``inputs`` (an mpf): ``d/de f(x + e t)[index]`` at 0 by
    mpmath's central differences, the step 1e-30 of the smallest nonzero ``|x|`` over ``|t|``.

    On a kink (relu, abs, leaky_relu at 0; a tie of maximum) the derivative does not exist:
    the registry's convention is returned (``relu'(0) = abs'(0) = 0``, ``leaky_relu'(0) =
    slope``, a tie follows ``a``), the same values the first-order findings use.
    """
    fn = FORMULAS[op]
    index = tuple(index)
    args = [_mp(x) for x in inputs]
    tans = [None if t is None else _mp(t) for t in tangents]
    kink = _jvp_on_kink(op, args, tans, params, index)
    if kink is not None:
        return kink
    moving = [a for a, t in zip(args, tans) if t is not None]
    top = max((abs(v) for t in tans if t is not None
               for v in np.asarray(t, dtype=object).reshape(-1)), default=mpmath.mpf(1))
    scale = _scale(moving) / (top if top else 1)
    h = mpmath.mpf(10) ** -STEP

    def phi(e):
        return np.asarray(fn(*_moved(args, tans, e * scale), **params), dtype=object)[index]

    return _until_settled(lambda: mpmath.diff(phi, 0, h=h) / scale, lambda: phi(0),
                          DPS + STEP + max(0, int(-mpmath.log10(scale))))


def _jvp_on_kink(op, args, tans, params, index):
    if op in ("relu", "abs", "leaky_relu"):
        if args[0][index] != 0:
            return None
        slope = {"relu": 0, "abs": 0}.get(op, mpmath.mpf(params.get("negative_slope", 0.01)))
        return slope * tans[0][index]
    if op == "maximum":
        a, b = np.broadcast_arrays(*args)
        if a[index] != b[index]:
            return None
        ta, _ = np.broadcast_arrays(tans[0], tans[1])
        return ta[index]
    return None


def exact_hvp_element(op, inputs, grad, tangents, params, k, index):
    """``(H t)_k[index]``, the derivative of ``<g, J(x) t>`` in the entry ``x_k[index]`` (an
    mpf): the mixed second difference ``d²/de ds <g, f(x + e t + s δ)>`` at 0 by mpmath, the
    steps 1e-30 of the scales they move (as :func:`exact_jvp_element`, and ``|x_k[index]|``
    for ``s``); 0 for a piecewise-linear op (``PIECEWISE_LINEAR``)."""
    if op in PIECEWISE_LINEAR:
        return mpmath.mpf(0)
    fn = FORMULAS[op]
    index = tuple(index)
    args = [_mp(x) for x in inputs]
    tans = [None if t is None else _mp(t) for t in tangents]
    g = np.asarray(_mp(grad), dtype=object).reshape(-1)
    moving = [a for a, t in zip(args, tans) if t is not None]
    top = max((abs(v) for t in tans if t is not None
               for v in np.asarray(t, dtype=object).reshape(-1)), default=mpmath.mpf(1))
    scale_e = _scale(moving) / (top if top else 1)
    base = args[k][index]
    scale_s = _scale([args[k]]) if base == 0 else abs(base)
    h = mpmath.mpf(10) ** -STEP

    def psi(e, s):
        moved = _moved(args, tans, e * scale_e)
        moved[k] = moved[k].copy()
        moved[k][index] = moved[k][index] + s * scale_s
        out = np.asarray(fn(*moved, **params), dtype=object).reshape(-1)
        return mpmath.fsum(abs(gi * oi) for gi, oi in zip(g, out)) if magnitude else \
            mpmath.fsum(gi * oi for gi, oi in zip(g, out))

    def size():
        nonlocal magnitude
        magnitude = True
        try:
            return psi(0, 0)
        finally:
            magnitude = False

    magnitude = False
    return _until_settled(
        lambda: mpmath.diff(psi, (0, 0), (1, 1), h=h) / (scale_e * scale_s), size,
        DPS + 2 * STEP + max(0, int(-mpmath.log10(scale_e * scale_s))))


#: the most digits a finite difference is given before its estimate is taken as it stands
MAX_DIGITS = 2000


def _until_settled(estimate, size, digits):
    """``estimate()`` at growing precision until two rounds agree to 30 digits.

    A difference quotient of steps ``h`` loses the digits of ``size / (h^n · result)``: a
    small derivative of a large function (softplus'' at 700 is 1e-306 beside 700) needs
    hundreds. Each round gives the digits the last estimate says it lacks; a result that is
    exactly 0 never settles and ends, at ``MAX_DIGITS``, as noise below 1e-1900 of ``size``.
    """
    last = None
    while True:
        with mpmath.workdps(digits):
            value = estimate()
            big = abs(size()) or mpmath.mpf(1)
        if last is not None and abs(value - last) <= abs(value) * mpmath.mpf(10) ** -30:
            return value
        if digits >= MAX_DIGITS:
            return value
        last = value
        lacking = int(mpmath.log10(big / abs(value))) if value else digits
        digits = min(MAX_DIGITS, max(digits + 40, DPS + 2 * STEP + lacking + 40))
