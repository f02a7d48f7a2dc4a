"""Plausible 16-bit bugs, planted in a running fastlib by monkeypatching: the 16-bit op rows must
fail under each (``verigrad conform --mutants``; source edits of the conversions are in
``mutants.MUTANTS``).

Each replaces what fastlib computes for one op in one storage format by what an engine that
computes in the storage format itself would return: NumPy's loops on ``ml_dtypes.bfloat16`` and
``np.float16`` arrays round every step to the format. The long story: docs/conformance.md,
"16-bit formats".
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["StorageMutant", "MUTANTS"]


@dataclass(frozen=True)
class StorageMutant:
    """A named bug: ``apply()`` is a context manager that plants it."""

    name: str
    description: str
    apply: Callable


@contextlib.contextmanager
def _replacing(names, planted):
    """Route ``fastlib.ops.<name>`` (and ``fastlib.<name>``, loaded lazily) through
    ``planted(name, original)`` for each of ``names``, inside the block."""
    import fastlib
    from fastlib import ops

    originals = {n: getattr(ops, n) for n in names}
    top = {n: vars(fastlib).get(n) for n in names}
    for n in names:
        setattr(ops, n, planted(n, originals[n]))
        setattr(fastlib, n, getattr(ops, n))
    try:
        yield
    finally:
        for n in names:
            setattr(ops, n, originals[n])
            if top[n] is None:
                delattr(sys.modules["fastlib"], n)
            else:
                setattr(fastlib, n, top[n])


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    return (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)


def bfloat16_sum_in_storage():
    """sum and mean of bfloat16 arrays accumulated in bfloat16: NumPy's add.reduce on
    ``ml_dtypes.bfloat16`` adds one entry at a time, rounding the running total to 8 bits."""
    import optable

    bf16 = optable.formats.dtype_of("bfloat16")

    def planted(which, original):
        def forward(name, inputs, **params):
            x = np.asarray(inputs[0]) if name in ("sum", "mean") and inputs else None
            if x is None or x.dtype != bf16:
                return original(name, inputs, **params)
            axes = _axes(params.get("axis"), x.ndim)
            total = np.add.reduce(x, axis=axes, keepdims=bool(params.get("keepdims")),
                                  dtype=bf16)
            if name == "mean":
                count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
                total = np.asarray(total, bf16) / np.asarray(count, bf16)
            return np.asarray(total, dtype=bf16)
        return forward

    return _replacing(("forward",), planted)


def float16_softmax_unshifted():
    """softmax of float16 arrays without the max subtraction, its exps kept in float16:
    exp(x) overflows float16 above x = 11.09 (65504), and inf / inf is NaN."""
    f16 = np.dtype(np.float16)

    def softmax(x, axis):
        with np.errstate(all="ignore"):
            e = np.exp(x)                       # float16 in, float16 out
            return e / np.sum(e, axis=axis, keepdims=True, dtype=f16)

    def planted(which, original):
        if which == "forward":
            def forward(name, inputs, **params):
                x = np.asarray(inputs[0]) if inputs else None
                if name != "softmax" or x is None or x.dtype != f16:
                    return original(name, inputs, **params)
                return softmax(x, params.get("axis", -1))
            return forward

        def vjp(name, inputs, grad, **params):
            x = np.asarray(inputs[0]) if inputs else None
            if name != "softmax" or x is None or x.dtype != f16:
                return original(name, inputs, grad, **params)
            axis = params.get("axis", -1)
            y = softmax(x, axis)
            g = np.asarray(grad, f16)
            with np.errstate(all="ignore"):
                return (y * (g - np.sum(g * y, axis=axis, keepdims=True, dtype=f16)),)
        return vjp

    return _replacing(("forward", "vjp"), planted)


MUTANTS = {m.name: m for m in (
    StorageMutant("bfloat16-sum-in-bfloat16",
                  "a bfloat16 sum (and mean) accumulated in bfloat16: a running total rounded to "
                  "8 bits at every addition", bfloat16_sum_in_storage),
    StorageMutant("float16-softmax-unshifted",
                  "a float16 softmax without the max subtraction, its exps in float16 (inf above "
                  "x = 11.09, then NaN)", float16_softmax_unshifted),
)}
