"""``dot_into(a, b, out)``: the kernels' matrix product ``out = a @ b``, through the BLAS that
:mod:`fastlib.blas_choice` picks.

With NumPy's OpenBLAS found, its ``cblas_sgemm`` / ``cblas_dgemm`` are registered with LLVM
under fixed names (``verigrad_sgemm``, ``verigrad_dgemm``) when this module is imported, and
the kernels call those names: the machine code refers to a symbol, not an address, so Numba's
on-disk cache stays valid in every process. Each operand is passed as it lies in memory (rows
with a leading dimension, or a transposed view) without a copy; an operand of another layout,
or an empty product, goes to ``np.dot``. Without such a library ``dot_into`` is ``np.dot``.
"""
from __future__ import annotations

import numpy as np
from llvmlite import binding as llvm
from numba import njit, types

from fastlib.blas_choice import choice

__all__ = ["dot_into", "USING"]

_CHOICE = choice()
#: what the kernels' products call (``blas_choice.describe``'s words)
USING = "numba np.dot" if _CHOICE is None else f"{_CHOICE.names[0]} ({_CHOICE.path})"

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

if _CHOICE is not None:
    llvm.add_symbol("verigrad_sgemm", _CHOICE.sgemm)
    llvm.add_symbol("verigrad_dgemm", _CHOICE.dgemm)
    _I = types.int64 if _CHOICE.int_bits == 64 else types.int32
    _E = types.int32          # CBLAS's enums are C ints
    _P = types.intp           # a data pointer, passed as its address
    _sgemm = types.ExternalFunction("verigrad_sgemm", types.void(
        _E, _E, _E, _I, _I, _I, types.float32, _P, _I, _P, _I, types.float32, _P, _I))
    _dgemm = types.ExternalFunction("verigrad_dgemm", types.void(
        _E, _E, _E, _I, _I, _I, types.float64, _P, _I, _P, _I, types.float64, _P, _I))

    @njit(inline="always")
    def _operand(a):
        """(transpose flag, leading dimension) of the 2-D ``a`` as CBLAS reads it in row-major
        order, or (0, 0) when neither ``a`` nor its transpose has unit-stride rows."""
        item = a.itemsize
        rows, cols = a.shape
        s0, s1 = a.strides
        if s1 == item and s0 % item == 0 and s0 // item >= max(cols, 1):
            return _NO_TRANS, s0 // item
        if s0 == item and s1 % item == 0 and s1 // item >= max(rows, 1):
            return _TRANS, s1 // item
        return 0, 0

    @njit(inline="always")
    def dot_into(a, b, out):
        """``out[:] = a @ b`` for 2-D arrays of one float dtype (``out`` with unit-stride rows),
        by the chosen library's ``?gemm``."""
        m, k = a.shape
        n = b.shape[1]
        ta, lda = _operand(a)
        tb, ldb = _operand(b)
        to, ldo = _operand(out)
        if m == 0 or n == 0 or k == 0 or ta == 0 or tb == 0 or to != _NO_TRANS:
            np.dot(a, b, out)
            return
        if out.itemsize == 4:
            _sgemm(_ROW_MAJOR, ta, tb, m, n, k, np.float32(1.0), a.ctypes.data, lda,
                   b.ctypes.data, ldb, np.float32(0.0), out.ctypes.data, ldo)
        else:
            _dgemm(_ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb,
                   0.0, out.ctypes.data, ldo)
else:
    @njit(inline="always")
    def dot_into(a, b, out):
        """``out[:] = a @ b``: Numba's ``np.dot`` (no CBLAS of NumPy's was found)."""
        np.dot(a, b, out)
