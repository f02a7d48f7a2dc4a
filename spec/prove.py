"""``spec.prove``: show each stated VJP equal to Jᵀ·grad, with J differentiated by SymPy.

The long story: docs/spec.md, section ``spec/prove.py``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import mpmath
import numpy as np

from spec.backends import SYMPY
from spec.evaluate import lookup
from spec.pieces import ConventionError, Undecided, kink_conventions, zero_on_pieces
from spec.samples import sample_inputs

MIN_POINTS = 20
MIN_DPS = 50
DEFAULT_TOL = 1e-40
# simplify() is only tried on differences this small (count_ops); larger ones go to sampling,
# which is where SymPy would spend seconds without deciding.
SIMPLIFY_MAX_OPS = 60


@dataclass(frozen=True)
class ProofResult:
    """The outcome of proving one op (or optimizer)."""

    op: str
    ok: bool
    method: str                 # "symbolic", "piecewise" or "sampling"
    shapes: tuple               # the examples tried, described ("x(2, 3) axis=0")
    seconds: float
    detail: str
    exact_entries: int = 0      # VJP entries proven by simplification to zero
    sampled_entries: int = 0    # VJP entries shown only by high-precision sampling
    max_error: float = 0.0      # largest |stated - Jᵀ·grad| seen while sampling
    piecewise_entries: int = 0  # VJP entries proven zero on each of their pieces
    points: int = MIN_POINTS    # random points of the sampled check (per example)

    @property
    def verdict(self):
        """What the result establishes, in words: never "proven" for a sampled check."""
        if not self.ok:
            return "FAILED: " + self.detail
        if self.method == "symbolic":
            return "proven"
        if self.method == "piecewise":
            return "proven on each piece"
        return f"checked at {self.points} points"


class _Failure(Exception):
    """A failed proof; ``method`` says which stage decided it."""

    def __init__(self, message, method="symbolic"):
        super().__init__(message)
        self.method = method


def _symbols(prefix, shape, domain):
    sp = SYMPY.sp
    assumptions = {"real": True}
    if domain in ("positive", "unit_open"):
        assumptions["positive"] = True
    elif domain == "nonzero":
        assumptions["nonzero"] = True
    out = np.empty(shape, dtype=object)
    flat = out.reshape(-1)
    for i, index in enumerate(np.ndindex(*shape)):
        suffix = "_".join(str(k) for k in index)
        flat[i] = sp.Symbol(f"{prefix}_{suffix}" if suffix else prefix, **assumptions)
    return out


def _is_zero(expr):
    """True only when SymPy reduces ``expr`` to exactly 0."""
    sp = SYMPY.sp
    if expr == 0:
        return True
    expanded = sp.expand(expr)
    if expanded == 0:
        return True
    # Branches (Piecewise against Heaviside) are where simplify() spends seconds without
    # deciding: those differences stay with sampling, which avoids the kinks.
    if expanded.has(sp.Piecewise, sp.Heaviside, sp.Max, sp.Min):
        return False
    if sp.count_ops(expanded) <= SIMPLIFY_MAX_OPS:
        return sp.simplify(expanded) == 0
    return False


def _canonical(expr):
    """``expr`` with its symbols renamed c0, c1, ... (in name order, assumptions kept).

    Entries of an elementwise op differ only by which symbols they use, so one simplification
    serves them all.
    """
    sp = SYMPY.sp
    symbols = sorted(expr.free_symbols, key=lambda s: s.name)
    return expr.xreplace({s: sp.Symbol(f"c{i}", **s.assumptions0) for i, s in enumerate(symbols)})


_BRANCHES = ("Piecewise", "Heaviside", "Max", "Min", "sign", "Abs")


def _prove_entry(expr, boundaries):
    """"exact", "pieces" (zero on each piece), or None: not proven, the sampled check stands."""
    sp = SYMPY.sp
    if _is_zero(expr):
        return "exact"
    if not expr.has(*(getattr(sp, b) for b in _BRANCHES)):
        return None
    try:
        return "pieces" if zero_on_pieces(expr, _is_zero, boundaries=boundaries) else None
    except Undecided:
        return None


def _prove_entry_cached(expr, cache, boundaries):
    key = (_canonical(expr), boundaries)
    if key not in cache:
        cache[key] = _prove_entry(key[0], boundaries)
    return cache[key]


def _jacobian_transpose_grad(out, grad, x):
    """(Jᵀ·grad)[i] = Σ_j ∂out_j/∂x_i · grad_j, entry by entry."""
    sp = SYMPY.sp
    flat_out = [sp.sympify(v) for v in np.asarray(out, dtype=object).reshape(-1)]
    flat_g = np.asarray(grad, dtype=object).reshape(-1)
    result = np.empty(x.shape, dtype=object)
    flat_res = result.reshape(-1)
    for i, xi in enumerate(x.reshape(-1)):
        total = sp.Integer(0)
        for oj, gj in zip(flat_out, flat_g):
            if xi in oj.free_symbols:
                total += sp.diff(oj, xi) * gj
        flat_res[i] = total
    return result


def _prove_example(op, example, index, points, dps, tol, seed, cache):
    """Prove one example; return (exact, sampled, max_error). Raise _Failure when it fails."""
    sp = SYMPY.sp
    params = op.resolve_params(example.params)
    expected_shape = op.check_shapes(example.shapes, example.params)
    rng = np.random.default_rng([seed, index])
    fixed = sample_inputs(op, rng, example.shapes, dict(example.params))
    values = []
    for name, shape, concrete in zip(op.inputs, example.shapes, fixed):
        if op.domains[name] == "class_index":
            values.append(concrete)
        else:
            values.append(_symbols(name, shape, op.domains[name]))
    out = np.asarray(op.run_forward(SYMPY, values, params), dtype=object)
    if out.shape != tuple(expected_shape):
        raise _Failure(f"forward returns shape {out.shape}, the shape rule says "
                       f"{tuple(expected_shape)}")
    grad = _symbols("grad", out.shape, "real")
    stated = op.run_vjp(SYMPY, values, params, out, grad)

    diffs = []  # (input name, index, stated - truth)
    for name, x, s in zip(op.inputs, values, stated):
        if s is None:
            continue
        s = np.asarray(s, dtype=object)
        if s.shape != x.shape:
            raise _Failure(f"VJP for {name!r} has shape {s.shape}, the input has {x.shape}")
        truth = _jacobian_transpose_grad(out, grad, x)
        for idx in np.ndindex(*x.shape):
            diffs.append((name, idx, sp.sympify(s[idx]) - truth[idx]))

    # Sampling first: a wrong VJP is rejected at once (simplifying a non-zero difference can
    # take SymPy a long time); a right one is then upgraded to exact where SymPy can.
    worst = sample_differences(op, example, values, [grad], diffs, rng, points, dps, tol, "VJP",
                               "Jᵀ·grad")
    # A declared kink's switch = 0 is a convention, proven separately (kink_conventions).
    kinds = [_prove_entry_cached(d, cache, boundaries=not op.kinks) for _, _, d in diffs]
    exact, pieces = kinds.count("exact"), kinds.count("pieces")
    return exact, pieces, len(diffs) - exact - pieces, worst


def sample_differences(op, example, values, extra, diffs, rng, points, dps, tol, label, truth):
    """Largest |difference| of ``diffs`` over ``points`` random points: the inputs drawn from
    the op's domains, the ``extra`` symbol arrays (cotangent, tangents) uniform in [-2, 2].

    Raises ``_Failure`` naming ``label`` (``"VJP"``, ``"HVP"``, ...), the entry and ``truth``
    (what it was compared with) at the first difference above ``tol``.
    """
    sp = SYMPY.sp
    symbols = [v for name, v in zip(op.inputs, values) if op.domains[name] != "class_index"]
    flat_symbols = [s for arr in symbols + list(extra) for s in arr.reshape(-1)]
    fn = sp.lambdify(flat_symbols, [d for _, _, d in diffs], modules="mpmath")
    n_extra = sum(a.size for a in extra)
    worst = 0.0
    with mpmath.workdps(dps):
        for _ in range(points):
            drawn = sample_inputs(op, rng, example.shapes, dict(example.params))
            args = []
            for name, arr in zip(op.inputs, drawn):
                if op.domains[name] != "class_index":
                    args += [mpmath.mpf(float(v)) for v in np.reshape(arr, -1)]
            args += [mpmath.mpf(float(v)) for v in rng.uniform(-2.0, 2.0, size=n_extra)]
            for (name, idx, _), value in zip(diffs, fn(*args)):
                if not isinstance(value, (mpmath.mpf, int)):
                    raise _Failure(f"{label} for {name!r} entry {idx}: the difference evaluates "
                                   f"to {value!r}, not a real number", "sampling")
                err = float(abs(value))
                worst = max(worst, err)
                if not err < tol:
                    raise _Failure(f"{label} for {name!r} entry {idx} differs from {truth} by "
                                   f"{mpmath.nstr(abs(value), 5)} at a sampled point "
                                   f"(tolerance {tol:g})", "sampling")
    return worst


def worst_at_points(symbols, diffs, seed, points=10, dps=MIN_DPS):
    """Largest |difference| of the SymPy expressions ``diffs`` at ``points`` points of
    ``symbols`` drawn uniform in [-1, 1], evaluated at ``dps`` digits."""
    fn = SYMPY.sp.lambdify(symbols, diffs, modules="mpmath")
    rng = np.random.default_rng(seed)
    worst = 0.0
    with mpmath.workdps(dps):
        for _ in range(points):
            values = fn(*[mpmath.mpf(float(v)) for v in rng.uniform(-1, 1, len(symbols))])
            worst = max([worst] + [float(abs(v)) for v in values])
    return worst


def prove_examples(op, label, prove_example, points, dps, conventions=lambda: []):
    """Run ``prove_example(example, index, cache) -> (exact, pieces, sampled, max error)`` on
    each of ``op``'s examples and state the verdict as one ``ProofResult`` named ``label``.

    ``conventions()`` proves what holds at the kinks (a list of findings, or
    ``ConventionError``). A failed example, or one whose formulas raise, is a failed proof
    naming the example, never an exception.
    """
    start = time.perf_counter()
    described = tuple(ex.describe(op.inputs) for ex in op.examples)
    counts = [0, 0, 0]      # entries: exact, zero on each piece, only sampled
    worst = 0.0
    cache = {}   # (canonical difference, boundaries) -> "exact" | "pieces" | None

    def result(ok, method, detail):
        return ProofResult(op=label, ok=ok, method=method, shapes=described,
                           seconds=time.perf_counter() - start, detail=detail,
                           exact_entries=counts[0], piecewise_entries=counts[1],
                           sampled_entries=counts[2], max_error=worst, points=points)

    for index, example in enumerate(op.examples):
        try:
            e, p, s, w = prove_example(example, index, cache)
        except _Failure as exc:
            return result(False, exc.method, f"example {example.describe(op.inputs)}: {exc}")
        except Exception as exc:  # a formula that raises is a failed proof, not a crash
            return result(False, "symbolic", f"example {example.describe(op.inputs)}: "
                                             f"{type(exc).__name__}: {exc}")
        counts = [counts[0] + e, counts[1] + p, counts[2] + s]
        worst = max(worst, w)
    try:
        at_kinks = conventions()
    except ConventionError as exc:
        return result(False, "symbolic", str(exc))
    except Exception as exc:  # a convention that raises is a failed proof, not a crash
        return result(False, "symbolic", f"kink convention: {type(exc).__name__}: {exc}")
    exact, pieces, sampled = counts
    checked = f"{points} points at {dps} digits, max |diff| {worst:.1e}"
    proven = ([f"{exact} simplify to 0"] if exact else []) + (
        [f"{pieces} are 0 on each side of every branch"] if pieces else []) + at_kinks
    if sampled:
        return result(True, "sampling", f"{sampled} of {sum(counts)} entries are NOT proven, only "
                                         f"checked at {checked}; proven: {'; '.join(proven)}")
    method = "piecewise" if pieces or op.kinks else "symbolic"
    return result(True, method, f"all {sum(counts)} entries proven: {'; '.join(proven)} "
                                f"(and all agree at {checked})")


def prove(name, *, points=MIN_POINTS, dps=MIN_DPS, tol=DEFAULT_TOL, seed=0):
    """Prove that every stated VJP of op ``name`` equals Jᵀ·grad on each of its examples.

    Parameters
    ----------
    name : str or OpSpec
        A registry op name, or an ``OpSpec`` (e.g. a deliberately broken copy in a test).
    points : int, default 20
        Random domain points per example where simplification cannot decide (at least 20).
    dps : int, default 50
        Decimal digits for the sampled evaluation (at least 50).
    tol : float, default 1e-40
        Largest accepted absolute difference at a sampled point.
    seed : int, default 0
        Seed of the sampled points (the proof is deterministic).

    Returns
    -------
    ProofResult
        ``ok`` is False (never an exception) when a VJP is wrong, the forward misbehaves or a
        formula raises; ``detail`` says which input, entry and example.
    """
    op = lookup(name)
    if points < MIN_POINTS or dps < MIN_DPS:
        raise ValueError(f"prove: points >= {MIN_POINTS} and dps >= {MIN_DPS} are required; got "
                         f"points={points}, dps={dps}")
    return prove_examples(
        op, op.name,
        lambda example, index, cache: _prove_example(op, example, index, points, dps, tol,
                                                     seed, cache),
        points, dps, lambda: kink_conventions(op, _is_zero))


def prove_all(names=None, *, progress=None, **options):
    """Prove every op (or the ops in ``names``), in registry order.

    Parameters
    ----------
    names : iterable of str, optional
        Op names; default all of ``spec.OPS``.
    progress : callable, optional
        ``progress(index, total, name, result)`` is called before each proof with
        ``result=None`` and after it with the ``ProofResult``.
    **options
        Passed to ``prove`` (points, dps, tol, seed).

    Returns
    -------
    list of ProofResult
    """
    from spec.catalog import OPS

    names = list(OPS) if names is None else [lookup(n).name for n in names]
    results = []
    for i, name in enumerate(names):
        if progress is not None:
            progress(i, len(names), name, None)
        results.append(prove(name, **options))
        if progress is not None:
            progress(i, len(names), name, results[-1])
    return results


__all__ = ["ProofResult", "prove", "prove_all"]
