"""The arguments of ``train`` and ``train_sh``: DataCode's order, and the keywords others use.

DataCode's positional order ``(model, x, y, epochs, batch_size, learning_rate, loss_type,
x_val, y_val, optimizer)`` keeps working; the keywords Keras and PyTorch users reach for are
accepted as well: ``lr=`` (``learning_rate``), ``loss=`` (``loss_type``) and
``validation_data=(x_val, y_val)``; ``epochs=``, ``batch_size=`` and ``optimizer=`` are the
parameters' own names. The same thing given twice (``lr=`` and ``learning_rate``, ``loss=`` and
``loss_type``, ``validation_data`` and ``x_val``/``y_val``) is a ``TypeError`` naming both.

An optimizer *object* carries its own learning rate: it is used when no rate is given, and a
different rate given beside it is a ``ValueError`` (it was silently replaced before).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MISSING", "CallArguments", "normalise"]


class _Missing:
    """The default of a required argument that may also come under another name."""

    def __repr__(self):
        return "<required>"


MISSING = _Missing()


@dataclass(frozen=True)
class CallArguments:
    """The arguments after normalisation: one value for each thing."""

    epochs: object
    batch_size: object
    learning_rate: object
    loss_type: object
    x_val: object
    y_val: object


def _one_of(name, value, alias, alias_value):
    """The value given under ``name`` or under ``alias``; both given is a TypeError."""
    given = value is not None and value is not MISSING
    if alias_value is not None and given:
        raise TypeError(f"train() got {name}={_show(value)} and {alias}={_show(alias_value)}: "
                        f"{alias} is another name for {name}; pass one of them")
    return alias_value if alias_value is not None else value


def _show(value):
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def normalise(fn, *, epochs, batch_size, learning_rate, lr, loss_type, loss, x_val, y_val,
              validation_data, optimizer) -> CallArguments:
    """Merge the aliases into one value each and check the optimizer's rate.

    Parameters
    ----------
    fn : str
        The function's name, for messages (``"train"`` or ``"train_sh"``).
    epochs, batch_size, learning_rate, loss_type, x_val, y_val, optimizer :
        As given (``MISSING`` where a required one was not).
    lr, loss, validation_data :
        The aliases (None when not given).

    Returns
    -------
    CallArguments

    Raises
    ------
    TypeError
        A required argument given under no name, or one thing given under two names.
    ValueError
        ``validation_data`` that is not a pair, or a rate that differs from the optimizer
        object's own.
    """
    from fastlib import optim

    rate = _one_of("learning_rate", learning_rate, "lr", lr)
    loss_type = _one_of("loss_type", loss_type, "loss", loss)
    for name, value in (("epochs", epochs), ("batch_size", batch_size),
                        ("loss_type", loss_type)):
        if value is MISSING:
            alias = " (or loss=)" if name == "loss_type" else ""
            raise TypeError(f"{fn}() missing required argument {name!r}{alias}")
    if validation_data is not None:
        if x_val is not None or y_val is not None:
            raise TypeError(f"{fn}() got validation_data and x_val/y_val: they are two "
                            "spellings of the validation data; pass one of them")
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
            raise ValueError(f"validation_data must be a pair (x_val, y_val), got "
                             f"{_show(validation_data)}")
        x_val, y_val = validation_data
    if isinstance(optimizer, optim.Optimizer) and rate is not None:
        try:
            same = math.isclose(float(rate), optimizer.lr, rel_tol=0.0, abs_tol=0.0)
        except (TypeError, ValueError):
            same = False     # not a number: the loop refuses it with its own message
        if not same:
            raise ValueError(f"{fn}(): optimizer={optimizer!r} has its own learning rate "
                             f"{optimizer.lr!r}, and learning_rate={_show(rate)} differs; give "
                             f"the rate once (learning_rate=None uses the optimizer's, or "
                             f"pass optimizer={optimizer.name!r} by name)")
    return CallArguments(epochs, batch_size, rate, loss_type, x_val, y_val)
