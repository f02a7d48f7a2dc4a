"""The suite on a Dask cluster: ``--cluster local:N`` or ``--cluster tcp://host:8786``.

The long story: docs/reports-bench.md, section ``reports/distributed/cluster.py``.
"""
from __future__ import annotations

import contextlib
import math
import re
import time

__all__ = ["INSTALL_HINT", "ClusterSpecError", "parse_cluster", "require_dask", "open_client",
           "run_rows", "run_mutants", "measure_report", "KILLED_TWICE"]

INSTALL_HINT = "install the Dask extra: pip install 'verigrad[dask]' (dask and distributed)"
KILLED_TWICE = "killed its worker process twice"


# NOTE: a task that kills one worker is retried once elsewhere; its second death marks it
# failed (KilledWorker) instead of crashing worker after worker. An existing scheduler needs
# the same setting in its config.
SCHEDULER_CONFIG = {"distributed.scheduler.allowed-failures": 1}
# NOTE: Dask blames a worker's death on every task assigned to that worker, also those waiting
# behind the one that ran; so each task asks for one unit of this worker resource and each
# worker has one: a worker then holds only the task it runs, and a death is blamed on that task
# alone. Workers started without it (dask worker ... without --resources verigrad=1) still
# run the tasks, with Dask's coarser blame.
RESOURCE = "verigrad"


class ClusterSpecError(ValueError):
    """A ``--cluster`` value that is neither ``local:N`` nor a scheduler address."""


def parse_cluster(spec):
    """``("local", N)`` for ``local:N``, ``("address", spec)`` for ``tcp://host:port``.

    Raises
    ------
    ClusterSpecError
        With the accepted forms.
    """
    m = re.fullmatch(r"local:(\d+)", spec or "")
    if m and int(m.group(1)) >= 1:
        return "local", int(m.group(1))
    if re.fullmatch(r"(tcp|tls|ucx|inproc)://[^\s]+", spec or ""):
        return "address", spec
    raise ClusterSpecError(f"--cluster {spec!r}: use local:N (a Dask LocalCluster of N worker "
                           "processes, N >= 1) or a scheduler address like tcp://host:8786")


def require_dask():
    """``(dask, distributed)``; ImportError with the install command when they are missing."""
    try:
        import dask
        import distributed
    except ImportError as exc:
        raise ImportError(f"--cluster needs Dask ({exc}); {INSTALL_HINT}") from None
    return dask, distributed


@contextlib.contextmanager
def open_client(spec):
    """A connected ``distributed.Client`` for ``spec`` (closed, with its cluster, on exit).

    ``spec`` may also be a ``distributed.Client`` already connected: it is used as is (and
    left open), so that several runs can share one cluster.
    """
    if not isinstance(spec, str):
        yield spec
        return
    kind, value = parse_cluster(spec)
    dask, distributed = require_dask()
    import logging

    if kind == "local":
        with dask.config.set(SCHEDULER_CONFIG):
            cluster = distributed.LocalCluster(n_workers=value, threads_per_worker=1,
                                               processes=True, dashboard_address=None,
                                               silence_logs=logging.CRITICAL,
                                               resources={RESOURCE: 1})
            client = distributed.Client(cluster)
            try:
                yield client
            finally:
                client.close()
                cluster.close()
    else:
        client = distributed.Client(value, timeout="30s")
        try:
            yield client
        finally:
            client.close()


def _gather(client, fn, keys, args, progress=None, stop=None):
    """Run ``fn(key, *args)`` for every key on the cluster; ``{key: result or exception}``.

    ``progress(key)`` after each task finishes (in completion order); ``stop(done)`` may end
    the wait early (the rest are cancelled). Each task is pure (``pure=False`` only so that a
    rerun is not served from a cache). A task Dask gives up on because workers died under it
    is run once more, alone (:func:`_alone`), before its death counts.
    """
    from distributed import as_completed

    slots = _slots(client)
    futures = {client.submit(fn, key, *args, pure=False, key=f"verigrad-{i}-{_slug(key)}",
                             resources=slots): key for i, key in enumerate(keys)}
    done, killed = {}, {}
    for future in as_completed(list(futures)):
        key = futures[future]
        try:
            done[key] = future.result()
        except Exception as exc:  # noqa: BLE001 - a worker death or a bug: kept as the result
            if type(exc).__name__ == "KilledWorker":
                killed[key] = exc
                continue
            done[key] = exc
        if progress is not None:
            progress(key)
        if stop is not None and stop(done):
            for f in futures:
                f.cancel()
            return done
    for key, exc in killed.items():
        # one task given up alone is its own verdict; two or more may have blamed each other
        done[key] = exc if len(killed) == 1 else _alone(client, fn, key, args, slots)
        if progress is not None:
            progress(key)
        if stop is not None and stop(done):
            break
    return done


def _slots(client):
    workers = client.scheduler_info().get("workers", {}).values()
    return {RESOURCE: 1} if any(RESOURCE in w.get("resources", {}) for w in workers) else None


def _alone(client, fn, key, args, slots):
    """``fn(key, *args)`` with nothing else running on the cluster.

    NOTE: Dask blames a worker's death on the tasks it held; when two tasks crash their
    workers at the same time, a task that crashed once was seen blamed for both deaths. Run
    alone, a task is blamed for its own deaths only: it passes, or it kills its worker twice
    again and its KilledWorker is the verdict.
    """
    future = client.submit(fn, key, *args, pure=False, key=f"verigrad-alone-{_slug(key)}",
                           resources=slots)
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - kept as the result
        return exc


def _slug(key):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(key))[:80]


def _death_reason(exc):
    name = type(exc).__name__
    if name == "KilledWorker":
        return (f"{KILLED_TWICE} ({name}: each run ended its process, e.g. a crash in native "
                "code or the memory limit); run it serially to see the crash")
    return f"{name} on the cluster: {exc}"


# ---------------------------------------------------------------------------------------------
# conformance rows

def row_key(row):
    """What names a row across processes: (engine as asked for, check, subject, dtype)."""
    from reports.conformance.workers import row_key as key

    return key(row)


def _run_row_task(key, profile, seed, ops, dtype):
    """On a worker: rebuild the row named ``key`` from the registry and run it."""
    from reports.conformance.workers import run_planned_rows

    return run_planned_rows([key], profile, seed, ops, dtype)[0]


def run_rows(spec, rows, profile, seed, ops=None, dtype=None, progress=None, fail_fast=False):
    """``runner.run_rows`` on the cluster ``spec``: the same rows, results and order.

    Parameters
    ----------
    spec : str
        ``local:N`` or a scheduler address.
    rows : list of runner.Row
        As planned by ``runner.plan_rows(engines, ops=ops, dtype=dtype)`` here; their results
        are filled in place.
    profile, seed :
        As for the serial run.
    ops, dtype :
        The filters the rows were planned with (a worker plans the same rows).
    progress : callable, optional
        ``progress(row)`` as each row finishes (one bar for the whole run).
    fail_fast : bool
        Return the rows up to the first failing one in plan order, as the serial run does.

    Returns
    -------
    list of runner.Row
    """
    from reports.conformance.runner import RowResult

    keys = [row_key(r) for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError("two rows share (engine, check, name, dtype); the cluster cannot tell "
                         "them apart")
    by_key = dict(zip(keys, rows))
    todo = [k for k, r in by_key.items() if r.result is None]

    def failed(result):
        return isinstance(result, Exception) or result.get("status") in ("FAIL", "error")

    def stop(done):
        if not fail_fast:
            return False
        for k in keys:  # the first row in plan order that is not a pass ends the run...
            if k not in done and by_key[k].result is None:
                return False  # ...once every row before it has finished
            if (k in done and failed(done[k])) or (k not in done and
                                                  by_key[k].result.status in ("FAIL", "error")):
                return True
        return False

    with open_client(spec) as client:
        done = _gather(client, _run_row_task, todo, (profile, seed, list(ops) if ops else None,
                                                     dtype),
                       progress=None if progress is None else lambda k: progress(by_key[k]),
                       stop=stop)
    out = []
    for k in keys:
        row = by_key[k]
        if k in done:
            result = done[k]
            if isinstance(result, Exception):
                row.result = RowResult(status="FAIL", error=math.inf, detail=_death_reason(result))
                from reports.conformance.runner import _command

                row.result.command = _command(row, profile, seed)
            else:
                row.result = RowResult(**result)
        elif row.result is None:
            break  # cancelled after an earlier failure (fail_fast)
        out.append(row)
        if fail_fast and row.result.status in ("FAIL", "error"):
            break
    return out


# ---------------------------------------------------------------------------------------------
# mutants

def _run_mutant_task(key, profile, seed):
    from reports.conformance import mutant_runner, mutants

    if key == "control":
        return mutant_runner.run_control(profile, seed)
    return mutant_runner.run_mutant({m.key: m for m in mutants.all_mutants()}[key], profile, seed)


def run_mutants(spec):
    """A ``run_all`` for ``verigrad conform --mutants`` that runs the control and each
    mutant as a task."""

    def run_all(chosen, profile="dev", seed=0, progress=None, control=True):
        from reports.conformance.mutant_runner import MutantError, MutantResult, check_targets

        problems = check_targets(chosen)
        if problems:
            raise MutantError("; ".join(problems))
        keys = (["control"] if control else []) + [m.key for m in chosen]
        what = {m.key: m.what for m in chosen}
        what["control"] = "fastlib unchanged"
        with open_client(spec) as client:
            done = _gather(client, _run_mutant_task, keys, (profile, seed), progress=progress)
        results = {}
        for k in keys:
            r = done[k]
            if isinstance(r, Exception):  # the run could not finish: counts as not caught
                r = MutantResult(k, what[k], False, math.nan, 0, "", _death_reason(r))
            results[k] = r
        return (results.get("control"), [results[m.key] for m in chosen])

    return run_all


# ---------------------------------------------------------------------------------------------
# the accuracy report

def _measure_op_task(name, engine_names, config):
    from reports.accuracy import measure_one
    from reports.conformance.engines import get_engine

    return measure_one(name, [get_engine(n) for n in engine_names], config)


def measure_report(spec, config, engines, unavailable=(), on_op=None, progress=None,
                   engine_refs=None):
    """``accuracy.measure`` with every op measured as a task on the cluster ``spec``.

    The report is assembled by ``accuracy.measure`` itself from the ops' results (each op's
    cases come from the run's seed and the op's name alone), so it is the serial report.

    Parameters
    ----------
    spec : str or distributed.Client
    config, engines, unavailable, on_op :
        As for ``accuracy.measure``.
    progress : callable, optional
        ``progress(op)`` as each op's task finishes (the progress bar).
    engine_refs : list of str, optional
        How each engine is asked for (registered name or ``module:Class``); default their
        names. Workers build the engines from these.

    Raises
    ------
    RuntimeError
        When an op cannot be measured on the cluster (e.g. it killed its worker twice).
    """
    import spec as spec_mod

    from reports import accuracy

    ops = list(config.ops or spec_mod.OPS)
    refs = list(engine_refs or [e.name for e in engines])
    started = time.perf_counter()
    with open_client(spec) as client:
        done = _gather(client, _measure_op_task, ops, (refs, config), progress=progress)
    bad = {k: v for k, v in done.items() if isinstance(v, Exception)}
    if bad:
        raise RuntimeError("; ".join(f"op {k}: {_death_reason(v)}" for k, v in bad.items()))
    # accuracy.measure assembles the report (summary, bar, notes) exactly as in a serial run,
    # from the results the cluster computed
    report = accuracy.measure(config, engines, unavailable, on_op=on_op, measured=done)
    # the measuring time is the cluster's wall time, not only the assembling's
    report["timing"]["total_seconds"] = round(time.perf_counter() - started, 3)
    return report
