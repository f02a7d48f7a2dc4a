"""The warnings of a training run, attributed to the line of the caller's code.

A warning raised deep in the loop's parts would otherwise point at a line of fastlib; Python
shows the line a ``stacklevel`` names, so :func:`warn` counts the frames up to the first one
outside ``fastlib/training``.
"""
from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn"]

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message, category=RuntimeWarning) -> None:
    """``warnings.warn(message, category)`` pointing at the first caller outside this package."""
    frame, level = sys._getframe(0), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_HERE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
