"""The schema of ``report.json`` (what every field means) and a validator for it.

The schema is written in a small subset of JSON Schema (draft 2020-12 keywords: ``type``,
``properties``, ``required``, ``additionalProperties``, ``items``, ``enum``, ``anyOf``,
``minimum``, ``maximum``, ``description``), so any JSON Schema tool can read it too;
:func:`validate` implements exactly that subset, with no dependency.
``verigrad report`` writes the schema beside the report as ``report_schema.json``.

Numbers that may be infinite or undefined (an error statistic) are written as a number, the
string ``"inf"`` (an infinite error: a non-finite result where the exact value is finite), or
``null`` (no data: zero elements in that row or bin).
"""
from __future__ import annotations

import json

import optable.formats

__all__ = ["SCHEMA", "validate", "check", "dumps"]

# --- building blocks ---------------------------------------------------------------------------

NUM = {"anyOf": [{"type": "number"}, {"enum": ["inf", "-inf"]}, {"type": "null"}],
       "description": "a number; \"inf\" for an infinite value; null when there is no data"}
COUNT = {"type": "integer", "minimum": 0}
SHARE = {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}],
         "description": "a fraction in [0, 1]; null when there is no data"}
TEXT = {"type": "string"}
DTYPE = {"enum": list(optable.formats.names())}   # float64 float32 bfloat16 float16
STATUS = {"enum": ["pass", "fail", "not measured"]}


def obj(description, required, optional=None, extra=False):
    """An object schema: every key in ``required`` must be present; no others unless listed."""
    props = dict(required)
    props.update(optional or {})
    return {"type": "object", "description": description, "properties": props,
            "required": list(required), "additionalProperties": extra}


def array(items, description=""):
    return {"type": "array", "items": items, "description": description}


STATS = obj("median, 99th percentile (an element's value, not interpolated) and maximum",
            {"median": NUM, "p99": NUM, "max": NUM})
BRIEF = obj("a subset of the elements: how many, median and max error in ULPs",
            {"n": COUNT, "median_ulp": NUM, "max_ulp": NUM})
WORST = {"anyOf": [{"type": "null"}, obj(
    "the element with the largest ULP error, with everything needed to reproduce it",
    {"case": COUNT, "source": TEXT, "input": {"type": "string", "description": "input name"},
     "index": array(COUNT, "the element's index in that input"),
     "inputs": {"type": "object", "description": "every input of the case (nested lists)",
                "additionalProperties": True},
     "params": {"type": "object", "additionalProperties": True},
     "grad": {"description": "the cotangent (nested lists)"},
     "computed": NUM, "exact": {"type": "string", "description": "20 significant digits"},
     "ulp": NUM, "rel": NUM, "kappa": NUM})]}
MAGNITUDE_BIN = obj("elements whose input entry |z| lies in [lo, hi) (lo = hi = 0: exactly 0)",
                    {"lo": NUM, "hi": NUM, "n": COUNT, "median_ulp": NUM, "max_ulp": NUM})
HISTOGRAM = obj("ULP errors: exact zeros, counts between consecutive histogram_edges, "
                "infinite errors",
                {"zero": COUNT, "counts": array(COUNT), "infinite": COUNT})

ROW = obj(
    "one row: an engine in one dtype, the floor, or a finite difference at one step",
    {
        "kind": {"enum": ["engine", "floor", "finite_difference"],
                 "description": "engine: an engine's VJP; floor: the exact value correctly "
                                "rounded to the dtype (the best possible answer); "
                                "finite_difference: central differences of the correctly "
                                "rounded forward"},
        "engine": {"type": "string", "description": "engine name, or a label for references"},
        "dtype": DTYPE,
        "status": {"enum": ["ok", "error", "unsupported"],
                   "description": "error: some cases raised (see first_error); unsupported: "
                                  "the engine declares the op unsupported (see reason)"},
        "reason": TEXT,
    },
    {
        "n": {**COUNT, "description": "elements measured (VJP entries of all cases)"},
        "beyond_bound": {**COUNT, "description": "elements beyond the conformance suite's own "
                                                 "bound (bounds.entrywise: the rule of "
                                                 "verigrad conform)"},
        "out_of_range": {**COUNT, "description": "elements whose exact value overflows the "
                                                 "dtype (not measured)"},
        "undefined": {**COUNT, "description": "elements without a value (a raising case, or "
                                              "a difference step outside the domain)"},
        "nonfinite": {**COUNT, "description": "NaN/inf results where the exact value is "
                                              "finite (counted as infinite errors)"},
        "ulp": {**STATS, "description": "error in ULPs of the dtype at the exact value"},
        "rel": {**STATS, "description": "relative error |computed - exact| / |exact|"},
        "correctly_rounded": {**SHARE, "description": "share of elements equal to the exact "
                                                      "value rounded to nearest in the dtype"},
        "well_conditioned": {**BRIEF, "description": "elements with kappa <= kappa_well"},
        "by_source": obj("errors per case source",
                         {"uniform": BRIEF, "log_uniform": BRIEF, "special": BRIEF}),
        "by_magnitude": array(MAGNITUDE_BIN, "errors per input-magnitude decade"),
        "histogram": HISTOGRAM,
        "worst": WORST,
        "worst_well": WORST,
        "step": {"type": "number", "description": "finite-difference step h (relative to "
                                                  "max(1, |z|))"},
        "errors": {**COUNT, "description": "cases that raised"},
        "first_error": TEXT,
        "returned_dtypes": array(TEXT, "dtypes the engine's results came back in"),
    },
)

OP = obj(
    "every row of one op",
    {
        "category": TEXT,
        "inputs": array(TEXT),
        "differentiable": array(TEXT),
        "cases": obj("cases drawn per source",
                     {"uniform": COUNT, "log_uniform": COUNT, "special": COUNT}),
        "elements": COUNT,
        "rejected": array(obj("a drawn case the exact oracle rejected",
                              {"source": TEXT, "reason": TEXT})),
        "conditioning": obj(
            "elements by componentwise relative condition number kappa of the exact VJP",
            {"well": {**COUNT, "description": "kappa <= kappa_well"},
             "ill": {**COUNT, "description": "kappa > kappa_well (finite)"},
             "singular": {**COUNT, "description": "the exact VJP is 0 and moves under "
                                                  "perturbation (infinite kappa)"}}),
        "rows": array(ROW),
    },
)

SUMMARY_ROW = obj(
    "an engine row of the summary table",
    {"op": TEXT, "engine": TEXT, "dtype": DTYPE, "status": TEXT, "reason": TEXT},
    {"median_ulp": NUM, "p99_ulp": NUM, "max_ulp": NUM, "max_ulp_well": NUM,
     "correctly_rounded": SHARE, "n": COUNT,
     "beyond_bound": {**COUNT, "description": "elements beyond the conformance suite's bound"},
     "verdict": {"enum": ["within bound", "beyond bound", "error", "unsupported"],
                 "description": "within bound: every element within the conformance suite's "
                                "bound; beyond bound: some are not; error: cases raised"}},
)

BAR = obj(
    "the issue's bar for fastlib, op by op",
    {
        "engine": TEXT, "rival": TEXT,
        "few_ulps": {"type": "number", "description": "the float64 bound on well-conditioned "
                                                      "elements, in ULPs"},
        "kappa_well": {"type": "number"},
        "float64": array(obj("max ULP error on well-conditioned elements <= few_ulps",
                             {"op": TEXT, "max_ulp_well": NUM, "max_ulp": NUM, "status": STATUS},
                             {"others_max_ulp_well": {"type": "object",
                                                      "additionalProperties": NUM}})),
        "float32": array(obj("median ULP error <= the rival's on the same inputs",
                             {"op": TEXT, "median_ulp": NUM, "rival_median_ulp": NUM,
                              "status": STATUS})),
        "correct_rounding": array(obj("every element correctly rounded (single-rounding ops)",
                                      {"op": TEXT, "dtype": DTYPE, "correctly_rounded": SHARE,
                                       "status": STATUS})),
    },
    {"storage": array(obj("per 16-bit format measured: median ULP error <= the rival's on the "
                          "same inputs", {"op": TEXT, "dtype": DTYPE, "median_ulp": NUM,
                                          "rival_median_ulp": NUM, "status": STATUS}))},
)

REGRESSIONS = {"anyOf": [{"type": "null"}, obj(
    "comparison with --baseline",
    {
        "baseline": {"type": "string", "description": "the baseline file"},
        "factor": {"type": "number"},
        "baseline_generated": {"anyOf": [TEXT, {"type": "null"}]},
        "config_differs": array(TEXT, "config fields that differ from the baseline's (figures "
                                      "then compare different samples)"),
        "compared": COUNT,
        "flagged": array(obj("a row whose error grew by more than factor",
                             {"op": TEXT, "engine": TEXT, "dtype": DTYPE,
                              "metric": {"enum": ["median_ulp", "max_ulp"]},
                              "baseline": NUM, "current": NUM, "ratio": NUM})),
    })]}

SCHEMA = obj(
    "verigrad gradient-accuracy report (verigrad report)",
    {
        "schema_version": {"enum": [1]},
        "generated": {"type": "string", "description": "UTC time, ISO 8601"},
        "config": obj("what was measured",
                      {"samples": COUNT, "ops": {"anyOf": [array(TEXT), {"type": "null"}]},
                       "dtypes": array(DTYPE), "seed": {"type": "integer"},
                       "fd_steps": array({"type": "number"}), "fd_cases": COUNT,
                       "sources": array(TEXT), "quick": {"type": "boolean"},
                       "dps": COUNT, "kappa_well": {"type": "number"},
                       "log_magnitudes": array({"type": "number"})},
                      {"second_order": {"type": "boolean", "description": "JVP and HVP "
                                                                            "measured too"}}),
        "versions": {"type": "object", "description": "Python, platform, packages, engines, "
                                                      "git commit",
                     "additionalProperties": {"anyOf": [TEXT, {"type": "null"}]}},
        "engines": array(obj("an engine asked for or registered",
                             {"name": TEXT, "available": {"type": "boolean"}, "reason": TEXT,
                              "dtypes": array(DTYPE), "description": TEXT})),
        "histogram_edges": array(NUM, "ULP-error bin edges of every row's histogram"),
        "ops": {"type": "object", "description": "op name -> its rows",
                "additionalProperties": OP},
        "timing": obj("seconds", {"total_seconds": {"type": "number",
                                                    "description": "measuring, all ops"},
                                  "per_op": {"type": "object",
                                             "additionalProperties": {"type": "number"}}},
                      {"render_seconds": {"type": "number",
                                          "description": "figures and pages"}}),
        "summary": array(SUMMARY_ROW, "engine rows, worst first (median ULP, then max ULP)"),
        "bar": BAR,
        "regressions": REGRESSIONS,
        "notes": array(TEXT, "what a reader should know (unavailable engines, rejected cases)"),
    },
    {"second_order": {"type": "object", "description": "op name -> JVP and HVP ULP rows "
                                                        "(reports.accuracy_second_order)",
                      "additionalProperties": array({"type": "object"})}},
)


# --- the validator -----------------------------------------------------------------------------

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(instance, schema=None, path="$"):
    """Every way ``instance`` breaks ``schema`` (default: :data:`SCHEMA`), as messages.

    Parameters
    ----------
    instance : object
        A parsed JSON document (dicts, lists, str, int, float, bool, None).
    schema : dict, optional
        A schema in the subset described in the module docstring.
    path : str
        Where ``instance`` sits (``$`` is the root), used in messages.

    Returns
    -------
    list of str
        Empty when valid; otherwise ``"$.ops.tanh.rows[2].ulp.max: ..."`` messages.
    """
    schema = SCHEMA if schema is None else schema
    errors = []
    if "anyOf" in schema:
        if not any(not validate(instance, s, path) for s in schema["anyOf"]):
            errors.append(f"{path}: {_show(instance)} matches none of the allowed forms "
                          f"({schema.get('description') or _forms(schema['anyOf'])})")
        return errors
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{path}: {_show(instance)} is not one of {schema['enum']}")
        return errors
    kind = schema.get("type")
    if kind is not None and not _TYPES[kind](instance):
        errors.append(f"{path}: expected {kind}, got {type(instance).__name__} "
                      f"{_show(instance)}")
        return errors
    if kind in ("number", "integer"):
        if "minimum" in schema and instance < schema["minimum"]:
            errors.append(f"{path}: {instance} is below the minimum {schema['minimum']}")
        if "maximum" in schema and instance > schema["maximum"]:
            errors.append(f"{path}: {instance} is above the maximum {schema['maximum']}")
    if kind == "object":
        props = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in instance:
                errors.append(f"{path}: missing required field {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, value in instance.items():
            where = f"{path}.{key}"
            if key in props:
                errors.extend(validate(value, props[key], where))
            elif extra is False:
                errors.append(f"{path}: unexpected field {key!r} (allowed: "
                              f"{', '.join(props)})")
            elif isinstance(extra, dict):
                errors.extend(validate(value, extra, where))
    if kind == "array" and "items" in schema:
        for i, item in enumerate(instance):
            errors.extend(validate(item, schema["items"], f"{path}[{i}]"))
    return errors


def _show(value):
    text = json.dumps(value) if not isinstance(value, float) or value == value else "NaN"
    return text if len(text) <= 60 else text[:57] + "..."


def _forms(options):
    return " or ".join(str(o.get("type") or o.get("enum")) for o in options)


def check(report):
    """Raise ``ValueError`` listing the first problems when ``report`` breaks the schema.

    Non-finite floats (NaN, inf) are refused too: JSON has no such numbers (the report writes
    ``"inf"`` or null instead).
    """
    problems = validate(report)
    problems += _nonfinite(report, "$")
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise ValueError(f"report does not match the schema ({len(problems)} problem(s)):"
                         f"\n  {shown}{more}")
    return report


# A report is a few levels deep; anything far deeper is not one (and would exhaust recursion).
MAX_DEPTH = 32
MAX_BYTES = 512 * 2 ** 20


def load(path):
    """Read and validate a ``report.json`` (e.g. a ``--baseline``) before anything uses it.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    dict
        The report, valid against :data:`SCHEMA`.

    Raises
    ------
    FileNotFoundError
        No such file.
    fastlib.errors.CorruptFileError
        (a ``ValueError``) too large, not UTF-8 JSON, nested too deep, or not a verigrad report;
        the message names the file and the problem.
    """
    import os

    from fastlib.errors import CorruptFileError
    from fastlib.io import json_depth

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path!r}")
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise CorruptFileError(path, "document", f"{size} bytes is more than a report "
                               f"({MAX_BYTES}); pass a report.json written by verigrad report")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptFileError(path, "document", f"not UTF-8 text ({exc})") from None
    depth = json_depth(text)
    if depth > MAX_DEPTH:
        raise CorruptFileError(path, "document", f"JSON nested {depth} deep; a report is at "
                               f"most {MAX_DEPTH} deep")
    try:
        doc = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - JSONDecodeError, huge integers, ...
        raise CorruptFileError(path, "document", f"not JSON ({type(exc).__name__}: "
                               f"{str(exc)[:200]}); pass a report.json written by verigrad "
                               "report") from None
    try:
        check(doc)
    except ValueError as exc:
        raise CorruptFileError(path, "document", f"is not a verigrad report: {exc}") from None
    return doc


def _nonfinite(value, path):
    if isinstance(value, float) and not (value == value and abs(value) != float("inf")):
        return [f"{path}: {value} is not a JSON number (write \"inf\" or null)"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _nonfinite(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nonfinite(v, f"{path}[{i}]")]
    return []


def dumps(schema=None):
    """The schema as a JSON Schema document (with ``$schema`` and ``title``)."""
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema",
           "title": "verigrad report.json", **(SCHEMA if schema is None else schema)}
    return json.dumps(doc, indent=1)
