"""A conformance row and how one runs: the profiles, ``Row`` / ``RowResult``, and the two drivers
``run_property`` (Hypothesis) and ``run_cases`` (a fixed list). The runner plans rows; the row
modules (training, algorithms, device training) build theirs from these.

The long story: docs/reports-conformance.md, section ``reports/conformance/runner.py``.
"""
from __future__ import annotations

import math
import traceback
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

__all__ = ["Profile", "PROFILES", "Row", "RowResult", "run_property", "run_cases", "KINDS",
           "ConformanceFailure", "MAX_FAILURES"]

KINDS = ("completeness", "exact", "jvp", "special", "jvp2", "hvp", "optimizer", "tape", "train",
         "targetprop", "cd", "program")


@dataclass(frozen=True)
class Profile:
    """How many examples each kind of row draws."""

    name: str
    examples: int          # exact / jvp rows
    optimizer: int         # optimizer trajectories per optimizer
    steps: int             # optimizer steps per trajectory
    tape: int              # random DAGs per tape
    train: int             # random models per layer type
    algorithms: int        # TargetProp / CD cases per row


PROFILES = {
    "dev": Profile("dev", examples=10, optimizer=5, steps=3, tape=25, train=2, algorithms=2),
    "ci": Profile("ci", examples=25, optimizer=15, steps=4, tape=25, train=4, algorithms=4),
    "thorough": Profile("thorough", examples=200, optimizer=100, steps=5, tape=200, train=25,
                        algorithms=25),
}


class ConformanceFailure(AssertionError):
    """A check's measures exceeded their bounds (or the engine broke its contract)."""


@dataclass
class RowResult:
    """What one row produced."""

    examples: int = 0
    error: float = 0.0        # worst error, eps units (of the worst error/bound example)
    bound: float = 0.0
    status: str = "pass"      # pass, FAIL, unsupported, unavailable, error
    detail: str = ""
    reproduction: str = ""
    command: str = ""
    seconds: float = 0.0
    unit: str = ""            # of error and bound: "ulp" (worst element), "abs" (exact 0), ""


@dataclass
class Row:
    """One check of one subject on one engine in one dtype."""

    kind: str
    name: str
    engine: str
    dtype: str
    run: Callable = field(repr=False, default=None)   # (profile, seed) -> RowResult
    result: RowResult = None
    engine_ref: str = ""     # how the engine was asked for (a plugin's module:Class)
    kinks: str = ""          # the --kinks mode asked for ("" = the engine's default)

    def label(self):
        return f"{self.kind} {self.name} [{self.engine} {self.dtype}]"

    def as_dict(self):
        d = {"check": self.kind, "name": self.name, "engine": self.engine, "dtype": self.dtype,
             "engine_ref": self.engine_ref or self.engine}
        r = self.result or RowResult(status="not run")
        d.update({k: v for k, v in asdict(r).items()})
        for k in ("error", "bound"):
            if isinstance(d[k], float) and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


# ---------------------------------------------------------------------------------------------
# running a property under Hypothesis


def _ratio(measure):
    if measure is None or measure.error == 0:
        return 0.0
    return math.inf if measure.bound == 0 else measure.error / measure.bound


MAX_FAILURES = 3   # distinct failures a row reports (by case form or special-values label)


def _case_size(case):
    try:
        return sum(int(np.size(x)) for x in case.inputs)
    except AttributeError:
        return 0


def _distinct_detail(failures):
    """One paragraph per distinct failure: its form and what failed."""
    return "\n".join(f"[{key}] {detail}" for key, (_, _, detail) in failures.items())


def run_property(strategy, check, max_examples, seed, reproduce=None, examples=(),
                 distinct=None):
    """Run ``check(case) -> properties.Result`` over ``strategy`` with Hypothesis.

    ``examples`` are cases run first, as given (Hypothesis's explicit examples), before
    ``max_examples`` drawn ones. Returns a :class:`RowResult`: on failure the case is the one
    Hypothesis shrank to (it runs the minimal failing example last), ``reproduction`` is
    ``reproduce(case)``.

    With ``distinct`` (a function naming a case's form) a failure does not end the search:
    every example is run and up to ``MAX_FAILURES`` failures of different forms are reported
    (the smallest one reproduced), so one 0-d edge case cannot hide the op's other failures.
    Kink conventions found (``Result.conventions``) and inputs skipped by declaration
    (``Result.skipped``) are listed in the row's detail.
    """
    import hypothesis
    from hypothesis import HealthCheck, Phase, given, settings

    state = {"n": 0, "worst": None, "worst_ratio": -1.0, "failure": None, "failures": {},
             "conventions": [], "skipped": []}

    @settings(max_examples=max_examples, database=None, deadline=None, print_blob=False,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=(Phase.explicit, Phase.generate, Phase.shrink))
    @hypothesis.seed(seed)
    @given(strategy)
    def prop(case):
        state["n"] += 1
        try:
            result = check(case)
        except ConformanceFailure:
            raise
        except Exception as exc:  # a crash inside a check: a failure with its traceback
            state["failure"] = (case, None, f"{type(exc).__name__}: {exc}\n"
                                            + traceback.format_exc(limit=6))
            raise ConformanceFailure(str(exc)) from exc
        worst = result.worst
        for c in getattr(result, "conventions", ()):
            if c not in state["conventions"]:
                state["conventions"].append(c)
        for c in getattr(result, "skipped", ()):
            if c not in state["skipped"]:
                state["skipped"].append(c)
        if state["failure"] is None and _ratio(worst) >= state["worst_ratio"] and worst:
            state["worst"], state["worst_ratio"] = worst, _ratio(worst)
        if not result.ok:
            if distinct is not None:
                key = distinct(case)
                if key not in state["failures"] and len(state["failures"]) < MAX_FAILURES:
                    state["failures"][key] = (case, result, result.describe())
                return
            state["failure"] = (case, result, result.describe())
            raise ConformanceFailure(result.describe())

    for case in reversed(list(examples)):
        prop = hypothesis.example(case)(prop)
    out = RowResult()
    from reports.conformance.draws import seed_only

    with hypothesis.reporting.with_reporter(lambda *a, **k: None), seed_only():
        try:
            prop()
        except ConformanceFailure:
            pass
        except Exception as exc:  # Hypothesis itself gave up (e.g. unsatisfiable strategy)
            out.status, out.detail = "error", f"{type(exc).__name__}: {exc}"
    out.examples = state["n"]
    if state["failures"]:
        failures = state["failures"]
        primary = min(failures.values(), key=lambda f: _case_size(f[0]))
        state["failure"] = (primary[0], primary[1], _distinct_detail(failures))
    if state["failure"] is not None:
        case, result, detail = state["failure"]
        worst = result.worst if result is not None else None
        out.status, out.detail = "FAIL", detail
        out.error = worst.error if worst else math.inf
        out.bound = worst.bound if worst else 0.0
        out.unit = getattr(worst, "unit", "") if worst else ""
        if reproduce is not None:
            try:
                out.reproduction = reproduce(case)
            except Exception as exc:  # never lose the failure over a formatting problem
                out.reproduction = f"# (could not format the case: {exc})\n# {case!r}"
    elif state["worst"] is not None:
        out.error, out.bound = state["worst"].error, state["worst"].bound
        out.unit = getattr(state["worst"], "unit", "")
    _annotate(out, state["conventions"], state["skipped"])
    return out


def _annotate(out, conventions, skipped):
    """Add the kink conventions found and the skipped inputs to a row's detail."""
    extra = []
    if conventions:
        extra.append("convention: " + "; ".join(conventions))
    if skipped:
        extra.append("not checked (declared by the engine): " + "; ".join(skipped))
    if extra:
        out.detail = "; ".join(([out.detail] if out.detail else []) + extra)


def _case_key(case, index):
    """A special case's label, with its value when it is a single one (``saturation -80.0``)."""
    label = getattr(case, "label", "") or f"case {index}"
    inputs = getattr(case, "inputs", ())
    if len(inputs) == 1 and np.size(inputs[0]) == 1:
        label += f" x = {np.asarray(inputs[0]).item()!r}"
    return label


def run_cases(cases, check, reproduce=None):
    """Run ``check`` on a fixed list of cases (the special-values table), without shrinking.

    ``reproduce(index, case)`` formats a failing case. Every case runs; up to
    ``MAX_FAILURES`` failures with different labels are reported (the first reproduced).
    """
    out = RowResult()
    worst, worst_ratio = None, -1.0
    failures = {}
    conventions, skipped = [], []
    for index, case in enumerate(cases):
        out.examples += 1
        label = _case_key(case, index)
        try:
            result = check(case)
        except Exception as exc:
            if label not in failures and len(failures) < MAX_FAILURES:
                failures[label] = (index, case, None, f"{type(exc).__name__}: {exc}")
            continue
        conventions += [c for c in getattr(result, "conventions", ()) if c not in conventions]
        skipped += [c for c in getattr(result, "skipped", ()) if c not in skipped]
        w = result.worst
        if not result.ok:
            if label not in failures and len(failures) < MAX_FAILURES:
                failures[label] = (index, case, result, result.describe())
            continue
        if w is not None and _ratio(w) >= worst_ratio:
            worst, worst_ratio = w, _ratio(w)
    if failures:
        index, case, result, _ = next(iter(failures.values()))
        w = result.worst if result is not None else None
        out.status = "FAIL"
        out.detail = "\n".join(f"[{label}] {d}" for label, (_, _, _, d) in failures.items())
        out.error, out.bound = (w.error, w.bound) if w else (math.inf, 0.0)
        out.unit = getattr(w, "unit", "") if w else ""
        out.reproduction = reproduce(index, case) if reproduce else repr(case)
    elif worst is not None:
        out.error, out.bound = worst.error, worst.bound
        out.unit = getattr(worst, "unit", "")
    _annotate(out, conventions, skipped)
    return out


# ---------------------------------------------------------------------------------------------
# building the rows
