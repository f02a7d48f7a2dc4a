"""Containers: Sequential (a chain) and Parallel (branches on one input, concat or add).

Children are numbered from 0 and their parameters are named ``"<index>.<name>"`` to any depth.
Backward routes the output cotangent into the children in reverse order (Loom's
BackwardPolymorphic) and their gradients out under the same dotted names
(ApplyRecursiveGradients' routing into nested branches).
"""
from __future__ import annotations

import warnings

import numpy as np

from fastlib.layers.base import Layer, check_dtype


def check_children(layers, owner):
    """The children as a tuple of distinct fastlib layers, or a clear error."""
    if isinstance(layers, Layer) or not hasattr(layers, "__iter__"):
        raise TypeError(f"{owner} takes a list of layers, e.g. {owner}([Dense(2, 3)])")
    layers = tuple(layers)
    if not layers:
        raise ValueError(f"{owner} needs at least one layer")
    for i, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise TypeError(f"{owner}: item {i} is {type(layer).__name__}, not a fastlib layer")
    if len({id(layer) for layer in layers}) != len(layers):
        raise ValueError(f"{owner}: the same layer object appears twice; build a new layer for "
                         "each position (parameters are not shared)")
    return layers


def _warn_redraw(owner, children):
    """Warn before a container redraws weights its user may mean to keep: weights set by
    ``load_parameters`` (PyTorch's and Keras's containers keep their children's weights; this
    one draws every weight from its seed, as reflib does), or a layer already inside another
    model, whose outputs the redraw changes too."""
    for i, child in enumerate(children):
        loaded = [layer for layer in _walk(child) if getattr(layer, "_weights_loaded", False)]
        if loaded:
            warnings.warn(f"{owner}: layer {i} ({type(child).__name__}) holds weights set by "
                          "load_parameters, and building the container redraws every weight "
                          f"from its seed; load them after building: {owner}(...)"
                          ".load_parameters(...)", UserWarning, stacklevel=4)
        elif getattr(child, "_contained", False):
            warnings.warn(f"{owner}: layer {i} ({type(child).__name__}) already belongs to "
                          "another model, and building this container redraws its weights, "
                          "changing that model too; build a new layer for each model",
                          UserWarning, stacklevel=4)


def _walk(layer):
    yield layer
    for child in layer._children:
        yield from _walk(child)


def _prefixed(index, grads, into):
    for name, value in grads.items():
        into[f"{index}.{name}"] = value


class _Container(Layer):
    """Shared constructor: children, one dtype for all, one generator for all draws."""

    def __init__(self, layers, dtype, seed, rng):
        owner = type(self).__name__
        super().__init__(check_dtype(dtype, owner))
        self._children = check_children(layers, owner)
        _warn_redraw(owner, self._children)
        for child in self._children:
            child._set_dtype(self.dtype)
            child._contained = True
        self.reset_parameters(seed, rng)

    @property
    def layers(self):
        return list(self._children)

    @property
    def takes_indices(self):
        return self._children[0].takes_indices

    def _infer_child(self, index, shape):
        try:
            return self._children[index].infer_shape(shape)
        except ValueError as exc:
            raise ValueError(f"{type(self).__name__} layer {index}: {exc}") from None

    def history(self):
        """Per child, the ``(hist_in, hist_pre)`` of the last forward (Loom's histIn/histPre)."""
        return [(c.hist_in, c.hist_pre) for c in self._children]


class Sequential(_Container):
    """Apply layers in order: ``layers[-1](... layers[0](x))``.

    Parameters
    ----------
    layers : list of Layer
        The children (containers nest to any depth). Only the first may take indices
        (Embedding).
    dtype : float32 (default) or float64
        Every child is converted to it.
    seed : int or numpy.random.Generator, default 0
        Every parameter of every child is (re)drawn from one generator, children in order,
        depth first, exactly as ``reflib.models.from_config(cfg, seed=seed)`` draws them.
    rng : numpy.random.Generator, optional
        reflib's spelling of a generator seed (then leave ``seed`` None).

    Examples
    --------
    >>> model = Sequential([Dense(784, 128, "relu"), Dense(128, 10)], seed=0)
    >>> sorted(model.parameters())
    ['0.bias', '0.weight', '1.bias', '1.weight']
    """

    def __init__(self, layers, dtype=np.float32, seed=0, rng=None):
        if rng is not None and seed == 0:
            seed = None  # the generator is the seed
        super().__init__(layers, dtype, seed, rng)
        for i, child in enumerate(self._children):
            if i > 0 and child.takes_indices:
                raise ValueError(f"Sequential: layer {i} ({type(child).__name__}) takes integer "
                                 "indices, so it must be the first layer")
        width = None
        for i, child in enumerate(self._children):
            need = child.in_width
            if need is not None and width is not None and need != width:
                raise ValueError(f"Sequential: layer {i} {child!r} expects {need} input features "
                                 f"but layer {i - 1} {self._children[i - 1]!r} produces {width}")
            width = child.out_width(width)

    @property
    def in_width(self):
        return self._children[0].in_width

    @property
    def output_range(self):
        """The last layer's: it alone decides where the outputs lie."""
        return self._children[-1].output_range

    def out_width(self, in_width):
        for child in self._children:
            in_width = child.out_width(in_width)
        return in_width

    def infer_shape(self, shape):
        for i in range(len(self._children)):
            shape = self._infer_child(i, shape)
        return shape

    def _run(self, x):
        self.hist_in = x
        for child in self._children:
            x = child._run(x)
        self._out_shape = x.shape
        return x

    def backward(self, grad_out, need_input_grad=True):
        g = self._cotangent(grad_out)
        per_child = [None] * len(self._children)
        for i in range(len(self._children) - 1, -1, -1):
            g, per_child[i] = self._children[i].backward(g, need_input_grad or i > 0)
        grads = {}
        for i, child_grads in enumerate(per_child):
            _prefixed(i, child_grads, grads)
        return (g if need_input_grad else None), grads

    def get_config(self):
        return {"type": "Sequential", "layers": [c.get_config() for c in self._children]}


class Parallel(_Container):
    """Run every branch on the same input and combine the outputs.

    Parameters
    ----------
    layers : list of Layer
        The branches.
    combine : {"concat", "add"}, default "concat"
        ``concat``: join the outputs on the last axis in branch order (leading axes must agree);
        ``add``: sum them left to right (shapes must be equal).
    dtype, seed, rng :
        As for ``Sequential``.
    """

    COMBINE = ("concat", "add")

    def __init__(self, layers, combine="concat", dtype=np.float32, seed=0, rng=None):
        if combine not in self.COMBINE:
            raise ValueError(f"Parallel: combine must be 'concat' or 'add', got {combine!r}")
        self.combine = combine
        if rng is not None and seed == 0:
            seed = None
        super().__init__(layers, dtype, seed, rng)
        kinds = {c.takes_indices for c in self._children}
        if len(kinds) > 1:
            raise ValueError("Parallel: some branches take integer indices (Embedding) and some "
                             "take features; all branches receive the same input")
        needs = {c.in_width for c in self._children} - {None}
        if len(needs) > 1:
            raise ValueError(f"Parallel: the branches expect different input widths "
                             f"{sorted(needs)}, but they all receive the same input")
        if combine == "add":
            outs = {c.out_width(self.in_width) for c in self._children} - {None}
            if len(outs) > 1:
                raise ValueError(f"Parallel(combine='add'): the branches produce widths "
                                 f"{sorted(outs)}; add needs equal shapes (use combine='concat')")

    @property
    def in_width(self):
        needs = [c.in_width for c in self._children if c.in_width is not None]
        return needs[0] if needs else None

    @property
    def output_range(self):
        """Where the combined outputs lie: the branches' union (concat) or the sum of their
        bounds (add); None when some branch's is unknown."""
        ranges = [c.output_range for c in self._children]
        if any(r is None for r in ranges):
            return None
        if self.combine == "concat":
            return min(r[0] for r in ranges), max(r[1] for r in ranges)
        return sum(r[0] for r in ranges), sum(r[1] for r in ranges)

    def out_width(self, in_width):
        widths = [c.out_width(in_width) for c in self._children]
        if any(w is None for w in widths):
            return None
        return sum(widths) if self.combine == "concat" else widths[0]

    def infer_shape(self, shape):
        out = None
        for i in range(len(self._children)):
            y = self._infer_child(i, shape)
            if out is not None:
                same = (len(out) == len(y) and
                        (out[:-1] == y[:-1] if self.combine == "concat" else out == y))
                if not same:
                    need = "equal leading axes" if self.combine == "concat" else "equal shapes"
                    raise ValueError(f"Parallel(combine={self.combine!r}): branch {i} gives "
                                     f"shape {y}, the branches before it {out}; {need} are "
                                     "required")
                if self.combine == "concat":
                    y = tuple(y[:-1]) + (out[-1] + y[-1],)
            out = y
        return out

    def _run(self, x):
        self.hist_in = x
        outs = [child._run(x) for child in self._children]
        if self.combine == "concat":
            self._widths = [o.shape[-1] for o in outs]
            total = np.concatenate(outs, axis=-1)
        else:
            total = outs[0].copy()
            for o in outs[1:]:
                total += o  # NOTE: summed left to right, as reflib's chain of add ops
        self._out_shape = total.shape
        return total

    def backward(self, grad_out, need_input_grad=True):
        g = self._cotangent(grad_out)
        if self.combine == "concat":
            bounds = np.cumsum(self._widths)[:-1]
            parts = np.split(g, bounds, axis=-1)
            parts = [np.ascontiguousarray(p) for p in parts]
        else:
            parts = [g] * len(self._children)
        grads, dx = {}, None
        for i, (child, part) in enumerate(zip(self._children, parts)):
            gi, child_grads = child.backward(part, need_input_grad)
            _prefixed(i, child_grads, grads)
            if need_input_grad and gi is not None:
                dx = gi if dx is None else dx + gi
        return dx, grads

    def get_config(self):
        return {"type": "Parallel", "combine": self.combine,
                "layers": [c.get_config() for c in self._children]}
