"""Measure a report's ops in worker processes on this machine, one task per op.

``verigrad report`` spends its time in pure-Python exact arithmetic (mpmath) and in engines
that compile per shape (JAX), both bound to one core per process; the ops are independent
(each op's cases come from the run's seed and the op's name alone), so W processes measure W
ops at once and the report is exactly the serial one. Each worker builds the engines once,
from how they were asked for (registered names or ``module:Class`` plugins).

Where no process can be started, or a worker dies, the ops it did not finish are measured in
this process instead: the report is complete either way.
"""
from __future__ import annotations

import os
import time

__all__ = ["usable_cores", "default_workers", "measure_ops", "measure_report"]

_ENGINES = None          # a worker's engines, built once by _start_worker


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):     # no affinity call on this platform
        return max(1, os.cpu_count() or 1)


def default_workers(n_ops: int) -> int:
    """One worker per usable core, never more than there are ops."""
    return max(1, min(usable_cores(), n_ops))


def _start_worker(engine_refs):
    global _ENGINES
    from reports.conformance.engines import get_engine

    _ENGINES = [get_engine(ref) for ref in engine_refs]


def _task(name, config):
    from reports.accuracy import measure_one

    return measure_one(name, _ENGINES, config)


def measure_ops(ops, engines, config, workers, engine_refs=None, on_op=None):
    """Every op of ``ops`` measured on ``engines``: ``{name: (result, seconds)}``.

    Parameters
    ----------
    ops : sequence of str
        Registry op names.
    engines : sequence
        The engine objects of this process (used where an op is measured here).
    config : accuracy.Config
    workers : int
        Processes to measure in; 1 measures every op in this process.
    engine_refs : sequence of str, optional
        How each engine is asked for in a worker (default: the engines' names).
    on_op : callable, optional
        ``on_op(name, result)`` as each op is done (in completion order).

    Returns
    -------
    dict
        Op name -> (result dict of ``accuracy.measure_op``, seconds it took).
    """
    done = {}

    def finish(name, outcome):
        done[name] = outcome
        if on_op is not None:
            on_op(name, outcome[0])

    pool = _pool(workers, list(engine_refs or [e.name for e in engines]))
    if pool is not None:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        try:
            futures = {pool.submit(_task, name, config): name for name in ops}
            for future in as_completed(futures):
                finish(futures[future], future.result())
        except BrokenProcessPool:   # a worker died: what it left is measured here
            pass
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    if len(done) < len(ops):
        from reports.accuracy import measure_one

        for name in ops:
            if name not in done:
                finish(name, measure_one(name, engines, config))
    return done


def measure_report(config, engines, unavailable=(), workers=1, engine_refs=None, on_op=None):
    """``accuracy.measure`` with the ops measured in ``workers`` processes (the same report).

    ``on_op(name, result)`` is called as each op is done, in completion order.
    """
    import spec

    from reports import accuracy

    ops = list(config.ops or spec.OPS)
    config.validate()
    started = time.perf_counter()
    measured = measure_ops(ops, engines, config, workers, engine_refs, on_op=on_op)
    report = accuracy.measure(config, engines, unavailable, measured=measured)
    # the measuring time is the workers' wall time, not only the assembling's
    report["timing"]["total_seconds"] = round(time.perf_counter() - started, 3)
    return report


def _pool(workers, engine_refs):
    if workers <= 1:
        return None
    try:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # NOTE: spawn, not fork: the parent has torch's and JAX's threads running, and a
        # forked child of a threaded process may deadlock
        return ProcessPoolExecutor(max_workers=workers,
                                   mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker, initargs=(engine_refs,))
    except (OSError, ValueError, ImportError):   # no processes here: measure inline
        return None
