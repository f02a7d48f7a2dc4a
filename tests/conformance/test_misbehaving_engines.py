"""Plug-in engines that break the protocol: each is reported, never read as a pass.

A correct tanh engine (the stable sech² form) is the base; each case breaks one thing: a call
that returns None, a VJP that is not one entry per input, ``sys.exit`` in a call or at import,
a ``supports`` that raises or answers in another shape. The oracle is the protocol itself
(docs/engines.md): a run that passes must have measured every row it lists.
"""
from __future__ import annotations

import pytest

from reports.cli import main

BASE = '''
import sys
import numpy as np


class Good:
    name = "good"
    dtypes = (np.dtype(np.float64),)

    def supports(self, op):
        return (True, "") if op == "tanh" else (False, "only tanh")

    def forward(self, name, inputs, **params):
        return np.tanh(inputs[0])

    def vjp(self, name, inputs, grad, **params):
        e = np.exp(-2 * np.abs(inputs[0]))
        return (grad * 4 * e / (1 + e) ** 2,)
'''

CASES = {
    "Good": ("", 0, None),
    "NoneForward": ("def forward(self, name, inputs, **params):\n        return None",
                    1, "forward returned None"),
    "NoneVjp": ("def vjp(self, name, inputs, grad, **params):\n        return None",
                1, "vjp returned None"),
    "BareVjp": ("def vjp(self, name, inputs, grad, **params):\n        return inputs[0] * 0",
                1, "vjp must return a tuple with one entry per input (None where"),
    "ExitInForward": ("def forward(self, name, inputs, **params):\n        sys.exit(0)",
                      1, "forward called sys.exit(0)"),
    "SupportsRaises": ("def supports(self, op):\n        raise RuntimeError('boom')",
                       2, "supports('neg') raised RuntimeError: boom"),
    "SupportsBool": ("def supports(self, op):\n        return op == 'tanh'",
                     2, "supports('neg') returned False; it must return (True, '')"),
}


def _engine_file(tmp_path, cls, body):
    text = BASE + (f"\n\nclass {cls}(Good):\n    name = {cls.lower()!r}\n\n    {body}\n"
                   if body else "")
    path = tmp_path / "engine.py"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("cls", list(CASES))
def test_a_broken_engine_fails_by_name(tmp_path, capsys, cls):
    body, code, words = CASES[cls]
    path = _engine_file(tmp_path, cls, body)
    got = main(["conform", "--engines", f"{path}:{cls}", "--ops", "tanh", "--dtypes", "float64",
                "--no-proofs", "--no-progress", "--workers", "1"])
    out = capsys.readouterr()
    assert got == code, out.out + out.err
    if words:
        assert words in out.out + out.err


def test_an_engine_that_exits_at_import_is_refused(tmp_path, capsys):
    path = tmp_path / "exits.py"
    path.write_text("import sys\nsys.exit(0)\n", encoding="utf-8")
    got = main(["conform", "--engines", f"{path}:E", "--ops", "tanh", "--no-progress"])
    err = capsys.readouterr().err
    assert got == 2 and "cannot import it: SystemExit: 0" in err, err


def test_a_supports_optimizer_that_raises_is_refused_by_name(tmp_path, capsys):
    body = ("def supports_optimizer(self, name):\n        raise RuntimeError('no table')\n\n"
            "    def optimizer_step(self, name, w, g, state, t, **hyper):\n        return w, state")
    path = _engine_file(tmp_path, "OptimizerRaises", body)
    got = main(["conform", "--engines", f"{path}:OptimizerRaises", "--ops", "SGD", "--dtypes",
                "float64", "--no-proofs", "--no-progress", "--workers", "1"])
    err = capsys.readouterr().err
    assert got == 2 and "supports_optimizer('SGD') raised RuntimeError: no table" in err, err


def test_a_system_exit_the_run_did_not_catch_exits_1_with_a_message(monkeypatch, capsys):
    # the backstop: code the run calls raises SystemExit(0) past every row's own catch; the
    # process must not exit 0 with no table
    from reports.commands import spec as spec_command

    def exits(args):
        raise SystemExit(0)

    monkeypatch.setattr(spec_command, "run", exits)
    assert main(["spec", "--list"]) == 1
    assert "raised SystemExit(0) before the run finished" in capsys.readouterr().err
