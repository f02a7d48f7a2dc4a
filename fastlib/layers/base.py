"""The fast layer protocol: parameters by name, initialisation, history capture, backward.

The long story: docs/fastlib-training.md, section ``fastlib/layers/base.py``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from fastlib.io import save_model
from fastlib.tape import check_dtype
from optable.parameters import initial_parameters
# the constructor checks and initial draws reflib's layers make too (one seed, one draw)
from optable.layers import (RELU_FAMILY, check_bool, check_eps, check_heads,  # noqa: F401
                            check_positive_int, close_matches, he_normal, layer_repr, set_sizes,
                            xavier_uniform)

#: ``output_range`` of a layer whose outputs may take any value, and of one whose outputs are
#: probabilities
UNBOUNDED = (-math.inf, math.inf)
PROBABILITIES = (0.0, 1.0)


def make_rng(seed=None, rng=None):
    """The generator to draw from.

    Parameters
    ----------
    seed : int, numpy.random.Generator or None
        An int seeds ``numpy.random.default_rng``; a Generator is used as is (and advanced);
        None means seed 0, so initialisation is reproducible unless a generator is passed.
    rng : numpy.random.Generator or None
        Same as passing the generator as ``seed`` (reflib's spelling); not both.
    """
    if rng is not None:
        if seed is not None:
            raise ValueError("pass either seed= or rng=, not both")
        seed = rng
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        return np.random.default_rng(0)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int or a numpy.random.Generator, got "
                        f"{type(seed).__name__}; use seed=0 or numpy.random.default_rng(0)")
    return np.random.default_rng(int(seed))


def require_sequence(shape, width, owner, what="features"):
    """Check a ``(batch, seq, width)`` input with at least one step; raise a ValueError."""
    if len(shape) != 3 or shape[-1] != width:
        raise ValueError(f"{owner}: expected input (batch, seq, {what}) = (batch, seq, "
                         f"{width}), got shape {tuple(shape)}")
    if shape[1] < 1:
        raise ValueError(f"{owner}: the sequence is empty (shape {tuple(shape)}); pass at "
                         "least one time step")


def require_last(shape, last, owner, what="features", ndim=None):
    """Check an input shape's rank and last axis; raise a ValueError naming both shapes."""
    if ndim is not None and len(shape) != ndim:
        expected = {3: "(batch, seq, features)", 2: "(batch, features)"}.get(ndim, f"{ndim}-D")
        raise ValueError(f"{owner}: expected a {ndim}-D input {expected} with {last} {what}, "
                         f"got shape {tuple(shape)}")
    if len(shape) == 0 or shape[-1] != last:
        raise ValueError(f"{owner}: input's last axis must have {last} {what}, got shape "
                         f"{tuple(shape)} (expected (..., {last}))")


class Layer:
    """Base of every fastlib layer and container.

    Subclasses set ``_params`` (local name -> array, in declaration order) or ``_children``, and
    implement ``_run`` (the unchecked forward; the inherited ``forward`` checks its input
    first), ``backward``, ``infer_shape`` and ``get_config``.

    Attributes
    ----------
    dtype : numpy.dtype
        float32 or float64; parameters, activations and gradients are of this dtype.
    hist_in, hist_pre : ndarray or None
        The input of the last forward and its pre-activation (None before the first forward,
        and ``hist_pre`` None for layers without one).
    """

    _children: tuple = ()
    #: True for layers whose input is integer indices (Embedding).
    takes_indices = False
    #: ``(low, high)``: bounds every output entry lies within, whatever the input; None when
    #: unknown (a layer that declares none). ``train`` reads it to refuse
    #: ``binary_cross_entropy`` on a model whose outputs cannot be probabilities.
    output_range = None

    def __init__(self, dtype=np.float32):
        self.dtype = check_dtype(dtype, type(self).__name__)
        self._params = {}
        self.hist_in = None
        self.hist_pre = None
        self._out_shape = None  # shape of the last forward's output, checked by backward

    # -- parameters ---------------------------------------------------------------------------
    # NOTE: after train(device="cuda") the newest weights live on the device; the run binds
    # every layer (``_device_binding``) and marks it stale after each step. Every host read of
    # the weights goes through this property (forward, backward, parameters(), save, CPU
    # evaluation), so a stale host copy is synchronised first and never read silently.
    @property
    def _params(self):
        binding = self.__dict__.get("_device_binding")
        if binding is not None and binding.stale:
            binding.sync()
        return self.__dict__["_param_store"]

    @_params.setter
    def _params(self, value):
        self.__dict__["_param_store"] = value

    @property
    def host_is_stale(self):
        """True when device training has weights newer than this layer's host arrays."""
        binding = self.__dict__.get("_device_binding")
        return binding is not None and binding.stale

    def to_host(self):
        """Copy the weights of ``train(device="cuda")`` back into the host arrays, now.

        Reading the parameters does this on demand anyway; ``to_host`` makes the moment
        explicit (e.g. before handing the arrays to other code). A no-op for a model trained
        on the CPU. Returns ``self``.
        """
        binding = self.__dict__.get("_device_binding")
        if binding is not None and binding.stale:
            binding.sync()
        return self

    def parameters(self):
        """Every parameter keyed by dotted name, depth first, in declaration order.

        Returns
        -------
        dict[str, numpy.ndarray]
            The model's own arrays (writing into them changes the model).
        """
        out = dict(self._params)
        for i, child in enumerate(self._children):
            for name, value in child.parameters().items():
                out[f"{i}.{name}"] = value
        return out

    def clear_history(self):
        """Drop what the last forward kept for a backward (its input, pre-activations and any
        other saved arrays), in this layer and every child; a backward before the next forward
        then says so. Evaluation calls it when it ends: its outputs are not kept alive."""
        self._out_shape = None
        for name in [n for n in vars(self) if n.startswith("hist_") or n == "_cache"]:
            setattr(self, name, None)
        for child in self._children:
            child.clear_history()

    def reset_parameters(self, seed=None, rng=None):
        """Re-draw every parameter from one generator, this layer first, then children in order.

        The arrays are refilled in place, so views from ``parameters()`` stay valid.
        """
        gen = make_rng(seed, rng)
        self._weights_loaded = False
        fresh = {name: np.asarray(v, dtype=self.dtype) for name, v in
                 self._init_parameters(gen).items()}
        if self._params and self._params.keys() == fresh.keys():
            for name, value in fresh.items():
                np.copyto(self._params[name], value)
        else:
            self._params = {name: np.ascontiguousarray(v) for name, v in fresh.items()}
        for child in self._children:
            child.reset_parameters(rng=gen)

    def _init_parameters(self, rng):
        """Return ``{name: float64 array}`` drawn from ``rng`` in declaration order: the layer
        kind's declaration (``optable.parameters``); a custom layer overrides this."""
        return initial_parameters(self, rng)

    def _set_dtype(self, dtype):
        """Convert every parameter (and every child) to ``dtype``; used by containers."""
        self.dtype = check_dtype(dtype, type(self).__name__)
        self._params = {k: np.ascontiguousarray(v, dtype=self.dtype)
                        for k, v in self._params.items()}
        for child in self._children:
            child._set_dtype(self.dtype)

    def load_parameters(self, params, strict=True):
        """Copy values into the parameters (in place: existing views see the new values).

        Parameters
        ----------
        params : Mapping[str, array_like]
            Keyed like ``parameters()``; values are converted to the model's dtype.
        strict : bool
            When True (default) every parameter must be given; unknown names are always an error.
        """
        if not hasattr(params, "items"):
            raise TypeError(f"load_parameters expects a dict of arrays, got "
                            f"{type(params).__name__}")
        current = self.parameters()
        owner = type(self).__name__
        for name in params:
            if name not in current:
                raise ValueError(f"{owner}.load_parameters: unknown parameter name {name!r}"
                                 f"{close_matches(name, current)}; expected names: "
                                 f"{sorted(current)}")
        missing = [k for k in current if k not in params]
        if strict and missing:
            raise ValueError(f"{owner}.load_parameters: missing parameters {missing}; pass every "
                             "name of parameters() or use strict=False")
        staged = {}
        for name, value in params.items():
            arr = np.asarray(value)
            if arr.dtype.kind not in "fiu":
                raise TypeError(f"{owner}.load_parameters: parameter {name!r} has dtype "
                                f"{arr.dtype}; expected a real array")
            if arr.shape != current[name].shape:
                raise ValueError(f"{owner}.load_parameters: parameter {name!r} has shape "
                                 f"{arr.shape}, expected {current[name].shape}; check the layer "
                                 "sizes in the config")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{owner}.load_parameters: parameter {name!r} contains NaN or "
                                 "Inf")
            # converted here and checked again: 1e39 is finite in float64 but inf in float32
            with np.errstate(over="ignore"):   # the overflow is reported below, by name
                converted = arr.astype(current[name].dtype)
            if not np.all(np.isfinite(converted)):
                biggest = float(np.max(np.abs(arr)))
                raise ValueError(f"{owner}.load_parameters: parameter {name!r} holds {biggest:.4g},"
                                 f" beyond {current[name].dtype.name}'s range (max "
                                 f"{float(np.finfo(current[name].dtype).max):.4g}); rescale it or "
                                 "build the model in float64")
            staged[name] = converted
        for name, arr in staged.items():  # all checked first: a failed load changes nothing
            np.copyto(current[name], arr)
        self._weights_loaded = True   # a container built around this layer warns on redrawing

    def num_parameters(self):
        """Total number of scalar parameters."""
        return int(sum(v.size for v in self.parameters().values()))

    # -- the public forward -------------------------------------------------------------------
    def __call__(self, x):
        """Validate ``x`` once, then run the forward (recording history for ``backward``).

        Parameters
        ----------
        x : array_like
            The input batch, of this layer's dtype (a float input of the other precision is
            converted); integer indices for a model that starts with ``Embedding``.

        Returns
        -------
        ndarray
        """
        return self.forward(self.check_input(x))

    def check_input(self, x):
        """Return ``x`` as the array ``forward`` expects, or raise a clear error.

        Checks the dtype (TypeError), NaN/Inf (ValueError), and every layer's shape
        (``infer_shape``, ValueError naming the layer and both shapes). ``forward`` makes the
        same dtype-kind and shape checks (``check_forward``), but neither converts nor scans.
        """
        owner = type(self).__name__
        arr = np.asarray(x)
        self._check_kind(arr, owner)
        if not self.takes_indices:
            given = arr
            if arr.dtype != self.dtype:
                # NOTE: a float input of the other precision is converted to the model's dtype
                # (what Keras does); the kernels then run in one dtype throughout. NumPy's
                # overflow warning is silenced: the check below names the value instead.
                with np.errstate(over="ignore"):
                    arr = arr.astype(self.dtype)
            if not np.isfinite(arr).all():
                raise self._non_finite_input(given, arr)
        self._check_shape(arr, owner)
        return np.ascontiguousarray(arr)  # the kernels are compiled for C-contiguous arrays

    def check_forward(self, x):
        """Refuse an input ``forward`` cannot take; O(1): metadata only, no pass over the data.

        ``x`` must be an ndarray of this layer's dtype exactly (integer indices, or floats
        holding them, for a model that starts with ``Embedding``), not a scalar, not empty, and
        of a shape every layer accepts (``infer_shape``). The rules and their messages are
        those of ``check_input`` (which ``model(x)`` runs), less what only ``check_input`` does:
        converting array-likes and the other float precision, and scanning for NaN/Inf.
        """
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{self._forward_owner()}.forward: expects a numpy array, got "
                            f"{type(x).__name__}; call the model, model(x), to validate and "
                            "convert array-likes")
        if x.dtype != self.dtype:
            owner = self._forward_owner()
            self._check_kind(x, owner)
            if not self.takes_indices:
                raise TypeError(f"{owner}: input dtype {x.dtype} differs from the layer's "
                                f"{self.dtype}; convert with x.astype(np.{self.dtype.name}) "
                                "(model(x) converts it for you)")
        if x.ndim == 0 or x.size == 0:
            self._check_shape(x, self._forward_owner())  # raises, naming the problem
        self.infer_shape(x.shape)

    def _forward_owner(self):
        """How ``forward``'s checks name the layer: its sizes when it has any (``Dense(4, 3)``)."""
        return self._shape_label() if self._label_attrs else type(self).__name__

    def _check_kind(self, arr, owner):
        """TypeError unless ``arr``'s dtype is of a kind this layer takes: integers (or whole
        floats) for indices, else a float (the precision is ``check_input``'s/``forward``'s)."""
        if self.takes_indices:
            if arr.dtype.kind == "b" or arr.dtype.kind not in "fiu":
                raise TypeError(f"{owner}: expects integer indices, got dtype {arr.dtype}")
        elif arr.dtype.kind not in "f":
            hint = f"x.astype(np.{self.dtype.name})"
            raise TypeError(f"{owner}: expects a floating-point input of dtype {self.dtype}, "
                            f"got {arr.dtype} with shape {arr.shape}; cast it with {hint}")

    def _check_shape(self, arr, owner):
        """ValueError unless ``arr``'s shape fits: not a scalar, every layer's ``infer_shape``
        (which names an empty sequence as such), then at least one example."""
        if arr.ndim == 0:
            raise ValueError(f"{owner}: input of shape {arr.shape} is empty or a scalar; pass a "
                             "batch with at least one example")
        self.infer_shape(arr.shape)
        if arr.size == 0:
            raise ValueError(f"{owner}: input of shape {arr.shape} is empty or a scalar; pass a "
                             "batch with at least one example")

    def _non_finite_input(self, given, converted):
        """The ValueError for an input whose conversion holds NaN or Inf: the data's own, or a
        finite value beyond this dtype's range (said as such, not as an Inf in the data)."""
        owner = type(self).__name__
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(converted))[0])
        value = given[bad]
        if np.isfinite(value):
            return ValueError(f"{owner}: input value {value:g} at index {bad} is beyond "
                              f"{self.dtype}'s range (largest finite "
                              f"{float(np.finfo(self.dtype).max):g}); rescale the data, or "
                              f"build the model with dtype=np.float64")
        return ValueError(f"{owner}: input contains NaN or Inf (first at index {bad}, value "
                          f"{value}); clean or rescale the data first")

    # -- the protocol -------------------------------------------------------------------------
    def forward(self, x):
        """Forward on an array of this layer's dtype and shape; records history for backward.

        Refuses, with the error ``model(x)`` gives, an input it cannot take (``check_forward``:
        O(1) checks of the type, dtype, rank and shape, no pass over the data), then runs the
        unchecked ``_run``. Unlike ``model(x)`` it neither converts nor looks for NaN/Inf.
        """
        self.check_forward(x)
        return self._run(x)

    def _run(self, x):
        """The unchecked forward, on an array ``check_forward`` accepted; records history.

        fastlib's layers implement this (containers call their children's ``_run``: the
        container's ``check_forward`` already checked every child). A layer that overrides
        ``forward`` itself (the older protocol) is run through it, unchecked.
        """
        if type(self).forward is Layer.forward:
            raise NotImplementedError(f"{type(self).__name__} must implement _run (or forward)")
        return self.forward(x)

    def backward(self, grad_out, need_input_grad=True):
        """Gradients from the history of the last forward.

        Parameters
        ----------
        grad_out : ndarray
            Cotangent of the output, of the output's shape and the layer's dtype.
        need_input_grad : bool
            False skips the input gradient (the first layer of a model) and returns None.

        Returns
        -------
        grad_in : ndarray or None
        grads : dict[str, ndarray]
            Keyed like ``parameters()``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement backward")

    def infer_shape(self, shape):
        """Output shape for input ``shape``; ValueError when the input does not fit.

        The default serves the layers that declare their widths (``_in_attr``, below): the
        input's last axis must be ``in_width`` (and its rank ``_input_rank`` when set), and the
        output is the input with that axis replaced by ``out_width``.
        """
        in_attr, out_attr = self._in_attr, self._out_attr
        if in_attr is None:
            raise NotImplementedError(f"{type(self).__name__} must implement infer_shape")
        # NOTE (speed): forward runs this on every batch, so the declared widths are read
        # directly (what in_width / out_width return) and the label is formatted on failure only
        width, rank = getattr(self, in_attr), self._input_rank
        if rank == 3:
            if len(shape) != 3 or shape[-1] != width or shape[1] < 1:
                require_sequence(shape, width, self._shape_label(), self._feature_name)
        elif (rank is not None and len(shape) != rank) or not shape or shape[-1] != width:
            require_last(shape, width, self._shape_label(), self._feature_name, ndim=rank)
        return tuple(shape[:-1]) + (width if out_attr is None else getattr(self, out_attr),)

    def get_config(self):
        """Architecture as a plain dict with a ``"type"`` key (``fastlib.layers.from_config``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_config")

    # -- widths known without an input, for container checks at construction ------------------
    # NOTE: declared, not written per layer: a layer names the attributes holding its input and
    # output widths, and the ones that label it in shape errors ("Dense(3, 2)"); in_width,
    # out_width and infer_shape read them. None keeps the defaults (any width, unchanged).
    _in_attr = None
    _out_attr = None
    _label_attrs = ()
    #: The rank the input must have (3: a sequence ``(batch, seq, features)``; None: any).
    _input_rank = None
    #: What the entries of the input's last axis are called in shape errors.
    _feature_name = "features"

    @property
    def in_width(self):
        """Size of the input's last axis this layer requires, or None when any size fits."""
        return None if self._in_attr is None else getattr(self, self._in_attr)

    def out_width(self, in_width):
        """Size of the output's last axis for an input last axis ``in_width`` (None: unknown)."""
        return in_width if self._out_attr is None else getattr(self, self._out_attr)

    def _shape_label(self):
        """The layer as shape errors name it: its class and sizes, e.g. ``Dense(3, 2)``."""
        sizes = ", ".join(str(getattr(self, a)) for a in self._label_attrs)
        return f"{type(self).__name__}({sizes})"

    # -- misc ---------------------------------------------------------------------------------
    def _cotangent(self, grad_out):
        """``grad_out`` as a C-contiguous array of the layer's dtype, of the output's shape.

        A shape check is one tuple comparison; without it a wrong cotangent would be read out
        of bounds by a kernel.
        """
        if self._out_shape is None:
            self._history("hist_in")
        g = np.ascontiguousarray(grad_out, dtype=self.dtype)
        if g.shape != self._out_shape:
            raise ValueError(f"{type(self).__name__}.backward: grad_out has shape {g.shape} but "
                             f"the last forward's output has shape {self._out_shape}; pass the "
                             "cotangent of that output")
        return g

    def _history(self, attr_name):
        value = getattr(self, attr_name)
        if value is None:
            raise RuntimeError(f"{type(self).__name__}.backward called before forward: run "
                               "model(x) (or forward) first, backward uses its history")
        return value

    def save(self, path):
        """Save architecture and weights to ``path`` (``fastlib.io.save_model``)."""
        return save_model(self, path)

    __repr__ = layer_repr

