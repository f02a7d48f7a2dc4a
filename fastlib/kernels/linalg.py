"""matmul: ``a (m, k) @ b (k, n)``, batched with equal batch shapes, or batched against a
shared ``b (k, n)`` (its VJP summed over the batch), through BLAS (Numba's ``np.dot`` calls
SciPy's ``?gemm``).

A shared ``b`` is one GEMM on the batch flattened into rows, ``(B*m, k) @ (k, n)``, and its VJP
``a2.T @ g2`` sums over the batch inside the GEMM. Equal batches loop over the batch in one
kernel call. The VJP uses the transposes as views: BLAS reads them as Fortran-ordered arrays,
so nothing is copied.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _gemm(a, b, out):
    """out = a @ b for 2-D arrays (C- or F-contiguous)."""
    np.dot(a, b, out)


@njit(cache=True, nogil=True)
def _gemm_batched(a, b, out):
    """out[t] = a[t] @ b[t] for 3-D C-contiguous stacks."""
    for t in range(a.shape[0]):
        np.dot(a[t], b[t], out[t])


@njit(cache=True, nogil=True)
def _gemm_batched_nt(g, b, out):
    """out[t] = g[t] @ b[t].T (the VJP of a batched matmul with respect to a)."""
    for t in range(g.shape[0]):
        np.dot(g[t], b[t].T, out[t])


@njit(cache=True, nogil=True)
def _gemm_batched_tn(a, g, out):
    """out[t] = a[t].T @ g[t] (the VJP of a batched matmul with respect to b)."""
    for t in range(a.shape[0]):
        np.dot(a[t].T, g[t], out[t])


def matmul_shape(a_shape, b_shape):
    """The output shape of ``a @ b`` under the contract's rules, or a ValueError saying why."""
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ValueError(f"matmul: both inputs need at least 2 dimensions, got shapes {a_shape} "
                         f"and {b_shape}; reshape a vector v to (1, n) or (n, 1)")
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: a {a_shape} has k={a_shape[-1]} "
                         f"columns but b {b_shape} has {b_shape[-2]} rows")
    if len(b_shape) > 2 and tuple(a_shape[:-2]) != tuple(b_shape[:-2]):
        raise ValueError(f"matmul: batch shapes differ: a {a_shape} and b {b_shape}; use equal "
                         f"batch shapes or a 2-D b (k, n) shared across the batch")
    return tuple(a_shape[:-1]) + (b_shape[-1],)


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
    shape = matmul_shape(a.shape, b.shape)
    out = np.empty(shape, a.dtype)
    if _zero_sized(a, b, out):
        out[...] = 0
        return out
    k = a.shape[-1]
    if b.ndim == 2:
        _gemm(a.reshape(-1, k), b, out.reshape(-1, b.shape[1]))
    else:
        m, n = a.shape[-2], b.shape[-1]
        _gemm_batched(a.reshape(-1, m, k), b.reshape(-1, k, n), out.reshape(-1, m, n))
    return out


def matmul_vjp(a, b, grad):
    """(grad_a, grad_b) of ``a @ b``: ``g @ b^T`` and ``a^T @ g`` (summed over the batch
    for a shared 2-D b)."""
    ga = np.empty(a.shape, a.dtype)
    gb = np.empty(b.shape, a.dtype)
    if _zero_sized(a, b, grad):
        ga[...] = 0
        gb[...] = 0
        return ga, gb
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    if b.ndim == 2:
        a2 = a.reshape(-1, k)
        g2 = grad.reshape(-1, n)
        _gemm(g2, b.T, ga.reshape(-1, k))
        _gemm(a2.T, g2, gb)
    else:
        a3 = a.reshape(-1, m, k)
        b3 = b.reshape(-1, k, n)
        g3 = grad.reshape(-1, m, n)
        _gemm_batched_nt(g3, b3, ga.reshape(-1, m, k))
        _gemm_batched_tn(a3, g3, gb.reshape(-1, k, n))
    return ga, gb
