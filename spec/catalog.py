"""The validated op registry, ``spec.OPS``: every op of ``spec.ops``, checked at import against
the op table. Its own module so spec's submodules can read it without importing the package.

The long story: docs/spec.md, section ``spec/__init__.py``.
"""
from __future__ import annotations

from spec.ops import ALL as _ALL_OPS
from spec.registry import check_covers_table, validate_registry

# Validated at import: a broken entry fails here with a message saying what to fix.
OPS = validate_registry(_ALL_OPS)
check_covers_table(OPS)
