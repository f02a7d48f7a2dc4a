"""What the suite finds in the peers (paddle, tinygrad, mygrad, autograd), element by element,
at first order (their VJPs) and at second order (``J t`` and ``H t``, also for torch and jax).

The long story: docs/reports-peers.md, section ``reports/peers_findings.py``; the second order:
docs/second-order.md, "What the rows find in the peers".
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import shlex
import sys
import time

import numpy as np

import optable

__all__ = ["ENGINES", "PEERS", "DERIVATIVES", "COLUMNS", "find", "worst_element",
           "second_order_worst", "markdown", "merge", "main", "rebuild_case", "case_tangents",
           "column_of", "held_dtypes", "tie_tolerance", "provenance_of"]

#: the derivatives a finding can be about: the first-order VJP, the second-order rows' J t
#: (``jvp2``) and H t (``hvp``)
DERIVATIVES = ("vjp", "jvp2", "hvp")
#: every engine the table holds, with the derivatives it is held at: the peers at every order
#: (second order where their adapter has jvp/hvp; else the file says why not), torch and jax,
#: which the suite runs anyway, at second order (docs/second-order.md) and, in the 16-bit
#: formats, at first order (their float32 and float64 VJPs are docs/conformance.md's)
ENGINES = {"paddle": DERIVATIVES, "tinygrad": DERIVATIVES, "mygrad": DERIVATIVES,
           "autograd": DERIVATIVES, "torch": DERIVATIVES, "jax": DERIVATIVES}
#: engines held at first order in the 16-bit storage formats only
STORAGE_VJP_ONLY = ("torch", "jax")
PEERS = tuple(n for n in ENGINES if n not in STORAGE_VJP_ONLY)
PACKAGES = {"paddle": "paddlepaddle"}          # engine name -> distribution, where they differ
KINK_SLOPES = {"relu": lambda p: (0.0, 1.0), "abs": lambda p: (-1.0, 1.0),
               "leaky_relu": lambda p: (p.get("negative_slope", 0.01), 1.0)}


#: the table's columns: the VJP in float32 and float64, the VJP in the 16-bit formats, J t, H t
COLUMNS = ("vjp", "vjp16", "jvp2", "hvp")


def column_of(entry):
    """The column of a finding: its derivative, ``vjp16`` for a VJP in bfloat16 or float16."""
    import optable

    derivative = entry.get("derivative", "vjp")
    if derivative == "vjp" and entry["dtype"] in optable.formats.STORAGE:
        return "vjp16"
    return derivative


def held_dtypes(name, engine, column):
    """The dtypes of ``engine`` held in ``column``: second order and the float32/float64 VJP
    in the wide formats, ``vjp16`` in the storage ones (torch and jax: those only)."""
    import optable

    storage = [d for d in engine.dtypes if optable.formats.is_storage(d)]
    if column == "vjp16":
        return storage
    if column == "vjp" and name in STORAGE_VJP_ONLY:
        return []
    return [d for d in engine.dtypes if d not in storage]


def engine_version(name):
    """The installed version of peer ``name``'s package."""
    return importlib.metadata.version(PACKAGES.get(name, name))


# ---------------------------------------------------------------------------------------------
# the failing calls


def _failing_cases(engine, name, dtype, examples, seed):
    """(check label, OpExample) of every failing call: the shrunk random one, each special."""
    from hypothesis import strategies as st

    import spec
    from reports.conformance import properties, runner, special_values
    from reports.conformance.strategies import op_examples

    found = []
    last = {}

    def check(ex):
        result = properties.check_call(engine, ex)
        if not result.ok:
            last["case"] = ex       # Hypothesis replays the shrunk example last
        return result

    strategy = op_examples(name, dtype)
    if spec.OPS[name].kinks:
        strategy = st.booleans().flatmap(lambda k: op_examples(name, dtype, near_kinks=k))
    row = runner.run_property(strategy, check, examples, seed)
    if row.status == "FAIL" and "case" in last:
        found.append(("exact", last["case"]))
    for index, ex in enumerate(special_values.special_cases(name, _dtype(dtype))):
        if not properties.check_call(engine, ex).ok:
            found.append((f"special #{index} ({ex.label})", ex))
    return found


def _second_order_failing(engine, name, dtype, derivative, examples, seed, tables):
    """(check label, OpExample) of every failing ``jvp2``/``hvp`` call of op ``name``: the
    shrunk drawn one and each explicit call of the rows (``second_order_rows``)."""
    from reports.conformance import kinks, second_order, second_order_rows
    from reports.conformance.rows import run_property

    check = getattr(second_order, f"check_{derivative}")
    mode = kinks.default_mode(engine.name)
    found, last = [], {}

    def run(ex):
        result = check(engine, ex, mode)
        if not result.ok:
            last["case"] = ex       # Hypothesis replays the shrunk example last
        return result

    row = run_property(second_order_rows.second_order_examples(name, dtype), run, examples,
                       seed)
    if row.status == "FAIL" and "case" in last:
        found.append(("drawn", last["case"]))
    for ex in second_order_rows.special_second_order_cases(name, dtype, tables):
        if not check(engine, ex, mode).ok:
            found.append((f"special ({ex.label})", ex))
    return found


def _dtype(name):
    """The NumPy dtype of a format name (bfloat16 through ``ml_dtypes``)."""
    import optable

    return optable.formats.dtype_of(np.dtype(name).name if not isinstance(name, str) else name)


def _engine_arrays(engine, ex):
    """(output, grads) of the engine at ``ex``, or the exception it raised."""
    import warnings

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.forward(ex.name, list(ex.inputs), **ex.params)
        grads = engine.vjp(ex.name, list(ex.inputs), ex.grad, **ex.params)
    return out, grads


def worst_element(engine, ex):
    """The worst entry of the call ``ex`` on ``engine`` (a dict; see the module doc)."""
    import spec
    from reports.conformance import oracle

    dtype = np.dtype(ex.dtype)
    try:
        out, grads = _engine_arrays(engine, ex)
    except Exception as exc:  # noqa: BLE001 - the engine's own error is the finding
        return {"kind": "contract", "what": "call", "note": f"raises {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160]}", "raises": type(exc).__name__}
    from reports.conformance.properties import admissible_for

    exact = oracle.exact_vjp(ex.name, ex.inputs, ex.grad, ex.params)
    inputs64 = [oracle.as_float64(x) for x in ex.inputs]
    # the bound the suite holds the engine to: its 16-bit declarations (computes_in,
    # accumulates) in a storage format, the general bound otherwise
    a_out, a_grads = admissible_for(engine, ex.name, dtype, inputs64, oracle.as_float64(ex.grad),
                                    ex.params, exact, once=False)
    arrays = [("output", out, exact.out, a_out)]
    for iname, g, e, a in zip(spec.OPS[ex.name].inputs, grads, exact.grads, a_grads):
        if e is not None:
            arrays.append((f"d/d{iname}", g, e, a))
    entry = _worst(arrays, dtype)
    if entry["kind"] == "failure":
        entry.update(_convention(ex, entry["what"], tuple(entry["index"]),
                                 entry["engine_value"], grads))
    return entry


def _worst(arrays, dtype, skip=None):
    """The worst entry over ``(what, engine array, (hi, lo), admissible in eps)`` arrays: a
    contract finding for a wrong dtype or shape; ``skip`` masks entries per ``what``."""
    import optable

    fmt = optable.formats.format_of(dtype)
    eps, tiny = fmt.eps, fmt.tiny
    best = None
    for what, got, (hi, lo), adm in arrays:
        if got is None:
            return {"kind": "contract", "what": what,
                    "note": f"{what} is None for a differentiable input", "returns_dtype": "None",
                    "returns_shape": []}
        got = np.asarray(got)
        if got.dtype != dtype or got.shape != hi.shape:
            return {"kind": "contract", "what": what,
                    "note": f"{what} has dtype {got.dtype} and shape {got.shape}; expected "
                            f"{dtype} and {hi.shape}", "returns_dtype": str(got.dtype),
                    "returns_shape": list(got.shape)}
        g64 = got.astype(np.float64)
        with np.errstate(all="ignore"):
            diff = np.abs((g64 - hi) - lo)
            diff = np.where(np.isfinite(g64), diff, np.inf)
            ratio = diff / (np.asarray(adm, np.float64) * eps + tiny)
        if skip is not None and what in skip:
            ratio = np.where(skip[what], 0.0, ratio)
        if ratio.size == 0:
            continue
        idx = np.unravel_index(int(np.nanargmax(ratio)), ratio.shape)
        if best is None or ratio[idx] > best[0]:
            best = (float(ratio[idx]), what, tuple(int(i) for i in idx), float(g64[idx]),
                    float(hi[idx]), float(lo[idx]), float(diff[idx]),
                    float(np.asarray(adm, np.float64)[idx]))
    _, what, idx, value, hi, lo, diff, adm = best
    scale = max(abs(hi), tiny)
    return {"kind": "failure", "what": what, "index": list(idx), "engine_value": value,
            "exact_hi": hi, "exact_lo": lo, "abs_error": diff,
            "error_eps": diff / (eps * scale), "admissible_abs": adm * eps}


def second_order_worst(engine, ex, derivative, tangents):
    """The worst entry of the engine's ``J t`` (``derivative="jvp2"``) or ``H t`` (``"hvp"``)
    at call ``ex`` with ``tangents`` (a dict, as :func:`worst_element`'s)."""
    import warnings

    import spec
    from reports.conformance import bounds, second_order

    dtype = np.dtype(ex.dtype)
    exact = second_order.exact_second_order(ex, tangents)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _second_order_arrays(engine, ex, derivative, tangents)
    except Exception as exc:  # noqa: BLE001 - the engine's own error is the finding
        return {"kind": "contract", "what": "call", "note": f"raises {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160]}", "raises": type(exc).__name__}
    if derivative == "jvp2":
        adm = second_order._admissible(exact["jvp_E"])
        arrays = [("J t", got, exact["jvp"], adm)]
        skip = None
        interval = second_order._kink_interval(ex, tangents)
        if interval is not None and np.shape(got) == np.shape(exact["jvp"][0]):
            # a J t entry on a kink inside the subdifferential is the engine's convention
            # (the peers' kink policy, "subgradient"), not a finding
            at, low, high = interval
            g = np.asarray(got, np.float64)
            _, allowed, _ = bounds.entrywise(g, exact["jvp"][0], exact["jvp"][1], adm, dtype)
            skip = {"J t": at & (g >= low - allowed) & (g <= high + allowed)}
        return _worst(arrays, dtype, skip)
    arrays = [(f"H t (d/d{n})", h, e, second_order._admissible(E))
              for n, h, e, E in zip(spec.OPS[ex.name].inputs, got, exact["hvp"],
                                    exact["hvp_E"]) if e is not None]
    return _worst(arrays, dtype)


def _second_order_arrays(engine, ex, derivative, tangents):
    """The engine's ``J t`` (one array) or ``H t`` (one per input) at ``ex``."""
    if derivative == "jvp2":
        return engine.jvp(ex.name, list(ex.inputs), list(tangents), **ex.params)[1]
    return engine.hvp(ex.name, list(ex.inputs), ex.grad, list(tangents), **ex.params)


def _convention(ex, what, idx, value, grads):
    """``{"kind": "convention", "note": ...}`` when the element is another subgradient."""
    params = ex.params
    if ex.name in KINK_SLOPES and what == "d/dx":
        x = float(np.asarray(ex.inputs[0], np.float64)[idx])
        g = float(np.asarray(ex.grad, np.float64)[idx])
        lo, hi = sorted(KINK_SLOPES[ex.name](params))
        if x == 0.0 and g != 0.0 and lo <= value / g <= hi:
            return {"kind": "convention",
                    "note": f"{ex.name}'({x:g}) taken as {value / g:g} (registry: "
                            f"{ {'relu': 0, 'abs': 0}.get(ex.name, lo):g}; any value in "
                            f"[{lo:g}, {hi:g}] is a subgradient)"}
    if ex.name == "maximum" and what in ("d/da", "d/db"):
        for share in (0.5, 0.0):
            if _maximum_split_matches(ex, grads, share):
                return {"kind": "convention",
                        "note": f"at ties the engine sends {share:g} of the gradient to a and "
                                f"{1 - share:g} to b (registry: all to a; any split summing "
                                f"to 1 is a subgradient)"}
    return {}


def tie_tolerance(ex, terms=1):
    """The relative tolerance to which a VJP of maximum (or the cotangent it carries) is read
    as the tie rule's value: 1e-6 in float32 and float64; in a 16-bit format the rounding
    of each of ``terms`` shares summed there, ``terms`` eps of the format (a split rounded to
    bfloat16 is 2**-8 off the exact half, which is no failure)."""
    fmt = optable.formats.format_of(np.dtype(ex.dtype))
    return max(1e-6, terms * fmt.eps) if fmt.storage else 1e-6


def _maximum_split_matches(ex, grads, share):
    """Whether ``grads`` of maximum are the tie rule "``share`` to a, the rest to b" (to the
    rounding of the format, ``tie_tolerance``)."""
    a, b = (np.asarray(x, np.float64) for x in ex.inputs)
    g = np.asarray(ex.grad, np.float64)
    a_full, b_full = np.broadcast_arrays(a, b)
    tie = a_full == b_full
    da = g * ((a_full > b_full) + share * tie)
    db = g * ((a_full < b_full) + (1 - share) * tie)

    def reduce_to(x, shape):
        while x.ndim > len(shape):
            x = x.sum(axis=0)
        for axis, n in enumerate(shape):
            if n == 1 and x.shape[axis] != 1:
                x = x.sum(axis=axis, keepdims=True)
        return x

    storage = optable.formats.is_storage(np.dtype(ex.dtype))

    def matches(got, want, x):
        got, exact = np.asarray(got, np.float64), reduce_to(want, x.shape)
        terms = max(1, int(np.size(want)) // max(1, int(np.size(x))))
        # a 16-bit sum of shares rounds relative to the shares' magnitudes, not to its total
        scale = reduce_to(np.abs(want), x.shape) if storage else np.abs(exact)
        return bool(np.all(np.abs(got - exact) <= tie_tolerance(ex, terms) * scale))

    return bool(tie.any()) and all(matches(got, want, x)
                                   for got, want, x in zip(grads, (da, db), (a, b)))


# ---------------------------------------------------------------------------------------------
# running it


def _serialise_case(check, ex, special_index, tangents=None):
    base = {"op": ex.name, "dtype": np.dtype(ex.dtype).name, "params": ex.params,
            "label": ex.label or "random"}
    if special_index is not None:
        return {**base, "special": special_index}
    base = {**base, "inputs": [np.asarray(x).tolist() for x in ex.inputs],
            "input_dtypes": [np.asarray(x).dtype.name for x in ex.inputs],
            "grad": np.asarray(ex.grad).tolist()}
    if tangents is None:
        return base
    # a second-order call: its seed and flags rebuild the same OpExample, and the tangents
    # are stored (the verification passes them to the engine as they are)
    return {**base, "seed": int(ex.seed), "near_kinks": bool(ex.near_kinks),
            "edges": bool(ex.edges),
            "tangents": [None if t is None else np.asarray(t).tolist() for t in tangents]}


def rebuild_case(case):
    """The ``OpExample`` a findings entry was measured on."""
    from reports.conformance import special_values
    from reports.conformance.strategies import OpExample

    if "special" in case:
        return special_values.special_cases(case["op"], _dtype(case["dtype"]))[case["special"]]
    import optable

    inputs = tuple(np.array(x, dtype=_dtype(d) if d in optable.formats.names() else d)
                   for x, d in zip(case["inputs"], case["input_dtypes"]))
    # JSON turns the tuple params (axis, axes, shape) into lists: turn them back
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in case["params"].items()}
    return OpExample(case["op"], inputs, np.array(case["grad"], dtype=_dtype(case["dtype"])),
                     params, case.get("seed", 0), case.get("near_kinks", False), case["label"],
                     case.get("edges", False))


def case_tangents(case):
    """The tangents stored with a second-order findings entry (None for class indices)."""
    return [None if t is None else np.array(t, dtype=_dtype(case["dtype"]))
            for t in case["tangents"]]



def _engine_info(name, engine):
    import spec
    from reports.conformance import second_order

    info = {"available": True, "version": engine_version(name),
            "description": getattr(engine, "description", ""),
            "composed": dict(getattr(engine, "composed", {})),
            "unsupported": {o: engine.supports(o)[1] for o in spec.OPS
                            if not engine.supports(o)[0]},
            "unsupported_derivatives": {d: dict(ops) for d, ops in
                                        getattr(engine, "unsupported_derivatives", {}).items()},
            "derivatives": list(ENGINES[name])}
    missing = second_order.not_provided(engine)
    info["second_order"] = missing or getattr(engine, "second_order_route", "") or \
        getattr(engine, "description", "")
    return info


def find(engine_names=tuple(ENGINES), ops=None, examples=10, seed=0, progress=None,
         second_order_tables=True, derivatives=DERIVATIVES, dtypes=None):
    """Every failing call of each engine at each derivative ``ENGINES`` holds it to, with its
    worst element (a JSON-ready dict).

    First order: ``examples`` drawn calls per op and dtype and the special-values table, in
    float32 and float64 and (column ``vjp16``) in the 16-bit formats the engine stores;
    second order: the ``jvp2``/``hvp`` rows' share of them (``second_order_rows.examples_for``)
    and their explicit calls (the first-order tables' small calls too when
    ``second_order_tables``, as the ``ci`` profile runs them). ``derivatives`` and ``dtypes``
    (format names) narrow the run (a run may be split by engine, derivative or format and the
    parts joined by :func:`merge`). An op an engine has no kernel for in a format
    (``engines.supports_in``) is listed in its ``unsupported_in``, with the reason.
    """
    import spec
    from reports.conformance import engines as registry
    from reports.conformance import second_order, second_order_rows

    so_examples = max(2, examples // second_order_rows.SHARE)
    doc = {"profile": {"examples": examples, "seed": seed}, "engines": {}, "findings": []}
    if set(derivatives) - {"vjp"}:
        doc["profile"].update(second_order_examples=so_examples,
                              second_order_tables=bool(second_order_tables))
    for name in engine_names:
        status = registry.engine_status(name)
        if not status.available:
            doc["engines"][name] = {"available": False, "reason": status.reason}
            continue
        engine = registry.get_engine(name)
        info = doc["engines"][name] = _engine_info(name, engine)
        seconds = info["seconds"] = {}
        for column in COLUMNS:
            derivative = "vjp" if column == "vjp16" else column
            held = [np.dtype(d).name for d in held_dtypes(name, engine, column)
                    if dtypes is None or np.dtype(d).name in dtypes]
            if derivative not in ENGINES[name] or derivative not in derivatives or not held \
                    or derivative != "vjp" and second_order.not_provided(engine):
                continue
            start = time.perf_counter()
            for op in ops or spec.OPS:
                if derivative != "vjp" and engine.supports(op)[0] \
                        and not engine.supports_derivative(op, derivative)[0]:
                    continue            # declared: recorded in the engine's entry, not a finding
                for dt in held:
                    ok, reason = registry.supports_in(engine, op, _dtype(dt))
                    if not ok:
                        if engine.supports(op)[0]:   # a kernel the format lacks: say so
                            info.setdefault("unsupported_in", {}).setdefault(dt, {})[op] = \
                                reason
                        continue
                    if progress:
                        progress(f"{name} {derivative} {op} {dt}")
                    doc["findings"] += _findings(engine, name, derivative, op, dt, examples,
                                                 so_examples, seed, second_order_tables)
            seconds[column] = round(time.perf_counter() - start, 1)
    return doc


#: the command line of this module, as a record names it
COMMAND = "python -m reports.peers_findings"
#: environment variables that change what a peer computes (tinygrad's backend)
RECORDED_ENVIRONMENT = ("DEV",)


def provenance_of(doc, argv, seconds):
    """The record of the run (or merge) that made ``doc``: ``command``, ``date``, ``machine``,
    ``versions`` (each engine's and the packages'), ``seconds``, the ``environment`` variables
    that change a peer's results, the load average; a merge keeps its parts' records in
    ``runs``."""
    from reports import provenance

    env = {k: os.environ[k] for k in RECORDED_ENVIRONMENT if os.environ.get(k)}
    prefix = "".join(f"{k}={v} " for k, v in env.items())
    names = [n for n, info in doc["engines"].items() if info.get("available", True)]
    record = {"command": prefix + COMMAND + (" " + shlex.join(argv) if argv else ""),
              "date": provenance.now(), "machine": provenance.machine(),
              "seconds": round(seconds, 1), "load_after": provenance.load_average()}
    if not doc.get("runs"):      # a merge measured nothing: its parts' records say what did
        record["versions"] = {**provenance.versions(("verigrad", "numpy", "numba", "mpmath",
                                                     "sympy")),
                              **provenance.versions(names, PACKAGES)}
    if env:
        record["environment"] = env
    return record


def _runs(doc):
    """The run records a findings document holds: its parts' (a merge), else its own."""
    if doc.get("runs"):
        return list(doc["runs"])
    own = {k: doc[k] for k in ("command", "date", "machine", "versions", "seconds",
                               "load_after", "environment", "recorded") if k in doc}
    return [own] if own else []


def merge(docs):
    """One findings document from the parts of a split run (disjoint engines or derivatives,
    the same profile); a part written before findings named their derivative holds VJPs. The
    parts' run records are kept in ``runs``."""
    out = {"profile": {}, "engines": {}, "findings": [], "runs": []}
    for doc in docs:
        out["runs"] += [r for r in _runs(doc) if r not in out["runs"]]
        second = any(d != "vjp" for info in doc["engines"].values()
                     for d in info.get("seconds", {}))
        for key, value in doc["profile"].items():
            if key.startswith("second_order") and not second:
                continue        # a first-order part: its second-order settings never ran
            if out["profile"].setdefault(key, value) != value:
                raise ValueError(f"the parts were run under different profiles: {key} is "
                                 f"{out['profile'][key]!r} in one and {value!r} in another; "
                                 f"rerun them with the same --examples and --seed")
        for name, info in doc["engines"].items():
            known = out["engines"].setdefault(name, info)
            if known.get("version") != info.get("version"):
                raise ValueError(f"{name} was run at versions {known.get('version')} and "
                                 f"{info.get('version')}: rerun the older part")
            known.update({k: v for k, v in info.items() if k not in known})
            known["seconds"] = {**known.get("seconds", {}), **info.get("seconds", {})}
            known["derivatives"] = list(dict.fromkeys(known.get("derivatives", [])
                                                      + info.get("derivatives", [])))
            for dt, missing in info.get("unsupported_in", {}).items():
                if missing is not known.get("unsupported_in", {}).get(dt):
                    known.setdefault("unsupported_in", {}).setdefault(dt, {}).update(missing)
        out["findings"] += [{"derivative": "vjp", **e} for e in doc["findings"]]
    order = {name: i for i, name in enumerate(ENGINES)}
    out["findings"].sort(key=lambda e: (order.get(e["engine"], len(order)),
                                        COLUMNS.index(column_of(e))))
    out["engines"] = dict(sorted(out["engines"].items(),
                                 key=lambda item: order.get(item[0], len(order))))
    return out


def _findings(engine, name, derivative, op, dt, examples, so_examples, seed, tables):
    from reports.conformance import second_order

    out = []
    if derivative == "vjp":
        for check, ex in _failing_cases(engine, op, dt, examples, seed):
            special = int(check.split("#")[1].split()[0]) if "#" in check else None
            entry = {"engine": name, "derivative": "vjp", "op": op, "dtype": dt,
                     "check": check, "case": _serialise_case(check, ex, special)}
            entry.update(worst_element(engine, ex))
            out.append(entry)
        return out
    for check, ex in _second_order_failing(engine, op, dt, derivative, so_examples, seed,
                                           tables):
        tangents = second_order.tangents_for(ex)
        entry = {"engine": name, "derivative": derivative, "op": op, "dtype": dt,
                 "check": check, "case": _serialise_case(check, ex, None, tangents)}
        entry.update(second_order_worst(engine, ex, derivative, tangents))
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------
# the table


def _inputs_text(entry, ex):
    """The inputs (and tangents) at the element for elementwise ops; else the call's shapes
    and label."""
    import spec

    family = spec.OPS[entry["op"]].category
    idx = tuple(entry.get("index", ()))
    elementwise = family in ("unary", "binary") or entry["op"] in (
        "mse", "binary_cross_entropy", "binary_cross_entropy_with_logits")
    if elementwise and entry.get("what", "") != "output" or family in ("unary", "binary"):
        arrays = [np.asarray(x, np.float64) for x in ex.inputs]
        if all(a.shape == arrays[0].shape for a in arrays) and len(idx) == arrays[0].ndim:
            names = list(spec.OPS[entry["op"]].inputs)
            if "tangents" in entry["case"]:
                tans = case_tangents(entry["case"])
                names += [f"t_{n}" for n, t in zip(names, tans) if t is not None]
                arrays += [np.asarray(t, np.float64) for t in tans if t is not None]
            return ", ".join(f"{n}={float(a[idx]):.9g}" for n, a in zip(names, arrays))
    shapes = " ".join(str(tuple(np.shape(x))) for x in ex.inputs)
    return f"{ex.label or 'random'} {shapes}".strip()


#: the table's words for each column (a derivative; the VJP in 16 bits apart)
DERIVATIVE_TEXT = {"vjp": "VJP", "vjp16": "VJP (16-bit)", "jvp2": "J t", "hvp": "H t"}


def markdown(doc):
    """The findings table as Markdown: per engine, derivative, op and dtype, the worst failing
    call.

    A row shows the worst finding of its (engine, derivative, op, dtype) (a contract finding
    first, then the largest error) and how many checks failed there; ``findings.json`` keeps
    them all. The derivative is the first-order VJP or the second order's ``J t`` / ``H t``.
    """
    groups = {}
    for e in doc["findings"]:
        key = (e["engine"], column_of(e), e["op"], e["dtype"])
        groups.setdefault(key, []).append(e)

    def severity(e):
        return (e["kind"] == "contract", e["kind"] == "failure", e.get("error_eps") or 0.0)

    lines = ["| engine | derivative | op | dtype | checks failing | kind | worst element | "
             "inputs there | engine value | exact | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (engine, derivative, op, dtype), entries in groups.items():
        e = max(entries, key=severity)
        labels = dict.fromkeys(x["check"].split("(", 1)[-1].rstrip(")") for x in entries)
        head = (f"| {engine} {doc['engines'][engine]['version']} | "
                f"{DERIVATIVE_TEXT[derivative]} | {op} | {dtype} | "
                f"{len(entries)}: {', '.join(labels)} |")
        ex = rebuild_case(e["case"])
        if e["kind"] == "contract":
            lines.append(f"{head} contract | {e['what']} | {_inputs_text(e, ex)} | {e['note']} "
                         f"| - | - |")
            continue
        kind = f"convention: {e['note']}" if e["kind"] == "convention" else "**failure**"
        lines.append(f"{head} {kind} | {e['what']}{list(e['index'])} | {_inputs_text(e, ex)} | "
                     f"{e['engine_value']:.9g} | {e['exact_hi']:.9g} | {e['error_eps']:.3g} eps "
                     f"(abs {e['abs_error']:.3g}) |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    """Command line: run the peers, write the JSON and the Markdown table."""
    parser = argparse.ArgumentParser(prog="python -m reports.peers_findings",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--ops", nargs="+")
    parser.add_argument("--examples", type=int, default=10, help="random draws per op (dev)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--derivatives", nargs="+", default=list(DERIVATIVES),
                        choices=list(DERIVATIVES), help="vjp (first order), jvp2, hvp")
    parser.add_argument("--dtypes", nargs="+", default=None,
                        choices=list(optable.formats.names()),
                        help="only these formats (default: every format each engine has)")
    parser.add_argument("--merge", nargs="+", metavar="FILE",
                        help="join the findings files of a split run instead of running")
    parser.add_argument("--no-second-order-tables", dest="tables", action="store_false",
                        help="second order: the calls placed for it only, not the first-order "
                             "tables' small calls (the dev profile's choice)")
    parser.add_argument("--json", metavar="FILE", help="write the findings here")
    parser.add_argument("--markdown", metavar="FILE", help="write the table here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.merge:
        doc = merge([json.loads(open(f, encoding="utf-8").read()) for f in args.merge])
    else:
        doc = find(args.engines, args.ops, args.examples, args.seed,
                   progress=lambda s: print(s, file=sys.stderr, flush=True),
                   second_order_tables=args.tables, derivatives=args.derivatives,
                   dtypes=args.dtypes)
    doc.update(provenance_of(doc, sys.argv[1:] if argv is None else argv,
                             time.perf_counter() - started))
    for name, info in doc["engines"].items():
        if not info["available"]:
            print(f"{name}: unavailable: {info['reason']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, default=float)
    table = markdown(doc)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(table)
    print(table)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
