"""The reference layer protocol: parameters by name, initialisation, config, tracing on a tape.

Every reference layer is a ``Layer``. It owns a dict of named parameter arrays (float64, or
object arrays of ``mpmath.mpf`` when exact values were loaded), and it *traces* its forward pass
onto a ``reflib.Tape`` using registry ops only, so every gradient comes from the tape and the
ops' VJPs, never from hand-written layer backward code.

Containers (``Sequential``, ``Parallel``) hold children and name their parameters
``"<index>.<child name>"``, to any depth (``"1.0.w_ih"``).
"""
from __future__ import annotations

import numbers

import mpmath
import numpy as np

# the constructor checks and initial draws fastlib's layers make too (one seed, one draw)
from optable.layers import (RELU_FAMILY, check_bool, check_eps, check_heads,  # noqa: F401
                            check_positive_int, close_matches, he_normal, layer_repr, set_sizes,
                            xavier_uniform)
from optable.parameters import initial_parameters
from reflib.tape import Tape


def make_rng(seed=None, rng=None):
    """The generator to initialise from: ``rng`` itself, else ``default_rng(seed)``.

    Parameters
    ----------
    seed : int or None
        Seed for ``numpy.random.default_rng``; None means 0, so that initialisation is always
        reproducible unless a generator is passed.
    rng : numpy.random.Generator or None
        Used as is (and advanced) when given; ``seed`` must then be None.
    """
    if rng is not None:
        if seed is not None:
            raise ValueError("pass either seed= or rng=, not both")
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}; "
                            "use numpy.random.default_rng(seed)")
        return rng
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return np.random.default_rng(0 if seed is None else int(seed))


def as_parameter(name, value, shape, owner):
    """Validate one loaded parameter and return the array the layer will own (a copy).

    Floats and integers become float64 (float32 -> float64 is exact); object arrays must hold
    real numbers (``mpmath.mpf`` for exact mode) and are kept as object arrays.
    """
    arr = np.asarray(value)
    if arr.shape != tuple(shape):
        raise ValueError(f"{owner}: parameter {name!r} has shape {arr.shape}, expected "
                         f"{tuple(shape)}; check the layer sizes in the config")
    if arr.dtype == object:
        out = np.empty(arr.shape, dtype=object)
        for idx, v in np.ndenumerate(arr):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, mpmath.mpf)):
                raise TypeError(f"{owner}: parameter {name!r} holds {type(v).__name__} at "
                                f"{idx}; object arrays must hold real numbers (mpmath.mpf)")
            if not _finite(v):
                raise ValueError(f"{owner}: parameter {name!r} is not finite at {idx} ({v})")
            out[idx] = v
        return out
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{owner}: parameter {name!r} has dtype {arr.dtype}; expected a real "
                        "floating or integer array")
    out = np.array(arr, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(out))[0])
        raise ValueError(f"{owner}: parameter {name!r} is not finite at {bad} ({out[bad]})")
    return out


def _finite(v):
    return bool(mpmath.isfinite(v))


class Layer:
    """Base of every reference layer and container.

    Subclasses set ``_params`` (local name -> array, in declaration order) or ``_children``, and
    implement ``trace`` and ``get_config``. The public surface:

    - ``parameters()`` -> dict of the model's own arrays keyed by dotted names (writing into
      them changes the model, as fastlib's views do),
    - ``load_parameters(params)`` validates names, shapes and values and copies them in,
    - ``reset_parameters(seed=None, rng=None)`` re-draws the initialisation,
    - ``get_config()`` -> plain dict with a ``"type"`` key (``reflib.models.from_config``),
    - ``attach(tape)`` adds one leaf per parameter, ``trace(tape, x, ids)`` adds the forward,
    - ``model(x, dps=None)`` runs the forward on a fresh tape and returns the output array.
    """

    _children: tuple = ()

    def __init__(self):
        self._params = {}

    # -- parameters -------------------------------------------------------------------------
    def parameters(self):
        """All parameters keyed by dotted name, depth first, in declaration order.

        Returns
        -------
        dict[str, numpy.ndarray]
            The layer's own arrays (not copies).
        """
        out = dict(self._params)
        for i, child in enumerate(self._children):
            for name, value in child.parameters().items():
                out[f"{i}.{name}"] = value
        return out

    def load_parameters(self, params, strict=True):
        """Copy parameter values in, after checking names, shapes, dtypes and finiteness.

        Parameters
        ----------
        params : Mapping[str, array_like]
            Keyed like ``parameters()``; float32/float64/int arrays load as float64, object
            arrays of ``mpmath.mpf`` stay exact.
        strict : bool
            When True (default) every parameter must be given and no unknown name may appear;
            when False, missing names keep their values (unknown names are still an error).
        """
        if not hasattr(params, "items"):
            raise TypeError("load_parameters expects a dict of arrays, got "
                            f"{type(params).__name__}")
        current = self.parameters()
        owner = type(self).__name__
        unknown = [k for k in params if k not in current]
        if unknown:
            k = unknown[0]
            raise ValueError(f"{owner}.load_parameters: unknown parameter name {k!r}"
                             f"{close_matches(k, current)}; expected names: {sorted(current)}")
        missing = [k for k in current if k not in params]
        if strict and missing:
            raise ValueError(f"{owner}.load_parameters: missing parameters {missing}; pass every "
                             "name of parameters() or use strict=False")
        # validate everything before changing anything, so a failed load leaves the model intact
        staged = {k: as_parameter(k, params[k], current[k].shape, owner) for k in params}
        for name, value in staged.items():
            self._set_parameter(name, value)

    def _set_parameter(self, name, value):
        if name in self._params:
            self._params[name] = value
            return
        head, _, rest = name.partition(".")
        self._children[int(head)]._set_parameter(rest, value)

    def reset_parameters(self, seed=None, rng=None):
        """Re-draw every parameter, children in order, from one generator (see ``init``)."""
        gen = make_rng(seed, rng)
        drawn = self._init_parameters(gen)
        if drawn is not None:          # a shared shell returns its parameters (optable.layers)
            self._params = drawn
        for child in self._children:
            child.reset_parameters(rng=gen)

    def _init_parameters(self, rng):
        """The parameters drawn in declaration order: the layer kind's declaration
        (``optable.parameters``); a custom layer overrides this (filling ``self._params`` or
        returning it)."""
        return initial_parameters(self, rng)

    # -- tracing ----------------------------------------------------------------------------
    def attach(self, tape, requires_grad=True):
        """Add one tape leaf per parameter; return ``{dotted name: node id}``."""
        return {name: tape.leaf(value, requires_grad=requires_grad)
                for name, value in self.parameters().items()}

    def trace(self, tape, x, ids):
        """Add this layer's forward to ``tape``; ``x`` is the input node id, ``ids`` maps this
        layer's parameter names (as in ``parameters()``) to node ids. Returns the output id."""
        raise NotImplementedError(f"{type(self).__name__} must implement trace")

    def get_config(self):
        """Architecture as a plain dict with a ``"type"`` key (see ``reflib.models.config``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_config")

    def __call__(self, x, dps=None):
        """Forward on a fresh ``reflib.Tape(dps)``; returns the output array.

        Parameters
        ----------
        x : array_like
            The input batch (integer indices for ``Embedding``).
        dps : int or None
            None: float64; an int: exact mpmath arithmetic at that many digits.
        """
        tape = Tape(dps=dps)
        ids = self.attach(tape, requires_grad=False)
        out = self.trace(tape, tape.leaf(input_array(x, type(self).__name__),
                                         requires_grad=False), ids)
        return tape.value(out)

    __repr__ = layer_repr


def input_array(x, owner):
    """Validate a model input: a finite real array (object arrays of mpf are kept)."""
    arr = np.asarray(x)
    if arr.dtype == object:
        return arr
    if arr.dtype.kind == "b" or arr.dtype.kind not in "fiu":
        raise TypeError(f"{owner}: input has dtype {arr.dtype}; expected a real array")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{owner}: input contains NaN or Inf; clean the data first")
    return arr


def input_shape(tape, x, owner, ndim, last=None, what="features"):
    """Shape of node ``x``, checked against the layer's expectations (clear errors)."""
    shape = np.shape(tape.value(x))
    if ndim is not None and len(shape) not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(f"{owner}: expected input with {ndim} dimensions, got shape {shape}")
    if last is not None and (len(shape) == 0 or shape[-1] != last):
        raise ValueError(f"{owner}: input's last axis must have {last} {what}, got shape {shape}")
    return shape
