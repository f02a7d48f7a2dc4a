"""What the suite finds in the peers (paddle, tinygrad, mygrad, autograd), element by element.

The long story: docs/reports.md, section ``reports/peers_findings.py``.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import sys

import numpy as np

__all__ = ["PEERS", "find", "worst_element", "markdown", "main", "rebuild_case"]

PEERS = ("paddle", "tinygrad", "mygrad", "autograd")
PACKAGES = {"paddle": "paddlepaddle"}          # engine name -> distribution, where they differ
KINK_SLOPES = {"relu": lambda p: (0.0, 1.0), "abs": lambda p: (-1.0, 1.0),
               "leaky_relu": lambda p: (p.get("negative_slope", 0.01), 1.0)}


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
    for index, ex in enumerate(special_values.special_cases(name, dtype)):
        if not properties.check_call(engine, ex).ok:
            found.append((f"special #{index} ({ex.label})", ex))
    return found


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
    from reports.conformance import bounds, oracle

    dtype = np.dtype(ex.dtype)
    eps, tiny = float(np.finfo(dtype).eps), float(np.finfo(dtype).tiny)
    try:
        out, grads = _engine_arrays(engine, ex)
    except Exception as exc:  # noqa: BLE001 - the engine's own error is the finding
        return {"kind": "contract", "what": "call", "note": f"raises {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160]}", "raises": type(exc).__name__}
    exact = oracle.exact_vjp(ex.name, ex.inputs, ex.grad, ex.params)
    inputs64 = [oracle.as_float64(x) for x in ex.inputs]
    a_out, a_grads = bounds.admissible(ex.name, inputs64, oracle.as_float64(ex.grad), ex.params,
                                       exact.out[0], [None if g is None else g[0]
                                                      for g in exact.grads])
    arrays = [("output", out, exact.out, a_out)]
    for iname, g, e, a in zip(spec.OPS[ex.name].inputs, grads, exact.grads, a_grads):
        if e is not None:
            arrays.append((f"d/d{iname}", g, e, a))
    best = None
    for what, got, (hi, lo), adm in arrays:
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
        if ratio.size == 0:
            continue
        idx = np.unravel_index(int(np.nanargmax(ratio)), ratio.shape)
        if best is None or ratio[idx] > best[0]:
            best = (float(ratio[idx]), what, tuple(int(i) for i in idx), float(g64[idx]),
                    float(hi[idx]), float(lo[idx]), float(diff[idx]),
                    float(np.asarray(adm, np.float64)[idx]))
    _, what, idx, value, hi, lo, diff, adm = best
    scale = max(abs(hi), tiny)
    entry = {"kind": "failure", "what": what, "index": list(idx), "engine_value": value,
             "exact_hi": hi, "exact_lo": lo, "abs_error": diff,
             "error_eps": diff / (eps * scale), "admissible_abs": adm * eps}
    entry.update(_convention(ex, what, idx, value, grads))
    return entry


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


def _maximum_split_matches(ex, grads, share):
    """Whether ``grads`` of maximum are exactly the tie rule "``share`` to a, the rest to b"."""
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

    return bool(tie.any()) and all(
        np.allclose(np.asarray(got, np.float64), reduce_to(want, x.shape), rtol=1e-6, atol=0)
        for got, want, x in zip(grads, (da, db), (a, b)))


# ---------------------------------------------------------------------------------------------
# running it


def _serialise_case(check, ex, special_index):
    base = {"op": ex.name, "dtype": np.dtype(ex.dtype).name, "params": ex.params,
            "label": ex.label or "random"}
    if special_index is not None:
        return {**base, "special": special_index}
    return {**base, "inputs": [np.asarray(x).tolist() for x in ex.inputs],
            "input_dtypes": [np.asarray(x).dtype.name for x in ex.inputs],
            "grad": np.asarray(ex.grad).tolist()}


def rebuild_case(case):
    """The ``OpExample`` a findings entry was measured on."""
    from reports.conformance import special_values
    from reports.conformance.strategies import OpExample

    if "special" in case:
        return special_values.special_cases(case["op"], case["dtype"])[case["special"]]
    inputs = tuple(np.array(x, dtype=d) for x, d in zip(case["inputs"], case["input_dtypes"]))
    # JSON turns the tuple params (axis, axes, shape) into lists: turn them back
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in case["params"].items()}
    return OpExample(case["op"], inputs, np.array(case["grad"], dtype=case["dtype"]),
                     params, 0, False, case["label"])


def find(engine_names=PEERS, ops=None, examples=10, seed=0, progress=None):
    """Every failing call of each peer, with its worst element (a JSON-ready dict)."""
    import spec
    from reports.conformance import engines as registry

    doc = {"profile": {"examples": examples, "seed": seed}, "engines": {}, "findings": []}
    for name in engine_names:
        status = registry.engine_status(name)
        if not status.available:
            doc["engines"][name] = {"available": False, "reason": status.reason}
            continue
        engine = registry.get_engine(name)
        doc["engines"][name] = {"available": True, "version": engine_version(name),
                                "description": getattr(engine, "description", ""),
                                "composed": dict(getattr(engine, "composed", {})),
                                "unsupported": {o: engine.supports(o)[1] for o in spec.OPS
                                                if not engine.supports(o)[0]}}
        for op in ops or spec.OPS:
            if not engine.supports(op)[0]:
                continue
            for dtype in engine.dtypes:
                dt = np.dtype(dtype).name
                if progress:
                    progress(f"{name} {op} {dt}")
                for check, ex in _failing_cases(engine, op, dt, examples, seed):
                    special = int(check.split("#")[1].split()[0]) if "#" in check else None
                    entry = {"engine": name, "op": op, "dtype": dt, "check": check,
                             "case": _serialise_case(check, ex, special)}
                    entry.update(worst_element(engine, ex))
                    doc["findings"].append(entry)
    return doc


# ---------------------------------------------------------------------------------------------
# the table


def _inputs_text(entry, ex):
    """The inputs at the element for elementwise ops; else the call's shapes and label."""
    import spec

    family = spec.OPS[entry["op"]].category
    idx = tuple(entry.get("index", ()))
    elementwise = family in ("unary", "binary") or entry["op"] in (
        "mse", "binary_cross_entropy", "binary_cross_entropy_with_logits")
    if elementwise and entry.get("what", "") != "output" or family in ("unary", "binary"):
        arrays = [np.asarray(x, np.float64) for x in ex.inputs]
        if all(a.shape == arrays[0].shape for a in arrays) and len(idx) == arrays[0].ndim:
            names = spec.OPS[entry["op"]].inputs
            return ", ".join(f"{n}={float(a[idx]):.9g}" for n, a in zip(names, arrays))
    shapes = " ".join(str(tuple(np.shape(x))) for x in ex.inputs)
    return f"{ex.label or 'random'} {shapes}".strip()


def markdown(doc):
    """The findings table as Markdown: per engine, op and dtype, the worst failing call.

    A row shows the worst finding of its (engine, op, dtype) (a contract finding first, then
    the largest error) and how many checks failed there; ``findings.json`` keeps them all.
    """
    groups = {}
    for e in doc["findings"]:
        groups.setdefault((e["engine"], e["op"], e["dtype"]), []).append(e)

    def severity(e):
        return (e["kind"] == "contract", e["kind"] == "failure", e.get("error_eps") or 0.0)

    lines = ["| engine | op | dtype | checks failing | kind | worst element | inputs there | "
             "engine value | exact | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (engine, op, dtype), entries in groups.items():
        e = max(entries, key=severity)
        labels = dict.fromkeys(x["check"].split("(", 1)[-1].rstrip(")") for x in entries)
        head = (f"| {engine} {doc['engines'][engine]['version']} | {op} | {dtype} | "
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
    parser.add_argument("--engines", nargs="+", default=list(PEERS))
    parser.add_argument("--ops", nargs="+")
    parser.add_argument("--examples", type=int, default=10, help="random draws per op (dev)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="write the findings here")
    parser.add_argument("--markdown", metavar="FILE", help="write the table here")
    args = parser.parse_args(argv)
    doc = find(args.engines, args.ops, args.examples, args.seed,
               progress=lambda s: print(s, file=sys.stderr, flush=True))
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
