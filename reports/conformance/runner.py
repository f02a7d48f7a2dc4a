"""Run the suite: build the rows for the chosen engines and profile, run each under Hypothesis,
and collect what the table, the JSON and the reproductions need.

The long story: docs/reports-conformance.md, section ``reports/conformance/runner.py``.
"""
from __future__ import annotations

import time
import traceback

import numpy as np

import optable

from reports.conformance import engines as _engines
from reports.conformance.rows import (KINDS, MAX_FAILURES, PROFILES, ConformanceFailure,  # noqa: F401
                                      Profile, Row, RowResult, run_cases, run_property)

__all__ = ["Profile", "PROFILES", "Row", "RowResult", "plan_rows", "run_rows", "run_property",
           "run_cases", "order_rows", "KINDS"]

def _op_rows(engine, ref, dtypes, ops, kinks=None):
    import spec

    from reports.conformance import kinks as _kinks
    from reports.conformance import edge_cases, properties, repro, special_values
    from reports.conformance.strategies import case_form, op_examples

    mode = kinks or _kinks.default_mode(engine.name if ":" not in ref else ref)
    flag = "" if kinks is None else kinks
    rows = []
    for name in ops:
        for dtype in dtypes:
            ok, reason = _engines.supports_in(engine, name, dtype)
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
                # the kernel-boundary and rare-parameter calls (edge_cases), after the table
                first_edge = len(cases)
                cases += edge_cases.edge_cases(name, dtype)

                def check(ex):
                    if ex.label == "non-finite":
                        return properties.check_nonfinite(engine, ex)
                    return properties.check_call(engine, ex, mode)

                def reproduce(i, ex):
                    if ex.label == "non-finite":
                        return repro.nonfinite(ref, ex)
                    if i >= first_edge:
                        return repro.edge(ref, ex, i - first_edge, kinks=mode)
                    return repro.special(ref, ex, i, kinks=mode)
                return run_cases(cases, check, reproduce)

            rows += [Row("exact", name, engine.name, dt, exact_row, kinks=flag),
                     Row("jvp", name, engine.name, dt, jvp_row, kinks=flag),
                     Row("special", name, engine.name, dt, special_row, kinks=flag)]
        running = [d for d in dtypes if _engines.supports_in(engine, "maximum", d)[0]]
        if name == "maximum" and running:   # the NaN routing: pinned (strict) or reported
            from reports.conformance.conventions import convention_rows
            rows += convention_rows(engine, engine.name, running, mode == "strict")
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
            else:       # an op a format lacks must raise there too
                for dtype in engine.dtypes:
                    if not _engines.supports_in(engine, name, dtype)[0]:
                        r = properties.check_unsupported(engine, name, dtype)
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
        ok, reason = (_engines.claim(engine, "supports_optimizer", name) if supports else
                      (False, "the engine has no optimizer_step"))
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
    from reports.conformance.rounding_points import rounding_rows
    from reports.conformance.training_rows import train_rows

    return train_rows(kinds) + rounding_rows("fastlib")


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
    dtype : str or collection of str, optional
        Format names (``float32``, ``bfloat16``, ...): keep rows of those dtypes (and
        dtype-free ones).
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
    from reports.conformance.second_order_rows import KINDS as SECOND_ORDER_KINDS
    from reports.conformance.second_order_rows import second_order_rows
    from reports.conformance.strategies import LAYER_KINDS, OPTIMIZER_NAMES

    all_ops = list(spec.OPS)
    statuses, rows = [], []
    wanted = None if not ops else set(ops)

    chosen = None if not dtype else ({dtype} if isinstance(dtype, str) else set(dtype))

    def keep(name, kind, dt):
        if kinds and kind not in kinds:
            return False
        if chosen and dt != "-" and dt not in chosen:
            return False
        if wanted is None:
            return True
        # an op's rows with a longer name come with it ("maximum NaN routing" with maximum)
        return name in wanted or name.split(" ")[0] in wanted or kind in wanted

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
        # the 16-bit storage formats have op rows; second order and the optimizers run in
        # the formats engines compute in (float32, float64)
        wide = [d for d in dtypes if not optable.formats.is_storage(d)]
        engine_rows = [_completeness_row(engine, all_ops)]
        # an op's rows, and its rows with a longer name ("maximum NaN routing")
        op_words = set() if wanted is None else {w.split()[0] for w in wanted if w.split()}
        engine_rows += _op_rows(engine, name, dtypes, [o for o in all_ops if
                                                 wanted is None or o in op_words or
                                                 {"exact", "jvp", "special"} & wanted],
                                kink_mode)
        engine_rows += second_order_rows(engine, name, wide,
                                         [o for o in all_ops if wanted is None or o in wanted
                                          or set(SECOND_ORDER_KINDS) & wanted], kink_mode)
        engine_rows += _optimizer_rows(engine, name, wide, OPTIMIZER_NAMES)
        if engine.name in TAPE_ENGINES and ":" not in name:
            engine_rows.append(_tape_row(engine.name))
        if engine.name == "fastlib" and ":" not in name:
            engine_rows += _train_rows(LAYER_KINDS)
        if engine.name == "fastlib-cuda" and ":" not in name:  # training on the device
            from reports.conformance.device_training import device_train_rows
            engine_rows += device_train_rows(LAYER_KINDS)
        if engine.name in ("fastlib", "reflib") and ":" not in name:
            engine_rows += _algorithm_rows(engine.name)
            from reports.conformance.program_check import program_rows
            engine_rows += program_rows(engine.name)
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
    """The ``verigrad conform`` line that runs ``row`` again (same profile, seed and draws),
    quoted for a POSIX shell, so that a name with spaces is one ``--ops`` value."""
    import shlex

    parts = ["verigrad", "conform", "--profile", profile.name,
             "--engines", row.engine_ref or row.engine]
    if row.kind != "completeness":
        parts += ["--ops", row.name]
    parts += ["--seed", str(seed)]
    if row.dtype != "-":
        parts += ["--dtypes", row.dtype]
    if row.kinks:
        parts += ["--kinks", row.kinks]
    parts.append("--no-proofs")
    return shlex.join(parts)


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
