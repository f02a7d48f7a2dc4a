"""Reference losses: DataCode's target formats, checked strictly, then one registry loss op.

``add_loss(tape, pred, target, loss_type)`` puts the target on the tape as a constant leaf and
adds the loss op; ``loss_and_grad`` does the same on a fresh tape for plain arrays. The loss's
value and its gradient come from the registry op and its VJP (``reflib.ops``).

The long story: docs/reflib.md, section ``reflib/losses.py``.
"""
from __future__ import annotations

import numpy as np

# the names are the op table's, shared with fastlib
from optable.losses import DEPRECATED_ALIASES, LOSSES, resolve_loss  # noqa: F401
from reflib.tape import Tape


# NOTE: rows of a categorical target must sum to 1; 1e-5 admits float32 label smoothing
# (rounding ~1e-7 per entry) while rejecting class-index or unnormalised targets.
_ROW_SUM_TOL = 1e-5


def _values(arr):
    """Float view of a target for range checks (object arrays of mpf included)."""
    return np.array([float(v) for v in np.asarray(arr).reshape(-1)]).reshape(np.shape(arr))


def check_target(loss_type, pred, target):
    """Validate ``target`` against ``pred`` for ``loss_type``; return the target array.

    Parameters
    ----------
    loss_type : str
        A canonical name (see ``resolve_loss``).
    pred : numpy.ndarray
        The model output (logits, probabilities or regression values).
    target : array_like

    Raises
    ------
    ValueError, TypeError
        With the expected format and the fix (e.g. one-hot vs class indices).
    """
    t = np.asarray(target)
    if t.dtype.kind not in "biufO":
        raise TypeError(f"{loss_type}: target has dtype {t.dtype}; expected a numeric array")
    if t.dtype.kind == "b":
        t = t.astype(np.float64)
    ps = np.shape(pred)
    vals = _values(t)
    if not np.all(np.isfinite(vals)):
        raise ValueError(f"{loss_type}: target contains NaN or Inf; clean the labels first")
    if loss_type == "cross_entropy":
        if len(ps) != 2:
            raise ValueError(f"cross_entropy expects logits [batch, classes], got {list(ps)}")
        n, c = ps
        if not (t.shape in ((n, 1), (n,))):
            hint = ("; for one-hot targets use categorical_cross_entropy"
                    if t.shape == (n, c) and c > 1 else "")
            raise ValueError(f"cross_entropy expects class indices [batch, 1] = [{n}, 1], got "
                             f"{list(t.shape)}{hint}")
        flat = vals.reshape(-1)
        if not np.all(flat == np.round(flat)):
            raise ValueError("cross_entropy expects whole-number class indices; got "
                             f"{flat[flat != np.round(flat)][0]}")
        if np.any((vals < 0) | (vals >= c)):
            raise ValueError(f"cross_entropy: class index out of range [0, {c}); got "
                             f"{vals.min():g}..{vals.max():g}")
        return t
    if loss_type == "categorical_cross_entropy":
        if len(ps) != 2:
            raise ValueError("categorical_cross_entropy expects logits [batch, classes], got "
                             f"{list(ps)}")
        if t.shape != ps:
            hint = ("; for class indices use cross_entropy (or one-hot encode them)"
                    if t.shape in ((ps[0], 1), (ps[0],)) else "")
            raise ValueError(f"categorical_cross_entropy expects one-hot targets {list(ps)}, got "
                             f"{list(t.shape)}{hint}")
        if np.any(vals < 0) or np.any(np.abs(vals.sum(axis=1) - 1.0) > _ROW_SUM_TOL):
            raise ValueError("categorical_cross_entropy expects one-hot (or probability) rows: "
                             "non-negative and summing to 1")
        return t
    if t.shape != ps:
        raise ValueError(f"{loss_type} expects a target of the prediction's shape {list(ps)}, "
                         f"got {list(t.shape)}; reshape the target (e.g. y.reshape(-1, 1))")
    if loss_type.startswith("binary_cross_entropy"):
        if np.any((vals < 0) | (vals > 1)):
            raise ValueError(f"{loss_type} expects target values in [0, 1]; got "
                             f"{vals.min():g}..{vals.max():g}")
        if loss_type == "binary_cross_entropy":
            p = _values(pred)
            if np.any((p <= 0) | (p >= 1)):
                raise ValueError("binary_cross_entropy expects probabilities strictly inside "
                                 "(0, 1); end the model with a sigmoid, or use "
                                 "binary_cross_entropy_with_logits on raw logits")
    return t


def add_loss(tape, pred, target, loss_type):
    """Add ``loss_type(pred, target)`` to ``tape``; the target is a constant leaf.

    Parameters
    ----------
    tape : reflib.Tape
    pred : int
        Node id of the prediction.
    target : array_like
    loss_type : str

    Returns
    -------
    int
        Node id of the 0-d loss.
    """
    name = resolve_loss(loss_type)
    t = check_target(name, tape.value(pred), target)
    return tape.op(name, pred, tape.leaf(t, requires_grad=False))


def loss_and_grad(loss_type, pred, target, dps=None):
    """The loss value and its gradient with respect to ``pred`` (float64, or exact at ``dps``).

    Returns
    -------
    loss : float or mpmath.mpf
    grad : numpy.ndarray
        Same shape as ``pred``.
    """
    tape = Tape(dps=dps)
    p = tape.leaf(np.asarray(pred), requires_grad=True)
    out = add_loss(tape, p, target, loss_type)
    grads = tape.backward_scalar(out)
    return tape.value(out)[()], grads[p]
