"""``verigrad conform`` in worker processes gives the serial run's rows and proofs.

The expected rows come from the serial runner in this process (``runner.run_rows``), an
independent path from the workers' (rows rebuilt from the registry in spawned processes, their
results sent back and put in plan order). Everything but the seconds must be identical, and
the printed table byte for byte.
"""
from __future__ import annotations

import io

import pytest

from tests.conform_runs import conform_args, results


def test_two_workers_print_the_serial_rows():
    from reports.commands import conform

    serial_out, parallel_out = io.StringIO(), io.StringIO()
    serial, _, code_s = conform.run_engines(conform_args(), out=serial_out)
    done, _, code_p = conform.run_engines(conform_args(workers=2), out=parallel_out)
    # per engine: exact, jvp, special, jvp2, hvp per op, and the optimizer row
    assert len(done) == len(serial) == 22
    assert results(done) == results(serial)
    assert parallel_out.getvalue() == serial_out.getvalue() and code_s == code_p == 0
    assert all(r.result.status == "pass" for r in done)


def test_proofs_in_workers_are_the_serial_proofs():
    import spec

    from reports.conformance import runner, workers

    asked = [("op", "tanh"), ("op", "mul"), ("optimizer", "Adam")]
    rows, _ = runner.plan_rows(["reflib"], ops=["tanh"], dtype="float64")
    seen = []
    done, proved = workers.run_rows_and_proofs(rows, runner.PROFILES["dev"], 0, 2,
                                               ops=["tanh"], dtype="float64", proofs=asked,
                                               on_proof=seen.append)
    expected = [spec.prove("tanh"), spec.prove("mul"), *spec.prove_optimizers(["Adam"])]
    strip = [(r.op, r.ok, r.method, r.shapes, r.verdict) for r in expected]
    assert [(r.op, r.ok, r.method, r.shapes, r.verdict) for r in proved] == strip
    assert sorted(r.op for r in seen) == sorted(r.op for r in expected)
    assert [r.label() for r in done] == [r.label() for r in rows]


def test_fail_fast_in_workers_stops_where_the_serial_run_stops():
    from reports.conformance import runner, workers
    from reports.conformance.rows import RowResult

    def planted():
        # a row planned with its verdict (as an unsupported row is) stands for a failure, so
        # the serial and the parallel run meet the same first failure in plan order
        rows, _ = runner.plan_rows(["reflib"], ops=["tanh", "exp"], dtype="float64")
        failing = next(i for i, r in enumerate(rows) if r.result is None and r.name == "exp")
        rows[failing].result = RowResult(status="FAIL", detail="planted")
        return rows, failing

    rows, failing = planted()
    serial = runner.run_rows(rows, runner.PROFILES["dev"], 0, fail_fast=True)
    rows, _ = planted()
    done, _ = workers.run_rows_and_proofs(rows, runner.PROFILES["dev"], 0, 2,
                                          ops=["tanh", "exp"], dtype="float64", fail_fast=True)
    assert [r.label() for r in done] == [r.label() for r in serial]
    assert len(done) == failing + 1 and done[-1].result.detail == "planted"
    assert all(r.result.status == "pass" for r in done[:-1] if r.run is not None)


@pytest.mark.parametrize("given, expected", [(None, "per core"), (1, 1), (3, 3)])
def test_workers_default_to_one_per_usable_core(given, expected):
    from reports.commands import conform
    from reports.local_workers import usable_cores

    want = usable_cores() if expected == "per core" else expected
    assert conform._workers(conform_args(workers=given)) == want
    assert conform._workers(conform_args(workers=given, cluster="local:2")) == 1


def test_a_task_put_back_runs_its_rest_in_the_pool_and_gives_the_serial_rows(monkeypatch):
    """A worker task that stops at a kernel another worker is compiling returns the rows it
    ran; the parent puts the rest back in the pool (not deferring again) and nothing is left
    for the parent's own fallback. Stand-ins: one pool thread, and a task that stops after its
    first row whenever it may defer."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from reports.conformance import runner, workers

    def plan():
        return runner.plan_rows(["reflib"], ops=["tanh", "exp"], dtype="float64")[0]

    serial = runner.run_rows(plan(), runner.PROFILES["dev"], 0)
    real_task, real_run, calls, in_parent = workers.run_planned_rows, runner.run_rows, [], []

    def stops_after_one(keys, profile, seed, ops=None, dtype=None, kink_mode=None, defer=False):
        calls.append((len(keys), defer))
        return real_task(keys[:1] if defer else keys, profile, seed, ops, dtype, kink_mode)

    def watched(rows, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            in_parent.extend(rows)
        return real_run(rows, *args, **kwargs)

    monkeypatch.setattr(workers, "run_planned_rows", stops_after_one)
    monkeypatch.setattr(workers, "_pool", lambda n: ThreadPoolExecutor(1))
    monkeypatch.setattr(runner, "run_rows", watched)
    done, _ = workers.run_rows_and_proofs(plan(), runner.PROFILES["dev"], 0, 2,
                                          ops=["tanh", "exp"], dtype="float64")
    assert results(done) == results(serial)
    assert in_parent == []
    first = [n for n, defer in calls if defer]
    # each task with more than one row came back once, with exactly its rest, not deferring
    assert sorted(n - 1 for n in first if n > 1) == sorted(n for n, defer in calls if not defer)
    assert any(n > 1 for n in first)


def test_training_subjects_are_split_by_dtype_and_queued_first():
    # the tasks are built from plain rows: what a row is made of does not matter here
    from reports.conformance import workers
    from reports.conformance.runner import Row

    def row(kind, name, dtype):
        return Row(kind, name, "fastlib", dtype, None)

    rows = [row("exact", "tanh", "float64"), row("exact", "tanh", "float32"),
            row("jvp", "tanh", "float64"), row("exact", "exp", "float64"),
            row("train", "fused MLP", "float64"), row("train", "fused MLP", "float32"),
            row("train", "Dense", "float64")]
    tasks = [[(r.kind, r.name, r.dtype) for r in group] for group in workers._tasks(rows)]
    assert tasks == [
        [("train", "fused MLP", "float64")], [("train", "fused MLP", "float32")],
        [("train", "Dense", "float64")],
        [("exact", "tanh", "float64"), ("exact", "tanh", "float32"), ("jvp", "tanh", "float64")],
        [("exact", "exp", "float64")]]


def test_training_tasks_alternate_float64_and_float32():
    # two workers that start together take different dtypes (different kernels): in plan
    # order both took float64 layers and compiled the same kernels side by side
    from reports.conformance import workers
    from reports.conformance.runner import Row

    rows = [Row("train", name, "fastlib", dtype, None) for name, dtype in [
        ("Dense", "float64"), ("RNN", "float64"), ("LSTM", "float64"),
        ("generic", "float32"), ("mixed MLP", "bfloat16")]]
    order = [(g[0].name, g[0].dtype) for g in workers._tasks(rows)]
    assert order == [("Dense", "float64"), ("generic", "float32"), ("RNN", "float64"),
                     ("mixed MLP", "bfloat16"), ("LSTM", "float64")]
