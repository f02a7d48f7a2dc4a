"""A row's draws depend on the run's seed and the row alone, not on the modules loaded.

Hypothesis mixes literal constants of loaded local modules into its draws; the harness turns
that off (``reports.conformance.draws.seed_only``), or a Dask worker, which imports other
modules than the command line, could draw other cases than the serial run. The expected value
is the same row run before the extra module exists (same process, same seed).
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import asdict

# floats a strategy of optimizer hyper-parameters and weights can take; the first two were
# seen changing the Adam row's draws when a module holding them was imported
CONSTANTS = '''
BANDWIDTH = 1.25e9
LATENCY = 30e-6
OTHERS = (0.1, 0.9, 0.999, 1e-8, 3.5, -2.25, 1e-3, 0.5, 7.0, 1e4, 2.0 ** -10, 123.456)
COUNTS = (3, 7, 11, 64, 101770)
'''


def adam_row():
    from reports.conformance import runner

    rows, _ = runner.plan_rows(["fastlib"], ops=["Adam"], dtype="float64")
    rows = [r for r in rows if r.kind == "optimizer"]
    runner.run_rows(rows, runner.PROFILES["dev"], 3)
    result = asdict(rows[0].result)
    result.pop("seconds")
    return result


def test_a_loaded_module_with_new_constants_does_not_change_a_row(tmp_path, monkeypatch):
    before = adam_row()
    # a local module (not a test file, not site-packages) with constants of its own
    (tmp_path / "extra_constants_module.py").write_text(CONSTANTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("extra_constants_module")
    try:
        assert adam_row() == before
    finally:
        sys.modules.pop("extra_constants_module", None)
