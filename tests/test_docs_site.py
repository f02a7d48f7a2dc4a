"""The API reference builds: Sphinx (autodoc + napoleon over the numpydoc docstrings) with every
warning an error, as CI runs it through this test. Configuration: docs/api/conf.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"


def _build(source, out):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH", "")]
                                                       if p])
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q",
                           "-b", "html", str(source), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_api_reference_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="the docs tools come with the test extra "
                                          "(pip install '.[test]')")
    proc = _build(API, tmp_path / "html")
    assert proc.returncode == 0, ("sphinx-build -W failed (fix the docstring it names):\n"
                                  + proc.stdout[-4000:] + proc.stderr[-4000:])
    training = (tmp_path / "html" / "training.html").read_text(encoding="utf-8")
    # train's keyword arguments are documented, not only in its signature
    for word in ("callbacks", "divergence", "resume_mismatch"):
        assert word in training, f"train's {word} is missing from the API reference"
    assert (tmp_path / "html" / "fastlib.html").is_file()


def test_a_broken_docstring_fails_the_build(tmp_path):
    # the -W build is what catches a bad docstring: plant one in a throwaway module
    pytest.importorskip("sphinx", reason="the docs tools come with the test extra")
    source = tmp_path / "src"
    source.mkdir()
    (tmp_path / "planted_mod.py").write_text(
        'def f(x):\n    """One line.\n\n    Parameters\n    ----------\n    x : int\n'
        '        An ``unclosed literal.\n    """\n')
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "extensions = ['sphinx.ext.autodoc', 'sphinx.ext.napoleon']\n")
    (source / "index.rst").write_text("T\n=\n\n.. autofunction:: planted_mod.f\n")
    proc = _build(source, tmp_path / "html")
    assert proc.returncode != 0
    assert "unclosed" in proc.stderr or "Inline literal" in proc.stderr
