"""The conformance suite on a 2-worker Dask LocalCluster against the serial run.

The expected rows come from the serial runner in this process (``runner.run_rows``), an
independent path from the cluster's (tasks rebuilt from the registry in worker processes,
results sent back and put in order). Everything but the seconds must be identical.
"""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

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


def results(rows):
    out = []
    for r in rows:
        d = asdict(r.result)
        d.pop("seconds")
        out.append((r.kind, r.name, r.engine, r.dtype, d))
    return out


def test_cluster_rows_equal_the_serial_rows(client):
    from reports.conformance import runner
    from reports.distributed import cluster

    ops, profile = ["tanh", "mul", "Adam"], runner.PROFILES["dev"]
    serial, _ = runner.plan_rows(["fastlib"], ops=ops, dtype="float64")
    runner.run_rows(serial, profile, 3)
    planned, _ = runner.plan_rows(["fastlib"], ops=ops, dtype="float64")
    seen = []
    done = cluster.run_rows(client, planned, profile, 3, ops=ops, dtype="float64",
                            progress=lambda row: seen.append(row.label()))
    assert len(done) == len(serial) == 7  # exact, jvp, special per op; the optimizer row
    assert results(done) == results(serial)
    assert sorted(seen) == sorted(r.label() for r in serial)  # one tick per check
    assert all(r.result.status == "pass" for r in done)


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


def test_a_check_that_kills_its_worker_twice_is_a_failure_and_others_are_rerun(client):
    from reports.conformance import runner
    from reports.distributed import cluster

    profile = runner.PROFILES["dev"]
    planned, _ = runner.plan_rows([CRASHING], ops=["tanh", "exp"], dtype="float64")
    planned = [r for r in planned if r.kind == "exact"]
    assert [r.name for r in planned] == ["exp", "tanh"]
    done = cluster.run_rows(client, planned, profile, 0, ops=["tanh", "exp"], dtype="float64")
    by_name = {r.name: r.result for r in done}
    assert by_name["tanh"].status == "FAIL" and cluster.KILLED_TWICE in by_name["tanh"].detail
    assert math.isinf(by_name["tanh"].error) and "--ops tanh" in by_name["tanh"].command
    # exp's first run killed its worker; the rerun elsewhere passed, with the serial result
    assert client.marker.exists() and by_name["exp"].status == "pass"
    again, _ = runner.plan_rows([CRASHING], ops=["exp"], dtype="float64")
    again = [r for r in again if r.kind == "exact"]
    runner.run_rows(again, profile, 0)  # the marker exists now: no crash in this process
    assert results([r for r in done if r.name == "exp"]) == results(again)


def test_conform_cli_rejects_a_bad_cluster_spec():
    proc = subprocess.run([sys.executable, "-m", "reports", "conform", "--no-proofs",
                           "--cluster", "local:zero"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "local:N" in proc.stderr
