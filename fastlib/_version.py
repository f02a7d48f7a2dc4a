"""``fastlib.__version__``: the version of the verigrad distribution this fastlib belongs to.

In a source checkout the ``pyproject.toml`` beside the package is the truth (an older copy may
be installed too); elsewhere the installed distribution's metadata.
"""
from __future__ import annotations

import pathlib
import re

DISTRIBUTION = "verigrad"


def read_version() -> str:
    """The version string, e.g. ``"0.1.0"`` (``"0+unknown"`` when neither source has one)."""
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.is_file():
        text = pyproject.read_text(encoding="utf-8")
        project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
        if project and re.search(rf'^name\s*=\s*"{DISTRIBUTION}"', project.group(1), re.M):
            found = re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.M)
            if found:
                return found.group(1)
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"
