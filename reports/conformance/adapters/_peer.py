"""What the peer adapters (paddle, tinygrad, mygrad, autograd) share: one op table per engine,
the engine's own autograd, and a record of every place the adapter had to compose.

The long story: docs/reports-peers.md, section ``reports/conformance/adapters/_peer.py``.
"""
from __future__ import annotations

import numpy as np

import optable
from reports.conformance.engines import Engine, UnsupportedOpError

__all__ = ["PeerEngine", "GraphSecondOrder", "class_index_inputs", "numpy_axes",
           "slice_index"]


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

    def supports_in(self, op, dtype):
        """As :meth:`supports`, and in ``dtype``: where the engine has no kernel of the op in
        a 16-bit format (``_format_reason``), it is unsupported there, with the engine's own
        words."""
        ok, reason = self.supports(op)
        if ok and optable.formats.is_storage(dtype):
            missing = self._format_reason(op, np.dtype(dtype))
            if missing:
                return False, missing
        return ok, reason

    def _format_reason(self, op, dtype):
        """Why the engine cannot run ``op`` in the 16-bit ``dtype`` (None: it can)."""
        return None

    def _require_in(self, name, arrays):
        """Raise ``UnsupportedOpError`` where the inputs' format lacks op ``name``."""
        dtypes = [np.asarray(a).dtype for a in arrays
                  if optable.formats.is_storage(np.asarray(a).dtype)]
        if dtypes:
            ok, reason = self.supports_in(name, dtypes[0])
            if not ok:
                raise UnsupportedOpError(f"{self.name}: {name} is not supported in "
                                         f"{dtypes[0]}: {reason}")

    def _tensors(self, name, inputs, track):
        fixed = class_index_inputs(name)
        return [self._tensor(np.array(np.asarray(x), dtype=np.int64) if i in fixed
                             else np.array(x), track and i not in fixed)
                for i, x in enumerate(inputs)]

    def _forward(self, name, inputs, **params):
        self._require_in(name, inputs)
        out = self.ops[name](*self._tensors(name, inputs, False), **params)
        return self._numpy(out)

    def _vjp(self, name, inputs, grad, **params):
        self._require_in(name, inputs)
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


class GraphSecondOrder:
    """Second order for a peer whose reverse mode builds a differentiable graph (a mixin before
    ``PeerEngine``): ``H t`` by reverse over reverse, ``J t`` by the double-backward trick.

    ``H t = ∇_x <t, ∇_x <g, f(x)>>``: the first VJP is kept on the graph and differentiated
    again. ``J t = ∇_u <t, Jᵀ u>`` for a tracked cotangent ``u`` (the VJP is linear in ``u``,
    so its gradient in ``u`` is ``J t`` exactly): a reverse-only engine's forward mode, the way
    ``paddle.incubate.autograd.jvp`` computes it in dynamic mode. Subclasses implement
    ``_graph_gradients`` and may route ``_jvp`` through the engine's own API instead.
    A loss whose stock target gets no gradient (``label_parts``) runs as the stock loss with
    its target detached plus ``P(z, t) - P(z, detach(t))`` for its target part ``P``: the
    same values and first derivatives, and the cross terms ``d²/dz dt`` from ``P``.
    """

    #: how the adapter computes J t and H t, in words (the findings file records it)
    second_order_route = ""

    def _graph_gradients(self, out, wanted, grad, keep=True):  # pragma: no cover
        """Cotangents of ``wanted`` for cotangent tensor ``grad`` (None: ``out`` is a scalar)
        on ``out``, kept on the graph when ``keep`` so they can be differentiated again; None
        where ``out`` does not depend on a tensor."""
        raise NotImplementedError

    def _detach(self, tensor):  # pragma: no cover - subclasses with label_parts implement
        raise NotImplementedError

    def _second_order_output(self, name, tensors, params):
        out = self.ops[name](*tensors, **params)
        part = self.label_parts.get(name)
        if part is None:
            return out
        labels, target_part = part
        held = [self._detach(t) if i in labels else t for i, t in enumerate(tensors)]
        return (self.ops[name](*held, **params) + target_part(*tensors)
                - target_part(*held))

    def _free(self, name, inputs):
        fixed = class_index_inputs(name)
        return [i for i in range(len(inputs)) if i not in fixed]

    def _pairing(self, grads, tangents):
        """``Σ_i <grads_i, tangents_i>`` as a scalar tensor (None when no term is left)."""
        terms = [(gi * ti).sum() for gi, ti in zip(grads, tangents) if gi is not None]
        if not terms:
            return None
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    def _jvp(self, name, inputs, tangents, **params):
        free = self._free(name, inputs)
        tensors = self._tensors(name, inputs, True)
        out = self._second_order_output(name, tensors, params)
        value = self._numpy(out)
        u = self._tensor(np.zeros(value.shape, value.dtype), True)
        vjp = self._graph_gradients(out, [tensors[i] for i in free], u)
        tans = [self._tensor(np.array(tangents[i], dtype=np.asarray(inputs[i]).dtype), False)
                for i in free]
        pairing = self._pairing(vjp, tans)
        (jt,) = ([None] if pairing is None else
                 self._graph_gradients(pairing, [u], None, keep=False))
        return value, (np.zeros(value.shape, value.dtype) if jt is None else self._numpy(jt))

    def _hvp(self, name, inputs, cotangent, tangents, **params):
        free = self._free(name, inputs)
        tensors = self._tensors(name, inputs, True)
        out = self._second_order_output(name, tensors, params)
        dtype = np.asarray(inputs[free[0]]).dtype
        g = self._tensor(np.array(cotangent, dtype=dtype), False)
        wanted = [tensors[i] for i in free]
        first = self._graph_gradients(out, wanted, g)
        tans = [self._tensor(np.array(tangents[i], dtype=np.asarray(inputs[i]).dtype), False)
                for i in free]
        pairing = self._pairing(first, tans)
        # a linear op: its first VJP does not depend on x and its Hessian is 0
        second = [None] * len(free) if pairing is None else self._graph_gradients(
            pairing, wanted, None, keep=False)
        got = dict(zip(free, second))
        return tuple(None if i not in got else
                     np.zeros(np.shape(x), dtype) if got[i] is None else self._numpy(got[i])
                     for i, x in enumerate(inputs))
