"""Errors raised by ``spec``, each with a message that says what to do."""
from __future__ import annotations

# The op-name error and the did-you-mean helpers are the op table's (one class for every engine).
from optable.errors import KeyErrorWithMessage as _KeyErrorWithMessage
from optable.errors import UnknownOpError, close_names, did_you_mean  # noqa: F401


class UnknownOptimizerError(_KeyErrorWithMessage):
    """An optimizer name that is not in ``spec.OPTIMIZERS``; the message lists close names."""


class RegistryError(ValueError):
    """A registry entry (op or optimizer) is malformed; the message says what to fix."""
