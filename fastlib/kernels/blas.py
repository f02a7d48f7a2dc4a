"""``dot_into(a, b, out)``: the kernels' matrix product ``out = a @ b``, through the BLAS that
:mod:`fastlib.blas_choice` picks.

With NumPy's OpenBLAS found, its ``cblas_sgemm`` / ``cblas_dgemm`` are registered with LLVM
under fixed names (``verigrad_sgemm``, ``verigrad_dgemm``) when this module is imported, and
the kernels call those names: the machine code refers to a symbol, not an address, so Numba's
on-disk cache stays valid in every process. Each operand is passed as it lies in memory (rows
with a leading dimension, or a transposed view) without a copy; an operand of another layout
is refused with a ValueError (no kernel passes one). Without such a library ``dot_into`` is
``np.dot``.
"""
from __future__ import annotations

import numpy as np
from llvmlite import binding as llvm
from numba import njit, types

from fastlib.blas_choice import choice

__all__ = ["dot_into", "CHOICE"]

#: the library the kernels' products call (``blas_choice.choice()`` when this module was
#: imported; None: Numba's ``np.dot``)
CHOICE = choice()

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

if CHOICE is not None:
    llvm.add_symbol("verigrad_sgemm", CHOICE.sgemm)
    llvm.add_symbol("verigrad_dgemm", CHOICE.dgemm)
    _I = types.int64 if CHOICE.int_bits == 64 else types.int32
    _E = types.int32          # CBLAS's enums are C ints
    _P = types.intp           # a data pointer, passed as its address
    _sgemm = types.ExternalFunction("verigrad_sgemm", types.void(
        _E, _E, _E, _I, _I, _I, types.float32, _P, _I, _P, _I, types.float32, _P, _I))
    _dgemm = types.ExternalFunction("verigrad_dgemm", types.void(
        _E, _E, _E, _I, _I, _I, types.float64, _P, _I, _P, _I, types.float64, _P, _I))

    @njit(inline="always")
    def _layout(s0, s1, rows, cols, item):
        """(transpose flag, leading dimension) of a 2-D operand with byte strides ``s0, s1``
        as CBLAS reads it in row-major order, or (0, 0) when neither it nor its transpose has
        unit-stride rows."""
        if s1 == item and s0 % item == 0 and s0 // item >= max(cols, 1):
            return _NO_TRANS, s0 // item
        if s0 == item and s1 % item == 0 and s1 // item >= max(rows, 1):
            return _TRANS, s1 // item
        return 0, 0

    # NOTE: every argument a scalar (addresses and byte strides), so that this compiles once,
    # whatever the operands' array types: typed on arrays, its thirty call sites' layouts took
    # a dozen signatures, each a second of compiling
    @njit(cache=True)
    def _gemm(item, m, n, k, pa, a0, a1, pb, b0, b1, pc, c0, c1):
        if m == 0 or n == 0:
            return
        ta, lda = _layout(a0, a1, m, k, item)
        tb, ldb = _layout(b0, b1, k, n, item)
        to, ldc = _layout(c0, c1, m, n, item)
        if ta == 0 or tb == 0 or to != _NO_TRANS:
            raise ValueError("dot_into: an operand is neither rows with unit stride nor the "
                             "transpose of such (copy it with np.ascontiguousarray first)")
        if item == 4:
            _sgemm(_ROW_MAJOR, ta, tb, m, n, k, np.float32(1.0), pa, lda, pb, ldb,
                   np.float32(0.0), pc, ldc)
        else:
            _dgemm(_ROW_MAJOR, ta, tb, m, n, k, 1.0, pa, lda, pb, ldb, 0.0, pc, ldc)

    @njit(inline="always")
    def dot_into(a, b, out):
        """``out[:] = a @ b`` for 2-D arrays of one float dtype (``out`` with unit-stride rows;
        each operand rows with unit stride, or the transpose of such), by the chosen
        library's ``?gemm``."""
        # NOTE: as np.dot does: ?gemm would read and write past mismatched operands
        if b.shape[0] != a.shape[1] or out.shape[0] != a.shape[0] or \
                out.shape[1] != b.shape[1]:
            raise ValueError("dot_into: incompatible shapes for out = a @ b")
        if a.shape[1] == 0:         # an empty inner dimension: the product is zero
            out[:, :] = 0.0
            return
        _gemm(out.itemsize, a.shape[0], b.shape[1], a.shape[1], a.ctypes.data, a.strides[0],
              a.strides[1], b.ctypes.data, b.strides[0], b.strides[1], out.ctypes.data,
              out.strides[0], out.strides[1])
else:
    @njit(inline="always")
    def dot_into(a, b, out):
        """``out[:] = a @ b``: Numba's ``np.dot`` (no CBLAS of NumPy's was found)."""
        np.dot(a, b, out)
