"""The report measured in worker processes is the serial report (reports.local_workers)."""
import json

import pytest

from reports import accuracy, local_workers
from reports.cli import main
from reports.conformance.engines import get_engine

VOLATILE = ("generated", "timing", "versions")


def _config():
    return accuracy.Config(samples=2, ops=("exp", "mul", "softmax"), fd_steps=(1e-3,),
                           fd_cases=2, sources=("uniform", "special"))


def _stable(report):
    return {k: v for k, v in report.items() if k not in VOLATILE}


@pytest.fixture(scope="module")
def serial():
    return accuracy.measure(_config(), [get_engine("reflib"), get_engine("fastlib")])


def test_two_workers_give_the_serial_report(serial):
    seen = []
    report = local_workers.measure_report(
        _config(), [get_engine("reflib"), get_engine("fastlib")], workers=2,
        on_op=lambda name, result: seen.append(name))
    # JSON round trip: the comparison is of what is written, NaN and all
    assert json.dumps(_stable(report), sort_keys=True) == \
        json.dumps(_stable(serial), sort_keys=True)
    assert list(report["ops"]) == ["exp", "mul", "softmax"]     # the registry's order
    assert sorted(seen) == ["exp", "mul", "softmax"]           # each op reported once
    assert set(report["timing"]["per_op"]) == {"exp", "mul", "softmax"}


def test_without_processes_the_ops_are_measured_here(serial, monkeypatch):
    monkeypatch.setattr(local_workers, "_pool", lambda workers, refs: None)
    report = local_workers.measure_report(
        _config(), [get_engine("reflib"), get_engine("fastlib")], workers=4)
    assert json.dumps(_stable(report), sort_keys=True) == \
        json.dumps(_stable(serial), sort_keys=True)


def test_default_workers_follow_the_cores_and_the_ops(monkeypatch):
    monkeypatch.setattr(local_workers, "usable_cores", lambda: 16)
    assert local_workers.default_workers(37) == 16
    assert local_workers.default_workers(3) == 3
    monkeypatch.setattr(local_workers, "usable_cores", lambda: 1)
    assert local_workers.default_workers(37) == 1


@pytest.mark.parametrize("argv, needle", [
    (["--workers", "0"], "--workers"),
    (["--workers", "2", "--cluster", "local:2"], "--workers and --cluster"),
])
def test_bad_workers_are_usage_errors(tmp_path, capsys, argv, needle):
    code = main(["report", "--quick", "--ops", "exp", "--out", str(tmp_path / "r")] + argv)
    assert code == 2
    assert needle in capsys.readouterr().err


def test_the_measuring_time_counts_the_workers(monkeypatch):
    import time as clock

    measure_ops = local_workers.measure_ops

    def slow_ops(ops, engines, config, workers, engine_refs=None, on_op=None):
        clock.sleep(0.5)
        return measure_ops(ops, engines, config, 1)

    monkeypatch.setattr(local_workers, "measure_ops", slow_ops)
    report = local_workers.measure_report(
        accuracy.Config(samples=1, ops=("exp",), fd_steps=(), sources=("uniform",)),
        [get_engine("reflib")], workers=2)
    assert report["timing"]["total_seconds"] >= 0.5
