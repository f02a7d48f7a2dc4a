"""A training run's data, converted to the model's dtype and checked once before any epoch.

Inputs go through the model's own input check (dtype, NaN/Inf, last axis); targets through the
loss's target check against the model's output shape, so batches skip both checks later.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
from dataclasses import dataclass

import numpy as np

__all__ = ["RunData", "check_data", "in_format"]


@dataclass
class RunData:
    """The checked arrays of a run (``y`` and the validation pair may be None)."""

    x: np.ndarray
    y: np.ndarray | None
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    #: a mixed-precision run's 16-bit format: the float inputs are what it rounds batch by
    #: batch (None: the model's own dtype)
    fmt: str | None = None

    @property
    def validated(self) -> bool:
        """Whether the run evaluates validation data after each epoch."""
        return self.x_val is not None

    @functools.cached_property
    def fingerprint(self) -> dict:
        """Shape, dtype and a hash of each array (compared when a checkpoint is resumed;
        hashed once per run)."""
        inputs = ("x", "x_val")
        return {name: _fingerprint(a, self.fmt if name in inputs else None) for name, a in (
            ("x", self.x), ("y", self.y), ("x_val", self.x_val), ("y_val", self.y_val))
            if a is not None}


def check_data(model, algo, loss_type, x, y, x_val, y_val) -> RunData:
    """Convert and check the training and validation data of ``model`` for ``algo``.

    Raises
    ------
    ValueError
        A missing array, a ragged one, inputs the model refuses, targets in the wrong format or
        count, a validation input without its targets (or the reverse), no samples, or
        ``binary_cross_entropy`` on a model whose outputs are not limited to [0, 1].
    """
    x = _as_inputs(model, x, "x")
    if x_val is None and y_val is not None:
        raise ValueError("y_val was given without x_val: pass both for validation, or neither")
    if x_val is not None and y_val is None and algo.needs_targets:
        raise ValueError("x_val was given without y_val: pass both for validation, or "
                         f"neither (only an algorithm without targets, like 'cd', "
                         f"validates on x_val alone)")
    x_val = None if x_val is None else _as_inputs(model, x_val, "x_val")
    if algo.needs_targets:
        if y is None:
            raise ValueError(f"algorithm {algo.name!r} needs targets y")
        y = _check_targets(loss_type, model, x, y, "y")
        y_val = None if y_val is None else _check_targets(loss_type, model, x_val, y_val, "y_val")
    else:
        y = None if y is None else np.asarray(y)
        y_val = None if y_val is None else np.asarray(y_val)
    if loss_type == "binary_cross_entropy" and algo.needs_targets:
        _check_probability_output(model)
    if algo.needs_targets:
        _warn_squashed_logits(model, loss_type)
    return RunData(x, y, x_val, y_val)


def _as_array(values, what) -> np.ndarray:
    """``values`` as one NumPy array, or a ValueError naming ``what`` when its rows are ragged.

    NumPy's own message ("inhomogeneous shape after 1 dimensions") names neither the argument
    nor the fix.
    """
    try:
        return np.asarray(values)
    except ValueError as exc:
        if "inhomogeneous" not in str(exc):
            raise
        raise ValueError(f"{what}: its rows have different lengths (a ragged list), so it is "
                         f"not one array; pad or cut them to one length, or pass a NumPy array "
                         f"of shape (samples, ...)") from None


def _as_inputs(model, x, what):
    if x is None:
        raise ValueError(f"{what} is None; pass an array of inputs")
    arr = _as_array(x, what)
    # the model's own check would say "input of shape (0, 4) is empty" without naming which
    if arr.ndim > 0 and arr.shape[0] == 0:
        extra = " (or leave the validation data out)" if what == "x_val" else ""
        raise ValueError(f"{what} has no samples (shape {arr.shape}); pass at least one{extra}")
    with _naming(what):
        arr = model.check_input(arr)
    return np.ascontiguousarray(arr)


def _check_targets(loss_type, model, x, y, what):
    """Validate the whole target array once; batches then skip the per-call checks."""
    from fastlib import losses

    y = _as_array(y, what)
    if y.ndim == 0 or y.shape[0] != x.shape[0]:
        raise ValueError(f"{what}: {x.shape[0]} inputs but targets of shape {y.shape}; x and y "
                         "need the same number of rows")
    out_shape = tuple(model.infer_shape(x.shape))
    # A zero "prediction" of the model's output shape (a broadcast view, no memory) lets the
    # loss module check the target format, class ranges and batch size before training starts.
    # Its dtype is the model's (what the targets are converted to): token inputs are integers,
    # and their model's float targets would otherwise be widened to float64, twice the memory.
    dtype = getattr(model, "dtype", None)
    pred_like = np.broadcast_to(np.zeros((), dtype=x.dtype if dtype is None else dtype),
                                out_shape)
    with _naming(what):
        return np.ascontiguousarray(losses.validate_targets(loss_type, pred_like, y))


@contextlib.contextmanager
def _naming(what):
    """Prefix a ValueError from the checks with the argument it is about (``x_val: ...``): the
    layers and the losses name themselves, not which of the run's arrays they were given."""
    try:
        yield
    except ValueError as exc:
        if str(exc).startswith(f"{what}:"):
            raise
        raise ValueError(f"{what}: {exc}") from None


def _check_probability_output(model):
    """Refuse ``binary_cross_entropy`` on a model whose outputs are not limited to [0, 1].

    NOTE: decided from the layers' declared ``output_range``, not from a forward: the target
    check sees no predictions, and an untrained model's outputs may happen to lie in [0, 1]
    while training carries them out (the run then diverges, blaming the learning rate). A model
    whose range is unknown (a custom last layer) is let through.
    """
    bounds = model.output_range
    if bounds is None or (bounds[0] >= 0 and bounds[1] <= 1):
        return
    low, high = bounds
    raise ValueError(f"binary_cross_entropy expects probabilities in [0, 1] as predictions, but "
                     f"the model ends in {_last_layer(model)!r}, whose outputs lie in "
                     f"[{low:g}, {high:g}]: end the model with a sigmoid (a Dense with "
                     f"activation='sigmoid', or a Softmax), or use "
                     f"binary_cross_entropy_with_logits on logits")


#: the losses that take logits, and what they apply to them
_LOGIT_LOSSES = {"cross_entropy": "a log-softmax", "categorical_cross_entropy": "a log-softmax",
                 "binary_cross_entropy_with_logits": "a log-sigmoid"}


def _warn_squashed_logits(model, loss_type):
    """Warn when a loss that takes logits meets a model whose outputs lie in [0, 1] (a softmax or
    sigmoid last layer): the loss squashes them again, so its gradients are flattened and
    training crawls (as Keras warns for ``from_logits``). A warning, not a refusal: it trains,
    just badly."""
    from fastlib.training.notices import warn

    applies = _LOGIT_LOSSES.get(loss_type)
    bounds = model.output_range
    if applies is None or bounds is None or not (bounds[0] >= 0 and bounds[1] <= 1):
        return
    instead = ("or keep it and use binary_cross_entropy, which takes probabilities"
               if loss_type.startswith("binary") else "and apply softmax when predicting")
    warn(f"{loss_type} takes logits and applies {applies} itself, but the model ends in "
         f"{_last_layer(model)!r}, whose outputs already lie in [0, 1]: they are squashed "
         f"twice. End the model with a linear layer (activation='linear'), {instead}",
         UserWarning)


def _last_layer(model):
    """The layer that gives ``model``'s outputs (the last of nested Sequentials)."""
    from fastlib.layers import Sequential

    while isinstance(model, Sequential):
        model = model.layers[-1]
    return model


def _fingerprint(a, fmt=None):
    """``dtype[shape]:hash`` of ``a``; with a 16-bit ``fmt``, of its float values as the run
    rounds them (float32), hashed chunk by chunk: no rounded copy of the data set is made."""
    a = np.ascontiguousarray(a)
    if fmt is None or a.dtype.kind in "iu":
        digest = hashlib.blake2b(memoryview(a).cast("B"), digest_size=8).hexdigest()
        return f"{a.dtype.str}{list(a.shape)}:{digest}"
    from fastlib.training.mixed_precision import input_chunks

    h = hashlib.blake2b(digest_size=8)
    for _, rounded in input_chunks(a, fmt):
        h.update(memoryview(rounded).cast("B"))
    return f"{np.dtype(np.float32).str}{list(a.shape)}:{h.hexdigest()}"


def in_format(data: RunData, fmt: str) -> RunData:
    """``data`` for a mixed-precision run in the 16-bit ``fmt``: the same arrays (each batch is
    rounded as it is read), checked to lie in the format's range; a ValueError names an input
    beyond it (``mixed_precision.check_inputs``)."""
    from fastlib.training.mixed_precision import check_inputs

    check_inputs(data.x, fmt, "x")
    if data.x_val is not None:
        check_inputs(data.x_val, fmt, "x_val")
    return RunData(data.x, data.y, data.x_val, data.y_val, fmt)
