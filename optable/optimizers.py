"""The optimizers every engine accepts: names, hyperparameters (defaults, ranges) and state.

One entry per optimizer, in registry order; an optimizer's position is the kind code compiled
kernels switch on. spec adds each update's formula and its proof, reflib evaluates spec's,
fastlib compiles its own rule (``fastlib/kernels/optim_rules.py``), and the harness reads the
names from here. :func:`check_hyperparameters` is the one check of a caller's hyperparameters,
with one set of messages for every engine.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from types import MappingProxyType

from optable.errors import KeyErrorWithMessage, did_you_mean

__all__ = ["Hyperparameter", "OptimizerSignature", "OPTIMIZERS", "UnknownOptimizerError",
           "HyperparameterError", "find_optimizer", "lookup_optimizer", "check_hyperparameters"]


class UnknownOptimizerError(KeyErrorWithMessage):
    """An optimizer name that is not in the registry; the message lists close names."""


class HyperparameterError(TypeError, ValueError):
    """A hyperparameter the optimizer does not take, or a value that is not a real number.

    Both a TypeError (a keyword the call does not take, as Python's own) and a ValueError (a bad
    setting), so every engine's ``except`` clause catches it.
    """


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter: its default and the interval of legal values.

    ``low`` is included unless ``low_open``; ``high`` (None: unbounded) is excluded.
    """

    name: str
    default: float
    low: float = 0.0
    high: float | None = None
    low_open: bool = False

    def interval(self):
        """The legal values in words: ``> 0``, ``>= 0`` or ``in [0, 1)``."""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g})"

    def check(self, owner, value):
        """``value`` unchanged when it is a real number in range; else a clear error."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise HyperparameterError(f"{owner}: hyperparameter {self.name!r} must be a real "
                                      f"number, got {type(value).__name__} {value!r}")
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"{owner}: {self.name} must be a finite real number, got {value!r}")
        if (v <= self.low if self.low_open else v < self.low) or (
                self.high is not None and v >= self.high):
            raise ValueError(f"{owner}: {self.name} must be {self.interval()}, got {value!r}")
        return value


@dataclass(frozen=True)
class OptimizerSignature:
    """One optimizer: its public name (any case is accepted), hyperparameters and state."""

    name: str
    hyper: tuple
    state: tuple

    @property
    def defaults(self):
        """``{hyperparameter: default}`` in declaration order."""
        return {h.name: h.default for h in self.hyper}


_LR_SMALL, _LR_ADAPTIVE = 0.01, 0.001


def _lr(default):
    return Hyperparameter("lr", default, low_open=True)


def _fraction(name, default):
    return Hyperparameter(name, default, 0.0, 1.0)


_EPS = Hyperparameter("eps", 1e-8)

_LIST = (
    OptimizerSignature("SGD", (_lr(_LR_SMALL),), ()),
    OptimizerSignature("Momentum", (_lr(_LR_SMALL), _fraction("beta", 0.9)), ("v",)),
    OptimizerSignature("NAG", (_lr(_LR_SMALL), _fraction("beta", 0.9)), ("v",)),
    OptimizerSignature("Adagrad", (_lr(_LR_SMALL), _EPS), ("G",)),
    OptimizerSignature("RMSprop", (_lr(_LR_ADAPTIVE), _fraction("gamma", 0.9), _EPS), ("E",)),
    OptimizerSignature("Adam", (_lr(_LR_ADAPTIVE), _fraction("beta1", 0.9),
                                _fraction("beta2", 0.999), _EPS), ("m", "v")),
    OptimizerSignature("AdamW", (_lr(_LR_ADAPTIVE), _fraction("beta1", 0.9),
                                 _fraction("beta2", 0.999), _EPS,
                                 Hyperparameter("weight_decay", 0.01)), ("m", "v")),
)

#: public name -> OptimizerSignature, in registry order (the kind codes).
OPTIMIZERS = MappingProxyType({o.name: o for o in _LIST})
_BY_LOWER = {name.lower(): o for name, o in OPTIMIZERS.items()}


def find_optimizer(name):
    """The signature called ``name`` in any case, or None."""
    return _BY_LOWER.get(name.lower()) if isinstance(name, str) else None


def lookup_optimizer(name, error=UnknownOptimizerError):
    """The signature called ``name`` (case-insensitive).

    Raises
    ------
    UnknownOptimizerError
        (or ``error``) naming the close names and every known one.
    TypeError
        ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"optimizer must be a name ({', '.join(OPTIMIZERS)}), "
                        f"got {type(name).__name__}")
    sig = find_optimizer(name)
    if sig is None:
        raise error(f"unknown optimizer {name!r}{did_you_mean(name, OPTIMIZERS)}; known "
                    f"optimizers (any case): {', '.join(OPTIMIZERS)}")
    return sig


def check_hyperparameters(sig, given, owner=None):
    """``sig``'s defaults overridden by ``given``, each given value checked.

    Returns
    -------
    dict
        Every hyperparameter, the given values unchanged (an exact engine keeps its numbers).

    Raises
    ------
    HyperparameterError
        A name the optimizer does not take (with the close name and the ones it takes), or a
        value that is not a real number.
    ValueError
        A value that is not finite or out of its range (``lr > 0``, ``0 <= beta < 1``, ...).
    """
    owner = owner or sig.name
    by_name = {h.name: h for h in sig.hyper}
    out = sig.defaults
    for key, value in given.items():
        if key not in by_name:
            raise HyperparameterError(
                f"{owner}: unknown hyperparameter {key!r}{did_you_mean(key, by_name)} ({owner} "
                f"has no hyperparameter {key!r}; it takes {', '.join(by_name)})")
        out[key] = by_name[key].check(owner, value)
    return out
