"""Error bounds per op family: how far from exact an engine's answer may be, entry by entry.

One rule, ``entrywise``: ``|got - exact| <= eps * A + tiny`` element by element, with the
admissible error ``A`` derived per op family from the op's conditioning on the input at hand;
the conformance rows and the accuracy report both judge by it.

The long story: docs/reports-accuracy.md, section ``reports/conformance/bounds.py``.
"""
from __future__ import annotations

import math

import numpy as np

import optable

__all__ = ["admissible", "rounded_once", "ROUNDED_ONCE_OPS", "pairwise", "K_TRANSCENDENTAL",
           "FAMILIES", "family_of", "entrywise", "storage", "check_working",
           "underflow_floor", "ulp"]

K_TRANSCENDENTAL = 8.0

_FAMILY_ORDER = ("copy", "rounded", "arithmetic", "transcendental", "reduction", "log-sum-exp",
                 "normalisation", "matmul", "loss")
#: family -> its ops, from the op table's ``family`` field (each family's bound is below)
FAMILIES = {family: optable.names(family=family) for family in _FAMILY_ORDER}


def family_of(name):
    """The bound family of op ``name`` (a key of ``FAMILIES``)."""
    sig = optable.OPS.get(name)
    if sig is None or sig.family not in FAMILIES:
        raise KeyError(f"no bound family for op {name!r}; set its family in optable/table.py "
                       f"(one of {', '.join(FAMILIES)})")
    return sig.family


BLOCK = 128


def pairwise(m):
    """P(m): the blocked-pairwise summation constant in eps units (0 for a single term).

    ``(min(m, BLOCK) + ceil(log2 m)) / 2``: at most ``BLOCK`` terms added one after another,
    then a binary tree (NumPy's and fastlib's layout, PyTorch's cascade sums). Recursive
    accumulation in the dtype over thousands of terms exceeds it.
    """
    m = int(m)
    return 0.0 if m <= 1 else (min(m, BLOCK) + math.ceil(math.log2(m))) / 2


def _sum_to_shape(g, shape):
    """Sum a broadcast array back to ``shape`` (as the VJPs do), for magnitudes."""
    g = np.asarray(g, dtype=np.float64)
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return tuple(sorted(int(a) % ndim for a in axes)) if ndim else ()


def _reduced_count(shape, axes):
    return int(np.prod([shape[a] for a in axes], dtype=np.int64)) if axes else 1


# ---------------------------------------------------------------------------------------------
# families


def _copy(name, x, g, p, y, G, acc=1.0):
    return np.zeros(np.shape(y)), [None if gi is None else np.zeros(np.shape(gi)) for gi in G]


def _rounded(name, x, g, p, y, G, acc=1.0):
    c = 2.0 if name == "sqrt" else 1.0
    return np.abs(y), [c * np.abs(G[0])]


def _arithmetic(name, x, g, p, y, G, acc=1.0):
    a, b = x
    out_shape = np.shape(y)
    g = np.broadcast_to(g, out_shape)
    ab = np.broadcast_to(a, out_shape), np.broadcast_to(b, out_shape)
    partials = {"add": (1.0, 1.0, 0.0, 0.0), "sub": (1.0, 1.0, 0.0, 0.0),
                "maximum": (1.0, 1.0, 0.0, 0.0),
                "mul": (np.abs(ab[1]), np.abs(ab[0]), 1.0, 1.0)}
    if name == "div":
        # |a| / b² as (|a| / |b|) / |b|: b² alone leaves float64's range for |b| beyond 1e154
        # (or below 1e-154) where the slope itself does not
        da, db = 1 / np.abs(ab[1]), (np.abs(ab[0]) / np.abs(ab[1])) / np.abs(ab[1])
        ca, cb = 0.5, 2.0
    else:
        da, db, ca, cb = partials[name]
        if name == "mul":
            ca = cb = 0.5       # g * b, g * a: each term rounded once
    grads = []
    for d, c, xi in ((da, ca, a), (db, cb, b)):
        terms = np.abs(g) * d
        m = int(np.prod(out_shape, dtype=np.int64)) // max(int(np.size(xi)), 1)
        grads.append((c + acc * pairwise(m)) * _sum_to_shape(terms, np.shape(xi)))
    # NOTE: maximum selects one argument: its value is copied, never rounded. The others are
    # IEEE operations, correctly rounded: half an ulp (u = eps / 2), not a whole one.
    return (np.zeros(out_shape) if name == "maximum" else 0.5 * np.abs(y)), grads


def _transcendental(name, x, g, p, y, G, acc=1.0):
    (x,) = x
    K = K_TRANSCENDENTAL
    ax, ay, ag, aG = np.abs(x), np.abs(y), np.abs(g), np.abs(G[0])
    if name == "exp":
        return K * (1 + ax) * ay, [K * (1 + ax) * aG]
    if name == "log":
        return K * (ay + 1), [K * aG]
    # Each bound is the op's conditioning at x: the forward K(|y| + |x f'(x)|), the VJP
    # g f'(x) held to K(|G| + |x f''(x)| |g|) (what rounding x by eps moves it by). Both are
    # relative to the entry's own size wherever f' and f'' fall off together, as they do in
    # every saturating tail: there a VJP formed from the rounded output (s (1 - s),
    # 1 - tanh²) has lost every digit, and it fails, where a stable form keeps a few ulp.
    d1, d2 = _slopes(name, x)
    return K * (ay + ax * np.abs(d1)), [K * (aG + ax * np.abs(d2) * ag)]


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_TANH_A = 0.044715


def _slopes(name, x):
    """(f'(x), f''(x)) of a smooth activation, in float64, from forms without cancellation
    (each sigmoid taken as the pair sigma(z), sigma(-z), never as 1 - sigma(z))."""
    from scipy.special import expit, ndtr

    if name == "tanh":
        e = np.exp(-2 * np.abs(x))
        d1 = 4 * e / (1 + e) ** 2
        return d1, -2 * np.tanh(x) * d1
    if name in ("sigmoid", "softplus", "silu"):
        s, sm = expit(x), expit(-x)
        if name == "sigmoid":
            return s * sm, s * sm * (sm - s)
        if name == "softplus":
            return s, s * sm
        return s * (1 + x * sm), s * sm * (2 + x * (sm - s))
    if name == "gelu":
        pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        # pdf = 0 where x² overflows: the limits are 0 (not 0 * inf)
        return ndtr(x) + x * pdf, np.where(pdf != 0, pdf * (2 - x * x), 0.0)
    if name == "gelu_tanh":
        u2 = 2 * _SQRT_2_OVER_PI * (x + _GELU_TANH_A * x ** 3)
        s, sm = expit(u2), expit(-u2)
        t = s * sm
        du2 = 2 * _SQRT_2_OVER_PI * (1 + 3 * _GELU_TANH_A * x * x)
        curve = 12 * _SQRT_2_OVER_PI * _GELU_TANH_A * x * x
        with np.errstate(invalid="ignore"):     # t = 0 where x³ overflows: the limit is 0
            return (np.where(t != 0, s + x * t * du2, s),
                    np.where(t != 0, t * (2 * du2 + curve + x * du2 ** 2 * (sm - s)), 0.0))
    raise KeyError(f"no slopes for the transcendental op {name!r}")


def _reduction(name, x, g, p, y, G, acc=1.0):
    (x,) = x
    axes = _axes(p.get("axis"), np.ndim(x))
    m = _reduced_count(np.shape(x), axes)
    S = np.sum(np.abs(x), axis=axes, keepdims=p.get("keepdims", False)) if axes else np.abs(x)
    S = np.reshape(S, np.shape(y))
    if name == "sum":
        return acc * pairwise(m) * S, [np.zeros(np.shape(x))]
    return (acc * pairwise(m) + 1) * S / m, [np.abs(G[0])]


def _row_stats(x, axis):
    """(m, d = m - x, p = softmax, w = Σ p d, lse) along ``axis`` (keepdims)."""
    m = np.max(x, axis=axis, keepdims=True)
    d = m - x
    e = np.exp(-d)
    s = np.sum(e, axis=axis, keepdims=True)
    p = e / s
    w = np.sum(p * d, axis=axis, keepdims=True)
    return m, d, p, w, m + np.log(s)


def _lse_family(name, x, g, p_, y, G, acc=1.0):
    if name in ("softmax", "log_softmax"):
        (z,) = x
        axis = p_.get("axis", -1)
        m, d, p, w, lse = _row_stats(z, axis)
        n = z.shape[axis]
        f = 4 + d + w + acc * pairwise(n)
        ag = np.abs(g)
        if name == "softmax":
            return f * np.abs(y), [f * p * (ag + np.sum(ag * p, axis=axis, keepdims=True))]
        return f + np.abs(y), [f * (ag + p * np.sum(ag, axis=axis, keepdims=True))]
    if name == "logsumexp":
        (z,) = x
        axes = _axes(p_.get("axis"), np.ndim(z))
        if not axes:
            return np.abs(y) + 1, [np.abs(G[0])]
        m, d, p, w, lse = _row_stats(z, axes)
        n = _reduced_count(z.shape, axes)
        f_out = 4 + w + acc * pairwise(n) + np.abs(m) + np.abs(lse)
        out = np.reshape(f_out, np.shape(y))
        return out, [np.abs(G[0]) * (4 + np.abs(z - lse) + f_out)]
    z, t = x
    N, C = z.shape
    m, d, p, w, lse = _row_stats(z, -1)
    f = 4 + d + w + acc * pairwise(C)
    ag = abs(float(g))
    # Each row's -log softmax is (m - z_j) + log s with s = 1 + rest, rest the other entries'
    # share: both terms >= 0, each computed to a few roundings of itself when log s is taken
    # as log1p(rest) (exp's argument m - z_j rounds relative to itself: the w = Σ p d term).
    # So a row's loss is held to its own size, never to |m|: with a dominant logit the loss
    # (~1e-17) is far below u |m|, and log(1 + rest) rounded to 0 is a failure, not rounding.
    rest = _share_of_others(z, m)
    log_s = np.log1p(rest)
    if name == "cross_entropy":
        rows = np.arange(N)
        idx = np.asarray(t).reshape(-1).astype(np.int64)
        onehot = np.zeros_like(z)
        onehot[rows, idx] = 1.0
        loss_n = d[rows, idx] + log_s[:, 0]
        terms = loss_n + w[:, 0] + rest[:, 0] / (1 + rest[:, 0])
        out = (6 + acc * (pairwise(C) + pairwise(N))) * (np.abs(y) + terms.sum() / N)
        # the gradient p - onehot: the target's p_t - 1 may round p_t once first (the form
        # every engine writes, softmax minus one-hot), so it keeps an allowance of |p_t|
        return np.asarray(out), [f * ag * (p + onehot) / N, None]
    at = np.abs(t)
    logp = z - lse
    terms = np.sum(at * (np.abs(d) + log_s)) + np.sum(
        np.sum(at, axis=-1) * (w[:, 0] + rest[:, 0] / (1 + rest[:, 0])))
    out = (6 + acc * (pairwise(C) + pairwise(N * C))) * (np.abs(y) + terms / N)
    grad_z = f * ag * (p * np.sum(at, axis=-1, keepdims=True) + at) / N
    grad_t = (4 + w + acc * pairwise(C)) * ag * (np.abs(logp) + 1) / N
    return np.asarray(out), [grad_z, grad_t]


def _share_of_others(z, m):
    """Σ exp(z - m) over each row but for one of its maxima (keepdims): s - 1 without the
    cancellation of subtracting 1 from s."""
    below = np.where(z < m, np.exp(np.minimum(z - m, 0.0)), 0.0).sum(axis=-1, keepdims=True)
    ties = np.sum(z == m, axis=-1, keepdims=True)
    return below + (ties - 1)


def _normalisation(name, x, g, p, y, G, acc=1.0):
    (x,) = x
    D = x.shape[-1]
    eps_param = p.get("eps", 1e-5 if name == "layer_norm" else 1e-6)
    f = 4 + acc * pairwise(D)
    ag, ay = np.abs(g), np.abs(y)
    if name == "layer_norm":
        xc = x - x.mean(-1, keepdims=True)
        r = 1 / np.sqrt((xc ** 2).mean(-1, keepdims=True) + eps_param)
        kappa = np.max(np.abs(x), axis=-1, keepdims=True) * r
        terms = r * (ag + np.abs(ag.mean(-1, keepdims=True))
                     + ay * (ag * ay).mean(-1, keepdims=True))
    else:
        r = 1 / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps_param)
        kappa = np.max(np.abs(x), axis=-1, keepdims=True) * r
        terms = r * (ag + ay * (ag * ay).mean(-1, keepdims=True))
    return f * (ay + kappa), [f * (1 + kappa) * terms]


def _matmul(name, x, g, p, y, G, acc=1.0):
    a, b = (np.abs(v) for v in x)
    ag = np.abs(g)
    k, n, m = a.shape[-1], b.shape[-1], a.shape[-2]
    batch = int(np.prod(a.shape[:-2], dtype=np.int64)) if b.ndim == 2 else 1
    grad_b = np.swapaxes(a, -1, -2) @ ag
    if grad_b.ndim > b.ndim:
        grad_b = grad_b.reshape(-1, *b.shape).sum(axis=0)
    return (acc * k + 2) * (a @ b), [(acc * n + 2) * (ag @ np.swapaxes(b, -1, -2)),
                                     (acc * m * batch + 2) * grad_b]


def _loss(name, x, g, p_, y, G, acc=1.0):
    pred, t = x
    n = pred.size
    ag = abs(float(g))
    f = 4 + acc * pairwise(n)
    if name == "mse":
        return np.asarray(f * abs(float(y))), [2 * np.abs(G[0]), 2 * np.abs(G[1])]
    if name == "binary_cross_entropy":
        # NOTE: every term -t log p, -(1 - t) log1p(-p) is >= 0 (no cancellation) and each is
        # held relative to itself: a loss of tiny terms (p = 1e-20, t = 0: log(1 - p) is 0,
        # log1p(-p) is -1e-20) keeps its relative accuracy
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = (np.nan_to_num(np.abs(t * np.log(pred)))
                     + np.nan_to_num(np.abs((1 - t) * np.log1p(-pred))))
        grad_p = 4 * ag * (np.abs(pred) + np.abs(t)) / (pred * (1 - pred)) / n
        grad_t = 4 * ag * (np.abs(np.log1p(-pred)) + np.abs(np.log(pred)) + 1) / n
        return np.asarray(f * (abs(float(y)) + terms.sum() / n)), [grad_p, grad_t]
    z = pred
    terms = np.maximum(z, 0) + np.abs(z * t) + np.log1p(np.exp(-np.abs(z))) + 1
    with np.errstate(over="ignore"):
        sig = 1 / (1 + np.exp(-np.clip(z, -700, 700)))
    return (np.asarray(f * (abs(float(y)) + terms.sum() / n)),
            [4 * ag * (sig + np.abs(t)) / n, 2 * np.abs(G[1])])


_FAMILY_FUNCS = {"copy": _copy, "rounded": _rounded, "arithmetic": _arithmetic,
                 "transcendental": _transcendental, "reduction": _reduction,
                 "log-sum-exp": _lse_family, "normalisation": _normalisation,
                 "matmul": _matmul, "loss": _loss}


def admissible(name, inputs, grad, params, exact_out, exact_grads, acc=1.0):
    """Per-entry admissible errors (eps units) of the output and of each VJP.

    Parameters
    ----------
    name : str
        Registry op.
    inputs : list of ndarray
        float64 inputs (class indices as integers).
    grad : ndarray
        float64 cotangent.
    params : dict
        The op's params (defaults filled by the caller or taken here).
    exact_out : ndarray
        The exact output (float64 ``hi`` part).
    exact_grads : sequence of ndarray or None
        The exact VJPs (``hi`` parts), None where not differentiable.
    acc : float
        The sums' share: their constants (``P(m)``, a dot product's ``k``) are multiplied by
        it. 1 for an engine that sums in the dtype itself; ``eps_acc / eps`` where it
        accumulates in a wider format (:func:`storage`).

    Returns
    -------
    (ndarray, list of ndarray or None)
        ``A_out`` shaped like the output and one ``A`` per input (None where not differentiable).
    """
    inputs = [np.asarray(v, dtype=np.float64) if optable.formats.is_float(np.asarray(v).dtype)
              else np.asarray(v) for v in inputs]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        out, grads = _FAMILY_FUNCS[family_of(name)](name, inputs, np.asarray(grad, np.float64),
                                                   dict(params or {}), np.asarray(exact_out),
                                                   list(exact_grads), acc=float(acc))
    grads = [None if e is None else np.broadcast_to(np.nan_to_num(a, posinf=np.finfo(float).max),
                                                    np.shape(e))
             for a, e in zip(grads, exact_grads)]
    return np.nan_to_num(np.broadcast_to(out, np.shape(exact_out)),
                         posinf=np.finfo(float).max), grads


# ---------------------------------------------------------------------------------------------
# the 16-bit storage formats: what an engine computes and accumulates in


def check_working(storage_dtype, working, what):
    """The Format an engine declares ``working`` (``computes_in`` / ``accumulates``) for
    ``storage_dtype``; a ValueError unless it is a format of the suite at least as wide."""
    store = optable.formats.format_of(storage_dtype)
    try:
        wide = optable.formats.format_of(working)
    except TypeError:
        wide = None
    if wide is None or wide.precision < store.precision:
        wider = [f for f, v in optable.formats.FORMATS.items() if v.precision >= store.precision]
        raise ValueError(f"{what} declares {working!r} for {store.name}: declare a float format "
                         f"at least as wide ({', '.join(wider)})")
    return wide


def storage(name, inputs, grad, params, exact_out, exact_grads, dtype, computes_in=None,
            accumulates=None):
    """Per-entry admissible errors (eps units of the storage ``dtype``) of a 16-bit op.

    What an engine promises sets the bound (docs/conformance.md, "16-bit formats"):

    - ``computes_in`` (a wider format ``w``): the op is evaluated in ``w`` on the exactly
      widened inputs and each result rounded once to ``dtype``. Its error is the general bound
      in ``w`` plus the rounding: ``(eps_w / eps)(1 + u) A_w + |exact| / 2``, plus
      ``(tiny_w + smallest subnormal) / eps`` for the floors of the two roundings;
    - ``accumulates`` (a wider format ``a``): every sum is accumulated in ``a``, any other
      rounding may be in ``dtype``: the general bound with the sums' constants scaled by
      ``eps_a / eps`` (``admissible(..., acc=)``) plus half an ulp for the rounding of each
      result to ``dtype``;
    - neither: the general bound in ``dtype`` itself (sums in ``dtype``).

    Same arguments as :func:`admissible`, plus the storage ``dtype`` and the declarations (format
    names, or None). Returns ``(A_out, [A_grad | None])``.
    """
    store = optable.formats.format_of(dtype)
    exact = [np.abs(np.asarray(exact_out, np.float64))] + [
        None if e is None else np.abs(np.asarray(e, np.float64)) for e in exact_grads]
    if computes_in is not None:
        wide = check_working(dtype, computes_in, "computes_in")
        ratio = wide.eps / store.eps
        floors = (wide.tiny + store.smallest_subnormal) / store.eps
        out, grads = admissible(name, inputs, grad, params, exact_out, exact_grads)
        parts = [out] + list(grads)
        bound = [None if a is None else ratio * (1 + store.unit_roundoff) * a + 0.5 * e + floors
                 for a, e in zip(parts, exact)]
        return bound[0], bound[1:]
    if accumulates is not None:
        acc = check_working(dtype, accumulates, "accumulates")
        out, grads = admissible(name, inputs, grad, params, exact_out, exact_grads,
                                acc=acc.eps / store.eps)
        parts = [out] + list(grads)
        bound = [None if a is None else a + 0.5 * e for a, e in zip(parts, exact)]
        return bound[0], bound[1:]
    return admissible(name, inputs, grad, params, exact_out, exact_grads)


# ---------------------------------------------------------------------------------------------
# results an engine declares rounded once

#: ``{op: paths}``: where :func:`rounded_once` knows the terms a result is summed from (the
#: binary ops' VJPs summed back over broadcast axes; the reductions' forward). A declaration
#: outside these is refused with a message naming them.
ROUNDED_ONCE_OPS = {**{n: ("forward", "vjp") for n in FAMILIES["arithmetic"]},
                    "sum": ("forward",), "mean": ("forward",),
                    **{n: ("vjp",) for n in FAMILIES["rounded"] + FAMILIES["transcendental"]}}
# float64 internals of a unary VJP g f'(x): a float64 primitive (exp within ~1e-14) and a few
# roundings, on the terms' scale |G| + |g| (1 + |x|) (f' may cancel: Φ(x) + x φ(x))
K_WORKING_UNARY = 256.0
WORKING_EPS = float(np.finfo(np.float64).eps)   # the accumulation precision of the promise


def _once(exact, S, m, ratio):
    """Half an ulp of ``exact`` plus a float64 accumulation of ``m`` terms of magnitude ``S``
    (recursive summation's bound, so any order passes), in eps units of the result dtype."""
    return 0.5 * np.abs(exact) + ratio * (m + 3) * S


def rounded_once(name, inputs, grad, params, exact_out, exact_grads, dtype):
    """Per-entry admissible errors (eps units) of results declared rounded once.

    Same arguments as :func:`admissible`, plus ``dtype`` (the engine's). Returns ``(A_out,
    [A_grad | None])``: each result's exact value to half an ulp, plus ``(eps64 / eps)(m + 3)``
    times the magnitudes of the ``m`` terms it sums (module docstring, "Rounded once").
    """
    if name not in ROUNDED_ONCE_OPS:
        raise KeyError(f"no rounded-once bound for op {name!r}; ops with one: "
                       f"{', '.join(ROUNDED_ONCE_OPS)}")
    ratio = WORKING_EPS / optable.formats.format_of(dtype).eps
    x = [np.asarray(v, dtype=np.float64) for v in inputs]
    g = np.asarray(grad, np.float64)
    y = np.asarray(exact_out, np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if name in ("sum", "mean"):
            axes = _axes(params.get("axis"), x[0].ndim)
            m = _reduced_count(x[0].shape, axes)
            S = np.sum(np.abs(x[0]), axis=axes, keepdims=params.get("keepdims", False)) \
                if axes else np.abs(x[0])
            out = _once(y, np.reshape(S, y.shape) / (m if name == "mean" else 1), m, ratio)
            return out, [None if e is None else np.zeros(np.shape(e)) for e in exact_grads]
        if len(x) == 1:         # a unary VJP: one product, no sum
            G = np.asarray(exact_grads[0], np.float64)
            terms = np.abs(G) + np.abs(g) * (1 + np.abs(x[0]))
            out = np.zeros(y.shape)      # forward: not declarable (ROUNDED_ONCE_OPS)
            return out, [np.nan_to_num(0.5 * np.abs(G) + ratio * K_WORKING_UNARY * terms,
                                       posinf=np.finfo(float).max)]
        a, b = x
        ab = np.broadcast_to(a, y.shape), np.broadcast_to(b, y.shape)
        gb = np.broadcast_to(g, y.shape)
        partials = {"add": (1.0, 1.0), "sub": (1.0, 1.0), "maximum": (1.0, 1.0),
                    "mul": (np.abs(ab[1]), np.abs(ab[0])),
                    "div": (1 / np.abs(ab[1]), np.abs(ab[0]) / ab[1] ** 2)}[name]
        grads = []
        for d, xi, e in zip(partials, (a, b), exact_grads):
            m = int(np.prod(y.shape, dtype=np.int64)) // max(int(np.size(xi)), 1)
            S = _sum_to_shape(np.abs(gb) * d, np.shape(xi))
            grads.append(np.nan_to_num(_once(np.asarray(e, np.float64), S, m, ratio),
                                       posinf=np.finfo(float).max))
        out = np.zeros(y.shape) if name == "maximum" else 0.5 * np.abs(y)
    return out, grads


# ---------------------------------------------------------------------------------------------
# the per-element rule


def underflow_floor(dtype):
    """The absolute floor of every bound: the dtype's smallest normal number.

    Differences below it are not counted, so an engine that flushes subnormal results to zero
    (FTZ) passes; nothing else is absorbed (1.2e-38 in float32 and bfloat16, 2.2e-308 in
    float64, 6.1e-5 in float16).
    """
    return optable.formats.format_of(dtype).tiny


def ulp(x, dtype):
    """The spacing of ``dtype`` at ``|x|`` (elementwise; the subnormal spacing at 0)."""
    return optable.formats.format_of(dtype).ulp(x)


def entrywise(got, hi, lo, admissible_eps, dtype):
    """The per-element verdict: each element against its own bound.

    Parameters
    ----------
    got : array_like
        The engine's values (any float dtype; read as float64, exactly).
    hi, lo : ndarray
        The exact values as a double-double pair (``lo`` may be 0).
    admissible_eps : ndarray
        ``A``: each element's admissible error in units of the dtype's eps.
    dtype : numpy dtype
        The dtype the engine computed in (sets eps and the underflow floor).

    Returns
    -------
    (ndarray, ndarray, ndarray)
        ``error`` (absolute, inf where ``got`` is not finite but the exact value is),
        ``allowed`` (absolute: ``eps * A + tiny``) and ``ok`` (``error <= allowed``).
    """
    fmt = optable.formats.format_of(dtype)
    eps = fmt.eps
    g = np.asarray(got, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), hi.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs((g - hi) - lo)
        same = (g == hi) | (np.isnan(g) & np.isnan(hi))   # an exact inf or NaN matched
        # an exact value beyond the dtype's largest number rounds to ±inf (or stops at ±max);
        # NaN is accepted there too: a sum whose terms overflow with both signs (a broadcast
        # VJP of div) cannot be told from its overflowing total without rescaling
        big = fmt.max
        overflow = (np.abs(hi) > big) & (np.isnan(g) | (
            (np.sign(g) == np.sign(hi)) & (np.abs(g) >= big)))
        error = np.where(same | overflow, 0.0, np.where(np.isnan(error), np.inf, error))
        allowed = eps * np.asarray(admissible_eps, dtype=np.float64) + fmt.tiny
    return error, allowed, error <= allowed
