"""Thousands of corrupted model and checkpoint files: each is a clean, named refusal or loads
exactly what it holds, under a memory limit (the script is ``tests/file_fuzz.py``).

The number of cases follows the Hypothesis profile (80 per ``max_examples``: 2,000 under ``ci``,
40,000 under ``thorough``); the slow test runs 20,000 more from another seed.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from hypothesis import settings

SCRIPT = pathlib.Path(__file__).resolve().parent / "file_fuzz.py"
ROOT = SCRIPT.parents[1]


def _fuzz(cases, seed, memory_mb=512):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cases", str(cases), "--seed",
                           str(seed), "--memory-mb", str(memory_mb)], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(report, cases):
    failures = report["failures"]
    assert not failures, json.dumps(failures[:10], indent=1)
    counts = report["counts"]
    assert sum(counts.values()) >= cases  # checkpoints are loaded twice
    # every kind of corruption was generated and refused at least once; some are still valid
    # files (a re-compressed member, a Fortran-order header) and load what they hold
    for kind in ("flip", "truncate", "member", "header", "json"):
        assert counts.get(f"{kind}/error", 0) > 0, counts
    assert counts.get("member/loaded", 0) > 0
    # no load spent long on any case (a declared 25000 x 25000 layer costs nothing)
    assert report["slowest_seconds"] < 2.0, report["slowest_case"]


def test_corrupted_files_are_refused_cleanly_under_a_memory_limit():
    cases = 80 * settings().max_examples
    _check(_fuzz(cases, seed=0), cases)


@pytest.mark.slow
def test_corrupted_files_deeper():
    _check(_fuzz(20000, seed=1), 20000)
