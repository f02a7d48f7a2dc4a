"""Calls placed where random draws never land, added to each op's ``special`` row: ``axis=()``
on an n-d input (``sum`` ``mean`` ``logsumexp``); a row-maximum shift tested with a dominant
entry at every position of a row longer than the vector lanes (the row-normalising ops); and a
row long enough that fastlib splits it into pieces (``sum`` ``mean``, and ``logsumexp`` with its
maximum in the last piece). Sizes are read from fastlib's constants when the cases are built.
Each case is checked like a special value: forward and every VJP, entry by entry, exactly.

The long story: docs/reports-conformance.md, section ``reports/conformance/edge_cases.py``.
"""
from __future__ import annotations

import numpy as np

from reports.conformance.strategies import OpExample

__all__ = ["edge_cases", "EDGE_LABELS", "SQUARE", "DOMINANT"]

EDGE_LABELS = ("axis=()", "dominant at every position", "long row in pieces")

#: rows and columns of the "dominant at every position" block: two groups of 16 lanes and
#: a ragged tail of 5 (37 is prime: no lane width divides it evenly)
SQUARE = 37
#: how far the dominant entry stands above the rest: exp of it overflows both float dtypes
#: (exp(88.7) in float32, exp(709.8) in float64), so a shift by a smaller value cannot hide
DOMINANT = 1.0e4

ROW_NORMALISING = ("softmax", "log_softmax", "logsumexp", "cross_entropy",
                   "categorical_cross_entropy")
REDUCTIONS = ("sum", "mean", "logsumexp")


def _piece_length():
    """A row fastlib splits into at least two pieces plus a remainder (its own constants)."""
    from fastlib.config import PARALLEL_MIN_CHUNK

    return 2 * int(PARALLEL_MIN_CHUNK) + 37


def _raw(name, dtype, rng):
    """(label, inputs in float64 / int, params) for ``name``."""
    cases = []
    if name in REDUCTIONS:
        x = rng.uniform(-2.0, 2.0, (2, 3, 4))
        for keep in (False, True):
            cases.append(("axis=()", [x], {"axis": (), "keepdims": keep}))
    if name in ROW_NORMALISING:
        n = SQUARE
        z = rng.uniform(-1.0, 1.0, (n, n))
        z[np.arange(n), np.arange(n)] += DOMINANT
        params = {"axis": -1} if name in ("softmax", "log_softmax") else \
            {"axis": 1} if name == "logsumexp" else {}
        # the cross-entropies' targets sit beside the dominant class: losses near DOMINANT
        target = (np.arange(n) + 1) % n
        if name == "cross_entropy":
            cases.append(("dominant at every position", [z, target], params))
        elif name == "categorical_cross_entropy":
            cases.append(("dominant at every position", [z, np.eye(n)[target]], params))
        else:
            cases.append(("dominant at every position", [z], params))
    if name in REDUCTIONS:
        r = _piece_length()
        if name != "logsumexp":
            cases.append(("long row in pieces", [rng.uniform(0.5, 1.5, (1, r))], {"axis": 1}))
        elif dtype == np.float64:
            # NOTE: float64 only: float32 pieces are combined in float64, where a shift by a
            # float32 spread cannot overflow; and the exact log-sum-exp of a row this long costs
            # seconds (an mpmath exp per entry), which the dev profile pays once
            row = rng.uniform(-1.0, 1.0, (1, r))
            row[0, -1] += DOMINANT
            cases.append(("long row in pieces", [row], {"axis": 1}))
    return cases


def edge_cases(name, dtype):
    """The edge calls of op ``name`` in ``dtype`` (``OpExample`` with a ``label``), in a fixed
    order (``repro.edge`` rebuilds case ``i`` as ``edge_cases(name, dtype)[i]``).

    Cases whose exact results overflow the dtype are left out (none do today: every output
    and VJP above is bounded by the inputs' magnitudes).
    """
    import spec

    from reports.conformance.oracle import representable as results_representable

    dtype = np.dtype(dtype)
    op = spec.OPS[name]
    rng = np.random.default_rng(20261124)
    out = []
    for label, inputs, params in _raw(name, dtype, rng):
        cast = tuple(np.asarray(x) if op.domains[n] == "class_index"
                     else np.asarray(x, np.float64).astype(dtype)
                     for n, x in zip(op.inputs, inputs))
        shape = op.check_shapes([np.shape(x) for x in cast], params)
        grad = rng.standard_normal(shape).astype(dtype)
        out.append(OpExample(name, cast, grad, dict(params), 0, False, label))
    return results_representable(out, dtype)
