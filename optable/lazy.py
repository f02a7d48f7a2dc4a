"""The lazy top-level namespace of fastlib and reflib: public names load on first use.

Both packages map each public name to the module that defines it, so ``import fastlib`` stays
cheap (no kernels, no SymPy) and ``__all__`` is derived from that one table. The machinery that
reads the table is the same for both, and plain Python, so it is written here once.
"""
from __future__ import annotations

import importlib
import sys


def lazy_namespace(package, exports, submodules):
    """``(__getattr__, __dir__)`` for ``package`` (PEP 562).

    Parameters
    ----------
    package : str
        The package's name; a name it loads is cached in its namespace.
    exports : Mapping[str, str]
        Public name -> the module that defines it.
    submodules : Iterable[str]
        Submodule names reachable as attributes (``fastlib.ops``).
    """
    submodules = frozenset(submodules)

    def __getattr__(name):
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports) | submodules)

    return __getattr__, __dir__
