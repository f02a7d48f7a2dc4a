"""The arguments of ``train`` and ``train_sh``: DataCode's order, other libraries' keywords.

DataCode's positional order keeps working, and so do the keywords Keras and PyTorch users reach
for: ``lr=`` (``learning_rate``), ``loss=`` (``loss_type``), ``validation_data=(x_val, y_val)``.
One thing given twice is a ``TypeError`` naming both; a misspelt keyword is a ``TypeError`` with
a did-you-mean. The rarely used options arrive as keywords or as ``options=TrainOptions(...)``
and leave here as one checked :class:`~fastlib.training.options.TrainOptions`; whatever else is
left is the algorithm's options. Past this module the learning rate has one name, ``lr``.
"""
from __future__ import annotations

import difflib
import inspect
import math
import numbers
from dataclasses import dataclass

import numpy as np

from fastlib.training.options import TrainOptions

__all__ = ["MISSING", "CallArguments", "normalise", "check_lr", "check_model",
           "check_parameters"]

# a keyword this close to one of train's own names is taken for a misspelling of it, even when
# the algorithm accepts any option (difflib's ratio: 'epoch' / 'epochs' is 0.91)
_MISSPELT = 0.8


class _Missing:
    """The default of a required argument that may also come under another name."""

    def __repr__(self):
        return "<required>"


MISSING = _Missing()


@dataclass(frozen=True)
class CallArguments:
    """The arguments after normalisation: one value for each thing, under one name."""

    epochs: object
    batch_size: object
    lr: object
    loss_type: object
    x_val: object
    y_val: object
    options: TrainOptions
    algorithm_options: dict


def _one_of(fn, name, value, alias, alias_value):
    """The value given under ``name`` or under ``alias``; both given is a TypeError."""
    given = value is not None and value is not MISSING
    if alias_value is not None and given:
        raise TypeError(f"{fn}() got {name}={_show(value)} and {alias}={_show(alias_value)}: "
                        f"{alias} is another name for {name}; pass one of them")
    return alias_value if alias_value is not None else value


def _show(value):
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _own_names(fn):
    """The keyword names ``fn`` itself takes (its parameters and the option fields)."""
    params = [p.name for p in inspect.signature(fn).parameters.values()
              if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return params + list(TrainOptions.field_names())


def _closest(key, names, cutoff=0.6):
    hits = difflib.get_close_matches(key, names, n=1, cutoff=cutoff)
    return hits[0] if hits else None


def _check_keywords(fn, keywords, algorithm):
    """Refuse a keyword that is neither an option field nor the algorithm's, with a guess."""
    name = fn.__name__
    own = _own_names(fn)
    accepted = algorithm.options
    unknown = [k for k in keywords if k not in TrainOptions.field_names()
               and (accepted is None or k not in accepted)]
    for key in unknown:
        if accepted is None:     # the algorithm takes any option: refuse only near-misses
            guess = _closest(key, own, _MISSPELT)
        else:
            guess = _closest(key, list(accepted) + own)
            guess = guess if guess in own else None
        if guess is not None:
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}; did you "
                            f"mean {guess!r}?")
    if accepted is not None and unknown:
        guess = _closest(unknown[0], list(accepted))
        hint = f" (did you mean {guess!r}?)" if guess else ""
        raise TypeError(f"{name}(): unexpected option(s) {unknown} for algorithm "
                        f"{algorithm.name!r}{hint}; it takes {list(accepted) or 'no options'}"
                        f" (and {name}() its own keywords: help({name}))")


def _split_options(fn, keywords, options):
    """``(TrainOptions, algorithm options)`` from the keywords and ``options=``."""
    name = fn.__name__
    given = {k: v for k, v in keywords.items() if k in TrainOptions.field_names()}
    rest = {k: v for k, v in keywords.items() if k not in given}
    if options is not None and not isinstance(options, TrainOptions):
        raise TypeError(f"{name}(): options must be a fastlib.TrainOptions, got "
                        f"{type(options).__name__}")
    if options is not None and given:
        raise TypeError(f"{name}() got options= and {', '.join(f'{k}=' for k in given)}: set "
                        f"{'it' if len(given) == 1 else 'them'} in TrainOptions(...) or as "
                        f"keyword(s), not both")
    options = options if options is not None else TrainOptions(**given)
    plateau = options.changed_plateau_fields()
    if name == "train" and plateau:
        raise TypeError(f"train() got {', '.join(plateau)}: only train_sh's plateau policy "
                        f"reads {'it' if len(plateau) == 1 else 'them'}; call train_sh, or "
                        f"leave {'it' if len(plateau) == 1 else 'them'} out")
    return options, rest


def check_model(fn, model):
    """Refuse a ``model`` that is not a fastlib layer, with what to pass instead.

    Raises
    ------
    TypeError
        A layer class (not built), a list of layers (not in a container), anything else.
    """
    from fastlib.layers import Layer

    if isinstance(model, Layer):
        return model
    name = fn.__name__
    if isinstance(model, type) and issubclass(model, Layer):
        raise TypeError(f"{name}(): model is the class {model.__name__}, not a layer; build "
                        f"one first, e.g. {model.__name__}(...) with its sizes, and pass that")
    if isinstance(model, (list, tuple)) and model and all(isinstance(m, Layer) for m in model):
        raise TypeError(f"{name}(): model is a {type(model).__name__} of {len(model)} layer(s); "
                        f"chain them in a container: fastlib.Sequential([...])")
    raise TypeError(f"{name}(): model must be a fastlib layer or container, e.g. "
                    f"fastlib.Sequential([fastlib.Dense(4, 3)]), got {type(model).__name__}")


def check_parameters(params):
    """Refuse starting weights that hold NaN or Inf (``{name: array}``, the model's).

    Raises
    ------
    ValueError
        Naming the first such parameter and entry. Without it the first batch's loss is NaN
        and the divergence rule stops the run, blaming the learning rate, and "restores"
        weights that still hold the NaN.
    """
    for name, value in params.items():
        arr = np.asarray(value)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            at = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
            raise ValueError(f"parameter {name!r} holds {arr[at]} at index {at} before "
                             "training: the model's weights must be finite; rebuild the model "
                             "or load finite weights (load_parameters refuses NaN/Inf)")


def normalise(fn, *, model, epochs, batch_size, learning_rate, lr, loss_type, loss, x_val, y_val,
              validation_data, optimizer, algorithm, options=None, keywords=None
              ) -> CallArguments:
    """Merge the aliases into one value each, route the keywords and check the optimizer's rate.

    Parameters
    ----------
    fn : callable
        ``train`` or ``train_sh`` (its name goes into messages, its parameters into guesses).
    model : object
        As given; anything but a fastlib layer is refused (:func:`check_model`).
    epochs, batch_size, learning_rate, loss_type, x_val, y_val, optimizer :
        As given (``MISSING`` where a required one was not).
    lr, loss, validation_data :
        The aliases (None when not given).
    algorithm : fastlib.training.algorithms.Algorithm
        The run's algorithm (its declared options are accepted as keywords).
    options : TrainOptions, optional
        ``options=`` as given.
    keywords : dict, optional
        The keywords ``fn`` did not name: option fields or the algorithm's options.

    Returns
    -------
    CallArguments

    Raises
    ------
    TypeError
        A model that is not a fastlib layer, a misspelt keyword (with a did-you-mean), a
        required argument given under no name, one thing given under two names, or an option
        given both in ``options=`` and as a keyword.
    ValueError
        ``validation_data`` that is not a pair, or a rate that differs from the optimizer
        object's own.
    """
    from fastlib import optim

    name = fn.__name__
    check_model(fn, model)
    keywords = dict(keywords or {})
    _check_keywords(fn, keywords, algorithm)
    options, algorithm_options = _split_options(fn, keywords, options)
    rate = _one_of(name, "learning_rate", learning_rate, "lr", lr)
    loss_type = _one_of(name, "loss_type", loss_type, "loss", loss)
    for required, value in (("epochs", epochs), ("batch_size", batch_size),
                            ("loss_type", loss_type)):
        if value is MISSING:
            alias = " (or loss=)" if required == "loss_type" else ""
            raise TypeError(f"{name}() missing required argument {required!r}{alias}")
    if validation_data is not None:
        if x_val is not None or y_val is not None:
            raise TypeError(f"{name}() got validation_data and x_val/y_val: they are two "
                            "spellings of the validation data; pass one of them")
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
            raise ValueError(f"validation_data must be a pair (x_val, y_val), got "
                             f"{_show(validation_data)}")
        x_val, y_val = validation_data
    if isinstance(optimizer, optim.Optimizer) and rate is not None:
        try:
            same = math.isclose(float(rate), optimizer.lr, rel_tol=0.0, abs_tol=0.0)
        except (TypeError, ValueError):
            same = False     # not a number: the run's set-up refuses it with its own message
        if not same:
            raise ValueError(f"{name}(): optimizer={optimizer!r} has its own learning rate "
                             f"{optimizer.lr!r}, and learning_rate={_show(rate)} differs; give "
                             f"the rate once (learning_rate=None uses the optimizer's, or "
                             f"pass optimizer={optimizer.name!r} by name)")
    return CallArguments(epochs, batch_size, rate, loss_type, x_val, y_val, options,
                         algorithm_options)


def check_lr(optimizer, lr) -> float:
    """The run's learning rate: ``lr`` as given, or the optimizer's own when None.

    Raises
    ------
    ValueError
        A rate that is not a finite number > 0.
    """
    value = optimizer.lr if lr is None else lr
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"learning_rate must be a finite number > 0, got {lr!r}")
    return float(value)
