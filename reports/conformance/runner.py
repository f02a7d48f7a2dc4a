"""Run the suite: build the rows for the chosen engines and profile, run each under Hypothesis,
and collect what the table, the JSON and the reproductions need.

The long story: docs/reports.md, section ``reports/conformance/runner.py``.
"""
from __future__ import annotations

import math
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from reports.conformance import engines as _engines

__all__ = ["Profile", "PROFILES", "Row", "RowResult", "plan_rows", "run_rows", "run_property",
           "run_cases", "order_rows", "KINDS"]

KINDS = ("completeness", "exact", "jvp", "special", "optimizer", "tape", "train", "targetprop",
         "cd")


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


def _op_rows(engine, ref, dtypes, ops, kinks=None):
    import spec

    from reports.conformance import kinks as _kinks
    from reports.conformance import properties, repro, special_values
    from reports.conformance.strategies import case_form, op_examples

    mode = kinks or _kinks.default_mode(engine.name if ":" not in ref else ref)
    flag = "" if kinks is None else kinks
    rows = []
    for name in ops:
        ok, reason = engine.supports(name)
        for dtype in dtypes:
            dt = np.dtype(dtype).name
            if not ok:
                rows.append(Row("exact", name, engine.name, dt, result=RowResult(
                    status="unsupported", detail=reason)))
                continue
            has_kinks = bool(spec.OPS[name].kinks)

            def exact_row(profile, seed, name=name, dtype=dtype, has_kinks=has_kinks):
                from hypothesis import strategies as st
                strategy = op_examples(name, dtype)
                if has_kinks:  # half the draws put values exactly on the kinks
                    strategy = st.booleans().flatmap(
                        lambda k: op_examples(name, dtype, near_kinks=k))
                return run_property(strategy,
                                    lambda ex: properties.check_call(engine, ex, mode),
                                    profile.examples, seed,
                                    lambda ex: repro.op_call(ref, ex, "check_call",
                                                             kinks=mode),
                                    distinct=case_form)

            def jvp_row(profile, seed, name=name, dtype=dtype):
                return run_property(op_examples(name, dtype),
                                    lambda ex: properties.check_jvp(engine, ex, seed),
                                    profile.examples, seed,
                                    lambda ex: repro.op_call(ref, ex, "check_jvp", seed),
                                    distinct=case_form)

            def special_row(profile, seed, name=name, dtype=dtype):
                cases = special_values.special_cases(name, dtype)
                n = len(cases)
                cases += special_values.nonfinite_cases(name, dtype)

                def check(ex):
                    if ex.label == "non-finite":
                        return properties.check_nonfinite(engine, ex)
                    return properties.check_call(engine, ex, mode)

                def reproduce(i, ex):
                    if ex.label == "non-finite":
                        return repro.nonfinite(ref, ex)
                    return repro.special(ref, ex, i, kinks=mode)
                return run_cases(cases, check, reproduce)

            rows += [Row("exact", name, engine.name, dt, exact_row, kinks=flag),
                     Row("jvp", name, engine.name, dt, jvp_row, kinks=flag),
                     Row("special", name, engine.name, dt, special_row, kinks=flag)]
    return rows


def _completeness_row(engine, ops):
    from reports.conformance import properties

    def run(profile, seed):
        out = RowResult()
        problems = []
        for name in ops:
            out.examples += 1
            ok, reason = engine.supports(name)
            if not isinstance(ok, bool) or not isinstance(reason, str):
                problems.append(f"supports({name!r}) must return (bool, str); got {(ok, reason)!r}")
            elif not ok:
                if not reason.strip():
                    problems.append(f"{name} is declared unsupported without a reason")
                r = properties.check_unsupported(engine, name)
                if not r.ok:
                    problems.append(r.describe())
        if problems:
            out.status, out.detail = "FAIL", "; ".join(problems)
        unsupported = [n for n in ops if not engine.supports(n)[0]]
        if unsupported and not problems:
            out.detail = f"{len(unsupported)} declared unsupported (each raises): " + \
                ", ".join(unsupported)
        return out

    return Row("completeness", "all ops", engine.name, "-", run)


def _optimizer_rows(engine, ref, dtypes, names):
    from reports.conformance import properties, repro
    from reports.conformance.strategies import optimizer_cases

    rows = []
    supports = getattr(engine, "supports_optimizer", None)
    for name in names:
        ok, reason = supports(name) if supports else (False, "the engine has no "
                                                             "optimizer_step")
        for dtype in dtypes:
            dt = np.dtype(dtype).name
            if not ok:
                def unsupported_row(profile, seed, name=name, reason=reason):
                    out = RowResult(status="unsupported", detail=reason)
                    if supports is None:
                        return out
                    try:
                        engine.optimizer_step(name, np.zeros(2, dtype), np.ones(2, dtype), {}, 1)
                    except NotImplementedError:
                        return out
                    except Exception as exc:
                        return RowResult(status="FAIL", detail=f"optimizer {name} is declared "
                                         f"unsupported but raised {type(exc).__name__}: {exc}")
                    return RowResult(status="FAIL", detail=f"optimizer {name} is declared "
                                     f"unsupported but optimizer_step returned a value")
                rows.append(Row("optimizer", name, engine.name, dt, unsupported_row))
                continue

            def row(profile, seed, name=name, dtype=dtype):
                def check(case):
                    _, shape, s, hyper = case
                    rng = np.random.default_rng(s)
                    w0 = rng.standard_normal(shape)
                    grads = [rng.standard_normal(shape) for _ in range(profile.steps)]
                    return properties.check_optimizer(engine, name, w0, grads, hyper, dtype)
                return run_property(optimizer_cases(names=(name,)), check, profile.optimizer,
                                    seed, lambda case: repro.optimizer(ref, case, dtype,
                                                                       profile.steps))
            rows.append(Row("optimizer", name, engine.name, dt, row))
    return rows


def _tape_row(engine_name):
    from hypothesis import strategies as st

    from reports.conformance import properties, repro
    from reports.conformance.strategies import TAPE_EXAMPLES, dags

    def run(profile, seed):
        strategy = st.tuples(dags(), st.integers(0, 2**31 - 1))
        return run_property(strategy, lambda c: properties.check_tape_laws(engine_name, *c),
                            profile.tape, seed, lambda c: repro.tape(engine_name, c),
                            examples=[(dag, 0) for dag in TAPE_EXAMPLES])

    return Row("tape", "random DAGs", engine_name, "float64", run)


def _train_rows(kinds):
    from reports.conformance.training_rows import train_rows

    return train_rows(kinds)


def _algorithm_rows(engine_name):
    from reports.conformance import algorithms

    rows = []
    for spec_ in algorithms.rows_for(engine_name):
        def run(profile, seed, spec_=spec_):
            return run_property(spec_.strategy, spec_.check,
                                algorithms.examples_for(profile), seed, spec_.reproduce)
        rows.append(Row(spec_.kind, spec_.name, engine_name, spec_.dtype, run))
    return rows


def plan_rows(engine_names, ops=None, dtype=None, kinds=None, kink_mode=None):
    """The rows of a run, and the status of every engine asked for.

    Parameters
    ----------
    engine_names : sequence of str
        Registered names or ``module:Class`` plugins.
    ops : sequence of str, optional
        Keep only rows whose subject is one of these (op, optimizer, layer kind, ``tape``,
        ``targetprop``, ``cd``).
    dtype : str, optional
        ``float32`` or ``float64``: keep rows of that dtype (and dtype-free ones).
    kinds : sequence of str, optional
        Keep only these kinds of row (``KINDS``).
    kink_mode : {"strict", "subgradient"}, optional
        The kink policy of the op rows (``kinks``); default: strict for verigrad's own
        engines, subgradient for any other.

    Returns
    -------
    (list of Row, list of engines.EngineStatus)
    """
    import spec

    from reports.conformance.properties import TAPE_ENGINES
    from reports.conformance.strategies import LAYER_KINDS, OPTIMIZER_NAMES

    all_ops = list(spec.OPS)
    statuses, rows = [], []
    wanted = None if not ops else set(ops)

    def keep(name, kind, dt):
        if kinds and kind not in kinds:
            return False
        if dtype and dt not in ("-", dtype):
            return False
        if wanted is None:
            return True
        return name in wanted or kind in wanted

    for name in engine_names:
        try:
            engine = _engines.get_engine(name)
        except _engines.EngineUnavailableError as exc:
            reason = _engines.engine_status(name).reason if name in _engines.ENGINES else ""
            statuses.append(_engines.EngineStatus(name, False, reason or str(exc)))
            continue
        statuses.append(_engines.EngineStatus(engine.name if ":" not in name else name, True, "",
                                              getattr(engine, "description", "")))
        dtypes = [np.dtype(d) for d in engine.dtypes]
        engine_rows = [_completeness_row(engine, all_ops)]
        engine_rows += _op_rows(engine, name, dtypes, [o for o in all_ops if
                                                 wanted is None or o in wanted or
                                                 {"exact", "jvp", "special"} & wanted],
                                kink_mode)
        engine_rows += _optimizer_rows(engine, name, dtypes, OPTIMIZER_NAMES)
        if engine.name in TAPE_ENGINES and ":" not in name:
            engine_rows.append(_tape_row(engine.name))
        if engine.name == "fastlib" and ":" not in name:
            engine_rows += _train_rows(LAYER_KINDS)
        if engine.name == "fastlib-cuda" and ":" not in name:  # training on the device
            from reports.conformance.device_training import device_train_rows
            engine_rows += device_train_rows(LAYER_KINDS)
        if engine.name in ("fastlib", "reflib") and ":" not in name:
            engine_rows += _algorithm_rows(engine.name)
        for r in engine_rows:
            r.engine_ref = name
        rows += [r for r in engine_rows if keep(r.name, r.kind, r.dtype)
                 or (r.kind == "completeness" and wanted is None)]
    return rows, statuses


def order_rows(rows, first):
    """Rows whose subject or kind is in ``first`` move to the front (stable otherwise).

    Only the order changes, never the set of rows: the mutant run uses it to reach the rows a
    mutant most likely breaks sooner.
    """
    if not first:
        return list(rows)
    first = set(first)
    return sorted(rows, key=lambda r: 0 if (r.name in first or r.kind in first) else 1)


def _command(row, profile, seed):
    """The ``verigrad conform`` line that runs ``row`` again (same profile, seed and draws)."""
    parts = ["verigrad conform", f"--profile {profile.name}",
             f"--engine {row.engine_ref or row.engine}"]
    if row.kind in ("tape", "targetprop", "cd"):
        parts.append(f"--ops {row.kind}")        # their names hold spaces: select the kind
    elif row.kind != "completeness":
        parts.append(f"--ops {row.name}")
    parts.append(f"--seed {seed}")
    if row.dtype != "-":
        parts.append(f"--dtype {row.dtype}")
    if row.kinks:
        parts.append(f"--kinks {row.kinks}")
    parts.append("--no-proofs")
    return " ".join(parts)


def run_rows(rows, profile, seed, progress=None, fail_fast=False):
    """Run every row (in place); ``progress(row)`` is called before each one.

    Returns
    -------
    list of Row
        The rows that ran (all of them, or up to the first failure with ``fail_fast``).
    """
    done = []
    for row in rows:
        if progress is not None:
            progress(row)
        if row.result is None:
            start = time.perf_counter()
            try:
                row.result = row.run(profile, seed)
            except Exception as exc:  # a broken row must not hide the others
                row.result = RowResult(status="error", detail=f"{type(exc).__name__}: {exc}\n"
                                       + traceback.format_exc(limit=8))
            row.result.seconds = time.perf_counter() - start
            if row.result.status in ("FAIL", "error"):
                row.result.command = _command(row, profile, seed)
        done.append(row)
        if fail_fast and row.result.status in ("FAIL", "error"):
            break
    return done
