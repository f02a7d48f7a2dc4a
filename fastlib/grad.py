"""``value_and_grad``: the loss of a model on a batch and its gradient for every parameter."""
from __future__ import annotations

from fastlib.losses import loss_value_and_grad, resolve_loss, validate_targets


def value_and_grad(model, x, y, loss_type):
    """The mean loss of ``model`` on ``(x, y)`` and its gradient for every parameter.

    One validated forward (history captured), the loss and its gradient from the loss kernels,
    one backward through the history; no tape.

    Parameters
    ----------
    model : fastlib.layers.Layer
    x : array_like
        Input batch (integer indices when the model starts with ``Embedding``).
    y : array_like
        Targets in the format ``loss_type`` expects (see ``fastlib.losses``).
    loss_type : str
        ``mse cross_entropy categorical_cross_entropy binary_cross_entropy
        binary_cross_entropy_with_logits`` (case-insensitive; ``sparse_cross_entropy`` warns).

    Returns
    -------
    loss : float
    grads : dict[str, ndarray]
        Keyed like ``model.parameters()``, of the model's dtype.
    """
    name = resolve_loss(loss_type)
    pred = model(x)
    target = validate_targets(name, pred, y)
    loss, dpred = loss_value_and_grad(name, pred, target, check=False)
    _, grads = model.backward(dpred, need_input_grad=False)
    return loss, grads
