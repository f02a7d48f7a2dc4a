"""The ``jvp2`` and ``hvp`` rows of ``verigrad conform``: what each draws, and the rows per engine.

Each row is a Hypothesis property over op calls with domain values, edge magnitudes (clipped to
the cube root of the dtype's range) or values on the op's kinks, after the op's special calls as
explicit examples: the small calls of the first-order special and edge tables and calls placed
for second order (narrow rows, dominant logits, points just off a kink, near ties, large and
small magnitudes). Checks: ``second_order.check_jvp2`` / ``check_hvp``. The long story:
docs/second-order.md.
"""
from __future__ import annotations

import numpy as np

from reports.conformance.strategies import OpExample

__all__ = ["second_order_rows", "second_order_examples", "special_second_order_cases",
           "examples_for", "second_order_decades", "SMALL", "LONG_PROFILES", "KINDS"]

KINDS = ("jvp2", "hvp")
#: the special and edge calls of the first-order tables that the ``ci`` profile's rows reuse:
#: at most this many entries over all inputs, unless the op is unary (a long unary call's
#: exact value is taken once per distinct value: ``second_order.BY_VALUE_FROM``); the exact
#: second order of a long row or a 37 x 37 dominant block costs spec's dual numbers up to a
#: minute of CPU per call
SMALL = 64
#: the profiles whose rows run the tables' calls of any length
LONG_PROFILES = ("thorough",)
#: the second-order rows draw this fraction of a profile's ``examples`` (at least 2): each
#: example costs an exact JVP and HVP and their running-error bound in mpmath
SHARE = 5
#: the profiles whose rows also run the first-order tables' special calls; ``dev`` runs the
#: calls placed for second order only (each exact call costs spec's dual numbers in mpmath)
TABLE_PROFILES = ("ci", "thorough")


def examples_for(profile):
    """How many examples a ``jvp2`` / ``hvp`` row draws under ``profile``."""
    return max(2, profile.examples // SHARE)


def second_order_decades(name, dtype):
    """``(lo, hi)``: the log10 range of the edge draws of op ``name``'s second-order rows."""
    from reports.conformance.strategies import edge_decades

    info = np.finfo(np.dtype(dtype))
    lo, hi = edge_decades(name, dtype)
    cube = float(np.log10(float(info.max))) / 3 - 1.0
    return max(lo, -cube), min(hi, cube)


def _edge_inputs(ex):
    """``ex`` with its real inputs redrawn across ``second_order_decades`` (kinks kept)."""
    import spec

    op = spec.OPS[ex.name]
    dtype = np.dtype(ex.dtype)
    lo, hi = second_order_decades(ex.name, dtype)
    rng = np.random.default_rng([int(ex.seed) % 2**32, 3])
    out = []
    for n, x in zip(op.inputs, ex.inputs):
        domain = op.domains[n]
        x = np.asarray(x)
        if domain in ("real", "nonzero", "positive"):
            mag = 10.0 ** rng.uniform(lo, hi, size=x.shape)
            sign = 1.0 if domain == "positive" else rng.choice([-1.0, 1.0], size=x.shape)
            keep = (x == 0) if ex.near_kinks else np.zeros(x.shape, bool)
            v = np.where(keep, 0.0, sign * mag)
            out.append(np.asarray(v).astype(dtype))
        elif domain == "unit_open":
            near = 10.0 ** rng.uniform(lo, -0.5, size=x.shape)
            gap = 10.0 ** rng.uniform(np.log10(float(np.finfo(dtype).epsneg)), -0.5,
                                      size=x.shape)
            v = np.asarray(np.where(rng.random(x.shape) < 0.5, near, 1.0 - gap)).astype(dtype)
            below_one = np.nextafter(np.asarray(1.0, dtype), np.asarray(0.0, dtype))
            out.append(np.clip(v, np.finfo(dtype).tiny, below_one).astype(dtype))
        else:
            out.append(x)
    if ex.name == "maximum" and ex.near_kinks:   # the ties the sampler placed stay ties
        a, b = (np.asarray(v, np.float64) for v in ex.inputs)
        if a.shape == np.broadcast_shapes(a.shape, b.shape):
            out[0] = np.where(a == b, np.broadcast_to(out[1], a.shape), out[0]).astype(dtype)
    return OpExample(ex.name, tuple(out), ex.grad, ex.params, ex.seed, ex.near_kinks,
                     "edge magnitudes", True)


def second_order_examples(name, dtype):
    """A strategy of op calls for the ``jvp2``/``hvp`` rows (module docstring)."""
    from hypothesis import strategies as st

    import spec

    from reports.conformance.strategies import make_example, op_case

    forms = ["domain values", "edge magnitudes"] + (["on kinks"] if spec.OPS[name].kinks
                                                    else [])

    @st.composite
    def draw(draw_):
        shapes, params, seed = draw_(op_case(name))
        form = draw_(st.sampled_from(forms))
        ex = make_example(name, shapes, params, seed, np.dtype(dtype),
                          near_kinks=form == "on kinks")
        if form == "edge magnitudes" or (form == "on kinks" and draw_(st.booleans())):
            ex = _edge_inputs(ex)
        return ex

    return draw()


def _raw_second_order(name, dtype):
    """(label, inputs as float64/int arrays, params): the calls placed for second order."""
    f64 = np.dtype(dtype) == np.float64
    u = float(np.finfo(dtype).eps) / 2
    a = np.array
    rng = np.random.default_rng(20261126)
    cases = []
    if name in ("layer_norm", "rms_norm"):
        # a row whose spread is tiny beside its mean: centring cancels, 1/σ² is large
        for spread in ((1e-3, 1e-6) if f64 else (1e-2, 1e-3)):
            row = 1.0 + spread * rng.standard_normal((2, 5))
            cases.append(("narrow row", [row], {"eps": 1e-12 if f64 else 1e-8}))
        cases.append(("narrow row", [1.0 + 1e-4 * rng.standard_normal((3, 4))], {}))
        cases.append(("large magnitudes", [1e6 * rng.standard_normal((2, 4))], {}))
    if name in ("softmax", "log_softmax", "logsumexp", "cross_entropy",
                "categorical_cross_entropy"):
        n, c = 5, 5
        z = rng.uniform(-1.0, 1.0, (n, c))
        z[np.arange(n), np.arange(n)] += 30.0 if f64 else 12.0
        params = {"axis": -1} if name in ("softmax", "log_softmax") else \
            {"axis": 1} if name == "logsumexp" else {}
        target = (np.arange(n) + 1) % c
        extra = [target] if name == "cross_entropy" else \
            [np.eye(c)[np.arange(n)]] if name == "categorical_cross_entropy" else []
        cases.append(("dominant logit at every position", [z] + extra, params))
        big = z.copy()
        big[np.arange(n), np.arange(n)] += 1e4
        extra = [np.arange(n) % c] if name == "cross_entropy" else extra
        cases.append(("dominant logit at every position", [big] + extra, params))
    if name in ("relu", "abs", "leaky_relu"):
        tiny = float(np.finfo(dtype).tiny)
        x = a([0.0, -0.0, tiny, -tiny, 3 * float(np.finfo(dtype).smallest_subnormal), u, -u])
        cases.append(("near kinks", [x], {"negative_slope": 0.2} if name == "leaky_relu"
                      else {}))
    if name == "maximum":
        b = a([1.0, -2.0, 0.5, 3.0])
        up = np.nextafter(b.astype(dtype), np.asarray(np.inf, dtype)).astype(np.float64)
        down = np.nextafter(b.astype(dtype), np.asarray(-np.inf, dtype)).astype(np.float64)
        cases += [("ties", [b, b.copy()], {}), ("near ties", [up, b], {}),
                  ("near ties", [down, b], {})]
    if name in ("exp", "tanh", "sigmoid", "softplus", "silu", "gelu", "gelu_tanh", "log",
                "sqrt", "square", "neg", "identity"):
        top = 5.0 if name in ("exp",) else (30.0 if f64 else 12.0)
        x = np.concatenate([np.linspace(-top, top, 9), [1e-3, -1e-3]])
        if name in ("log", "sqrt"):
            x = np.abs(x) + 1e-3
        cases.append(("large and small magnitudes", [x], {}))
    if name in ("mul", "div"):
        lo, hi = second_order_decades(name, dtype)
        big, small = 10.0 ** (hi / 2), 10.0 ** (lo / 2)
        cases.append(("large and small magnitudes",
                      [a([big, -small, 1.0, 3.0]), a([small, big, -big, 1.0 / 3.0])], {}))
    if name in ("binary_cross_entropy", "binary_cross_entropy_with_logits"):
        p = a([1e-6, 0.5, 1 - 2.0 ** -10, 0.25]) if name == "binary_cross_entropy" else \
            a([20.0 if f64 else 8.0, -(20.0 if f64 else 8.0), 0.0, 3.0])
        cases.append(("saturation", [p, a([1.0, 0.0, 0.25, 1.0])], {}))
    return cases


def _representable(ex, dtype):
    """Whether ``ex``'s exact JVP and HVP are finite numbers of ``dtype``."""
    from reports.conformance.second_order import exact_second_order, tangents_for

    exact = exact_second_order(ex, tangents_for(ex))
    big = float(np.finfo(dtype).max)
    arrays = [exact["jvp"][0]] + [h[0] for h in exact["hvp"] if h is not None]
    return all(np.all(np.abs(v) <= big) for v in arrays)


def _first_order_calls(name, dtype):
    """(label, inputs, params) of the first-order special-values and edge tables, before their
    own exact filtering (the second-order one follows)."""
    from reports.conformance import edge_cases, special_values

    return (special_values._raw_cases(name, dtype)
            + edge_cases._raw(name, dtype, np.random.default_rng(20261124)))


def special_second_order_cases(name, dtype, tables=True, long_calls=False):
    """The explicit calls of op ``name``'s ``jvp2``/``hvp`` rows in ``dtype``, in a fixed
    order (``OpExample`` with a ``label``; module docstring). ``tables=False`` leaves out the
    first-order tables' calls (the ``dev`` profile: ``TABLE_PROFILES``); ``long_calls=False``
    leaves out their calls of more than ``SMALL`` entries unless the op is unary (``ci``;
    ``thorough`` runs them all: ``LONG_PROFILES``)."""
    import spec

    from reports.conformance.strategies import make_example

    dtype = np.dtype(dtype)
    op = spec.OPS[name]
    rng = np.random.default_rng(26)
    cases = []
    for label, inputs, params in ((_first_order_calls(name, dtype) if tables else [])
                                  + _raw_second_order(name, dtype)):
        if (not long_calls and op.category != "unary"
                and sum(int(np.size(x)) for x in inputs) > SMALL):
            continue
        cast = tuple(np.asarray(x) if op.domains[n] == "class_index"
                     else np.asarray(x, np.float64).astype(dtype)
                     for n, x in zip(op.inputs, inputs))
        shape = op.check_shapes([np.shape(x) for x in cast], params)
        grad = rng.standard_normal(shape).astype(dtype)
        cases.append(OpExample(name, cast, grad, dict(params), len(cases), False, label))
    example = op.examples[0]
    base = make_example(name, example.shapes, dict(example.params), 0, dtype)
    cases.append(OpExample(name, base.inputs, np.zeros_like(base.grad), base.params, len(cases),
                           False, "zero cotangent"))
    return [ex for ex in cases if _representable(ex, dtype)]


def _form(ex):
    from reports.conformance.strategies import case_form

    label = getattr(ex, "label", "")
    if label and label != "edge magnitudes":
        return f"special: {label}"
    return case_form(ex)


def _reproduce(engine_ref, check, kinks):
    from reports.conformance.repro import literal

    def snippet(ex):
        return ("import numpy as np\nfrom reports.conformance import engines, second_order\n"
                "from reports.conformance.strategies import OpExample\n"
                f"engine = engines.get_engine({engine_ref!r})\n"
                f"ex = OpExample({ex.name!r}, {literal(tuple(ex.inputs))},\n"
                f"               {literal(ex.grad)}, {literal(ex.params)}, {int(ex.seed)})\n"
                f"result = second_order.{check}(engine, ex, {kinks!r})\n"
                "print(result.describe().replace('; ', '\\n') or result)\n")
    return snippet


def _declared(engine, name, kind):
    """The reason ``engine`` declares its ``kind`` of op ``name`` missing, or ""."""
    supports = getattr(engine, "supports_derivative", None)
    if supports is None:        # a plugin without the base class: nothing declared
        return ""
    ok, reason = supports(name, kind)
    return "" if ok else reason


def second_order_rows(engine, ref, dtypes, ops, kinks=None):
    """The ``jvp2`` and ``hvp`` rows of ``engine`` for ``ops`` in ``dtypes``.

    An engine without ``jvp``/``hvp`` gets its rows as "unsupported" with the reason
    ("not provided: ..."), never failed; an op it does not support likewise, and a derivative
    of an op it declares missing (``Engine.supports_derivative``).
    """
    from reports.conformance import kinks as _kinks
    from reports.conformance import second_order
    from reports.conformance.rows import Row, RowResult, run_property

    mode = kinks or _kinks.default_mode(engine.name if ":" not in ref else ref)
    flag = "" if kinks is None else kinks
    missing = second_order.not_provided(engine)
    rows = []
    for name in ops:
        ok, reason = engine.supports(name)
        for dtype in dtypes:
            dt = np.dtype(dtype).name
            for kind, check in zip(KINDS, ("check_jvp2", "check_hvp")):
                why = (missing or reason) if (missing or not ok) else _declared(engine, name, kind)
                if why:
                    rows.append(Row(kind, name, engine.name, dt, result=RowResult(
                        status="unsupported", detail=why)))
                    continue

                def run(profile, seed, name=name, dtype=dtype, check=check):
                    fn = getattr(second_order, check)
                    return run_property(second_order_examples(name, dtype),
                                        lambda ex: fn(engine, ex, mode),
                                        examples_for(profile), seed,
                                        _reproduce(ref, check, mode),
                                        examples=special_second_order_cases(
                                            name, dtype, profile.name in TABLE_PROFILES,
                                            profile.name in LONG_PROFILES),
                                        distinct=_form)
                rows.append(Row(kind, name, engine.name, dt, run, kinks=flag))
    return rows
