"""The suite's rows and the spec's proofs in worker processes on this machine.

Rows are independent (each draws from the run's seed and its own name), so W processes run W
at once and the table is exactly the serial one, in plan order. A task is every row of one
subject on one engine (its dtypes and checks; a training subject's split by dtype and run
first): they call the same kernels, so on a first run a kernel is compiled by one worker; a
task that reaches a large kernel (a training epoch, an elementwise family) while another
worker compiles it goes back in the queue (``fastlib.compile_once``) and the worker takes the
next one. The proofs of ``verigrad conform`` are tasks too. Where no process can be started,
or a worker dies, what it did not finish runs here instead: the run is complete either way.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import asdict

from reports.local_workers import default_workers, usable_cores  # noqa: F401 - re-exported

__all__ = ["default_workers", "row_key", "run_planned_rows", "run_rows_and_proofs"]

_PLANS = {}      # a worker's planned rows, by the filters they were planned with


def row_key(row):
    """What names a row across processes: (engine as asked for, check, subject, dtype)."""
    return (row.engine_ref or row.engine, row.kind, row.name, row.dtype)


def run_planned_rows(keys, profile, seed, ops=None, dtype=None, kink_mode=None, defer=False):
    """In a worker: rebuild the rows named ``keys`` from the registry and run them.

    Parameters
    ----------
    keys : sequence of tuple
        ``row_key`` of each row, all of one engine.
    profile, seed :
        As for ``runner.run_rows``.
    ops, dtype, kink_mode :
        The filters the parent planned with (a worker plans the same rows).
    defer : bool
        Stop at a row that would wait for another worker compiling the same large kernel.

    Returns
    -------
    list of dict
        Each row's ``RowResult`` as a dict, in the order of ``keys``; with ``defer``, only the
        rows before the one that stopped (the parent puts the rest back in the queue).
    """
    from reports.conformance import runner

    engine_ref = keys[0][0]
    plan = (engine_ref, tuple(ops) if ops else None, dtype, kink_mode)
    if plan not in _PLANS:  # planning builds the engine once per worker process
        rows, _ = runner.plan_rows([engine_ref], ops=ops, dtype=dtype, kink_mode=kink_mode)
        _PLANS[plan] = {row_key(r): r for r in rows}
    chosen = [_PLANS[plan][key] for key in keys]
    for row in chosen:
        row.result = None
    from fastlib.compile_once import CompileBusy, deferring

    done = []
    with warnings.catch_warnings():  # one progress bar: no worker's warnings on the terminal
        warnings.simplefilter("ignore")
        for row in chosen:
            try:
                with deferring() if defer else contextlib.nullcontext():
                    runner.run_rows([row], profile, seed)
            except CompileBusy:      # another worker compiles its kernel: run other tasks
                row.result = None
                break
            done.append(asdict(row.result))
    return done


def _prove(kind, name):
    import spec

    return spec.prove(name) if kind == "op" else spec.prove_optimizers([name])[0]


def _tasks(rows):
    """Rows grouped by (engine, subject), a training subject also by dtype; the training
    tasks first, float64 and float32 (with the 16-bit formats) taken in turn, then the others
    in the order of each group's first row.

    NOTE: the longest tasks first, so that the run does not end with one worker compiling a
    training epoch (a minute per dtype) while the others are idle; a training subject's dtypes
    call different kernels, so each is a task of its own, and the dtypes alternate: workers
    that start together start on different dtypes, and do not compile the same kernels side
    by side (in plan order, both began with float64 layers and compiled their Dense and
    recurrent kernels twice).
    """
    groups = {}
    for row in rows:
        engine, kind, subject, dtype = row_key(row)
        groups.setdefault((kind == "train", engine, subject, dtype if kind == "train" else None),
                          []).append(row)
    lanes = {}       # float64, and float32 with the 16-bit formats (computed in float32)
    for group in groups.values():
        if group[0].kind == "train":
            lanes.setdefault(group[0].dtype == "float64", []).append(group)
    training = []
    for turn in range(max((len(lane) for lane in lanes.values()), default=0)):
        training.extend(lane[turn] for lane in lanes.values() if turn < len(lane))
    return training + [g for g in groups.values() if g[0].kind != "train"]


def _pool(workers):
    if workers <= 1:
        return None
    try:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # NOTE: spawn, not fork: the parent may have torch's or Numba's threads running, and a
        # forked child of a threaded process may deadlock
        return ProcessPoolExecutor(max_workers=workers,
                                   mp_context=multiprocessing.get_context("spawn"))
    except (OSError, ValueError, ImportError):   # no processes here: run inline
        return None


def run_rows_and_proofs(rows, profile, seed, workers, ops=None, dtype=None, kink_mode=None,
                        proofs=(), on_row=None, on_proof=None, fail_fast=False):
    """Run ``rows`` (in place) and prove ``proofs`` in ``workers`` processes.

    Parameters
    ----------
    rows : list of runner.Row
        As planned by ``runner.plan_rows(engines, ops=ops, dtype=dtype, kink_mode=kink_mode)``.
    profile, seed :
        As for ``runner.run_rows``.
    workers : int
        Processes; 1 runs everything in this process.
    ops, dtype, kink_mode :
        The filters ``rows`` were planned with.
    proofs : sequence of (kind, name)
        ``("op", name)`` or ``("optimizer", name)``: the spec proofs to run.
    on_row, on_proof : callable, optional
        ``on_row(row)`` after each row finishes, ``on_proof(result)`` after each proof (in
        completion order).
    fail_fast : bool
        Return the rows up to the first failing one in plan order, as the serial run does.

    Returns
    -------
    (list of runner.Row, list of ProofResult)
        The rows that ran, in plan order; the proofs, in the order of ``proofs``.
    """
    from reports.conformance import runner

    proved, pool = {}, _pool(workers)
    todo = [r for r in rows if r.result is None]
    if pool is not None:
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        failed = False
        try:
            futures = {pool.submit(_prove, *p): ("proof", p) for p in proofs}
            for group in _tasks(todo):
                # NOTE: a first task may stop where another worker is compiling the kernel it
                # needs (a minute for a training epoch, seconds for an elementwise family); its
                # rest goes to the back of the queue, to wait there for the cache, while this
                # worker runs other tasks
                futures[pool.submit(run_planned_rows, [row_key(r) for r in group], profile,
                                    seed, ops, dtype, kink_mode, True)] = ("rows", group)
            pending = set(futures)
            while pending and not failed:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    what, item = futures[future]
                    if what == "proof":
                        proved[item] = future.result()
                        if on_proof is not None:
                            on_proof(proved[item])
                        continue
                    results = future.result()
                    if len(results) < len(item):    # put back: it waits for the kernel
                        rest = item[len(results):]
                        again = pool.submit(run_planned_rows, [row_key(r) for r in rest],
                                            profile, seed, ops, dtype, kink_mode)
                        futures[again] = ("rows", rest)
                        pending.add(again)
                    for row, result in zip(item, results):
                        row.result = runner.RowResult(**result)
                        if row.result.status in ("FAIL", "error"):
                            row.result.command = runner._command(row, profile, seed)
                            failed = fail_fast
                        if on_row is not None:
                            on_row(row)
        except BrokenProcessPool:   # a worker died: what it left runs here
            pass
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    for p in proofs:
        if p not in proved:
            proved[p] = _prove(*p)
            if on_proof is not None:
                on_proof(proved[p])
    done = []
    for row in rows:
        if row.result is None:
            runner.run_rows([row], profile, seed)
            if on_row is not None:
                on_row(row)
        done.append(row)
        if fail_fast and row.result.status in ("FAIL", "error"):
            break
    return done, [proved[p] for p in proofs]
