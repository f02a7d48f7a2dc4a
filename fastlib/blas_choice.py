"""Which BLAS the kernels' matrix products call: NumPy's own OpenBLAS where it exports CBLAS.

Numba's ``np.dot`` calls SciPy's bundled OpenBLAS. NumPy's wheels bundle another build, and
on the machine measured (NumPy 2.4, SciPy 1.17) it carries OpenBLAS's small-matrix kernels
(``sgemm_small_kernel_*``) that SciPy's lacks: an 8 x 128 by 128 x 512 product, one thread,
took 23 us from a kernel through NumPy's and 52 us through Numba's ``np.dot``; fastlib's
recurrent and per-piece products are that small. This module
finds the library and its ``cblas_?gemm`` symbols with ``ctypes`` only (no Numba import:
``fastlib.cache_guard`` folds :func:`stamp` into its fingerprint, so a cache compiled for
one choice is never loaded under another). None: the kernels keep Numba's ``np.dot``.
"""
from __future__ import annotations

import ctypes
import functools
import os
import pathlib
from dataclasses import dataclass

__all__ = ["BlasChoice", "choice", "describe", "stamp"]

# (single, double, integer bits): the CBLAS names of NumPy's OpenBLAS builds, 64-bit integer
# interfaces first
_SYMBOLS = (("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", 64),
            ("cblas_sgemm64_", "cblas_dgemm64_", 64),
            ("scipy_cblas_sgemm", "scipy_cblas_dgemm", 32),
            ("cblas_sgemm", "cblas_dgemm", 32))


@dataclass(frozen=True)
class BlasChoice:
    """A library's ``?gemm`` CBLAS entry points (addresses) and their integer width."""

    path: str
    sgemm: int
    dgemm: int
    int_bits: int
    names: tuple


def _candidates():
    """NumPy's bundled OpenBLAS files (its wheel's ``numpy.libs`` or ``numpy/.dylibs``)."""
    import numpy

    root = pathlib.Path(numpy.__file__).resolve().parent
    for folder in (root.parent / "numpy.libs", root / ".dylibs"):
        if folder.is_dir():
            yield from sorted(p for p in folder.iterdir() if "openblas" in p.name.lower())


@functools.lru_cache(maxsize=1)
def choice() -> BlasChoice | None:
    """NumPy's OpenBLAS with its CBLAS ``sgemm``/``dgemm``, or None (then ``np.dot``).

    ``VERIGRAD_BLAS=numba`` keeps Numba's ``np.dot`` whatever is found.
    """
    if os.environ.get("VERIGRAD_BLAS", "").strip().lower() == "numba":
        return None
    for path in _candidates():
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        for single, double, bits in _SYMBOLS:
            if hasattr(lib, single) and hasattr(lib, double):
                address = ctypes.cast(getattr(lib, single), ctypes.c_void_p).value
                d_address = ctypes.cast(getattr(lib, double), ctypes.c_void_p).value
                return BlasChoice(str(path), address, d_address, bits, (single, double))
    return None


def describe() -> str:
    """The choice in a few words (whose library, its single-precision symbol, integer width),
    for the benchmarks' headers."""
    c = choice()
    if c is None:
        return "numba np.dot (SciPy's BLAS)"
    return f"NumPy's BLAS, {c.names[0]} ({c.int_bits}-bit integers)"


def stamp() -> str:
    """The choice exactly (the library file, both symbols, the integer width), for the cache's
    stamp: kernels compiled for one are never loaded under another."""
    c = choice()
    if c is None:
        return "numba np.dot"
    return f"{pathlib.Path(c.path).name}: {c.names[0]}/{c.names[1]} ({c.int_bits}-bit)"
