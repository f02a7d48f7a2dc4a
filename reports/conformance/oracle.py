"""Exact values and the error measure every check uses.

The oracle is ``spec.evaluate`` at 50 digits: the registry's own forward and VJP formulas (the
ones ``spec.prove`` proves) evaluated in mpmath at the engine's inputs themselves (a float32
input is exactly a float64, so the only error measured is the engine's). Results are kept as
double-double pairs (``hi + lo``, both float64), which carry about 32 digits: enough to measure
a float64 engine's error to a fraction of an ulp without holding mpf arrays.

Evaluations are cached by content (op, params, input and cotangent bytes), in the process and
on disk (:func:`cache_dir`, shared by processes and kept between runs) in a folder named by a
hash of the referee's code and its libraries' versions (:func:`referee_version`).
"""
from __future__ import annotations

import hashlib
import math
import contextlib
import os
import pathlib
import pickle
import zlib
from dataclasses import dataclass

import numpy as np

DPS = 50
_MEMORY: dict = {}
CACHE_ENV = "VERIGRAD_CONFORM_CACHE"
# the code whose edit may change an exact value: its hash names the cache's folder
_REFEREE_CODE = ("spec", "reflib", "optable", "reports/conformance", "reports/accuracy.py")
_ROOT = pathlib.Path(__file__).resolve().parents[2]
_VERSION: list = []


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


def _key(kind, name, arrays, params):
    h = hashlib.sha1(f"{kind}|{name}|{sorted((params or {}).items())!r}".encode())
    for a in arrays:
        a = np.array(as_float64(a), order="C")  # NOTE: ascontiguousarray makes 0-d arrays 1-d
        h.update(f"|{a.dtype.str}{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def referee_version() -> str:
    """A hash of the referee's code (spec, reflib, optable, the conformance checks and the
    accuracy report's sources) and of the mpmath (with its integer backend: a value pickled
    over GMP's integers needs gmpy2 to load), SymPy, NumPy and Python versions: what an exact
    value may depend on besides its inputs (computed once per process)."""
    if not _VERSION:
        import platform

        import mpmath
        import sympy

        h = hashlib.sha1(f"{DPS}|{mpmath.__version__}|{mpmath.libmp.BACKEND}|"
                         f"{sympy.__version__}|{np.__version__}|"
                         f"{platform.python_version()}".encode())
        for part in _REFEREE_CODE:
            path = _ROOT / part
            files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
            for f in files:
                if not f.is_file():      # a part this installation lacks
                    continue
                h.update(str(f.relative_to(_ROOT)).encode())
                h.update(f.read_bytes())
        _VERSION.append(h.hexdigest()[:16])
    return _VERSION[0]


def cache_dir():
    """The folder of exact values kept between runs, or None (``VERIGRAD_CONFORM_CACHE``).

    ``VERIGRAD_CONFORM_CACHE=DIR`` chooses the parent folder and ``=off`` keeps the values in
    this process only; the default is ``verigrad/exact`` in the user's cache folder
    (``fastlib.datasets.user_cache_dir``). Inside it, one folder per :func:`referee_version`;
    the first call of a process removes the folders of other versions unused for
    :data:`STALE_DAYS` days.
    """
    chosen = os.environ.get(CACHE_ENV, "").strip()
    if chosen.lower() in ("off", "0", "none", "no"):
        return None
    if chosen:
        base = pathlib.Path(chosen).expanduser()
    else:
        from fastlib.datasets import user_cache_dir

        base = user_cache_dir() / "exact"
    if base not in _PRUNED:
        _PRUNED.add(base)
        _prune(base, referee_version())
    return base / referee_version()


#: days after which another version's folder of exact values is removed
STALE_DAYS = 7
_PRUNED: set = set()


def _prune(base, keep):
    """Remove the folders of versions other than ``keep`` under ``base`` not written to for
    :data:`STALE_DAYS` days (a folder in use by another checkout's runs is newer)."""
    import shutil
    import time

    cutoff = time.time() - STALE_DAYS * 86400
    try:
        folders = [f for f in base.iterdir() if f.is_dir() and f.name != keep and
                   len(f.name) == 16 and all(c in "0123456789abcdef" for c in f.name)]
    except OSError:        # no folder yet, or unreadable: nothing to prune
        return
    for folder in folders:
        try:
            newest = max([folder.stat().st_mtime] + [p.stat().st_mtime
                                                     for p in folder.iterdir()])
            if newest < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:    # removed by another process meanwhile
            pass


def _disk_path(key):
    root = cache_dir()
    return None if root is None else os.path.join(root, key[:2], key + ".pkz")


def _cached(key, compute):
    if key in _MEMORY:
        return _MEMORY[key]
    path = _disk_path(key)
    if path and os.path.exists(path):
        try:
            with open(path, "rb") as f:
                value = pickle.loads(zlib.decompress(f.read()))
            _MEMORY[key] = value
            return value
        except Exception:  # noqa: BLE001 - unreadable for any reason: recompute, rewrite
            pass
    value = compute()
    _MEMORY[key] = value
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # NOTE: compressed: a long elementwise case repeats a few values (the special
            # values' 32,805 entries hold 64 distinct pairs), 74 MB of them became 2 MB
            with open(tmp, "wb") as f:
                f.write(zlib.compress(pickle.dumps(value, pickle.HIGHEST_PROTOCOL), 1))
            os.replace(tmp, path)
        except OSError:    # a read-only or full cache folder: the value is still returned
            with contextlib.suppress(OSError):
                os.remove(tmp)
    return value


def as_float64(x):
    """``x`` (floats, or an object array of exact numbers) as a float64 array."""
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype == object else np.asarray(x, dtype=np.float64)


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
        if spec.OPS[name].category == "unary" and grad.size > _DEDUPE_MIN:
            return _unary_by_unique_pairs(name, inputs[0], grad, params)
        out, grads = spec.evaluate(name, inputs, grad, params=params or None, dps=DPS)
        return Exact(_split(out), tuple(None if g is None else _split(g) for g in grads))

    return _cached(_key("vjp", name, list(inputs) + [grad], params), compute)


# A unary op is elementwise: its forward at x and its VJP at (x, g) depend on that element
# alone, so a long call (the special-values table's parallel-size case) is evaluated once per
# distinct (x, g) pair and scattered back: exactly the same values, at a fraction of the cost.
_DEDUPE_MIN = 4096


def representable(examples, dtype):
    """The examples whose exact output and VJPs ``dtype`` holds (an edge draw whose true result
    overflows the dtype asks nothing an engine can answer), and, in a 16-bit format, whose
    inputs cast to it stay in the op's domain (bfloat16's 1 - 2**-20 is 1, outside
    binary_cross_entropy's (0, 1): a case a format cannot express is not one of its cases)."""
    import optable

    big = optable.formats.format_of(dtype).max
    kept = []
    for ex in examples:
        try:
            exact = exact_vjp(ex.name, ex.inputs, ex.grad, ex.params)
        except ValueError:
            if not optable.formats.is_storage(dtype):
                raise      # the float32 and float64 tables are built inside every domain
            continue
        arrays = [exact.out[0]] + [g[0] for g in exact.grads if g is not None]
        if all(np.all(np.abs(v) <= big) for v in arrays):
            kept.append(ex)
    return kept


def _unary_by_unique_pairs(name, x, grad, params):
    import spec

    pairs = np.stack([np.broadcast_to(x, grad.shape).reshape(-1), grad.reshape(-1)], axis=1)
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    out, grads = spec.evaluate(name, [unique[:, 0]], unique[:, 1], params=params or None,
                               dps=DPS)

    def scatter(values, shape):
        hi, lo = _split(values)
        return hi[inverse].reshape(shape), lo[inverse].reshape(shape)

    return Exact(scatter(out, grad.shape),
                 tuple(None if g is None else scatter(g, np.shape(x)) for g in grads))


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
    """One array's error against exact, judged element by element (``bounds.entrywise``).

    The figures are those of the *worst* element (largest error / allowed ratio): ``error`` and
    ``bound`` in ULPs of the exact value there (``unit == "ulp"``), or, where the exact value is
    0, the absolute error and the absolute bound (``unit == "abs"``: a relative measure of an
    exact zero means nothing). ``index``, ``got`` and ``exact`` say which element and what the
    engine and the oracle gave; ``abs_error`` / ``abs_bound`` are the same element's absolute
    figures, ``failing`` how many elements exceed their bound, ``ok`` whether none does.
    """

    what: str
    error: float
    bound: float
    ok: bool
    note: str = ""
    unit: str = "eps"         # "ulp", "abs" (entrywise measures) or "eps" (normwise ones)
    index: tuple = None
    got: float = None
    exact: float = None
    abs_error: float = None
    abs_bound: float = None
    failing: int = 0
    size: int = 0
    where: str = ""

    def element(self):
        """The worst element as a line of text.

        ``"d/dx[1, 0] at x = 0.0, grad = 1.0: engine 0.5, exact 0.0, absolute error 0.5 >
        bound 2.2e-308 (exact 0)"``.
        """
        idx = "" if self.index is None else "[" + ", ".join(str(i) for i in self.index) + "]"
        if self.unit == "abs":
            err = f"absolute error {self.abs_error:.3g} > bound {self.abs_bound:.3g} (exact 0)"
        else:
            err = f"error {_fmt_count(self.error)} ulp > bound {_fmt_count(self.bound)} ulp"
        if self.ok:
            err = err.replace(" > ", " <= ")
        many = f" ({self.failing} of {self.size} elements out of bound)" if self.failing > 1 \
            else ""
        at = f" at {self.where}" if self.where else ""
        return (f"{self.what}{idx}{at}: engine {self.got!r}, exact {self.exact!r}, {err}{many}")


def _fmt_count(x):
    return "inf" if not math.isfinite(x) else (f"{x:.3g}" if x < 1e6 else f"{x:.2e}")


def measure(what, got, exact, admissible, dtype, magnitude=0.0):
    """Compare ``got`` with ``exact`` (``(hi, lo)``) element by element.

    Each element must be within its own bound (``bounds.entrywise``: ``eps * A_i`` plus the
    dtype's underflow floor, never a floor scaled by another entry). The returned
    :class:`Measure` describes the worst element. ``magnitude`` is accepted for compatibility
    and unused.
    """
    from reports.conformance.bounds import entrywise, ulp

    dtype = np.dtype(dtype)
    hi, lo = exact
    got = np.asarray(got)
    if got.shape != hi.shape:
        return Measure(what, math.inf, 0.0, False,
                       f"{what}: shape {got.shape}, expected {hi.shape}")
    if got.dtype != dtype:
        return Measure(what, math.inf, 0.0, False,
                       f"{what}: dtype {got.dtype}, expected {dtype} (the inputs' dtype)")
    g64 = got.astype(np.float64)
    if hi.size == 0:
        return Measure(what, 0.0, 0.0, True, size=0)
    error, allowed, ok = entrywise(g64, hi, lo, admissible, dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(error == 0, 0.0, error / allowed)
    flat = int(np.argmax(np.where(np.isnan(ratio), np.inf, ratio).reshape(-1)))
    if not np.any(error):
        flat = 0
    idx = tuple(int(i) for i in np.unravel_index(flat, hi.shape))
    e, a, h = float(error[idx]), float(allowed[idx]), float(hi[idx])
    if h == 0.0 or not math.isfinite(h):
        unit, err_u, bound_u = "abs", e, a
    else:
        step = float(ulp(h, dtype))
        unit, err_u, bound_u = "ulp", e / step, a / step
    failing = int(np.sum(~ok))
    m = Measure(what, err_u, bound_u, failing == 0, "", unit, idx, float(g64[idx]), h, e, a,
                failing, int(hi.size))
    if not m.ok and not math.isfinite(float(g64[idx])):
        m = Measure(what, math.inf, bound_u, False,
                    f"{what}: non-finite value {float(g64[idx])} at index {list(idx)} where "
                    f"the exact value is {h!r}", unit, idx, float(g64[idx]), h, e, a, failing,
                    int(hi.size))
    return m
