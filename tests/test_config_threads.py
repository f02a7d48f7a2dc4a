"""fastlib.config's adaptive thread count: only other processes' runnable tasks count as busy."""
import io

import pytest

from fastlib import config


def _fake_loadavg(running):
    def fake_open(path, *args, **kwargs):
        assert path == "/proc/loadavg"
        return io.StringIO(f"0.50 0.40 0.30 {running}/120 4242\n")
    return fake_open


@pytest.mark.parametrize("running, own, expected_idle", [
    (1, 1, 4),   # only the caller runs: every core is idle
    (3, 3, 4),   # the caller plus two of our own spinning OpenMP workers: still all idle
    (3, 1, 2),   # two tasks of other processes: two cores left
    (9, 1, 1),   # overloaded: never fewer than one
])
def test_idle_cores_ignores_own_threads(monkeypatch, running, own, expected_idle):
    monkeypatch.setattr(config.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(config, "open", _fake_loadavg(running), raising=False)
    monkeypatch.setattr(config, "_own_running_threads", lambda: own)
    monkeypatch.setitem(config._idle, "checked", -1.0)
    assert config._idle_cores() == expected_idle


def test_own_running_threads_counts_the_caller():
    # the calling thread is running while it reads its own /proc entry
    assert config._own_running_threads() >= 1
