"""The fast tape: TorchLean's reverse-mode tape over fastlib's kernels.

Same contract as ``reflib.Tape`` (docs/semantics.md): node ids are append
order; a node holds its value, its parents, ``requires_grad`` and a backward function from a
cotangent to ``[(parent_id, contribution), ...]``. Traversal visits ids n-1 down to 0, folds the
contributions left to right as ``existing + new`` and keeps a gradient for every node id.

The traversal is written here again rather than imported: fastlib must not import reflib (its
training path must not pay for mpmath/SymPy), and the loop is a dozen lines. The tests hold both
tapes to the same answers and the same errors on random DAGs.
"""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["Tape", "AutogradError"]

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_dtype(dtype, owner):
    """A layer's or a tape's dtype as a numpy dtype: float32 or float64, else a TypeError."""
    if dtype is None:   # NumPy reads None as float64: a silent switch from the float32 default
        raise TypeError(f"{owner}: dtype must be float32 or float64, got None; pass "
                        "dtype=np.float32 or dtype=np.float64 (or leave it out for the default)")
    try:
        resolved = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{owner}: dtype must be float32 or float64, got {dtype!r}") from exc
    if resolved not in _FLOAT_DTYPES:
        raise TypeError(f"{owner}: dtype must be float32 or float64, got {resolved}; pass "
                        "dtype=np.float32 or dtype=np.float64")
    return resolved


class AutogradError(ValueError):
    """A misuse of the tape: an invalid id, or a gradient whose shape or count is wrong."""


def _shape(x):
    return None if x is None else np.shape(x)


class Tape:
    """A reverse-mode tape whose values are NumPy arrays of one float dtype.

    Parameters
    ----------
    dtype : numpy dtype, default float64
        float32 or float64. Leaves and custom-node values are converted to it; registry ops run
        fastlib's kernels in it.

    Examples
    --------
    >>> t = Tape()
    >>> x = t.leaf(np.array([1.0, 2.0]))
    >>> y = t.op("sum", t.op("square", x))
    >>> t.backward_scalar(y)[x]
    array([2., 4.])
    """

    def __init__(self, dtype=np.float64):
        self.dtype = check_dtype(dtype, "Tape")
        self._values = []
        self._parents = []
        self._backward = []
        self._requires_grad = []

    def __len__(self):
        return len(self._values)

    # ------------------------------------------------------------------ building
    def _append(self, value, parents, backward, requires_grad):
        value.flags.writeable = False  # values are shared with the VJPs: no in-place edits
        self._values.append(value)
        self._parents.append(tuple(parents))
        self._backward.append(backward)
        self._requires_grad.append(bool(requires_grad))
        return len(self._values) - 1

    def _valid(self, node_id):
        return (not isinstance(node_id, (bool, np.bool_)) and isinstance(node_id, numbers.Integral)
                and 0 <= node_id < len(self._values))

    def _check_input_id(self, node_id, what):
        n = len(self._values)
        if not self._valid(node_id):
            raise AutogradError(f"autograd: invalid {what} id {node_id!r}: the tape has {n} "
                                f"nodes (ids 0..{n - 1})")
        return int(node_id)

    def _array(self, value, what):
        """``value`` as a new array of the tape's dtype; non-real dtypes are a TypeError."""
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{what} has dtype {arr.dtype}; pass a real array (float, int or "
                            "bool dtype)")
        return np.array(arr, dtype=self.dtype)

    def leaf(self, value, requires_grad=True):
        """Append an input node; return its id.

        Parameters
        ----------
        value : array_like
            Converted to the tape's dtype.
        requires_grad : bool, default True
            False makes the node drop every contribution sent to it.
        """
        return self._append(self._array(value, "leaf value"), (), None, requires_grad)

    def op(self, name, *ids, **params):
        """Append the registry op ``name`` applied to the nodes ``ids``; return its id.

        The node requires grad when any parent does. Its backward calls ``fastlib.vjp`` with the
        saved inputs; inputs whose VJP is None (class indices) receive no contribution.
        """
        parents = tuple(self._check_input_id(i, "input") for i in ids)
        from fastlib import ops  # deferred: the kernels are only needed once an op is recorded

        inputs = [self._values[p] for p in parents]
        value = np.asarray(ops.forward(name, inputs, **params))

        def backward(cotangent):
            grads = ops.vjp(name, inputs, cotangent, **params)
            return [(p, g) for p, g in zip(parents, grads) if g is not None]

        requires_grad = any(self._requires_grad[p] for p in parents)
        return self._append(value, parents, backward, requires_grad)

    def node(self, value, parents, backward, requires_grad=True):
        """Append a custom node; return its id.

        Parameters
        ----------
        value : array_like
            The node's value, converted to the tape's dtype.
        parents : sequence of int
            Existing node ids (checked now); the ids that actually receive gradient are the ones
            ``backward`` returns (checked during backward).
        backward : callable
            ``backward(cotangent) -> list[(parent_id, contribution)]``.
        requires_grad : bool, default True
        """
        if not callable(backward):
            raise TypeError(f"autograd: backward must be callable (cotangent -> [(parent_id, "
                            f"contribution)]); got {type(backward).__name__}")
        parents = tuple(self._check_input_id(p, "parent") for p in parents)
        return self._append(self._array(value, "node value"), parents, backward, requires_grad)

    def value(self, node_id):
        """The value of node ``node_id``."""
        return self._values[self._check_input_id(node_id, "node")]

    def parents(self, node_id):
        """The parent ids node ``node_id`` was built from."""
        return self._parents[self._check_input_id(node_id, "node")]

    def requires_grad(self, node_id):
        """Whether node ``node_id`` takes part in backward."""
        return self._requires_grad[self._check_input_id(node_id, "node")]

    # ------------------------------------------------------------------ traversal
    def _step(self, slots, node_id):
        """Run node ``node_id``'s backward on its slot and fold the contributions into ``slots``.

        NOTE: contributions are folded left to right as ``existing + new`` (TorchLean's
        addGradDense), so sums are formed in the same order as reflib's tape.
        """
        n = len(self._values)
        for parent, contribution in self._backward[node_id](slots[node_id]):
            if not self._valid(parent):
                raise AutogradError(
                    f"autograd: invalid parent id during backward: node {node_id} (shape "
                    f"{self._values[node_id].shape}) returned parent id {parent!r} (tape has {n} "
                    f"nodes) with a contribution of shape {_shape(contribution)}")
            if not self._requires_grad[parent]:
                continue  # a parent that does not require grad drops its contribution
            parent_shape = self._values[parent].shape
            if contribution is None or np.shape(contribution) != parent_shape:
                raise AutogradError(
                    f"autograd: gradient contribution has wrong shape for parent {parent} from "
                    f"node {node_id}: contribution shape {_shape(contribution)}, parent shape "
                    f"{parent_shape}")
            contribution = self._array(contribution,
                                       f"contribution from node {node_id} to parent {parent}")
            existing = slots[parent]
            slots[parent] = (contribution if existing is None
                             else np.asarray(existing + contribution, self.dtype))

    def backward_dense(self, out, seed):
        """Reverse-mode gradients of every node from output ``out`` seeded with ``seed``.

        Returns
        -------
        list of ndarray or None
            One entry per node id; None where the node was not reached.
        """
        if not self._valid(out):
            n = len(self._values)
            raise AutogradError(f"autograd: invalid output id {out!r}: the tape has {n} nodes "
                                f"(ids 0..{n - 1}); seed shape {_shape(seed)}")
        out = int(out)
        out_shape = self._values[out].shape
        if np.shape(seed) != out_shape:
            raise AutogradError(f"autograd: seed gradient shape mismatch for output {out}: output "
                                f"shape {out_shape}, seed shape {np.shape(seed)}")
        seed = self._array(seed, "seed")
        slots = [None] * len(self._values)
        slots[out] = seed
        for node_id in range(out, -1, -1):  # ids above out cannot be reached from it
            if slots[node_id] is None or not self._requires_grad[node_id]:
                continue
            if self._backward[node_id] is not None:
                self._step(slots, node_id)
        return slots

    def backward_dense_all(self, out, seed):
        """As :meth:`backward_dense`, with zeros of the node's shape where it was not reached.

        The VJP of an unreached node never runs.
        """
        slots = self.backward_dense(out, seed)
        return [np.zeros_like(v) if g is None else g for g, v in zip(slots, self._values)]

    def backward_dense_from(self, grads0):
        """Run every node with requires_grad, n-1 down to 0, from the dense array ``grads0``.

        Parameters
        ----------
        grads0 : sequence of array_like
            One gradient per node id, each of its node's shape.
        """
        return self.backward_dense_from_loop(grads0, len(self._values))

    def backward_dense_from_loop(self, grads, k):
        """The loop form: visit node ids k-1 down to 0 over the total gradient array ``grads``."""
        n = len(self._values)
        if not hasattr(grads, "__len__") or len(grads) != n:
            got = len(grads) if hasattr(grads, "__len__") else type(grads).__name__
            raise AutogradError(f"autograd: initial dense gradient array has wrong length: got "
                                f"{got} entries, the tape has {n} nodes")
        for node_id, (g, v) in enumerate(zip(grads, self._values)):
            if g is None or np.shape(g) != v.shape:
                raise AutogradError(f"autograd: gradient array has wrong shape for node "
                                    f"{node_id}: node shape {v.shape}, gradient shape {_shape(g)}")
        slots = [self._array(g, f"gradient for node {i}") for i, g in enumerate(grads)]
        if (isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer))
                or not 0 <= k <= n):
            raise AutogradError(f"autograd: loop bound k={k!r} must be an int in 0..{n}")
        for node_id in range(k - 1, -1, -1):
            if self._requires_grad[node_id] and self._backward[node_id] is not None:
                self._step(slots, node_id)
        return slots

    def backward(self, out, seed):
        """Sparse form: ``{node_id: gradient}`` for the reached nodes only."""
        return {i: g for i, g in enumerate(self.backward_dense(out, seed)) if g is not None}

    def backward_scalar(self, out):
        """Sparse gradients from a scalar (0-d) output with seed 1."""
        return self.backward(out, np.ones((), dtype=self.dtype))
