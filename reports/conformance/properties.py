"""The checks of the suite, as plain functions of a drawn case (Hypothesis-free, pytest-free).

Each returns a :class:`Result`: the measures taken (error and bound in eps units per array) and
whether all hold. The runner and ``tests/conformance`` wrap them in Hypothesis; a failing
case can be replayed by calling the function again (the reproduction the runner prints does
exactly that).

The long story: docs/reports-conformance.md, section ``reports/conformance/properties.py``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

import optable
from reports.conformance import bounds as _bounds
from reports.conformance import oracle as _oracle

__all__ = ["Result", "check_call", "check_jvp", "check_nonfinite", "check_unsupported",
           "check_optimizer",
           "check_tape_laws", "TAPE_ENGINES"]


@dataclass
class Result:
    """Measures of one case; ``ok`` when every measure is within its bound."""

    measures: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def ok(self):
        return not self.notes and all(m.ok for m in self.measures)

    @property
    def worst(self):
        """The measure with the largest error/bound ratio (None when nothing was measured)."""
        if not self.measures:
            return None

        def ratio(m):
            if m.error == 0:
                return (0.0, -m.bound)
            return (math.inf if m.bound == 0 else m.error / m.bound, -m.bound)
        return max(self.measures, key=ratio)

    def fail(self, note):
        self.notes.append(note)
        return self

    conventions: list = field(default_factory=list)   # kink conventions found (passing)
    skipped: list = field(default_factory=list)       # inputs the engine declares gradient-free

    def describe(self):
        """One line per failing measure or note: the worst element, its values and bound."""
        lines = list(self.notes)
        for m in self.measures:
            if not m.ok:
                if getattr(m, "index", None) is not None and not m.note:
                    lines.append(m.element())
                else:
                    lines.append(m.note or f"{m.what}: error {m.error:.4g} > bound "
                                           f"{m.bound:.4g}")
        return "; ".join(lines)

    def __repr__(self):
        w = self.worst
        head = "ok" if self.ok else "FAIL: " + self.describe()
        if self.ok and w is not None and getattr(w, "index", None) is not None:
            tail = f" (worst element {w.element()})"
        else:
            tail = "" if w is None else f" (worst {w.what}: {w.error:.3g}, bound {w.bound:.3g})"
        extra = "".join(f"; convention {c}" for c in self.conventions)
        return f"<Result {head}{tail}{extra}>"


def _differentiable(name):
    import spec

    op = spec.OPS[name]
    return [op.vjp.get(n) is not None for n in op.inputs]


def measurable(result, what, iname, got, exact, skip=(), hint=""):
    """Whether ``got`` (``what``'s array for input ``iname``) is to be measured against
    ``exact``: None is expected for a non-differentiable input (``exact`` None) and a skipped
    one (``skip``, name -> reason); anything else is a failure recorded in ``result``."""
    if exact is None:
        if got is not None:
            result.fail(f"{what} returned an array for {iname!r}, which is not "
                        f"differentiable (class indices): expected None")
        return False
    if iname in skip:
        result.skipped.append(f"d/d{iname}: {skip[iname]}")
        return False
    if got is None:
        result.fail(f"{what} returned None for the differentiable input {iname!r}{hint}")
        return False
    return True


def nonfinite_call(result, call, rejects, failure, fix):
    """``call()`` (an engine on NaN or inf inputs) with floating-point warnings silenced; None
    when it raised: a ValueError (or FloatingPointError) is the convention ``rejects``, noted in
    ``result``; any other error fails ``result`` (``failure`` and the error, then ``fix``)."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return call()
    except (ValueError, FloatingPointError) as exc:
        result.conventions.append(f"{rejects} ({type(exc).__name__})")
    except Exception as exc:
        result.fail(f"{failure}{type(exc).__name__}: {exc} ({fix})")
    except SystemExit as exc:   # as _call: a failing row, not the end of the suite
        result.fail(f"{failure}SystemExit({exc.code!r}) ({fix})")
    return None


def one_per_input(result, what, got, name):
    """Op ``name``'s input names when ``got`` (what ``what`` returned) holds one entry per
    input; otherwise None, and ``result`` failed with the counts."""
    import spec

    names = spec.OPS[name].inputs
    if len(got) != len(names):
        result.fail(f"{what} returned {len(got)} arrays for {len(names)} inputs "
                    f"({', '.join(names)})")
        return None
    return names


def _call(result, what, fn):
    """Run an engine call; an exception on a valid call is a failure with its message.

    Floating-point warnings (overflow in an intermediate, say) are silenced: the results are
    measured, so a warning adds nothing but noise to the table.
    """
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            value = fn()
    except Exception as exc:  # the engine's own error: report it, do not crash the suite
        result.fail(f"{what} raised {type(exc).__name__}: {exc}")
        return None
    except SystemExit as exc:  # an engine that ends the process would end the suite silently
        result.fail(f"{what} called sys.exit({exc.code!r}); raise an exception instead")
        return None
    # no call of the protocol returns None: the callers would have nothing to measure, and a
    # silent skip would read as a pass
    if value is None:
        result.fail(f"{what} returned None; return its result (docs/engines.md, the protocol)")
    elif what in _SEQUENCES and not isinstance(value, (tuple, list)):
        result.fail(f"{what} must return a tuple with one entry per input (None where an input "
                    f"has no gradient); got {type(value).__name__}")
        return None
    return value


#: the calls whose result is one entry per input
_SEQUENCES = ("vjp", "hvp")


def declared_no_gradient(engine, name):
    """``{input: reason}``: inputs of op ``name`` the engine declares without a gradient.

    Read from the engine's optional ``no_gradient`` attribute (``{op: {input: reason}}``, see
    docs/engines.md). Those inputs' VJPs are not measured (the engine may return None for
    them); every other input still is.
    """
    declared = getattr(engine, "no_gradient", None) or {}
    return dict(declared.get(name, {}))


def declared_rounded_once(engine, name, dtype):
    """The paths (``"forward"``, ``"vjp"``) of op ``name`` in ``dtype`` that ``engine``
    declares rounded once (its optional ``rounded_once`` attribute, docs/engines.md).

    Raises ``ValueError`` for a declaration the suite cannot hold (an op or path without a
    rounded-once bound), naming what it can.
    """
    declared = (getattr(engine, "rounded_once", None) or {}).get(name) or {}
    paths = {path for path, dtypes in declared.items()
             if np.dtype(dtype).name in {np.dtype(d).name for d in dtypes}}
    allowed = _bounds.ROUNDED_ONCE_OPS.get(name, ())
    bad = sorted(p for p in declared if p not in allowed)
    if bad:
        raise ValueError(
            f"{getattr(engine, 'name', engine)}: rounded_once declares {name} {bad}, which has "
            f"no rounded-once bound; declare only these: "
            + "; ".join(f"{op}: {', '.join(ps)}" for op, ps in _bounds.ROUNDED_ONCE_OPS.items()))
    return paths


def declared_working(engine, attr, name, dtype):
    """The format ``engine`` declares in its ``attr`` (``computes_in`` or ``accumulates``,
    docs/engines.md) for op ``name`` in the storage ``dtype``, or None.

    A declaration maps a storage format's name to a format name (every op) or to
    ``{op: format name}`` (those ops; ``"*"`` for the others).
    """
    entry = (getattr(engine, attr, None) or {}).get(np.dtype(dtype).name)
    if isinstance(entry, dict) or hasattr(entry, "get"):
        entry = entry.get(name, entry.get("*"))
    return entry


def admissible_for(engine, name, dtype, inputs64, grad64, params, exact, once=True):
    """``(A_out, [A_grad])`` for op ``name`` in ``dtype`` on ``engine``: the general bound,
    the storage formats' bound from what the engine declares it computes and accumulates in
    (``bounds.storage``), and (with ``once``) the rounded-once bound where it declares one."""
    exact_grads = [None if g is None else g[0] for g in exact.grads]
    if optable.formats.is_storage(dtype):
        a_out, a_grads = _bounds.storage(
            name, inputs64, grad64, params, exact.out[0], exact_grads, dtype,
            computes_in=declared_working(engine, "computes_in", name, dtype),
            accumulates=declared_working(engine, "accumulates", name, dtype))
    else:
        a_out, a_grads = _bounds.admissible(name, inputs64, grad64, params, exact.out[0],
                                            exact_grads)
    once = once and declared_rounded_once(engine, name, dtype)
    if once:        # the engine promises a single rounding there: hold it to that
        o_out, o_grads = _bounds.rounded_once(name, inputs64, grad64, params, exact.out[0],
                                              exact_grads, dtype)
        a_out = o_out if "forward" in once else a_out
        a_grads = o_grads if "vjp" in once else a_grads
    return a_out, a_grads


def _value_at(x, shape, index):
    """``x``'s entry that lands on ``index`` of an array of ``shape`` (or a short summary)."""
    x = np.asarray(x)
    if x.ndim == 0:
        return x.item()
    if x.ndim <= len(shape):
        try:
            return np.broadcast_to(x, shape)[index].item()
        except ValueError:
            pass
    flat = x.reshape(-1)
    if flat.size <= 6:
        return flat.tolist()
    return f"<shape {x.shape}>"


def _where(ex, shape, index):
    """The inputs (and cotangent) at one element of an array of ``shape``, as text."""
    import spec

    names = list(spec.OPS[ex.name].inputs)
    parts = [f"{n} = {_value_at(x, shape, index)!r}" for n, x in zip(names, ex.inputs)]
    parts.append(f"grad = {_value_at(ex.grad, shape, index)!r}")
    return ", ".join(parts)


def check_call(engine, ex, kinks="strict"):
    """Forward and every VJP of ``engine`` on the call ``ex`` against the exact values.

    Every element is held to its own bound (``bounds.entrywise``). At a kink (``kinks``
    module) the registry's convention is required under ``kinks="strict"``; under
    ``"subgradient"`` any member of the Clarke subdifferential passes and is recorded as the
    engine's convention. A kink element outside the subdifferential fails in both modes.
    Inputs the engine declares without a gradient (:func:`declared_no_gradient`) are not
    measured and are listed in ``Result.skipped``.

    Parameters
    ----------
    engine : engine (``engines.get_engine``)
    ex : strategies.OpExample
    kinks : {"strict", "subgradient"}

    Returns
    -------
    Result
    """
    from dataclasses import replace

    from reports.conformance import kinks as _kinks

    result = Result()
    dtype = np.dtype(ex.dtype)
    exact = _oracle.exact_vjp(ex.name, ex.inputs, ex.grad, ex.params)
    inputs64 = [_oracle.as_float64(x) for x in ex.inputs]
    a_out, a_grads = admissible_for(engine, ex.name, dtype, inputs64,
                                    _oracle.as_float64(ex.grad), ex.params, exact)
    out = _call(result, "forward", lambda: engine.forward(ex.name, list(ex.inputs), **ex.params))
    if out is not None:
        m = _oracle.measure("output", out, exact.out, a_out, dtype)
        result.measures.append(replace(m, where=_where(ex, np.shape(exact.out[0]), m.index))
                               if m.index is not None else m)
    if getattr(engine, "fused_value", False):
        # the value a VJP computes on the way (a loss with its gradient) is what training
        # reads: held to the forward's bound, as the forward is
        both = _call(result, "value_and_vjp", lambda: engine.value_and_vjp(
            ex.name, list(ex.inputs), ex.grad, **ex.params))
        if both is not None:
            m = _oracle.measure("output with the vjp", both[0], exact.out, a_out, dtype)
            result.measures.append(replace(m, where=_where(ex, np.shape(exact.out[0]), m.index))
                                   if m.index is not None else m)
    grads = _call(result, "vjp", lambda: engine.vjp(ex.name, list(ex.inputs), ex.grad,
                                                     **ex.params))
    if grads is None:
        return result
    grads, names = tuple(grads), one_per_input(result, "vjp", grads, ex.name)
    if names is None:
        return result
    import spec

    skip = declared_no_gradient(engine, ex.name)
    measured = {}
    for k, (iname, g, e, a) in enumerate(zip(names, grads, exact.grads, a_grads)):
        if measurable(result, "vjp", iname, g, e, skip, " (declare it in the engine's "
                      "no_gradient, with a reason, if it has none)"):
            measured[k] = (iname, g, e, a)
    verdict = None
    if spec.OPS[ex.name].kinks and measured:
        eps = optable.formats.format_of(dtype).eps
        floor = _bounds.underflow_floor(dtype)
        views = [np.asarray(measured[k][1], np.float64) if k in measured else None
                 for k in range(len(names))]
        shaped = all(v is None or v.shape == np.shape(measured[k][2][0])
                     for k, v in enumerate(views))
        if shaped:
            tol = [None if k not in measured else eps * np.asarray(measured[k][3]) + floor
                   for k in range(len(names))]
            verdict = _kinks.judge(ex, views, tol)
    for k, (iname, g, e, a) in measured.items():
        m = _oracle.measure(f"d/d{iname}", g, e, a, dtype)
        if verdict is not None and k in verdict.accepted and not m.ok and not m.note:
            m = _kink_measure(m, g, e, a, dtype, verdict, k, kinks, ex)
        if m.index is not None:
            m = replace(m, where=_where(ex, np.shape(e[0]), m.index))
        result.measures.append(m)
    if verdict is not None:
        if verdict.outside:
            result.fail(verdict.outside)
        elif verdict.convention and kinks == "subgradient":
            result.conventions.append(verdict.convention)
    return result


def _kink_measure(m, g, e, a, dtype, verdict, k, mode, ex):
    """Re-judge a VJP whose failing elements may be kink elements (``kinks`` module)."""
    from dataclasses import replace

    from reports.conformance.bounds import entrywise

    accepted = np.asarray(verdict.accepted[k])
    _, _, ok = entrywise(np.asarray(g, np.float64), e[0], e[1], a, dtype)
    rest_ok = bool(np.all(ok | accepted))
    if not rest_ok:
        return m                    # an element off the kinks fails anyway: report it as is
    if mode == "subgradient":
        # the valid subgradients pass; every other element keeps its own bound
        return _oracle.measure(m.what, g, e, np.where(accepted, np.inf, a), dtype)
    if verdict.outside:
        return m
    convention = verdict.convention or "another member of the subdifferential"
    return replace(m, note=(f"{m.what}: {convention} at a kink: a valid subgradient (inside the "
                            f"Clarke subdifferential) but not the registry's convention "
                            f"({_registry_convention(ex.name)}); --kinks subgradient accepts "
                            f"it as the engine's convention"))


def _registry_convention(name):
    import spec

    return "; ".join(k.convention for k in spec.OPS[name].kinks)


def _jvp_exact(ex, directions, h_digits=20, scale=1.0):
    """<J t, c> by central differences of the spec's forward at 50 digits (see module doc).

    The step is ``10**-h_digits * scale``: ``scale`` is the inputs' largest magnitude for edge
    draws (whose directions are normalised by it), so the step stays relative to the inputs.
    """
    import mpmath

    differentiable = _differentiable(ex.name)

    # NOTE: a relative step of 1e-20 at an input of size s moves an output of size F by
    # ~1e-20 s f'; with F up to max(scale, 1) (exp(1e-70) ~ 1; logsumexp of 1e182 and 1e-62)
    # the working precision grows by log10(max(scale, 1) / s) digits so none is lost
    extra = 0
    if scale != 1.0 or getattr(ex, "edges", False):
        smallest = min([float(np.min(np.abs(t[t != 0]))) for t in directions
                        if t is not None and np.any(t != 0)] + [1.0])
        decades = math.log10(max(scale, 1.0)) - math.log10(smallest) - math.log10(scale)
        extra = min(max(0, math.ceil(decades)), 800)

    def compute():
        with mpmath.workdps(_oracle.DPS + 20 + extra):
            h = mpmath.mpf(10) ** (-h_digits) * mpmath.mpf(float(scale))
            sides = []
            for sign in (1, -1):
                args = []
                for x, t, d in zip(ex.inputs, directions, differentiable):
                    if not d:
                        args.append(np.asarray(x).astype(np.int64))
                        continue
                    x64 = np.asarray(x, np.float64)
                    t64 = np.zeros_like(x64) if t is None else np.asarray(t, np.float64)
                    arr = np.empty(x64.shape, dtype=object)
                    arr.reshape(-1)[:] = [mpmath.mpf(float(a)) + sign * h * mpmath.mpf(float(b))
                                          for a, b in zip(x64.reshape(-1), t64.reshape(-1))]
                    args.append(arr)
                sides.append(_oracle.exact_forward_at(ex.name, args, ex.params,
                                                      dps=_oracle.DPS + extra))
            c = np.asarray(ex.grad, np.float64).reshape(-1)
            diff = np.asarray(sides[0] - sides[1], dtype=object).reshape(-1)
            total = mpmath.fsum(mpmath.mpf(float(ci)) * di for ci, di in zip(c, diff)) / (2 * h)
            return float(total)

    return _oracle.cached("jvp", ex.name, list(ex.inputs) + [ex.grad] + list(
        t for t in directions if t is not None) + ([np.asarray(float(scale))]
                                                  if scale != 1.0 else []), ex.params, compute)


def check_jvp(engine, ex, direction_seed=0):
    """``<t, Jᵀ c>`` from the engine's VJP against ``<J t, c>`` of the exact forward.

    The direction ``t`` is standard normal (one per differentiable input, from
    ``direction_seed``), scaled entry by entry to the input's magnitude for edge draws (so a
    step of 1e-20 is relative wherever the input lies in the dtype's range); the bound is
    ``Σ |t| A`` with ``A`` the admissible VJP errors, so this holds whenever the VJPs are
    within their own bounds, and fails when a VJP is not the derivative of the forward (a
    missing term, a wrong sign, a transposed gradient). Inputs the engine declares without a
    gradient get no direction.
    """
    import spec

    result = Result()
    dtype = np.dtype(ex.dtype)
    rng = np.random.default_rng(direction_seed)
    differentiable = _differentiable(ex.name)
    skip = declared_no_gradient(engine, ex.name)
    names = spec.OPS[ex.name].inputs
    directions = []
    edges = getattr(ex, "edges", False)
    exact = _oracle.exact_vjp(ex.name, ex.inputs, ex.grad, ex.params)
    big = optable.formats.format_of(dtype).max
    top = max([float(np.max(np.abs(np.asarray(x, np.float64)))) for x, d in
               zip(ex.inputs, differentiable) if d and np.size(x)] + [0.0])
    domains = spec.OPS[ex.name].domains
    for x, d, iname, e in zip(ex.inputs, differentiable, names, exact.grads):
        t = rng.standard_normal(np.shape(x)) if d else None
        if t is not None and edges and top > 0:
            # NOTE: t_i ∝ |x_i| / max|x| (the distance to 0 or 1 for probabilities): a relative
            # step at every entry, and no overflow of t * g at 1e300
            x64 = np.asarray(x, np.float64)
            room = np.abs(x64)
            if domains[iname] in ("unit_open", "unit_closed"):
                room = np.minimum(room, np.abs(1.0 - x64))
            t = t * (room / top)
        if t is not None and e is not None:
            t = np.where(np.abs(e[0]) > big, 0.0, t)   # a VJP beyond the dtype: not measured
        directions.append(None if iname in skip else t)
    result.skipped.extend(f"d/d{n}: {skip[n]}" for n in names if n in skip)
    grads = _call(result, "vjp", lambda: engine.vjp(ex.name, list(ex.inputs), ex.grad,
                                                     **ex.params))
    if grads is None:
        return result
    inputs64 = [_oracle.as_float64(x) for x in ex.inputs]
    _, a_grads = admissible_for(engine, ex.name, dtype, inputs64, _oracle.as_float64(ex.grad),
                                ex.params, exact, once=False)
    terms, allowed, ref = [], 0.0, 0.0
    for g, t, a, e in zip(grads, directions, a_grads, exact.grads):
        if t is None:
            continue
        if g is None or np.shape(g) != np.shape(t):
            return result.fail(f"vjp returned {None if g is None else np.shape(g)} where an "
                               f"array of shape {np.shape(t)} was expected")
        g64 = np.asarray(g, np.float64)
        beyond = np.abs(e[0]) > big
        if not np.all(np.isfinite(g64) | beyond):
            i = tuple(int(k) for k in np.argwhere(~(np.isfinite(g64) | beyond))[0])
            return result.fail(f"vjp returned a non-finite value {g64[i]} at index {list(i)} "
                               f"where the exact value is {e[0][i]!r}")
        terms.extend(np.where(beyond, 0.0, t * np.where(beyond, 0.0, g64)).reshape(-1).tolist())
        allowed += float(np.sum(np.where(beyond, 0.0, np.abs(t) * a)))
        ref += float(np.sum(np.abs(t * np.where(beyond, 0.0, e[0]))))
    engine_side = math.fsum(terms)
    exact_side = _jvp_exact(ex, directions, scale=top if edges and top > 0 else 1.0)
    if not math.isfinite(exact_side):
        return result.fail(f"<J t, c> is {exact_side} (an input outside the dtype's range?)")
    eps = optable.formats.format_of(dtype).eps
    tiny = optable.formats.format_of(dtype).tiny
    diff = abs(engine_side - exact_side)
    # float64 rounding of the exact side and of the products t * g (2 eps64 each, relative to
    # the terms' magnitude): far below any float32 bound, a few eps for float64.
    slack = 4 * 2.0 ** -52 * sum(abs(v) for v in terms) + tiny * math.sqrt(max(len(terms), 1))
    # the exact side's own resolution: the forward works at DPS + 20 digits, so a term that
    # cancels inside it (z - lse) leaves ~10^-(DPS+20) of the inputs' scale per side, divided
    # by the step 2h = 2e-20 x scale; a few such roundings: 5 x 10^-DPS. Only a derivative
    # that is exactly 0 (cross_entropy over one class: 6e-53 from the oracle) ever sees it.
    step_scale = top if edges and top > 0 else 1.0
    c_sum = float(np.sum(np.abs(np.asarray(ex.grad, np.float64))))
    slack += 5 * 10.0 ** -_oracle.DPS * max(top, 1.0) / step_scale * c_sum
    ref = max(ref, tiny)
    from reports.conformance.oracle import Measure

    ok = diff <= allowed * eps + slack
    result.measures.append(Measure("<t, J^T c>", diff / (eps * ref),
                                   (allowed * eps + slack) / (eps * ref), ok,
                                   "" if ok else f"<t, J^T c> = {engine_side!r} but <J t, c> = "
                                                 f"{exact_side!r}"))
    return result


def check_nonfinite(engine, ex):
    """The contract for NaN and ±inf inputs of an elementwise op (docs/CONTRACTS.md).

    An engine either rejects the call with a ``ValueError`` (or ``FloatingPointError``) whose
    message names the problem, or propagates elementwise: NaN in, NaN out at that element; ±inf
    in, the op's limit out (``special_values.LIMITS``; NaN accepted only where the formula is
    an indeterminate form); the finite entries beside them are held to their own bounds, in
    the forward and in the VJP (a NaN must not leak into its neighbours).
    """
    from reports.conformance.special_values import LIMITS, NAN_ALLOWED

    result = Result()
    dtype = np.dtype(ex.dtype)
    x = np.asarray(ex.inputs[0])
    called = nonfinite_call(
        result, lambda: (engine.forward(ex.name, [x], **ex.params),
                         engine.vjp(ex.name, [x], ex.grad, **ex.params)),
        "rejects non-finite inputs", "non-finite input: ", "reject it with a ValueError naming "
        "the input, or propagate it")
    if called is None:
        return result
    out, grads = called
    out = np.asarray(out, np.float64)
    g = np.asarray(grads[0], np.float64)
    if out.shape != x.shape or g.shape != x.shape:
        return result.fail(f"non-finite input: shapes {out.shape}, {g.shape}; expected "
                           f"{x.shape}")
    up, down = LIMITS[ex.name]
    for i, v in enumerate(x.astype(np.float64)):
        if np.isnan(v):
            if not np.isnan(out[i]):
                result.fail(f"{ex.name}(nan) = {out[i]!r}: a NaN input must give NaN")
        elif np.isinf(v):
            want = up if v > 0 else down
            sign = 1 if v > 0 else -1
            if np.isnan(out[i]) and (ex.name, sign) in NAN_ALLOWED:
                continue
            if not (out[i] == want and np.signbit(out[i]) == np.signbit(want)
                    or (want == 0 and out[i] == 0)):
                result.fail(f"{ex.name}({v}) = {out[i]!r}; the limit is {want!r}")
    finite = np.isfinite(x.astype(np.float64))
    sub = OpExample_like(ex, x[finite], np.asarray(ex.grad)[finite])
    checked = check_call(engine, sub)
    for m in checked.measures:
        from dataclasses import replace

        result.measures.append(replace(m, what=f"{m.what} (finite entries beside NaN and inf)"))
    if not np.allclose(np.asarray(engine.forward(ex.name, [x[finite]], **ex.params),
                                  np.float64), out[finite], rtol=0, atol=0, equal_nan=True):
        result.fail(f"{ex.name}: the finite entries' outputs change when NaN and inf stand "
                    f"beside them (a non-finite value leaks into its neighbours)")
    if not np.array_equal(np.asarray(engine.vjp(ex.name, [x[finite]], sub.grad, **ex.params)[0],
                                     np.float64), g[finite], equal_nan=True):
        result.fail(f"{ex.name}: the finite entries' VJP changes when NaN and inf stand beside "
                    f"them (a non-finite value leaks into its neighbours)")
    return result


def OpExample_like(ex, x, grad):  # noqa: N802 - reads as the constructor it wraps
    """``ex`` with input ``x`` and cotangent ``grad`` (same op, params and dtype)."""
    from reports.conformance.strategies import OpExample

    return OpExample(ex.name, (np.asarray(x),), np.asarray(grad), dict(ex.params), ex.seed,
                     False, ex.label)


def check_unsupported(engine, name, dtype=None):
    """An op ``engine`` declares unsupported (in ``dtype``, when given) must raise
    ``UnsupportedOpError`` (both calls)."""
    import spec

    result = Result()
    ex = spec.OPS[name].examples[0]
    inputs = spec.sample_inputs(name, np.random.default_rng(0), shapes=ex.shapes,
                                params=dict(ex.params))
    dtype = np.dtype(engine.dtypes[0] if dtype is None else dtype)
    op = spec.OPS[name]
    inputs = [x if op.domains[n] == "class_index" else x.astype(dtype)
              for n, x in zip(op.inputs, inputs)]
    grad = np.ones(op.check_shapes([x.shape for x in inputs], dict(ex.params)), dtype)
    for what, call in (("forward", lambda: engine.forward(name, inputs, **ex.params)),
                       ("vjp", lambda: engine.vjp(name, inputs, grad, **ex.params))):
        try:
            call()
        except NotImplementedError:
            continue
        except Exception as exc:
            result.fail(f"{what} of unsupported {name} raised {type(exc).__name__} ({exc}); "
                        f"expected UnsupportedOpError")
            continue
        where = "" if dtype == np.dtype(engine.dtypes[0]) else f" in {dtype}"
        result.fail(f"{name} is declared unsupported{where} but {what} returned a value; raise "
                    f"UnsupportedOpError (or drop the claim)")
    return result


# ---------------------------------------------------------------------------------------------
# optimizers


OPTIMIZER_K = 16   # eps per step: ~10 roundings per element per step (spec.optimizers' table)


def _rel_measure(what, got, exact_hi, dtype, k_eps, scale=None):
    """Normwise error of ``got`` in eps units relative to ``max(||exact||, ||scale||)``."""
    from reports.conformance.oracle import Measure

    eps = float(np.finfo(dtype).eps)
    got = np.asarray(got)
    if got.shape != np.shape(exact_hi):
        return Measure(what, math.inf, k_eps, False,
                       f"{what}: shape {got.shape}, expected {np.shape(exact_hi)}")
    if got.dtype != dtype:
        return Measure(what, math.inf, k_eps, False,
                       f"{what}: dtype {got.dtype}, expected {dtype}")
    g64 = got.astype(np.float64)
    if not np.all(np.isfinite(g64)):
        return Measure(what, math.inf, k_eps, False, f"{what}: non-finite values")
    ref = float(np.linalg.norm(exact_hi))
    if scale is not None:
        ref = max(ref, float(np.linalg.norm(scale)))
    ref = max(ref, float(np.finfo(dtype).tiny))
    err = float(np.linalg.norm(g64 - exact_hi)) / (eps * ref)
    return Measure(what, err, k_eps, err <= k_eps)


def exact_trajectory(name, w0, grads, hyper):
    """Exact parameters and state after each step of ``spec.step`` (the table's form).

    The parameters reported are those an engine holds (``OptimizerSpec.held``: a look-ahead
    engine form stores the point w - beta v, spec.optimizers' NOTE), so engines are compared on
    what they hold.
    """
    import spec

    opt = spec.optimizers.lookup_optimizer(name)
    values = {k: spec.backends.MPMATH.param(v) for k, v in {**opt.hyper, **hyper}.items()}

    def compute():
        w, state, out = np.asarray(w0, np.float64), None, []
        for t, g in enumerate(grads, start=1):
            w, state = spec.step(name, w, np.asarray(g, np.float64), state, t, **hyper)
            shown = opt.held(spec.backends.MPMATH, w, state, values)
            out.append((np.asarray(shown, dtype=float),
                        {k: np.asarray(v, dtype=float) for k, v in state.items()}))
        return out

    return _oracle.cached("optim", name, [np.asarray(w0)] + [np.asarray(g) for g in grads],
                          hyper, compute)


def _bias_condition(name, hyper, t):
    """Condition number of the bias corrections 1 - beta^t at step t of an optimizer with the
    moment decays ``beta1`` and ``beta2`` (0 for an optimizer without them).

    ``1 - beta2**t`` cancels for beta2 near 1 (1 - 0.9999**2 ~ 2e-4): a rounding of beta2**t is
    amplified by beta2**t / (1 - beta2**t), and the update divides by its square root.
    """
    import spec

    h = {**spec.optimizers.lookup_optimizer(name).hyper, **hyper}
    if "beta1" not in h or "beta2" not in h:
        return 0.0
    b1, b2 = float(h["beta1"]), float(h["beta2"])
    k1 = b1 ** t / (1 - b1 ** t) if b1 ** t < 1 else 0.0
    k2 = b2 ** t / (1 - b2 ** t) if b2 ** t < 1 else 0.0
    return k1 + k2 / 2


def check_optimizer(engine, name, w0, grads, hyper, dtype):
    """``len(grads)`` steps of ``engine.optimizer_step`` against ``spec.step``'s trajectory.

    Inputs are cast to ``dtype`` first and the exact trajectory is computed from the cast
    values, so only the engine's arithmetic is measured. Bound after step t:
    ``OPTIMIZER_K * t * (1 + κ_t)`` eps, relative to the larger of ||w|| and the distance the
    parameters travelled (so a step much larger than w is measured against the step), with κ_t
    the conditioning of the bias corrections (``_bias_condition``); the state (m, v, G, E,
    v) is held to ``OPTIMIZER_K * t`` relative to its own norm.
    """
    dtype = np.dtype(dtype)
    result = Result()
    w0 = np.asarray(w0).astype(dtype)
    grads = [np.asarray(g).astype(dtype) for g in grads]
    exact = exact_trajectory(name, w0.astype(np.float64), [g.astype(np.float64) for g in grads],
                             hyper)
    w, state = w0.copy(), {}
    travelled, previous = 0.0, w0.astype(np.float64)
    for t, (g, (w_exact, s_exact)) in enumerate(zip(grads, exact), start=1):
        step = _call(result, f"step {t}", lambda: engine.optimizer_step(name, w, g, state, t,
                                                                        **dict(hyper)))
        if step is None:
            return result
        w, state = step
        travelled += _oracle.norm(w_exact - previous)
        previous = w_exact
        k = OPTIMIZER_K * t
        scale = max(_oracle.norm(w0.astype(np.float64)), travelled)
        result.measures.append(_rel_measure(f"w after step {t}", w, w_exact, dtype,
                                            k * (1 + _bias_condition(name, hyper, t)),
                                            scale=np.array([scale])))
        for key, value in s_exact.items():
            if key not in state:
                return result.fail(f"step {t}: state has no {key!r} (keys {sorted(state)})")
            result.measures.append(_rel_measure(f"{key} after step {t}", state[key], value,
                                                dtype, k))
    return result


# ---------------------------------------------------------------------------------------------
# tape laws


TAPE_ENGINES = ("reflib", "fastlib")


def _tape(engine):
    if engine == "reflib":
        import reflib

        return reflib.Tape()
    import fastlib

    return fastlib.Tape()


def check_tape_laws(engine, dag, seed):
    """The tape laws (docs/semantics.md) on one random DAG, for ``engine`` ("reflib" or "fastlib").

    1. backward_dense reaches exactly the nodes graph reachability says (others None);
    2. the sparse form has the same keys and values as the dense form;
    3. backward_dense_all is backward_dense with zeros where not reached;
    4. backward_dense_all == backward_dense_from(one-hot seed) (every VJP here maps 0 to 0);
    5. custom nodes run in id order n-1..0, each reached node once;
    6. linearity in the seed: bd(a s1 + b s2) = a bd(s1) + b bd(s2);
    7. every reached slot equals the exact gradient (reflib's tape at 30 digits).
    """
    import reflib

    from reports.conformance.strategies import build_dag, reached

    nodes, out = dag
    result = Result()
    rng = np.random.default_rng(seed)
    tape = _tape(engine)
    build_dag(tape, nodes)
    shape = np.shape(tape.value(out))
    s1, s2 = rng.standard_normal(shape), rng.standard_normal(shape)
    dense = tape.backward_dense(out, s1)
    hit = reached(nodes, out)
    got_hit = {i for i, g in enumerate(dense) if g is not None}
    if got_hit != hit:
        result.fail(f"law 1: backward_dense reached {sorted(got_hit)}, graph reachability "
                    f"gives {sorted(hit)}")
    sparse = tape.backward(out, s1)
    if sorted(sparse) != sorted(got_hit) or any(
            not np.array_equal(sparse[i], dense[i]) for i in sparse):
        result.fail("law 2: backward (sparse) differs from backward_dense")
    dense_all = tape.backward_dense_all(out, s1)
    for i, (a, d) in enumerate(zip(dense_all, dense)):
        want = np.zeros(np.shape(tape.value(i))) if d is None else d
        if not np.array_equal(np.asarray(a), np.asarray(want)):
            result.fail(f"law 3: backward_dense_all slot {i} is not backward_dense's (or zeros)")
            break
    one_hot = [np.zeros(np.shape(tape.value(i))) for i in range(len(tape))]
    one_hot[out] = s1
    from_form = tape.backward_dense_from(one_hot)
    for i in range(len(tape)):
        if not np.allclose(np.asarray(from_form[i], float), np.asarray(dense_all[i], float),
                           rtol=1e-12, atol=0):
            result.fail(f"law 4: backward_dense_from(one-hot) slot {i} differs from "
                        f"backward_dense_all")
            break
    # law 5: the order of custom-node calls of the first backward
    tape5 = _tape(engine)
    calls5 = build_dag(tape5, nodes)
    tape5.backward_dense(out, s1)
    if calls5 != sorted(calls5, reverse=True) or len(set(calls5)) != len(calls5):
        result.fail(f"law 5: custom VJPs ran in order {calls5}, expected ids descending, once")
    a, b = 0.75, -1.5
    lin = tape.backward_dense(out, a * s1 + b * s2)
    d2 = tape.backward_dense(out, s2)
    both = sorted(hit & got_hit)     # law 1 reports any difference between the two sets
    for i in both:
        want = a * np.asarray(dense[i], float) + b * np.asarray(d2[i], float)
        scale = np.linalg.norm(np.abs(a * np.asarray(dense[i], float))
                               + np.abs(b * np.asarray(d2[i], float))) + 1e-300
        if np.linalg.norm(np.asarray(lin[i], float) - want) > 1e-12 * scale:
            result.fail(f"law 6: slot {i} is not linear in the seed")
            break
    exact_tape = reflib.Tape(dps=30)
    build_dag(exact_tape, nodes)
    exact = exact_tape.backward_dense(out, s1)
    eps = 2.0 ** -52
    from reports.conformance.oracle import Measure

    worst = Measure("slots", 0.0, 1e4, True)
    norms = [np.linalg.norm(np.asarray(e, float)) for e in exact if e is not None]
    floor = max(norms) if norms else 1.0
    for i in both:
        e = np.asarray(exact[i], dtype=float)
        err = np.linalg.norm(np.asarray(dense[i], float) - e) / (eps * max(
            np.linalg.norm(e), 1e-3 * floor, 1e-300))
        if err > worst.error:
            worst = Measure(f"slot {i}", float(err), 1e4, err <= 1e4)
    # NOTE: 1e4 eps64 ~ 2e-12: at most 8 ops on values in [-2, 2], each a few ulps; the floor
    # at 1e-3 of the largest slot absorbs slots that cancel to ~0 (x - x).
    result.measures.append(worst)
    return result
