"""One status line on stderr, rewritten in place on a terminal, for the commands' long steps.

Off a terminal (a redirected log) nothing is written until ``finish``, which prints one line,
so a log never holds carriage-return frames. ``--progress`` / ``--no-progress`` decide whether
a command shows it at all (``arguments.progress_enabled``).
"""
from __future__ import annotations

import sys

__all__ = ["ProgressLine"]


class ProgressLine:
    """A single status line on stderr, rewritten in place on a terminal.

    Off a terminal (CI logs) nothing is written until ``finish``, which prints one line.
    """

    def __init__(self, stream=None, enabled=True):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._width = 0

    def update(self, text):
        """Replace the line with ``text`` (terminal only)."""
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self._width = len(text)

    def finish(self, text):
        """End the line with a final message."""
        if not self.enabled:
            return
        if self.tty:
            self.update(text)
            self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def clear(self):
        """Erase the line (terminal only): what follows is printed where it stood."""
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
