"""The callbacks of a run: checked before training, called in order at each epoch's end.

A callback is an object with ``on_epoch_end(epoch, logs)`` (and optionally
``on_train_begin(logs)`` / ``on_train_end(logs)``), or a plain callable ``f(epoch, logs)``;
returning True from the epoch hook asks training to stop, as Keras's ``stop_training`` does.
``callbacks=`` takes one callback or a list of them.
"""
from __future__ import annotations

__all__ = ["Callbacks", "epoch_logs"]


def epoch_logs(loss, accuracy, val_loss, val_accuracy, lr, seconds) -> dict:
    """The ``logs`` every epoch hook receives (the epoch's figures, as its histories hold them)."""
    return {"loss": loss, "acc": accuracy, "val_loss": val_loss, "val_acc": val_accuracy,
            "lr": lr, "epoch_time": seconds}


def _as_tuple(callbacks) -> tuple:
    """``callbacks`` as a tuple; one callback on its own counts as a list of one.

    NOTE: Keras (``callbacks=cb`` is flattened) and PyTorch Lightning (``Trainer(callbacks=cb)``)
    both take a single callback, and one cannot be mistaken for a list: it has
    ``on_epoch_end`` or is callable, which a list is not.
    """
    if callbacks is None:
        return ()
    if hasattr(callbacks, "on_epoch_end") or callable(callbacks):
        return (callbacks,)
    if isinstance(callbacks, (str, bytes)) or not hasattr(callbacks, "__iter__"):
        raise TypeError(f"callbacks must be a callback or a list of them (objects with "
                        f"on_epoch_end(epoch, logs), or callables f(epoch, logs)), got "
                        f"{callbacks!r}")
    return tuple(callbacks)


class Callbacks:
    """The run's callbacks, each checked now (a TypeError names one that cannot be called)."""

    def __init__(self, callbacks):
        self.items = _as_tuple(callbacks)
        self.epoch_hooks = []
        for cb in self.items:
            if isinstance(cb, type):     # a class is callable, but calling it builds one
                raise TypeError(f"callback {cb.__name__} is a class; pass an instance, "
                                f"{cb.__name__}(...)")
            fn = getattr(cb, "on_epoch_end", None)
            if fn is None and callable(cb):
                fn = cb
            if fn is None:
                raise TypeError(f"callback {cb!r} has no on_epoch_end(epoch, logs) method and is "
                                "not callable")
            self.epoch_hooks.append((cb, fn))

    def begin(self, logs) -> None:
        """``on_train_begin(logs)`` of each callback that has it."""
        self._hook("on_train_begin", logs)

    def end(self, logs) -> None:
        """``on_train_end(logs)`` of each callback that has it."""
        self._hook("on_train_end", logs)

    def epoch_end(self, epoch, logs) -> str | None:
        """Call every epoch hook; the stop reason of the first that returned True, or None."""
        stop = None
        for cb, fn in self.epoch_hooks:
            if fn(epoch, logs) is True and stop is None:
                stop = f"callback {getattr(cb, '__name__', type(cb).__name__)} asked to stop"
        return stop

    def _hook(self, name, logs):
        for cb in self.items:
            fn = getattr(cb, name, None)
            if fn is not None:
                fn(logs)
