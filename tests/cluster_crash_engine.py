"""A plugin engine for tests/test_cluster.py: fastlib's ops, except that ``tanh`` ends its
process every time and ``exp`` ends it once (the first time, when the marker file named by
``VERIGRAD_TEST_CRASH_MARKER`` does not exist yet), as a crash in native code would."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reports.conformance.engines import FastlibEngine  # noqa: E402


class CrashingEngine(FastlibEngine):
    name = "crashing"

    def _crash(self, name):
        if name == "tanh":
            os._exit(13)
        marker = os.environ.get("VERIGRAD_TEST_CRASH_MARKER")
        if name == "exp" and marker and not os.path.exists(marker):
            Path(marker).write_text("died once")
            os._exit(13)

    def _forward(self, name, inputs, **params):
        self._crash(name)
        return super()._forward(name, inputs, **params)

    def _vjp(self, name, inputs, grad, **params):
        self._crash(name)
        return super()._vjp(name, inputs, grad, **params)


class WrongEngine(FastlibEngine):
    """fastlib with sigmoid's VJP 0.1% too large: a bug the suite must find and shrink."""

    name = "wrong"

    def _vjp(self, name, inputs, grad, **params):
        out = super()._vjp(name, inputs, grad, **params)
        if name == "sigmoid":
            out = tuple(None if g is None else g * g.dtype.type(1.001) for g in out)
        return out
