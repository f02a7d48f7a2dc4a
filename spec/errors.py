"""Errors raised by ``spec``, each with a message that says what to do."""
from __future__ import annotations

# The op-name error and the did-you-mean helpers are the op table's (one class for every engine).
from optable.errors import UnknownOpError, close_names, did_you_mean  # noqa: F401
# ...and so is the optimizer-name error (the optimizer registry's).
from optable.optimizers import UnknownOptimizerError  # noqa: F401


class RegistryError(ValueError):
    """A registry entry (op or optimizer) is malformed; the message says what to fix."""
