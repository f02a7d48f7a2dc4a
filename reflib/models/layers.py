"""Feed-forward reference layers: Dense, SwiGLU, LayerNorm, RMSNorm, Embedding, Softmax.

Each ``trace`` uses registry ops only (``matmul``, ``add``, ``mul``, ``reshape``, activations,
``layer_norm``, ``rms_norm``, ``softmax``), so the tape and the op VJPs give every gradient.
"""
from __future__ import annotations

import numbers

import numpy as np

import optable
from optable.layers import NormShell
from reflib.models.base import Layer, close_matches, input_shape, make_rng, set_sizes

# activation name -> registry op (None: no op at all), from the op table's activations
ACTIVATIONS = {a.name: None if a.op == "identity" else a.op for a in optable.ACTIVATIONS.values()}


def check_activation(name, owner):
    """Canonical activation name (case-insensitive), or a ValueError listing close names."""
    if not isinstance(name, str):
        raise TypeError(f"{owner}: activation must be a name (str), got {name!r}")
    key = name.lower()
    if key not in ACTIVATIONS:
        raise ValueError(f"{owner}: unknown activation {name!r}{close_matches(key, ACTIVATIONS)}; "
                         f"choose one of {sorted(ACTIVATIONS)}")
    return key


def apply_activation(tape, x, name):
    """Add the activation's op (softmax over the last axis); ``linear`` adds nothing."""
    op = ACTIVATIONS[name]
    if op is None:
        return x
    if op == "softmax":
        return tape.op("softmax", x, axis=-1)
    return tape.op(op, x)


def affine(tape, x, w, b=None):
    """``x @ w (+ b)`` over the last axis of ``x`` for any number of leading axes.

    NOTE: inputs with more than two axes are flattened to 2-D, multiplied, and reshaped back,
    so one plain 2-D ``matmul`` carries every product (its VJP is the textbook one).
    """
    shape = np.shape(tape.value(x))
    n_out = np.shape(tape.value(w))[1]
    flat = x if len(shape) == 2 else tape.op("reshape", x, shape=(-1, shape[-1]))
    y = tape.op("matmul", flat, w)
    if b is not None:
        y = tape.op("add", y, b)
    return y if len(shape) == 2 else tape.op("reshape", y, shape=tuple(shape[:-1]) + (n_out,))


class Dense(Layer):
    """Fully connected layer ``y = activation(x @ weight + bias)``.

    Parameters
    ----------
    in_features, out_features : int
        Sizes; ``weight`` is ``(in_features, out_features)`` and ``bias`` ``(out_features,)``.
    activation : str
        One of ``linear relu leaky_relu tanh sigmoid silu gelu gelu_tanh softplus softmax``
        (softmax over the last axis; leaky_relu with slope 0.01).
    seed, rng :
        Initialisation source (``rng`` wins; neither means seed 0): He-normal weight for relu and
        leaky_relu, Xavier-uniform otherwise; zero bias.

    Notes
    -----
    Input ``(batch, in_features)`` or ``(..., in_features)``.
    """

    def __init__(self, in_features, out_features, activation="linear", *, seed=None, rng=None):
        super().__init__()
        set_sizes(self, in_features=in_features, out_features=out_features)
        self.activation = check_activation(activation, "Dense")
        self.reset_parameters(seed, rng)

    def trace(self, tape, x, ids):
        input_shape(tape, x, "Dense", None, self.in_features)
        y = affine(tape, x, ids["weight"], ids["bias"])
        return apply_activation(tape, y, self.activation)

    def get_config(self):
        return {"type": "Dense", "in_features": self.in_features,
                "out_features": self.out_features, "activation": self.activation}


class SwiGLU(Layer):
    """Gated feed-forward ``y = (silu(x @ w_gate) * (x @ w_up)) @ w_down`` (no biases).

    Parameters
    ----------
    d, hidden, out : int
        ``w_gate (d, hidden)``, ``w_up (d, hidden)``, ``w_down (hidden, out)``; all
        Xavier-uniform, drawn in that order.
    """

    def __init__(self, d, hidden, out, *, seed=None, rng=None):
        super().__init__()
        set_sizes(self, d=d, hidden=hidden, out=out)
        self.reset_parameters(seed, rng)

    def trace(self, tape, x, ids):
        input_shape(tape, x, "SwiGLU", None, self.d)
        gate = tape.op("silu", affine(tape, x, ids["w_gate"]))
        hidden = tape.op("mul", gate, affine(tape, x, ids["w_up"]))
        return affine(tape, hidden, ids["w_down"])

    def get_config(self):
        return {"type": "SwiGLU", "d": self.d, "hidden": self.hidden, "out": self.out}


class LayerNorm(NormShell, Layer):
    """``layer_norm(x, eps) * weight + bias`` over the last axis (biased variance).

    Parameters
    ----------
    d : int
        Size of the last axis; ``weight (d,)`` starts at ones, ``bias (d,)`` at zeros.
    eps : float
        Added to the variance inside the square root.
    """

    def __init__(self, d, eps=1e-5, *, seed=None, rng=None):
        super().__init__()
        self._setup(d, eps, seed, rng)

    def trace(self, tape, x, ids):
        input_shape(tape, x, "LayerNorm", None, self.d)
        y = tape.op("layer_norm", x, eps=self.eps)
        return tape.op("add", tape.op("mul", y, ids["weight"]), ids["bias"])


class RMSNorm(NormShell, Layer):
    """``rms_norm(x, eps) * weight`` over the last axis; ``weight (d,)`` starts at ones."""

    def __init__(self, d, eps=1e-6, *, seed=None, rng=None):
        super().__init__()
        self._setup(d, eps, seed, rng)

    def trace(self, tape, x, ids):
        input_shape(tape, x, "RMSNorm", None, self.d)
        return tape.op("mul", tape.op("rms_norm", x, eps=self.eps), ids["weight"])


class Embedding(Layer):
    """Lookup table: integer indices of any shape -> ``indices.shape + (dim,)``.

    Parameters
    ----------
    num, dim : int
        ``weight (num, dim)``, Xavier-uniform with fan_in = num, fan_out = dim.

    NOTE: the lookup is ``one_hot(indices) @ weight`` (a constant one-hot leaf and a registry
    ``matmul``), so the weight's gradient is the matmul VJP, i.e. the scatter-add of the output
    cotangent rows, with repeated indices summed.
    """

    def __init__(self, num, dim, *, seed=None, rng=None):
        super().__init__()
        set_sizes(self, num=num, dim=dim)
        self.reset_parameters(seed, rng)

    def indices(self, values):
        """Validate indices (integers, or floats holding integers, in [0, num))."""
        arr = np.asarray(values)
        if arr.dtype.kind == "b":
            raise TypeError("Embedding: indices must be integers, got booleans")
        flat = [v for v in arr.reshape(-1)]
        out = np.empty(len(flat), dtype=np.int64)
        for i, v in enumerate(flat):
            if not isinstance(v, (numbers.Integral, np.integer)):
                fv = float(v)
                if not (np.isfinite(fv) and fv == int(fv)):
                    raise ValueError(f"Embedding: indices must be whole numbers, got {v} "
                                     "(pass integer token ids, not embeddings)")
            out[i] = int(v)
        bad = (out < 0) | (out >= self.num)
        if np.any(bad):
            raise ValueError(f"Embedding: index {out[bad][0]} out of range [0, {self.num}); "
                             "check the vocabulary size (num)")
        return out.reshape(arr.shape)

    def trace(self, tape, x, ids):
        idx = self.indices(tape.value(x))
        one_hot = np.zeros((idx.size, self.num))
        one_hot[np.arange(idx.size), idx.reshape(-1)] = 1.0
        rows = tape.op("matmul", tape.leaf(one_hot, requires_grad=False), ids["weight"])
        return tape.op("reshape", rows, shape=idx.shape + (self.dim,))

    def get_config(self):
        return {"type": "Embedding", "num": self.num, "dim": self.dim}


class Softmax(Layer):
    """``softmax(x, axis)``; no parameters."""

    def __init__(self, axis=-1, *, seed=None, rng=None):
        super().__init__()
        if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
            raise TypeError(f"Softmax: axis must be an int, got {axis!r}")
        self.axis = int(axis)
        make_rng(seed, rng)  # validated for a uniform constructor signature; nothing to draw

    def trace(self, tape, x, ids):
        ndim = np.ndim(tape.value(x))
        if not -ndim <= self.axis < ndim:
            raise ValueError(f"Softmax: axis {self.axis} out of range for input of {ndim} "
                             "dimensions")
        return tape.op("softmax", x, axis=self.axis)

    def get_config(self):
        return {"type": "Softmax", "axis": self.axis}
