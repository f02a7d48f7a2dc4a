"""Helpers of the tests that run the conformance rows in workers or on a cluster: the rows'
results without their timings, and the arguments of a small ``verigrad conform`` run."""
from __future__ import annotations

import argparse
from dataclasses import asdict


def results(rows):
    """(check, subject, engine, dtype, result without seconds) of each row, in order."""
    out = []
    for r in rows:
        d = asdict(r.result)
        d.pop("seconds")
        out.append((r.kind, r.name, r.engine, r.dtype, d))
    return out


def conform_args(**kw):
    """``verigrad conform``'s parsed arguments for three subjects in float64, with ``kw``."""
    args = dict(profile="dev", engines=["reflib", "fastlib"], ops=["tanh", "mul", "Adam"],
                dtypes=["float64"], json=None, seed=3, mutants=False, no_proofs=True,
                fail_fast=False, first=None, progress=False, cluster=None, workers=1)
    args.update(kw)
    return argparse.Namespace(**args)
