"""The conformance suite on a 2-worker Dask LocalCluster against the serial run.

The expected rows come from the serial runner in this process (``runner.run_rows``), an
independent path from the cluster's (tasks rebuilt from the registry in worker processes,
results sent back and put in order). Everything but the seconds must be identical.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.conform_runs import conform_args, results

try:  # part of the test extra: missing means the environment is wrong, never a skip
    import distributed  # noqa: F401
except ImportError as exc:
    raise ImportError(f"the cluster tests need the test extra (pip install '.[test]'): {exc}") \
        from None

ROOT = Path(__file__).resolve().parents[1]
CRASHING = f"{ROOT / 'tests' / 'cluster_crash_engine.py'}:CrashingEngine"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """One 2-worker LocalCluster for the module (as ``--cluster local:2`` starts it)."""
    import os

    marker = tmp_path_factory.mktemp("crash") / "exp-died"
    os.environ["VERIGRAD_TEST_CRASH_MARKER"] = str(marker)  # workers inherit it
    from reports.distributed import cluster

    with cluster.open_client("local:2") as c:
        c.marker = marker
        yield c


def test_conform_on_the_cluster_prints_the_serial_rows(client):
    """``verigrad conform``'s engine part, serially and with ``--cluster`` (given the running
    cluster's client, then its scheduler's address as on a real cluster: a new connection):
    the same rows and the same printed table."""
    import io

    from reports.commands import conform

    serial_out = io.StringIO()
    serial, _, code_s = conform.run_engines(conform_args(engines=["fastlib"]), out=serial_out)
    address = client.scheduler.address
    assert address.startswith("tcp://")
    for spec in (client, address):
        cluster_out = io.StringIO()
        done, _, code_c = conform.run_engines(conform_args(engines=["fastlib"], cluster=spec), out=cluster_out)
        # exact, jvp, special, jvp2, hvp per op; the optimizer row
        assert len(done) == len(serial) == 11
        assert results(done) == results(serial)
        assert cluster_out.getvalue() == serial_out.getvalue() and code_s == code_c == 0
        assert all(r.result.status == "pass" for r in done)


def test_progress_ticks_once_per_check(client):
    from reports.conformance import runner
    from reports.distributed import cluster

    planned, _ = runner.plan_rows(["reflib"], ops=["exp"], dtype="float64")
    # the rows planned without a result (an engine without jvp/hvp gets its jvp2 / hvp rows
    # planned as "not provided") are the ones that run
    to_run = sorted(r.label() for r in planned if r.result is None)
    seen = []
    cluster.run_rows(client, planned, runner.PROFILES["dev"], 0, ops=["exp"], dtype="float64",
                     progress=lambda row: seen.append(row.label()))
    assert sorted(seen) == to_run and len(planned) == 5 and 3 <= len(seen) <= 5


def test_the_report_on_the_cluster_is_the_serial_report(client):
    from reports import accuracy
    from reports.conformance.engines import get_engine
    from reports.distributed import cluster

    config = accuracy.Config.quick_config(ops=("tanh", "mul"), dtypes=("float64",), seed=1)
    engines = [get_engine("fastlib")]
    serial = accuracy.measure(config, engines)
    done = cluster.measure_report(client, config, engines)
    for r in (serial, done):
        r.pop("timing")
        r.pop("generated")
    assert done == serial
    assert accuracy.measure_op is not None and "lambda" not in accuracy.measure_op.__qualname__


def test_a_failing_row_keeps_its_counterexample(client):
    """A failing row shrinks to the same counterexample on the cluster as serially."""
    from reports.conformance import runner
    from reports.distributed import cluster

    engine = f"{ROOT / 'tests' / 'cluster_crash_engine.py'}:WrongEngine"
    profile = runner.PROFILES["dev"]
    serial, _ = runner.plan_rows([engine], ops=["sigmoid"], dtype="float64")
    runner.run_rows(serial, profile, 0)
    planned, _ = runner.plan_rows([engine], ops=["sigmoid"], dtype="float64")
    done = cluster.run_rows(client, planned, profile, 0, ops=["sigmoid"], dtype="float64")
    assert any(r.result.status == "FAIL" and r.result.reproduction for r in serial)
    assert results(done) == results(serial)


def _crashing_rows():
    """The dev profile and the exact rows of tanh (always crashes) and exp (crashes once)."""
    from reports.conformance import runner

    profile = runner.PROFILES["dev"]
    planned, _ = runner.plan_rows([CRASHING], ops=["tanh", "exp"], dtype="float64")
    planned = {r.name: r for r in planned if r.kind == "exact"}
    assert sorted(planned) == ["exp", "tanh"]
    return profile, planned


def _judged(client, planned, exp, tanh):
    """tanh, which kills its worker every time, failed; exp, which killed it once, passed on
    its rerun elsewhere, with the result a serial run gives."""
    from reports.conformance import runner
    from reports.distributed import cluster

    assert tanh.status == "FAIL" and cluster.KILLED_TWICE in tanh.detail
    assert math.isinf(tanh.error) and "--ops tanh" in tanh.command
    assert client.marker.exists() and exp.status == "pass", exp.detail
    again, _ = runner.plan_rows([CRASHING], ops=["exp"], dtype="float64")
    again = [r for r in again if r.kind == "exact"]
    runner.run_rows(again, runner.PROFILES["dev"], 0)  # the marker exists now: no crash here
    assert results([planned["exp"]]) == results(again)


def test_a_check_that_kills_its_worker_twice_is_a_failure_and_others_are_rerun(client):
    from reports.distributed import cluster

    profile, planned = _crashing_rows()
    # one after the other (side by side: the slow test below)
    exp = cluster.run_rows(client, [planned["exp"]], profile, 0, ops=["tanh", "exp"],
                           dtype="float64")[0].result
    tanh = cluster.run_rows(client, [planned["tanh"]], profile, 0, ops=["tanh", "exp"],
                            dtype="float64")[0].result
    _judged(client, planned, exp, tanh)


@pytest.mark.slow  # ~30 s: four worker deaths and restarts
def test_two_crashing_checks_side_by_side_are_judged_alone(tmp_path, monkeypatch):
    """Dask may blame one crash on a task beside it; each is then run again alone: the
    check that crashed once passes, the one that always crashes fails."""
    from reports.distributed import cluster as cluster_mod

    marker = tmp_path / "exp-died"
    monkeypatch.setenv("VERIGRAD_TEST_CRASH_MARKER", str(marker))
    with cluster_mod.open_client("local:2") as client:
        client.marker = marker
        _side_by_side(client)


def _side_by_side(client):
    from reports.distributed import cluster

    profile, planned = _crashing_rows()
    # side by side: tanh kills its worker every time, exp once (its rerun passes)
    done = cluster.run_rows(client, [planned["exp"], planned["tanh"]], profile, 0,
                            ops=["tanh", "exp"], dtype="float64")
    exp, tanh = done[0].result, done[1].result
    _judged(client, planned, exp, tanh)


def test_conform_rejects_a_bad_cluster_spec(capsys):
    from reports.commands import conform

    assert conform.run(conform_args(engines=["fastlib"], cluster="local:zero")) == 2
    assert "local:N" in capsys.readouterr().err


def _strip_seconds(value):
    """``value`` without its timings (the only thing a cluster run may change)."""
    if isinstance(value, dict):
        return {k: _strip_seconds(v) for k, v in value.items()
                if k not in ("seconds", "timing", "generated", "total_seconds")}
    if isinstance(value, list):
        return [_strip_seconds(v) for v in value]
    return value


@pytest.mark.slow  # 100 s here at load 14: the report and its plots, twice
def test_report_with_a_scheduler_address_writes_the_serial_report(client, tmp_path):
    """``verigrad report --cluster tcp://...``: the same report.json as the serial command
    (but for its timings)."""
    import json

    from reports.cli import main

    base = ["report", "--quick", "--ops", "exp", "mul", "--dtypes", "float64", "--engines",
            "fastlib", "--seed", "2", "--no-progress"]
    assert main(base + ["--out", str(tmp_path / "serial")]) == 0
    assert main(base + ["--out", str(tmp_path / "cluster"), "--cluster",
                        client.scheduler.address]) == 0
    serial, done = (json.loads((tmp_path / n / "report.json").read_text())
                    for n in ("serial", "cluster"))
    assert _strip_seconds(done) == _strip_seconds(serial)


@pytest.mark.slow  # 23 s here at load 14: the dev profile under the mutant, twice
def test_a_mutant_on_the_cluster_gets_the_serial_verdict(client):
    """``verigrad conform --mutants --cluster``'s runner (the control left out: it is the whole
    dev profile) against the serial runner, one mutant: the same verdict, row and detail."""
    from dataclasses import asdict

    from reports.conformance import mutant_runner, mutants
    from reports.distributed import cluster

    chosen = [{m.key: m for m in mutants.all_mutants()}["gradient-1e-10"]]
    control, (done,) = cluster.run_mutants(client)(chosen, "dev", 0, control=False)
    serial = mutant_runner.run_mutant(chosen[0], "dev", 0)
    assert control is None and serial.caught
    assert _strip_seconds(asdict(done)) == _strip_seconds(asdict(serial))
