"""Exact values and the error measure every check uses.

The oracle is ``spec.evaluate`` at 50 digits: the registry's own forward and VJP formulas (the
ones ``spec.prove`` proves) evaluated in mpmath at the engine's inputs themselves (a float32
input is exactly a float64, so the only error measured is the engine's). Results are kept as
double-double pairs (``hi + lo``, both float64), which carry about 32 digits: enough to measure
a float64 engine's error to a fraction of an ulp without holding mpf arrays.

Evaluations are cached by content (op, params, input and cotangent bytes): the runner draws the
same examples for every engine (one seed), so each exact value is computed once per run. With
``VERIGRAD_CONFORM_CACHE=DIR`` the cache also lives on disk, shared by processes (the mutant
run starts one process per mutant and draws the same examples in each).
"""
from __future__ import annotations

import hashlib
import math
import os
import pickle
from dataclasses import dataclass

import numpy as np

DPS = 50
_MEMORY: dict = {}
CACHE_ENV = "VERIGRAD_CONFORM_CACHE"


@dataclass(frozen=True)
class Exact:
    """Forward and VJPs of one call, as double-double float64 pairs."""

    out: tuple                # (hi, lo)
    grads: tuple              # one (hi, lo) per input, None where not differentiable


def _split(values):
    """An mpf object array as (hi, lo) float64 arrays with hi + lo = value to ~32 digits."""
    flat = np.asarray(values, dtype=object).reshape(-1)
    hi = np.empty(flat.size)
    lo = np.empty(flat.size)
    for i, v in enumerate(flat):
        h = float(v)
        hi[i] = h
        lo[i] = float(v - h) if math.isfinite(h) else 0.0
    shape = np.shape(values)
    return hi.reshape(shape), lo.reshape(shape)


def as_float64(x):
    """Float inputs as float64 (exact for float32); integer class indices unchanged."""
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype.kind == "f" else x


def _key(kind, name, arrays, params):
    h = hashlib.sha1(f"{kind}|{name}|{sorted((params or {}).items())!r}".encode())
    for a in arrays:
        a = np.array(as_float64(a), order="C")  # NOTE: ascontiguousarray makes 0-d arrays 1-d
        h.update(f"|{a.dtype.str}{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _disk_path(key):
    root = os.environ.get(CACHE_ENV)
    return None if not root else os.path.join(root, key[:2], key + ".pkl")


def _cached(key, compute):
    if key in _MEMORY:
        return _MEMORY[key]
    path = _disk_path(key)
    if path and os.path.exists(path):
        try:
            with open(path, "rb") as f:
                value = pickle.load(f)
            _MEMORY[key] = value
            return value
        except (OSError, pickle.UnpicklingError, EOFError):
            pass  # a torn write by another process: recompute
    value = compute()
    _MEMORY[key] = value
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(value, f)
        os.replace(tmp, path)
    return value


def exact_vjp(name, inputs, grad, params=None):
    """Exact forward and VJPs of op ``name`` at ``inputs`` with cotangent ``grad`` (cached).

    Returns
    -------
    Exact
    """
    import spec

    inputs = [as_float64(x) for x in inputs]
    grad = as_float64(grad)

    def compute():
        out, grads = spec.evaluate(name, inputs, grad, params=params or None, dps=DPS)
        return Exact(_split(out), tuple(None if g is None else _split(g) for g in grads))

    return _cached(_key("vjp", name, list(inputs) + [grad], params), compute)


def exact_forward_at(name, inputs, params=None, dps=DPS):
    """The forward of op ``name`` at (possibly out-of-float) mpf inputs, without domain checks.

    Used by the JVP check, whose central differences step a tiny distance off the float grid
    (and, for targets sitting on 0 or 1, a hair outside [0, 1], where the formula is still the
    same analytic expression).
    """
    import mpmath
    import spec
    from spec.backends import MPMATH
    from spec.evaluate import GUARD_DIGITS

    op = spec.OPS[name]
    resolved = op.resolve_params(params)
    with mpmath.workdps(dps + GUARD_DIGITS):
        return np.asarray(op.run_forward(MPMATH, inputs, resolved), dtype=object)


def cached(kind, name, arrays, params, compute):
    """Memoise ``compute()`` under a content key (used for other exact computations)."""
    return _cached(_key(kind, name, arrays, params), compute)


# ---------------------------------------------------------------------------------------------
# the error measure


def norm(x):
    """The 2-norm of ``x`` without overflow or underflow (scaled by its largest entry)."""
    x = np.abs(np.asarray(x, dtype=np.float64)).ravel()
    if x.size == 0:
        return 0.0
    top = float(np.max(x))
    if top == 0.0 or not math.isfinite(top):
        return top
    return top * float(np.sqrt(np.sum((x / top) ** 2)))


@dataclass(frozen=True)
class Measure:
    """One array's error against exact, in units of the dtype's eps.

    ``error`` is ``||got - exact||_2 / (eps * ref)`` and ``bound`` is
    ``||A||_2 / ref`` (plus the underflow allowance), with ``ref = max(||exact||_2, tiny)`` and
    ``A`` the admissible error of each entry in eps units (``bounds``); ``ok`` is
    ``error <= bound``. ``what`` says which array (``"output"``, ``"d/dx"``).
    """

    what: str
    error: float
    bound: float
    ok: bool
    note: str = ""


RESIDUE = 1e-45


def measure(what, got, exact, admissible, dtype, magnitude=0.0):
    """Compare ``got`` with ``exact`` (``(hi, lo)``) under per-entry ``admissible`` error.

    NOTE (underflow): differences below the dtype's smallest normal number ``tiny`` per entry
    are not counted, so an engine that flushes subnormal results to zero passes; every other
    difference counts in full.
    NOTE (oracle residue): an exact 0 computed through intermediate values of size M (a
    one-class cross-entropy: z - logsumexp(z)) comes out of mpmath as ~1e-51 M, the rounding of
    the 70-digit working precision. Differences below ``RESIDUE * M`` per entry (``magnitude``
    = M, the largest input or cotangent entry) are not counted: 1e-45 M is 29 orders below
    eps64 relative to the inputs.
    """
    dtype = np.dtype(dtype)
    hi, lo = exact
    eps = float(np.finfo(dtype).eps)
    tiny = float(np.finfo(dtype).tiny)
    got = np.asarray(got)
    if got.shape != hi.shape:
        return Measure(what, math.inf, 0.0, False,
                       f"{what}: shape {got.shape}, expected {hi.shape}")
    if got.dtype != dtype:
        return Measure(what, math.inf, 0.0, False,
                       f"{what}: dtype {got.dtype}, expected {dtype} (the inputs' dtype)")
    g64 = got.astype(np.float64)
    if not np.all(np.isfinite(g64)):
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(g64))[0])
        return Measure(what, math.inf, 0.0, False,
                       f"{what}: non-finite value {g64[idx]} at index {list(idx)} where the "
                       f"exact value is {hi[idx]!r}")
    diff = (g64 - hi) - lo
    n = max(hi.size, 1)
    num = norm(diff)
    allowed = norm(admissible)
    floor = (tiny + RESIDUE * magnitude) * math.sqrt(n)
    ref = max(norm(hi), tiny)
    error = num / (eps * ref)
    bound = (allowed * eps + floor) / (eps * ref)
    return Measure(what, error, bound, num <= allowed * eps + floor)
