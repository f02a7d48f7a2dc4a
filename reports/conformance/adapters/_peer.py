"""What the peer adapters (paddle, tinygrad, mygrad, autograd) share: one op table per engine,
the engine's own autograd, and a record of every place the adapter had to compose.

The long story: docs/reports.md, section ``reports/conformance/adapters/_peer.py``.
"""
from __future__ import annotations

import numpy as np

from reports.conformance.engines import Engine

__all__ = ["PeerEngine", "class_index_inputs", "numpy_axes", "slice_index"]


def class_index_inputs(name):
    """Positions of the inputs of registry op ``name`` that are not differentiable."""
    import spec

    op = spec.OPS[name]
    return {i for i, n in enumerate(op.inputs) if op.vjp.get(n) is None}


def numpy_axes(axis, ndim):
    """NumPy's ``axis`` argument as a tuple of non-negative axes (None: every axis)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim for a in axes) if ndim else ()


def slice_index(ndim, axis=0, start=0, stop=None, step=1):
    """The index tuple of the registry's ``slice`` op (``x[..., start:stop:step, ...]``)."""
    index = [slice(None)] * ndim
    index[axis] = slice(start, stop, step)
    return tuple(index)


class PeerEngine(Engine):
    """An engine driven through an op table and its own reverse mode (see the module doc)."""

    ops: dict = {}
    composed: dict = {}
    label_parts: dict = {}

    # -- hooks ----------------------------------------------------------------------------------
    def _tensor(self, array, differentiable):  # pragma: no cover - subclasses implement
        """The engine's tensor holding ``array`` (tracked for gradients when differentiable)."""
        raise NotImplementedError

    def _numpy(self, tensor):  # pragma: no cover - subclasses implement
        """A NumPy copy of the engine's ``tensor``."""
        raise NotImplementedError

    def _gradients(self, out, wanted, grad):  # pragma: no cover - subclasses implement
        """The engine's VJP: cotangents of ``wanted`` tensors for ``grad`` (NumPy) on ``out``;
        None for a tensor ``out`` does not depend on (as the engine's autograd sees it)."""
        raise NotImplementedError

    # -- the protocol ---------------------------------------------------------------------------
    def supports(self, op):
        """As ``Engine.supports``; an op of the table missing from ``ops`` is declared, not a
        KeyError later."""
        ok, reason = super().supports(op)
        if ok and op not in self.ops:
            return False, f"the {self.name} adapter has no mapping for {op!r} yet"
        return ok, reason

    def _tensors(self, name, inputs, track):
        fixed = class_index_inputs(name)
        return [self._tensor(np.array(np.asarray(x), dtype=np.int64) if i in fixed
                             else np.array(x), track and i not in fixed)
                for i, x in enumerate(inputs)]

    def _forward(self, name, inputs, **params):
        out = self.ops[name](*self._tensors(name, inputs, False), **params)
        return self._numpy(out)

    def _vjp(self, name, inputs, grad, **params):
        fixed = class_index_inputs(name)
        free = [i for i in range(len(inputs)) if i not in fixed]
        tensors = self._tensors(name, inputs, True)
        out = self.ops[name](*tensors, **params)
        dtype = np.asarray(inputs[free[0]]).dtype
        grad = np.array(grad, dtype=dtype)
        got = dict(zip(free, self._gradients(out, [tensors[i] for i in free], grad)))
        part = self.label_parts.get(name)
        if part is not None:
            # NOTE: the stock loss treats these inputs as labels; their gradient comes from the
            # engine's autograd of the loss's part that depends on them (declared in composed).
            tensors = self._tensors(name, inputs, True)
            labels = list(part[0])
            extra = self._gradients(part[1](*tensors), [tensors[i] for i in labels], grad)
            got.update(zip(labels, extra))
        result = []
        for i, x in enumerate(inputs):
            if i in fixed:
                result.append(None)
            elif got[i] is None:   # the engine's autograd saw no path: the gradient is zero
                result.append(np.zeros(np.shape(x), dtype))
            else:
                result.append(got[i])
        return tuple(result)
