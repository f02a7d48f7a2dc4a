"""matmul: ``a (m, k) @ b (k, n)``, batched with equal batch shapes, or batched against a
shared ``b (k, n)`` (its VJP summed over the batch), through BLAS.

A shared ``b`` is one GEMM on the batch flattened into rows, ``(B*m, k) @ (k, n)``, and its VJP
``a2.T @ g2`` sums over the batch inside the GEMM. The VJP uses the transposes as views: BLAS
reads them as Fortran-ordered arrays, so nothing is copied.

The long story: docs/fastlib.md, section ``fastlib/kernels/linalg.py``.
"""
from __future__ import annotations

import numpy as np

import optable


def _gemm(a, b, out):
    """out = a @ b (2-D or stacked; C- or F-ordered views), NumPy's BLAS into ``out``."""
    np.matmul(a, b, out=out)


def _zero_sized(*arrays):
    return any(x.size == 0 for x in arrays)


def matmul_forward(a, b):
    """``a @ b`` (2-D, batched, or batched against a shared 2-D ``b``); a new array.

    Parameters
    ----------
    a : ndarray
        (..., m, k), C-contiguous float32 or float64.
    b : ndarray
        (k, n) or (..., k, n) with ``a``'s batch shape; ``a``'s dtype.

    Returns
    -------
    ndarray
        (..., m, n).
    """
    shape = optable.output_shape("matmul", [a.shape, b.shape], {})
    if a.ndim == 2 and b.ndim == 2:
        return np.matmul(a, b)          # the common case, exactly NumPy's call (zeros if k = 0)
    out = np.empty(shape, a.dtype)
    if _zero_sized(a, b, out):
        out[...] = 0
        return out
    k = a.shape[-1]
    if b.ndim == 2:
        _gemm(a.reshape(-1, k), b, out.reshape(-1, b.shape[1]))
    else:
        m, n = a.shape[-2], b.shape[-1]
        _gemm(a.reshape(-1, m, k), b.reshape(-1, k, n), out.reshape(-1, m, n))
    return out


def matmul_vjp(a, b, grad):
    """(grad_a, grad_b) of ``a @ b``: ``g @ b^T`` and ``a^T @ g`` (summed over the batch
    for a shared 2-D b)."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    if b.ndim == 2:
        a2 = a.reshape(-1, k)          # a batch flattened into rows (a view)
        g2 = grad.reshape(-1, n)
        ga = np.matmul(g2, b.T)                      # NumPy's matmul: zeros if n = 0
        gb = np.empty(b.shape, a.dtype)
        _gemm(a2.T, g2, gb)
        return ga.reshape(a.shape), gb
    ga = np.empty(a.shape, a.dtype)
    gb = np.empty(b.shape, a.dtype)
    if _zero_sized(a, b, grad):
        ga[...] = 0
        gb[...] = 0
        return ga, gb
    a3 = a.reshape(-1, m, k)
    b3 = b.reshape(-1, k, n)
    g3 = grad.reshape(-1, m, n)
    _gemm(g3, b3.transpose(0, 2, 1), ga.reshape(-1, m, k))
    _gemm(a3.transpose(0, 2, 1), g3, gb.reshape(-1, k, n))
    return ga, gb
