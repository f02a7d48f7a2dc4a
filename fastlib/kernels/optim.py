"""Numba kernels for the seven optimizers: one fused, in-place, elementwise pass per parameter.

Private kernels work on flat, contiguous arrays of one dtype (float32 or float64) and do not
validate; ``fastlib.optim`` is the public wrapper that checks, allocates and computes the
coefficients. Clipping helpers (value clamp, float64 sum of squares, finiteness) sit at the end.

Every optimizer is one *kind* code and a vector of scalar coefficients; each per-element rule
lives in exactly one place (``_momentum``, ``_adam``, ...), inlined by :func:`update_arrays`,
which both ``fastlib.optim`` and the fused MLP epoch kernel (``fastlib.training.mlp_schedule``)
call, so the two paths run the same arithmetic in the same order.

The long story: docs/fastlib.md, section ``fastlib/kernels/optim.py``.
"""
from __future__ import annotations

import math
import platform

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from fastlib import config

# Kind codes: the index of each optimizer in this tuple (fastlib.optim keys its table by them).
KINDS = ("sgd", "momentum", "nag", "adagrad", "rmsprop", "adam", "adamw")
SGD, MOMENTUM, NAG, ADAGRAD, RMSPROP, ADAM, ADAMW = range(len(KINDS))

# Length of the coefficient vector every kind receives (unused entries are 0).
N_COEFFS = 9


# ---------------------------------------------------------------------------------------------
# flush-to-zero while a kernel runs
#
# NOTE: Adam's and RMSprop's g * g, and the decaying state of parameters whose gradient is 0
# most of the time (MNIST's border pixels), fall into the subnormal range, where x86 arithmetic
# is ~100 times slower: batch-1 Adam on MNIST ran 7x slower than with subnormals off. The
# optimizer kernels (and the fused epoch) therefore run with the SSE control bits FTZ and DAZ
# set, as ``torch.set_flush_denormal(True)`` does, and restore the caller's bits on return:
# results below the smallest normal number (1.2e-38 in float32, 2.2e-308 in float64) become 0.
# That is far below every tolerance of the tests, and it never changes a normal-range result.
# Other processors keep their default (no-op functions below).

_FTZ_DAZ = np.uint32(0x8040)

if platform.machine().lower() in ("x86_64", "amd64"):
    @intrinsic
    def _get_mxcsr(typingctx):
        def codegen(context, builder, sig, args):
            ptr = cgutils.alloca_once(builder, ir.IntType(32))
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.stmxcsr")
            builder.call(fn, [builder.bitcast(ptr, ir.IntType(8).as_pointer())])
            return builder.load(ptr)
        return types.uint32(), codegen

    @intrinsic
    def _set_mxcsr(typingctx, value):
        def codegen(context, builder, sig, args):
            ptr = cgutils.alloca_once(builder, ir.IntType(32))
            builder.store(args[0], ptr)
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.ldmxcsr")
            builder.call(fn, [builder.bitcast(ptr, ir.IntType(8).as_pointer())])
            return context.get_dummy_value()
        return types.void(types.uint32), codegen

    @njit(inline="always")
    def enter_ftz():
        """Set FTZ and DAZ for the calling thread; return the previous control word."""
        old = _get_mxcsr()
        _set_mxcsr(old | _FTZ_DAZ)
        return old

    @njit(inline="always")
    def leave_ftz(old):
        """Restore the control word returned by :func:`enter_ftz`."""
        _set_mxcsr(old)
else:  # pragma: no cover - exercised on non-x86 machines only
    @njit(inline="always")
    def enter_ftz():
        return np.uint32(0)

    @njit(inline="always")
    def leave_ftz(old):
        return None


@njit(inline="always", error_model="numpy")
def _momentum(w, g, a, lr, beta, one_minus_beta):
    a = beta * a + one_minus_beta * g
    return w - lr * a, a


@njit(inline="always", error_model="numpy")
def _nag(w, g, a, lr, beta):
    a = beta * a + lr * g
    return w - lr * g - beta * a, a


@njit(inline="always", error_model="numpy")
def _adagrad(w, g, a, lr, eps):
    a = a + g * g
    return w - lr / math.sqrt(a + eps) * g, a


@njit(inline="always", error_model="numpy")
def _rmsprop(w, g, a, lr, gamma, one_minus_gamma, eps):
    a = gamma * a + one_minus_gamma * (g * g)
    return w - lr / math.sqrt(a + eps) * g, a


@njit(inline="always", error_model="numpy")
def _adam(w, g, m, v, lr, b1, one_minus_b1, b2, one_minus_b2, inv_bc1, inv_bc2, eps, wd):
    m = b1 * m + one_minus_b1 * g
    v = b2 * v + one_minus_b2 * (g * g)
    m_hat = m * inv_bc1
    v_hat = v * inv_bc2
    # NOTE: wd = 0 for Adam; AdamW's decoupled term uses the weight before the step.
    return w - lr * (m_hat / (math.sqrt(v_hat) + eps) + wd * w), m, v


@njit(inline="always", error_model="numpy")
def _update_impl(kind, w, g, a, b, c):
    """Apply one step in place to the whole flat arrays (serial); ``a``/``b`` may be empty.

    NOTE (speed): the coefficients are read into scalars before the loop (``c`` could alias the
    other arrays as far as the compiler knows, and reloading it would block vectorisation), and
    the loop runs over ``range(len)`` so the index is provably non-negative (a ``range(lo, hi)``
    index makes Numba emit wrap-around checks that also block vectorisation).
    """
    c0, c1, c2, c3, c4, c5, c6, c7, c8 = c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]
    n = w.shape[0]
    if kind == SGD:
        for i in range(n):
            w[i] = w[i] - c0 * g[i]
    elif kind == MOMENTUM:
        for i in range(n):
            w[i], a[i] = _momentum(w[i], g[i], a[i], c0, c1, c2)
    elif kind == NAG:
        for i in range(n):
            w[i], a[i] = _nag(w[i], g[i], a[i], c0, c1)
    elif kind == ADAGRAD:
        for i in range(n):
            w[i], a[i] = _adagrad(w[i], g[i], a[i], c0, c1)
    elif kind == RMSPROP:
        for i in range(n):
            w[i], a[i] = _rmsprop(w[i], g[i], a[i], c0, c1, c2, c3)
    else:
        for i in range(n):
            w[i], a[i], b[i] = _adam(w[i], g[i], a[i], b[i], c0, c1, c2, c3, c4, c5, c6, c7, c8)


@njit(cache=True, error_model="numpy")
def update_arrays(kind, w, g, a, b, c):
    """Apply one step in place to the whole flat arrays (serial, flush-to-zero on)."""
    old = enter_ftz()
    _update_impl(kind, w, g, a, b, c)
    leave_ftz(old)


@njit(cache=True, error_model="numpy")
def _update_serial(kind, w, g, a, b, c):
    update_arrays(kind, w, g, a, b, c)


@njit(cache=True, parallel=True, error_model="numpy")
def _update_parallel(kind, w, g, a, b, c, chunks):
    n = w.shape[0]
    size = -(-n // chunks)
    for k in prange(chunks):
        lo, hi = k * size, min(n, (k + 1) * size)
        # empty state arrays stay empty when sliced; each worker thread sets its own FTZ bits
        old = enter_ftz()
        _update_impl(kind, w[lo:hi], g[lo:hi], a[lo:hi], b[lo:hi], c)
        leave_ftz(old)


def update_flat(kind: int, w: np.ndarray, g: np.ndarray, a: np.ndarray, b: np.ndarray,
                c: np.ndarray) -> None:
    """Apply one step in place to 1-d contiguous arrays of one dtype (no validation here).

    The caller (``fastlib.optim``) guarantees equal sizes, a common float dtype, and ``c`` of
    that dtype with :data:`N_COEFFS` entries; ``a``/``b`` may be empty for kinds without them.
    """
    chunks = config.num_chunks(w.shape[0])
    if chunks > 1:
        _update_parallel(kind, w, g, a, b, c, chunks)
    else:
        _update_serial(kind, w, g, a, b, c)


@njit(cache=True, error_model="numpy")
def _clip_value(g, limit):
    for i in range(g.shape[0]):
        if g[i] > limit:
            g[i] = limit
        elif g[i] < -limit:
            g[i] = -limit


@njit(cache=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _sum_squares(g):
    # NOTE: float64 accumulator even for float32 gradients, so the global norm used by
    # clip_mode="norm" is accurate to float64 rounding whatever the parameter count.
    # Reassociation lets the sum vectorise; it changes only the rounding of a sum of
    # non-negative terms (bounded by n * eps64 relative either way), and NaN/Inf still
    # propagate (no "nnan"/"ninf"), which is how callers detect non-finite gradients.
    s = 0.0
    for i in range(g.shape[0]):
        x = np.float64(g[i])
        s += x * x
    return s


@njit(cache=True, error_model="numpy")
def _all_finite(g):
    for i in range(g.shape[0]):
        if not math.isfinite(g[i]):
            return False
    return True


@njit(cache=True, error_model="numpy")
def _scale(g, factor):
    for i in range(g.shape[0]):
        g[i] = g[i] * factor


def clip_value_flat(g: np.ndarray, limit: float) -> None:
    """Clamp every element of the 1-d array ``g`` to ``[-limit, limit]`` in place."""
    _clip_value(g, g.dtype.type(limit))


def sum_squares_flat(g: np.ndarray) -> float:
    """Sum of squares of a 1-d array, accumulated in float64 (non-finite if any element is)."""
    return float(_sum_squares(g))


def all_finite_flat(g: np.ndarray) -> bool:
    """True when every element of the 1-d array ``g`` is finite."""
    return bool(_all_finite(g))


def scale_flat(g: np.ndarray, factor: float) -> None:
    """Multiply the 1-d array ``g`` by ``factor`` in place (in ``g``'s dtype)."""
    _scale(g, g.dtype.type(factor))
