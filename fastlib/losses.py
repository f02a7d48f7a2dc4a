"""Losses for training: DataCode's target formats, strictly checked, and accuracy per loss.

The long story: docs/fastlib-kernels.md, section ``fastlib/losses.py``.
"""
from __future__ import annotations

import numpy as np

# the names are the op table's, shared with reflib
from optable.losses import DEPRECATED_ALIASES, LOSSES, resolve_loss  # noqa: F401

__all__ = ["LOSSES", "resolve_loss", "validate_targets", "loss_value_and_grad", "loss_value",
           "accuracy", "onehot"]


# NOTE: rows of a categorical target must sum to 1 within 1e-5 (reflib's tolerance): that admits
# float32 label smoothing (rounding ~1e-7 per entry) and rejects class indices or raw scores.
_ROW_SUM_TOL = 1e-5


def _dims(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _batch_dims(shape):
    """``[batch, 10]`` style: the batch axis by name, the rest by size (DataCode's messages)."""
    return "[" + ", ".join(["batch"] + [str(s) for s in shape[1:]]) + "]"


def _first_bad(mask):
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _check_finite(arr, what, loss_type):
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        at = _first_bad(~np.isfinite(arr))
        fix = ("the model diverged: lower the learning rate or clip gradients"
               if what == "predictions" else "clean the data first")
        raise ValueError(f"{loss_type}: {what} contain NaN or Inf (first at index {at}, value "
                         f"{arr[at]}); {fix}")


def _check_pred(loss_type, pred):
    if not isinstance(pred, np.ndarray) or pred.dtype.kind != "f":
        arr = np.asarray(pred)
        if arr.dtype.kind not in "fiu" or arr.dtype.kind == "b":
            raise TypeError(f"{loss_type}: predictions must be a float array, got dtype "
                            f"{arr.dtype}")
        pred = arr.astype(np.float64)
    if pred.ndim == 0:
        raise ValueError(f"{loss_type}: predictions must have a batch axis, got a scalar")
    _check_finite(pred, "predictions", loss_type)
    return pred


def _check_target_array(loss_type, target):
    t = np.asarray(target)
    if t.dtype.kind == "b":
        t = t.astype(np.float64)
    if t.dtype.kind not in "fiu":
        raise TypeError(f"{loss_type}: targets must be a numeric array, got dtype {t.dtype}")
    _check_finite(t, "targets", loss_type)
    return t


def _in_dtype(loss_type, t, dtype):
    """The finite targets ``t`` in the prediction's ``dtype``; a ValueError for a target beyond
    that dtype's range (it would become Inf, and the run would stop on a non-finite loss that
    blames the learning rate)."""
    with np.errstate(over="ignore"):
        out = t.astype(dtype, copy=False)
    if out is not t and out.dtype.kind == "f" and not np.isfinite(out).all():
        at = _first_bad(~np.isfinite(out))
        raise ValueError(f"{loss_type}: target {t[at]:g} at index {at} is beyond "
                         f"{out.dtype}'s range (largest finite {float(np.finfo(out.dtype).max):g});"
                         f" rescale the targets, or build the model with dtype=np.float64")
    return out


def _class_indices(loss_type, t, n, c):
    """Flat int64 class indices from ``t`` of shape ``(n, 1)`` or ``(n,)``, checked."""
    if t.dtype.kind == "f":
        whole = t == np.round(t)
        if not whole.all():
            at = _first_bad(~whole)
            raise ValueError(f"{loss_type} expects whole-number class indices, got {t[at]} at "
                             f"index {at}; pass class indices 0..{c - 1}")
    # NOTE: the range is checked on the labels as given, before the cast: a float label beyond
    # int64 (1e30) would become -2**63 (with NumPy's warning) and be reported as that
    flat = t.reshape(n)
    bad = (flat < 0) | (flat >= c)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"{loss_type}: class index {_index_text(flat[row])} at row {row} is out "
                         f"of range for {c} classes (valid 0..{c - 1}); check num_classes of the "
                         "last layer")
    return flat.astype(np.int64)


def _index_text(value):
    """A whole-number index as written: ``7`` (not ``7.0``), ``1e+30`` beyond int64's range."""
    value = value.item()
    return value if isinstance(value, int) or abs(value) >= 2 ** 63 else int(value)


def validate_targets(loss_type, pred, target):
    """Check ``target`` against ``pred`` for ``loss_type`` and return the normalised target.

    Parameters
    ----------
    loss_type : str
        Any accepted name (case-insensitive, alias included).
    pred : ndarray
        The model output: logits, probabilities (binary_cross_entropy) or regression values.
    target : array_like

    Returns
    -------
    ndarray
        ``cross_entropy``: int64 class indices of shape ``(N,)``; otherwise the target as an
        array of the prediction's dtype and shape.

    Raises
    ------
    ValueError
        Format mismatch (with the fix: one-hot vs class indices, reshape), batch sizes that
        differ, class indices out of range, probabilities or targets outside [0, 1], NaN/Inf.
    TypeError
        Non-numeric predictions or targets.
    """
    name = resolve_loss(loss_type)
    pred = _check_pred(name, pred)
    t = _check_target_array(name, target)
    return _validated(name, pred, t)


def _validated(name, pred, t):
    ps = pred.shape
    if t.ndim == 0 or t.shape[0] != ps[0]:
        got = "a scalar" if t.ndim == 0 else f"{t.shape[0]} rows"
        raise ValueError(f"{name}: batch sizes differ: predictions have {ps[0]} rows "
                         f"{_dims(ps)}, targets {got} {_dims(t.shape)}; pass one target per "
                         "example")
    if name == "cross_entropy":
        if pred.ndim != 2:
            raise ValueError(f"cross_entropy expects logits [batch, classes], got {_dims(ps)}")
        n, c = ps
        if t.shape not in ((n, 1), (n,)):
            raise ValueError(f"cross_entropy expects class indices [batch, 1], got "
                             f"{_batch_dims(t.shape)}: use categorical_cross_entropy for one-hot "
                             "targets, or pass class indices")
        return _class_indices(name, t, n, c)
    if name == "categorical_cross_entropy":
        if pred.ndim != 2:
            raise ValueError(f"categorical_cross_entropy expects logits [batch, classes], got "
                             f"{_dims(ps)}")
        if t.shape != ps:
            raise ValueError(f"categorical_cross_entropy expects one-hot targets "
                             f"{_batch_dims(ps)}, got {_batch_dims(t.shape)}: convert class "
                             f"indices with fastlib.onehot(y, {ps[1]}), or use cross_entropy")
        t = _in_dtype(name, t, pred.dtype)
        sums = t.sum(axis=1, dtype=np.float64)
        negative = (t < 0).any(axis=1)
        if negative.any() or (np.abs(sums - 1.0) > _ROW_SUM_TOL).any():
            row = int(np.argmax(negative | (np.abs(sums - 1.0) > _ROW_SUM_TOL)))
            what = (f"row {row} holds {t[row].min():g} at class {int(np.argmin(t[row]))}"
                    if negative[row] else f"row {row} sums to {sums[row]:g}")
            raise ValueError(f"categorical_cross_entropy expects one-hot (or probability) rows: "
                             f"non-negative and summing to 1; {what}. "
                             "Use fastlib.onehot(y, num_classes) for class indices")
        return t
    if t.shape != ps:
        raise ValueError(f"{name} expects targets of the prediction's shape {_dims(ps)}, got "
                         f"{_dims(t.shape)}; reshape them (e.g. y.reshape{ps})")
    t = _in_dtype(name, t, pred.dtype)
    if name.startswith("binary_cross_entropy"):
        outside = (t < 0) | (t > 1)
        if outside.any():
            at = _first_bad(outside)
            raise ValueError(f"{name} expects targets in [0, 1], got {t[at]} at index {at}; "
                             "binary targets are 0/1 labels or probabilities")
        if name == "binary_cross_entropy":
            outside = (pred < 0) | (pred > 1)
            if outside.any():
                at = _first_bad(outside)
                raise ValueError(f"binary_cross_entropy expects probabilities in [0, 1] as "
                                 f"predictions, got {pred[at]} at index {at}: end the model with "
                                 "a sigmoid, or use binary_cross_entropy_with_logits on logits")
    return t


def _clamped_probabilities(pred, target):
    """``pred`` with the probabilities that would make the loss infinite moved inside (0, 1).

    NOTE: a saturated sigmoid gives exactly 0 or 1 (float32 already for |z| > 17). Where the
    target agrees (p = 0, t = 0) the term is exactly 0 and is left alone; where it does not
    (p = 0, t > 0 or p = 1, t < 1) the loss is infinite, so, as PyTorch clamps the log, p is
    clamped into [eps, 1 - eps] (eps of the dtype) and loss and gradient stay finite. Every
    p in (0, 1) is untouched and matches the registry op.
    """
    if not ((pred <= 0).any() or (pred >= 1).any()):
        return pred
    infinite = ((pred <= 0) & (target > 0)) | ((pred >= 1) & (target < 1))
    if not infinite.any():
        return pred
    eps = np.finfo(pred.dtype).eps
    return np.where(infinite, np.clip(pred, eps, 1 - eps), pred).astype(pred.dtype)


def _kernel_inputs(name, pred, t):
    if name == "binary_cross_entropy":
        pred = _clamped_probabilities(pred, t)
    return pred, t


def _checked(name, pred, target):
    """Validated, normalised kernel inputs ``(name, pred, target)`` for a canonical ``name``."""
    pred = _check_pred(name, pred)
    target = _validated(name, pred, _check_target_array(name, target))
    return (name, *_kernel_inputs(name, pred, target))


def _unchecked(name, pred, t, want_grad):
    """The loss kernel of ``name`` on inputs ``validate_targets`` already normalised.

    NOTE: calls the kernel launcher of ``fastlib.kernels.loss`` directly: ``fastlib.ops``'s
    wrapper would re-check what was checked once per dataset (about 30 us a call, 5% of an
    MNIST step), and the kernels are the same.
    """
    from fastlib.kernels import loss as kernels

    pred = np.ascontiguousarray(pred)
    t = np.ascontiguousarray(t)
    grad = np.ones((), dtype=pred.dtype) if want_grad else None
    return getattr(kernels, name)(pred, t, grad=grad)


def loss_value_and_grad(loss_type, pred, target, check=True):
    """The mean loss and its gradient with respect to ``pred``.

    Parameters
    ----------
    loss_type : str
    pred : ndarray
        Float32 or float64 predictions; the gradient has the same dtype and shape.
    target : array_like
    check : bool, default True
        False skips every check: ``loss_type`` must be a canonical name (``resolve_loss``) and
        ``target`` what ``validate_targets`` returned for predictions of this dtype (a training
        loop validates its whole dataset once, then passes batches of it).

    Returns
    -------
    loss : float
    dpred : ndarray
    """
    if not check:
        value, grads = _unchecked(loss_type, *_kernel_inputs(loss_type, pred, target), True)
        return float(value), grads[0]
    name, pred, t = _checked(resolve_loss(loss_type), pred, target)
    from fastlib.ops import value_and_vjp  # deferred: importing the kernels compiles nothing

    value, grads = value_and_vjp(name, [pred, t], np.ones((), dtype=pred.dtype))
    return float(value), grads[0]


def loss_value(loss_type, pred, target, check=True):
    """The mean loss only (no gradient): validation passes use it."""
    if not check:
        value, _ = _unchecked(loss_type, *_kernel_inputs(loss_type, pred, target), False)
        return float(value)
    name, pred, t = _checked(resolve_loss(loss_type), pred, target)
    from fastlib.ops import forward

    return float(forward(name, [pred, t]))


def accuracy(loss_type, pred, target, check=True):
    """Fraction of correct predictions, chosen by the loss; None for ``mse``.

    - ``cross_entropy``: argmax of the logits equals the class index;
    - ``categorical_cross_entropy``: argmax of the logits equals argmax of the target row;
    - ``binary_cross_entropy``: ``p > 0.5`` equals ``target > 0.5``, over every element;
    - ``binary_cross_entropy_with_logits``: ``z > 0`` (``sigmoid(z) > 0.5``) equals
      ``target > 0.5``;
    - ``mse``: None (regression has no accuracy).

    NOTE: ties go to class 0 / the first maximum: ``p == 0.5`` (``z == 0``) predicts 0, and
    argmax takes the first of equal logits, as NumPy does.

    Returns
    -------
    float or None
    """
    name = resolve_loss(loss_type)
    if name == "mse":
        return None
    if check:
        pred = _check_pred(name, pred)
        target = _validated(name, pred, _check_target_array(name, target))
    t = np.asarray(target)
    if name == "cross_entropy":
        return float(np.mean(np.argmax(pred, axis=1) == t.reshape(-1)))
    if name == "categorical_cross_entropy":
        return float(np.mean(np.argmax(pred, axis=1) == np.argmax(t, axis=1)))
    threshold = 0.0 if name == "binary_cross_entropy_with_logits" else 0.5
    return float(np.mean((pred > threshold) == (t > 0.5)))


def onehot(y, num_classes, dtype=np.float32):
    """One-hot rows ``(N, num_classes)`` from class indices ``(N, 1)`` or ``(N,)``.

    Parameters
    ----------
    y : array_like
        Integer class indices (or floats holding integers) in ``[0, num_classes)``.
    num_classes : int
    dtype : float dtype, default float32

    Returns
    -------
    ndarray
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) \
            or num_classes < 1:
        raise ValueError(f"onehot: num_classes must be a positive int, got {num_classes!r}")
    t = _check_target_array("onehot", y)
    if t.ndim == 2 and t.shape[1] != 1 or t.ndim not in (1, 2):
        raise ValueError(f"onehot expects class indices [batch, 1] or [batch], got "
                         f"{_batch_dims(t.shape)}")
    n = t.shape[0]
    idx = _class_indices("onehot", t, n, int(num_classes))
    out = np.zeros((n, int(num_classes)), dtype=dtype)
    out[np.arange(n), idx] = 1
    return out
