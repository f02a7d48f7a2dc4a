"""The reference tape: reverse-mode autograd exactly as TorchLean documents it (docs/semantics.md).

A tape is a list of nodes in append order; a node's id is its index. Each node holds a value,
its parent ids, ``requires_grad`` and a backward function ``cotangent -> [(parent_id,
contribution), ...]``. Backward visits ids n-1 down to 0 and folds each node's contributions
left to right into its parents' slots (``existing + contribution``). Gradients are kept for
every node id, not only leaves.

The long story: docs/reflib.md, section ``reflib/tape.py``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

import numpy as np

from reflib.numeric import numeric_for
from reflib.ops import forward, vjp_from_output

__all__ = ["Tape", "AutogradError"]


class AutogradError(ValueError):
    """A misuse of the tape: a bad id, a gradient of the wrong shape, a wrong-length array."""


@dataclass
class _Node:
    value: np.ndarray
    parents: tuple
    backward: Callable  # cotangent -> list of (parent_id, contribution)
    requires_grad: bool


def _no_parents(cotangent):
    return []


def _shape(x):
    return None if x is None else np.shape(x)


class Tape:
    """A TorchLean-style tape. ``Tape()`` computes in float64; ``Tape(dps=50)`` with mpmath.

    Parameters
    ----------
    dps : int or None
        None: values and gradients are float64 arrays. An int: object arrays of ``mpmath.mpf``,
        every op evaluated at that many decimal digits.

    Examples
    --------
    >>> t = Tape()
    >>> x = t.leaf([1.0, 2.0])
    >>> y = t.op("sum", t.op("square", x))
    >>> t.backward_scalar(y)[x]
    array([2., 4.])
    """

    def __init__(self, dps=None):
        self._num = numeric_for(dps)
        self.dps = self._num.dps
        self._nodes: list[_Node] = []

    def __len__(self):
        return len(self._nodes)

    # -- building ------------------------------------------------------------------------

    def _valid(self, i):
        return not isinstance(i, bool) and isinstance(i, numbers.Integral) and 0 <= i < len(self._nodes)

    def _check_id(self, i, what):
        if not self._valid(i):
            raise AutogradError(f"autograd: invalid {what} id {i!r}: the tape has {len(self._nodes)} "
                                f"nodes (ids 0..{len(self._nodes) - 1})")
        return int(i)

    def _array(self, value, what):
        with self._num.context():
            return self._num.asarray(value, what)

    def _append(self, value, parents, backward, requires_grad):
        value.flags.writeable = False  # values are shared with VJPs; an in-place edit would corrupt them
        self._nodes.append(_Node(value, tuple(parents), backward, bool(requires_grad)))
        return len(self._nodes) - 1

    def leaf(self, value, requires_grad=True):
        """Add an input node (no parents) and return its id."""
        return self._append(self._array(value, "leaf value"), (), _no_parents, requires_grad)

    def node(self, value, parents, backward, requires_grad=True):
        """Add a custom node and return its id.

        ``backward(cotangent)`` returns a list of ``(parent_id, contribution)`` pairs, each
        contribution shaped like that parent's value.
        """
        if not callable(backward):
            raise TypeError(f"autograd: backward must be callable (cotangent -> [(parent_id, "
                            f"contribution)]); got {type(backward).__name__}")
        parents = tuple(self._check_id(p, "parent") for p in parents)
        return self._append(self._array(value, "node value"), parents, backward, requires_grad)

    def op(self, name, *ids, **params):
        """Add registry op ``name`` applied to nodes ``ids``; it requires grad when any parent does."""
        ids = tuple(self._check_id(i, "input") for i in ids)
        inputs = [self._nodes[i].value for i in ids]
        value = forward(name, inputs, dps=self.dps, **params)

        def backward(cotangent):
            grads = vjp_from_output(name, inputs, value, cotangent, dps=self.dps, **params)
            return [(i, g) for i, g in zip(ids, grads) if g is not None]

        return self._append(value, ids, backward, any(self._nodes[i].requires_grad for i in ids))

    def value(self, i):
        """The value of node ``i``."""
        return self._nodes[self._check_id(i, "node")].value

    def parents(self, i):
        """The parent ids node ``i`` was built from."""
        return self._nodes[self._check_id(i, "node")].parents

    def requires_grad(self, i):
        """Whether node ``i`` takes part in backward."""
        return self._nodes[self._check_id(i, "node")].requires_grad

    # -- backward ------------------------------------------------------------------------

    def _accumulate(self, grads, i):
        """Run node ``i``'s backward on ``grads[i]`` and fold its contributions into ``grads``."""
        with self._num.context():  # custom backward functions compute at the tape's precision
            pairs = list(self._nodes[i].backward(grads[i]))
        for pid, contribution in pairs:
            if not self._valid(pid):
                raise AutogradError(f"autograd: invalid parent id during backward: node {i} (shape "
                                    f"{self._nodes[i].value.shape}) returned parent id {pid!r} (tape "
                                    f"has {len(self._nodes)} nodes) with a contribution of shape "
                                    f"{_shape(contribution)}")
            parent = self._nodes[pid]
            if not parent.requires_grad:
                continue  # a parent that does not require grad drops its contribution
            if contribution is None or np.shape(contribution) != parent.value.shape:
                raise AutogradError(f"autograd: gradient contribution has wrong shape for parent "
                                    f"{pid} from node {i}: contribution shape {_shape(contribution)}, "
                                    f"parent shape {parent.value.shape}")
            c = self._array(contribution, f"contribution from node {i} to parent {pid}")
            with self._num.context():
                # NOTE: fold order is existing + new, contributions in the order backward lists them.
                grads[pid] = c if grads[pid] is None else np.asarray(grads[pid] + c, self._num.dtype)

    def backward_dense(self, out, seed):
        """Reverse-mode from ``out`` seeded with ``seed``: a list with one entry per node id,
        the gradient where the node was reached and None where it was not.

        Raises
        ------
        AutogradError
            For an invalid ``out``, a seed shaped unlike the output, an invalid parent id or a
            contribution shaped unlike its parent.
        """
        if not self._valid(out):
            raise AutogradError(f"autograd: invalid output id {out!r}: the tape has {len(self._nodes)} "
                                f"nodes (ids 0..{len(self._nodes) - 1}); seed shape {_shape(seed)}")
        shape = self._nodes[out].value.shape
        if np.shape(seed) != shape:
            raise AutogradError(f"autograd: seed gradient shape mismatch for output {out}: output "
                                f"shape {shape}, seed shape {np.shape(seed)}")
        grads = [None] * len(self._nodes)
        grads[out] = self._array(seed, "seed")
        for i in range(len(self._nodes) - 1, -1, -1):
            if grads[i] is not None and self._nodes[i].requires_grad:
                self._accumulate(grads, i)
        return grads

    def backward_dense_all(self, out, seed):
        """``backward_dense`` with zeros of each node's shape where it was not reached."""
        grads = self.backward_dense(out, seed)
        return [self._num.zeros(n.value.shape) if g is None else g for g, n in zip(grads, self._nodes)]

    def backward_dense_from_loop(self, grads, k):
        """Visit ids k-1 down to 0, running every node with requires_grad on ``grads`` (total).

        ``grads`` has one array per node with that node's shape; a new list is returned.
        """
        grads = self._check_dense(grads)
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k <= len(self._nodes):
            raise AutogradError(f"autograd: loop bound k={k!r} must be an int in 0..{len(self._nodes)}")
        for i in range(int(k) - 1, -1, -1):
            if self._nodes[i].requires_grad:
                self._accumulate(grads, i)
        return grads

    def backward_dense_from(self, grads0):
        """Reverse-mode from an explicit total gradient array: every node with requires_grad runs."""
        return self.backward_dense_from_loop(grads0, len(self._nodes))

    def _check_dense(self, grads):
        n = len(self._nodes)
        if not hasattr(grads, "__len__") or len(grads) != n:
            got = len(grads) if hasattr(grads, "__len__") else type(grads).__name__
            raise AutogradError(f"autograd: initial dense gradient array has wrong length: got {got} "
                                f"entries, the tape has {n} nodes")
        for i, (g, node) in enumerate(zip(grads, self._nodes)):
            if g is None or np.shape(g) != node.value.shape:
                raise AutogradError(f"autograd: gradient array has wrong shape for node {i}: node "
                                    f"shape {node.value.shape}, gradient shape {_shape(g)}")
        return [self._array(g, f"gradient for node {i}") for i, g in enumerate(grads)]

    def backward(self, out, seed):
        """The sparse form: ``{node_id: gradient}`` for the reached nodes only."""
        return {i: g for i, g in enumerate(self.backward_dense(out, seed)) if g is not None}

    def backward_scalar(self, out):
        """``backward(out, 1)`` for a scalar (shape ``()``) output, as ``loss.backward()``."""
        return self.backward(out, self._num.asarray(1.0))
