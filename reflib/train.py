"""Reference training math: the loss and its parameter gradients, and one optimizer step.

Both run the model on a fresh ``reflib.Tape(dps)``: float64 when ``dps`` is None, exact mpmath
arithmetic at ``dps`` digits otherwise. Gradients come from the tape (``backward_scalar``) and
the registry ops' VJPs; the update comes from ``spec.engine_step`` (``reflib.optim``).
"""
from __future__ import annotations

from reflib import optim
from reflib.losses import add_loss
from reflib.models.base import Layer, input_array
from reflib.models.config import twin
from reflib.numeric import numeric_for
from reflib.tape import Tape


def trace_loss(model, x, y, loss_type, dps=None):
    """Build model and loss on a new tape; return ``(tape, loss_id, {param name: leaf id})``."""
    tape = Tape(dps=dps)
    ids = model.attach(tape, requires_grad=True)
    out = model.trace(tape, tape.leaf(input_array(x, type(model).__name__),
                                      requires_grad=False), ids)
    return tape, add_loss(tape, out, y, loss_type), ids


def value_and_grad(model, x, y, loss_type, dps=None):
    """The mean loss of ``model`` on ``(x, y)`` and its gradient for every parameter.

    Parameters
    ----------
    model : reflib model, or any model with ``get_config()`` and ``parameters()``
        A non-reflib model (a fastlib model) is evaluated through its reference twin.
    x : array_like
        Input batch (integer indices for an ``Embedding`` first layer).
    y : array_like
        Targets in the format ``loss_type`` expects (see ``reflib.losses``).
    loss_type : str
        ``mse cross_entropy categorical_cross_entropy binary_cross_entropy
        binary_cross_entropy_with_logits`` (``sparse_cross_entropy`` warns and means
        ``cross_entropy``).
    dps : int or None
        None: float64; an int: exact at that many digits.

    Returns
    -------
    loss : float, or mpmath.mpf when exact
    grads : dict[str, numpy.ndarray]
        Keyed like ``model.parameters()``. A parameter the loss does not reach (an RNN's
        ``w_hh`` on a length-1 sequence) gets exact zeros.
    """
    model = twin(model)
    tape, loss, ids = trace_loss(model, x, y, loss_type, dps)
    reached = tape.backward_scalar(loss)
    zeros = numeric_for(dps).zeros
    grads = {name: reached[i] if i in reached else zeros(tape.value(i).shape)
             for name, i in ids.items()}
    value = tape.value(loss)[()]
    return (float(value) if dps is None else value), grads


def train_step(model, x, y, loss_type, optimizer="SGD", state=None, t=None, lr=None, *,
               dps=None, apply=False, **hyper):
    """One reference training step: ``value_and_grad``, then the spec's update of every parameter.

    Pure by default: the model is not changed unless ``apply=True`` (then the new values are
    loaded into it; only for reflib models).

    Parameters
    ----------
    model, x, y, loss_type, dps :
        As for ``value_and_grad``.
    optimizer : str
        A name of the optimizer registry (``optable.OPTIMIZERS``), in any case.
    state : dict or None
        From ``reflib.optim.init_state`` or a previous step: ``{"t": steps taken, "slots":
        {param name: {state variable: array}}}``; None means a fresh state.
    t : int or None
        The step number (1 for the first update); None means ``state["t"] + 1``.
    lr : float or None
        Learning rate; None is the optimizer's default (docs/CONTRACTS.md).
    apply : bool
        Load the new parameters into ``model``.
    **hyper :
        Other hyperparameters by name (``beta``, ``gamma``, ``beta1``, ``beta2``, ``eps``,
        ``weight_decay``).

    Returns
    -------
    loss, grads :
        As ``value_and_grad`` at the current parameters.
    new_params : dict[str, numpy.ndarray]
    new_state : dict
        ``new_state["t"]`` is the step number used.

    Notes
    -----
    The update is ``spec.engine_step`` (``reflib.optim.step``): where an optimizer's engine
    form holds the parameters elsewhere than its table's form (spec.optimizers' look-ahead
    form), the model holds them there and the gradient is taken at them.
    """
    if apply and not _is_reference(model):
        raise ValueError("apply=True needs a reflib model; load new_params into a fastlib model "
                         "yourself")
    ref = twin(model)
    loss, grads = value_and_grad(ref, x, y, loss_type, dps=dps)
    new_params, new_state = optim.step(optimizer, ref.parameters(), grads, state, t=t, lr=lr,
                                       dps=dps, **hyper)
    if apply:
        ref.load_parameters(new_params)
    return loss, grads, new_params, new_state


def _is_reference(model):
    return isinstance(model, Layer)
