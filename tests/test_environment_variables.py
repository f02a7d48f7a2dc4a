"""Every environment variable the code reads is in the one table (docs/cli.md), and only those."""
import pathlib
import re

from reports.commands.environment import VARIABLES

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("optable", "spec", "reflib", "fastlib", "reports", "tools")
NAME = re.compile(r"\b(?:VERIGRAD|FASTLIB)_[A-Z][A-Z_]*[A-Z]\b")


def _read_in_code():
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "environment.py":
                continue
            for name in NAME.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, path.relative_to(ROOT).as_posix())
    return found


def test_every_variable_read_is_listed():
    listed = {v.name for v in VARIABLES}
    missing = {n: p for n, p in _read_in_code().items() if n not in listed}
    assert not missing, f"read but not in reports/commands/environment.py: {missing}"


def test_every_listed_variable_is_read_somewhere():
    stale = {v.name for v in VARIABLES} - set(_read_in_code())
    assert not stale, f"listed in reports/commands/environment.py but read nowhere: {stale}"


def test_each_variable_points_at_a_page_that_explains_it():
    for v in VARIABLES:
        page = ROOT / "docs" / v.doc
        assert page.is_file(), (v.name, v.doc)
        assert v.name in page.read_text(encoding="utf-8"), f"{v.doc} does not explain {v.name}"
        assert v.effect and v.default
