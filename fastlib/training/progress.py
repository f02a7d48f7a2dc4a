"""A run's progress on stderr: a bar on a terminal, one plain line per epoch in a log.

``verbose=True`` draws a tqdm bar only where someone watches (stderr is a terminal, or a
notebook's kernel); into a redirected log it writes one line per epoch and never a carriage
return. ``verbose=2`` asks for the lines everywhere (Keras's ``verbose=2``), False for nothing.
"""
from __future__ import annotations

import sys

__all__ = ["Progress", "progress_mode"]


def _watched(stream) -> bool:
    """Whether ``stream`` is a terminal or a notebook kernel's output (a bar can be drawn)."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):   # no isatty, or a closed stream
        return False
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def progress_mode(verbose, stream) -> str | None:
    """``"bar"``, ``"lines"`` or None (silent) for ``verbose`` writing to ``stream``.

    Raises
    ------
    ValueError
        ``verbose`` other than True / False / 0 / 1 / 2.
    """
    if verbose is True or verbose is False or verbose in (0, 1, 2):
        level = int(verbose)
    else:
        raise ValueError(f"verbose must be True (a bar on a terminal, else a line per epoch), "
                         f"2 (a line per epoch) or False (silent), got {verbose!r}")
    if level == 0:
        return None
    return "bar" if level == 1 and _watched(stream) else "lines"


class Progress:
    """Shows the epochs of one run (see the module docstring).

    Parameters
    ----------
    verbose : bool or int
        True / 1, 2 or False / 0.
    epochs, start_epoch : int
        The run's total epochs and those done before it started (a resume).
    label : str
        What runs, e.g. ``"train bp"``.
    stream : file, optional
        Where to write (default: ``sys.stderr`` at the time of the call).
    """

    def __init__(self, verbose, epochs, start_epoch, label, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.mode = progress_mode(verbose, self.stream) if start_epoch < epochs else None
        self.epochs, self.label = epochs, label
        self.bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=epochs, initial=start_epoch, unit="epoch", desc=label,
                            leave=True, file=self.stream)

    def update(self, epoch, logs) -> None:
        """One epoch ended with ``logs`` (``fastlib.training.callbacks.epoch_logs``)."""
        figures = {k: v for k, v in logs.items() if v is not None and k != "epoch_time"}
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in figures.items()})
        elif self.mode == "lines":
            shown = ", ".join(f"{k} {v:.4g}" for k, v in figures.items())
            self.stream.write(f"{self.label}: epoch {epoch}/{self.epochs}: {shown} "
                              f"({logs['epoch_time']:.2f} s)\n")
            self.stream.flush()

    def close(self) -> None:
        """Finish the bar (idempotent)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
