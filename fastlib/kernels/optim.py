"""The optimizers' compiled update: one fused, in-place, elementwise pass per parameter.

Private kernels work on flat, contiguous arrays of one dtype (float32 or float64) and do not
validate; ``fastlib.optim`` is the public wrapper that checks, allocates and fills the
coefficient record. Clipping helpers (value clamp, float64 sum of squares, finiteness) sit at
the end.

Every optimizer is one *kind* code (its position in the registry) and a coefficient record;
each per-element rule lives once, in ``fastlib.kernels.optim_rules``, and
:func:`update_elements` (generated from the rules) runs it over whole arrays. Both
``fastlib.optim`` and the compiled epochs' skeleton call it, so the two paths run the same
arithmetic in the same order. The long story: docs/fastlib.md, ``fastlib/kernels/optim.py``.
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
from fastlib.kernels import optim_rules as _rules
from fastlib.kernels.switch import compile_switch, switch_source

# ---------------------------------------------------------------------------------------------
# flush-to-zero while a kernel runs
#
# NOTE: the adaptive rules' g * g, and the decaying state of parameters whose gradient is 0
# most of the time (MNIST's border pixels), fall into the subnormal range, where x86 arithmetic
# is ~100 times slower: a batch-1 adaptive update on MNIST ran 7x slower than with subnormals
# off. The optimizer kernels (and the fused epoch) therefore run with the SSE control bits FTZ
# and DAZ set, as ``torch.set_flush_denormal(True)`` does, and restore the caller's bits on return:
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


def _loop_branch(rule):
    # the coefficients read into locals before the loop: the record could alias the arrays as
    # far as the compiler knows, and reloading it every element would block vectorisation;
    # ``range(n)`` keeps the index provably non-negative (no wrap-around checks either)
    return ([f"{f} = c[0][{f!r}]" for f in rule.fields] + ["for i in range(n):"]
            + ["    " + _rules.call_line(rule, lambda x: f"{x}[i]", lambda f: f)])


#: The text of :func:`update_elements`, generated from the rules (docs/fastlib.md shows it).
#: NOTE: no branch raises (a raise inside ``_update_parallel``'s prange would keep the loop
#: serial): a kind outside the registry changes nothing, and ``update_flat`` refuses one.
UPDATE_SOURCE = switch_source("update_elements", "kind, w, g, a, b, c", "kind",
                              _rules.cases(_loop_branch), head=["    n = w.shape[0]"])

#: ``update_elements(kind, w, g, a, b, c)``: one step of optimizer ``kind`` in place on the
#: whole flat arrays (serial), its coefficients the one record of ``c`` (a table of one row,
#: ``table[k:k + 1]``: NOTE a bare record cannot enter a prange region in Numba, an array can);
#: ``a``/``b`` may be empty.
update_elements = compile_switch(UPDATE_SOURCE, "update_elements",
                                 {r: getattr(_rules, r) for r in _rules.SOURCES},
                                 njit(inline="always", error_model="numpy"))


@njit(cache=True, error_model="numpy")
def update_arrays(kind, w, g, a, b, c):
    """Apply one step in place to the whole flat arrays (serial, flush-to-zero on)."""
    old = enter_ftz()
    update_elements(kind, w, g, a, b, c)
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
        update_elements(kind, w[lo:hi], g[lo:hi], a[lo:hi], b[lo:hi], c)
        leave_ftz(old)


def update_flat(kind: int, w: np.ndarray, g: np.ndarray, a: np.ndarray, b: np.ndarray,
                c: np.ndarray) -> None:
    """Apply one step in place to 1-d contiguous arrays of one dtype (no validation here).

    The caller (``fastlib.optim``) guarantees equal sizes, a common float dtype, and ``c`` a
    table of one coefficient record of that dtype; ``a``/``b`` may be empty for kinds without
    them.
    """
    if not 0 <= kind < len(_rules.RULES):
        raise ValueError(f"unknown optimizer kind {kind}: the registry's kinds are "
                         f"0..{len(_rules.RULES) - 1}")
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
