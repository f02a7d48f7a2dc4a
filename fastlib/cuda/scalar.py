"""The CPU scalar sources of ``fastlib/kernels/scalar.py``, compiled as CUDA device functions.

numba.cuda kernels cannot call the CPU's ``@njit`` scalars, so each recorded source
(``<name>_f``, ``<name>_df``, the sigmoid pair) is compiled again here with
``@cuda.jit(device=True)`` over this module's math shim: the same formulas, term for term, with
no second copy to keep in step. ``ACTIVATIONS`` maps each unary op to its device
``(value, derivative)`` pair; the kernels call them on float64 values (a float32 input is
widened first) and round once when they store. docs/fastlib.md tells the story.
"""
from __future__ import annotations

import builtins
import math
import numbers
import types

from numba import cuda

from fastlib.kernels import scalar as _cpu

_SQRT_HALF = 0.7071067811865476            # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327         # 1 / sqrt(2 pi)
_EXP_OVERFLOW = 709.782712893384           # log(largest float64): exp overflows above it


@cuda.jit(device=True)
def _exp(x):
    # IEEE overflow to +inf, said explicitly: the simulator's math.exp raises instead.
    if x > _EXP_OVERFLOW:
        return math.inf
    return math.exp(x)


@cuda.jit(device=True)
def _like(x, value):
    # The kernels pass float64 arguments, so a float64 constant already has x's type.
    return value


@cuda.jit(device=True)
def _normcdf(x):
    """Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation in the lower tail (unlike 1 + erf)."""
    return 0.5 * math.erfc(-x * _SQRT_HALF)


@cuda.jit(device=True)
def _normpdf(x):
    """phi(x) = exp(-x^2 / 2) / sqrt(2 pi)."""
    return _INV_SQRT_2PI * math.exp(-0.5 * x * x)


#: The device side of the math shim: one entry per name of ``scalar.MATH_SHIM``.
SHIM = {"exp": _exp, "log": math.log, "log1p": math.log1p, "sqrt": math.sqrt,
        "tanh": math.tanh, "normcdf": _normcdf, "normpdf": _normpdf, "like": _like}


def compile_sources(sources, shim, jit, module=__name__):
    """Compile plain Python scalar sources for another target, calling each other there.

    Parameters
    ----------
    sources : dict
        name -> function, as ``fastlib.kernels.scalar.SOURCES``.
    shim : dict
        A callable for every name of ``scalar.MATH_SHIM``, for the target.
    jit : callable
        The target's decorator (``cuda.jit(device=True)``).
    module : str
        The ``__module__`` the compiled copies report.

    Returns
    -------
    dict
        name -> compiled function, one per source.

    Raises
    ------
    ValueError
        ``shim`` does not bind exactly the shim's names, a source is a closure, or a source
        reads a global that is not a shim name, another source, a builtin or a number constant
        (a CPU-only helper would otherwise be compiled into device code, or fail deep inside
        numba).
    """
    if set(shim) != set(_cpu.MATH_SHIM):
        raise ValueError(f"the shim must bind exactly {sorted(_cpu.MATH_SHIM)}, "
                         f"got {sorted(shim)}")
    namespace = {"__name__": module, **shim}
    for name, fn in sources.items():
        if fn.__closure__:
            raise ValueError(f"scalar source {name} is a closure: define it at module level "
                             f"so that every name it reads is a global")
        for ref in fn.__code__.co_names:
            if ref in shim or ref in sources or hasattr(builtins, ref):
                continue
            value = fn.__globals__.get(ref)
            if not isinstance(value, numbers.Real):
                raise ValueError(
                    f"scalar source {name} reads {ref!r}, which has no counterpart on this "
                    f"target: call a name of MATH_SHIM (and bind it in each shim) instead")
            namespace[ref] = value
    compiled = {}
    for name, fn in sources.items():
        copy = types.FunctionType(fn.__code__, namespace, name, fn.__defaults__)
        copy.__qualname__, copy.__doc__ = fn.__qualname__, fn.__doc__
        compiled[name] = namespace[name] = jit(copy)
    return compiled


DEVICE = compile_sources(_cpu.SOURCES, SHIM, cuda.jit(device=True))
globals().update(DEVICE)           # ``from fastlib.cuda.scalar import silu_f`` and the like
sigmoid_pair = DEVICE["_sigmoid_pair"]

#: unary op name -> (value, derivative) device functions; leaky_relu's take the slope second.
ACTIVATIONS = {name[:-2]: (DEVICE[name], DEVICE[name[:-2] + "_df"])
               for name in DEVICE if name.endswith("_f") and name[:-2] + "_df" in DEVICE}

#: The unary ops whose pair takes a parameter (passed as the second argument).
WITH_PARAM = frozenset(name for name, (f, _) in ACTIVATIONS.items()
                       if _cpu.SOURCES[name + "_f"].__code__.co_argcount > 1)
