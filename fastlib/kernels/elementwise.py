"""The unary ops over arrays: forward ``y = f(x)``, VJP ``g f'(x)`` and second order ``g f''(x) t``.

One chunk kernel per direction, for every op, maps the op's scalar functions
(``fastlib.kernels.scalar``) over a contiguous slice; a ``prange`` driver splits large arrays
into ``config.num_chunks`` slices. The op's code picks a generated branch, which reads it as a
literal to pick, at compile time, ``<name>_f``, ``<name>_vjp`` where scalar has one (rounded
once) else ``g * <name>_df``, and ``<name>_d2f``. Nothing is written per op: an op of the table
without its scalar functions is an ImportError; a code that is not the table's raises
``ValueError`` (never an identity fallback). docs/fastlib.md has the details.
"""
from __future__ import annotations

import inspect
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

import optable
from fastlib import config
from fastlib.compile_once import compiled_for, native_entry, read_only
from fastlib.kernels import scalar as S
from fastlib.kernels.native_call import call_compiled
from fastlib.kernels.switch import compile_switch, switch_source

_FM = config.FASTMATH

# op name -> code: the op table's stable codes (compiled into the kernels as constants)
UNARY_OPS = optable.names(category="unary")
CODES = optable.codes(UNARY_OPS)
# NOTE: a code the kernels do not know raises (never an identity fallback); the launchers
# check the name first, so this is the message of a direct kernel call with a bad code.
_UNKNOWN = "unknown unary op code (not a code of optable's unary ops):"


# NOTE: the element functions and each op's loop are inlined by LLVM (``scalar.INLINED``), not
# at Numba's IR level, which copied and typed each body again inside every branch: the family's
# kernels compile in a fifth less time, with the same machine loops (the same bits on every op,
# direction and dtype; the same speed)
_ELEMENT_JIT = S.INLINED


def _scalar(name, suffix):
    fn = getattr(S, name + suffix, None)
    if fn is None:
        raise ImportError(f"fastlib.kernels.elementwise: unary op {name!r} of the op table has no "
                          f"scalar function {name}{suffix} in fastlib/kernels/scalar.py")
    return fn


def _elements(name):
    """``(forward(x, p), vjp(x, g, p), hvp(x, g, t, p))`` of op ``name``: its scalar functions,
    each taking the op's param ``p`` last (used by leaky_relu only)."""
    f, df, d2f = (_scalar(name, s) for s in ("_f", "_df", "_d2f"))
    rounded_vjp = getattr(S, name + "_vjp", None)
    inline = njit(**_ELEMENT_JIT)
    if len(inspect.signature(f.py_func).parameters) > 1:
        forward, slope, curve = (inline(lambda x, p: f(x, p)), inline(lambda x, p: df(x, p)),
                                 inline(lambda x, p: d2f(x, p)))
    else:
        forward, slope, curve = (inline(lambda x, p: f(x)), inline(lambda x, p: df(x)),
                                 inline(lambda x, p: d2f(x)))
    vjp = (inline(lambda x, g, p: rounded_vjp(x, g)) if rounded_vjp is not None
           else inline(lambda x, g, p: g * slope(x, p)))
    return forward, vjp, inline(lambda x, g, t, p: g * curve(x, p) * t)


#: code -> the op's element functions (built at import: a missing scalar function fails here).
ELEMENTS = {CODES[n]: _elements(n) for n in UNARY_OPS}


def _element(op, direction):
    """The element function of the literal code ``op`` (None: not a literal yet, or unknown)."""
    if not isinstance(op, types.IntegerLiteral):
        return None
    return ELEMENTS.get(op.literal_value, (None,) * 3)[direction]


def _unknown(op, *arrays):
    raise ValueError(_UNKNOWN, op)


def _map_forward(op, x, out, slope):
    """``out = f(x)`` for the literal code ``op`` (typed by the overload below)."""


@overload(_map_forward, jit_options=_ELEMENT_JIT)
def _map_forward_typed(op, x, out, slope):
    e = _element(op, 0)
    if e is None:
        return _unknown if isinstance(op, types.IntegerLiteral) else None

    def impl(op, x, out, slope):
        for i in range(x.size):
            out[i] = e(x[i], slope)
    return impl


def _map_vjp(op, x, g, out, slope):
    """``out = g f'(x)`` for the literal code ``op``."""


@overload(_map_vjp, jit_options=_ELEMENT_JIT)
def _map_vjp_typed(op, x, g, out, slope):
    e = _element(op, 1)
    if e is None:
        return _unknown if isinstance(op, types.IntegerLiteral) else None

    def impl(op, x, g, out, slope):
        for i in range(x.size):
            out[i] = e(x[i], g[i], slope)
    return impl


def _map_hvp(op, x, g, t, out, slope):
    """``out = g f''(x) t`` for the literal code ``op``."""


@overload(_map_hvp, jit_options=_ELEMENT_JIT)
def _map_hvp_typed(op, x, g, t, out, slope):
    e = _element(op, 2)
    if e is None:
        return _unknown if isinstance(op, types.IntegerLiteral) else None

    def impl(op, x, g, t, out, slope):
        for i in range(x.size):
            out[i] = e(x[i], g[i], t[i], slope)
    return impl


def _family_switch(direction, params):
    """``<direction>_switch(op, params)``: one branch per op of the table, each calling the
    ``_map_<direction>`` overload with its code as a literal, so every branch compiles to the
    op's own loop; True where ``op`` is a code of the table, False (nothing written) else.
    Inlined into the kernels below (generated by ``fastlib.kernels.switch``)."""
    cases = [(code, name, [f"_map_{direction}({code}, {params})", "return True"])
             for name, code in CODES.items()]
    source = switch_source(f"{direction}_switch", f"op, {params}", "op", cases,
                           tail=["    return False"])
    return compile_switch(source, f"{direction}_switch",
                          {"_map_forward": _map_forward, "_map_vjp": _map_vjp,
                           "_map_hvp": _map_hvp},
                          njit(inline="always", error_model="numpy", fastmath=_FM))


_forward_switch = _family_switch("forward", "x, out, slope")
_vjp_switch = _family_switch("vjp", "x, g, out, slope")
_hvp_switch = _family_switch("hvp", "x, g, t, out, slope")


# NOTE: one kernel per direction for every op of the table (compiled once per dtype and
# layout), not one per op: a first run compiles 5 kernels per dtype instead of 5 per op and
# dtype. Each op's branch is its own loop, so the branch is taken once per call, not per
# element, and the loop vectorises as the op's own kernel did.
@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def forward_chunk(op, x, out, slope):
    """``out = f(x)`` for the op of code ``op`` (one chunk, serial)."""
    if not _forward_switch(op, x, out, slope):
        raise ValueError(_UNKNOWN, op)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def vjp_chunk(op, x, g, out, slope):
    """``out = g f'(x)`` for the op of code ``op`` (one chunk, serial)."""
    if not _vjp_switch(op, x, g, out, slope):
        raise ValueError(_UNKNOWN, op)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
def hvp_chunk(op, x, g, t, out, slope):
    """``out = g f''(x) t`` for the op of code ``op`` (one chunk, serial)."""
    if not _hvp_switch(op, x, g, t, out, slope):
        raise ValueError(_UNKNOWN, op)


# NOTE: the split kernels call the chunk kernel by address (``chunk``: its native entry,
# ``fastlib.kernels.native_call``), not the switch inlined: the switch's branches were typed
# and compiled a second time for the parallel loop's body, as long again as the chunk kernel
# itself. The launchers pass only the table's codes (the chunk's raise is never reached).
@njit(cache=True, parallel=True, error_model="numpy")
def forward_split(op, x, out, slope, nchunks, chunk):
    """``forward_chunk`` (its entry ``chunk``) over ``nchunks`` slices in parallel."""
    n = x.size
    for c in prange(nchunks):
        lo, hi = n * c // nchunks, n * (c + 1) // nchunks
        call_compiled(chunk, (op, x[lo:hi], out[lo:hi], slope))


@njit(cache=True, parallel=True, error_model="numpy")
def vjp_split(op, x, g, out, slope, nchunks, chunk):
    """``vjp_chunk`` (its entry ``chunk``) over ``nchunks`` slices in parallel."""
    n = x.size
    for c in prange(nchunks):
        lo, hi = n * c // nchunks, n * (c + 1) // nchunks
        call_compiled(chunk, (op, x[lo:hi], g[lo:hi], out[lo:hi], slope))


#: the launches whose kernel signature this process holds (direction, split, dtype) and, for
#: a split one, the chunk kernel's native entry
_READY = {}

#: direction -> (serial kernel, parallel kernel or None)
KERNELS = {"forward": (forward_chunk, forward_split), "vjp": (vjp_chunk, vjp_split),
           "hvp": (hvp_chunk, None)}


def _forward_chunk(op, x, out, slope):
    """``out = f(x)`` for the op of code ``op`` (one chunk)."""
    forward_chunk(op, x, out, slope)


def _vjp_chunk(op, x, g, out, slope):
    """``out = g f'(x)`` for the op of code ``op`` (one chunk)."""
    vjp_chunk(op, x, g, out, slope)


def _launch(name, what, direction, x, *arrays, negative_slope=0.01):
    """``out`` of op ``name``'s kernel ``direction`` over the flat arrays: one chunk, or
    ``prange``'s chunks where the op has a split kernel for it and the size asks for one."""
    code = optable.code_of(name, "unary", what)
    serial, split = KERNELS[direction]
    out = np.empty_like(x)
    flat = [read_only(a.reshape(-1)) for a in (x, *arrays)] + [out.reshape(-1)]
    nchunks = config.num_chunks(flat[0].size)
    slope = x.dtype.type(negative_slope)
    serial_args = (code, *flat, slope)
    parallel = nchunks > 1 and split is not None  # else no parallel region: no thread hand-off
    # NOTE: a family kernel carries every op's branch (seconds to compile): the first call of
    # each signature goes through compiled_for, so two processes compile it once between them
    key = (direction, parallel, x.dtype.char)
    if key not in _READY:
        entry = native_entry(serial, *serial_args) if parallel else None
        if parallel:
            compiled_for(split, *serial_args, nchunks, entry)
        else:
            compiled_for(serial, *serial_args)
        _READY[key] = entry
    if parallel:
        split(*serial_args, nchunks, _READY[key])
    else:
        serial(*serial_args)
    return out


def unary_forward(name, x, negative_slope=0.01):
    """``name(x)`` for a unary op on a C-contiguous float32/float64 array (new array).

    Parameters
    ----------
    name : str
        One of ``UNARY_OPS``.
    x : ndarray
        C-contiguous float32 or float64 input (validated by ``fastlib.ops``).
    negative_slope : float
        leaky_relu's slope (ignored by the other ops).

    Returns
    -------
    ndarray
        Same shape and dtype as ``x``.
    """
    return _launch(name, "unary_forward", "forward", x, negative_slope=negative_slope)


def unary_vjp(name, x, grad, negative_slope=0.01):
    """``grad * name'(x)`` (the VJP of a unary op) for C-contiguous arrays of one shape/dtype.

    Parameters
    ----------
    name : str
        One of ``UNARY_OPS``.
    x, grad : ndarray
        The op's input and the cotangent of its output (same shape, same dtype).
    negative_slope : float
        leaky_relu's slope (ignored by the other ops).

    Returns
    -------
    ndarray
        The cotangent of ``x``.
    """
    return _launch(name, "unary_vjp", "vjp", x, grad, negative_slope=negative_slope)


def unary_hvp(name, x, grad, tangent, negative_slope=0.01):
    """``grad * name''(x) * tangent``: the derivative of the VJP in direction ``tangent``.

    Parameters
    ----------
    name : str
        One of ``UNARY_OPS``.
    x, grad, tangent : ndarray
        C-contiguous arrays of one shape and dtype.
    negative_slope : float
        leaky_relu's slope (ignored by the other ops).

    Returns
    -------
    ndarray
        The Hessian-vector product of ``<grad, name(x)>`` in direction ``tangent``.
    """
    return _launch(name, "unary_hvp", "hvp", x, grad, tangent, negative_slope=negative_slope)
