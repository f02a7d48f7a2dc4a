"""Gradient accuracy: every op's VJP, per engine and dtype, held against exact values.

Each VJP element of sampled and special cases is compared with spec's exact value at 50 digits
(ULP and relative error, correct rounding, conditioning), beside the floor of a correctly
rounded answer and finite differences; the result is one JSON-ready dict for the renderers.

The long story: docs/reports-accuracy.md, section ``reports/accuracy.py``.
"""
from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.metadata
import math
import platform
import sys
import time
import warnings
import zlib
from dataclasses import dataclass, field

import mpmath
import numpy as np

import optable

SCHEMA_VERSION = 1
SOURCES = ("uniform", "log_uniform", "special")
DTYPES = ("float32", "float64")            # the default; --dtypes takes every format:
FORMATS_ALL = optable.formats.names()      # float64 float32 bfloat16 float16
STORAGE = optable.formats.STORAGE          # measured on cases rounded to the format
DPS = 50                                     # digits of the exact values
MAX_DPS = 1600                               # the most digits for kappa's evaluations
KAPPA_AGREEMENT_DIGITS = 20                  # kappa's precision must reproduce this many

# NOTE: float formats as (precision in bits, minimum normal exponent).
FORMATS = {"float32": (24, -126), "float64": (53, -1022)}

DEFAULT_SAMPLES = 40                         # random cases per random source and op
QUICK_SAMPLES = 6
DEFAULT_FD_STEPS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8)
QUICK_FD_STEPS = (1e-2, 1e-4, 1e-6)
DEFAULT_FD_CASES = 16                        # FD runs on the first cases of each source only
QUICK_FD_CASES = 3
FD_MAX_ENTRIES = 64                          # larger inputs are not differenced
LOG_MAGNITUDES = (-6.0, 2.0)                 # log10 range of the log-uniform source
GRAD_RANGE = 1.0                             # cotangents are U(-1, 1), rounded to float32

# An element is well conditioned when kappa <= KAPPA_WELL: a backward-stable algorithm then
# errs by at most a few units of kappa/2 ULPs, so "a few ULPs" is a fair demand there.
KAPPA_WELL = 8.0
# NOTE: kappa comes from one-sided differences of the exact VJP at relative step 2**-28: inputs
# are float32 numbers (24 bits), so z (1 ± 2**-28) is exact in float64 and the registry's
# formulas take it as it is; the truncation error (~4e-9 relative) is invisible in a condition
# number reported to two digits.
KAPPA_STEP = 2.0 ** -28
KAPPA_MAX_ENTRIES = 48                       # above: kappa from random directions
KAPPA_DIRECTIONS = 3

FEW_ULPS = 4.0                               # the float64 bar: max ULP on well-conditioned
REGRESSION_FACTOR = 2.0                      # --baseline flags growth beyond this factor
REGRESSION_FLOOR_ULP = 0.5                   # baselines below half an ULP count as half an ULP

# Ops whose VJP is exact or a single rounding of exact operands on the sampled cases, so an
# engine can return the correctly rounded value on every element (the bar asks for it there).
# NOTE: binary ops are left out (a broadcast operand's VJP is a sum), and so is leaky_relu
# (its float64 slope 0.01 is not a float32 number, so float32 engines round it first).
SINGLE_ROUNDING_OPS = optable.names(single_rounding=True)     # the op table's flag

# Histogram of ULP errors: exact zeros, then these edges, then infinite errors.
HIST_EDGES = tuple([0.0] + [10.0 ** (k / 2) for k in range(-6, 35)] + [math.inf])
# Input-magnitude bins (|z| of the differentiated element): zero, then decades.
MAGNITUDE_EDGES = tuple([0.0] + [10.0 ** k for k in range(-6, 4)] + [math.inf])


# ---------------------------------------------------------------------------------------------
# configuration

@dataclass(frozen=True)
class Config:
    """What to measure. ``ops=None`` means every registry op; ``fd_steps=()`` skips FD."""

    samples: int = DEFAULT_SAMPLES
    ops: tuple | None = None
    dtypes: tuple = DTYPES
    seed: int = 0
    fd_steps: tuple = DEFAULT_FD_STEPS
    fd_cases: int = DEFAULT_FD_CASES
    sources: tuple = SOURCES
    quick: bool = False
    second_order: bool = False     # also each engine's JVP and HVP in ULPs (slower)

    @classmethod
    def quick_config(cls, **overrides):
        """The ``--quick`` configuration (few samples, three FD steps), with overrides."""
        base = dict(samples=QUICK_SAMPLES, fd_steps=QUICK_FD_STEPS, fd_cases=QUICK_FD_CASES,
                    quick=True)
        base.update(overrides)
        return cls(**base)

    def validate(self):
        """Check every field; ``ValueError`` names the bad one and what is accepted."""
        import spec
        from spec.errors import did_you_mean

        if not isinstance(self.samples, int) or isinstance(self.samples, bool) \
                or self.samples < 1:
            raise ValueError(f"samples must be an int >= 1; got {self.samples!r}")
        for d in self.dtypes:
            if d not in FORMATS_ALL:
                raise ValueError(f"unknown dtype {d!r}{did_you_mean(str(d), FORMATS_ALL)} "
                                 f"(dtypes: {', '.join(FORMATS_ALL)})")
        if not self.dtypes:
            raise ValueError("dtypes is empty; pass float32 and/or float64")
        for s in self.sources:
            if s not in SOURCES:
                raise ValueError(f"unknown source {s!r}{did_you_mean(str(s), SOURCES)} "
                                 f"(sources: {', '.join(SOURCES)})")
        for name in self.ops or ():
            if name not in spec.OPS:
                raise ValueError(f"unknown op {name!r}{did_you_mean(str(name), spec.OPS)} "
                                 f"(`verigrad spec --list` lists all {len(spec.OPS)})")
        for h in self.fd_steps:
            if not (isinstance(h, (int, float)) and 0 < h < 1):
                raise ValueError(f"finite-difference steps must be in (0, 1); got {h!r}")
        if not isinstance(self.fd_cases, int) or self.fd_cases < 0:
            raise ValueError(f"fd_cases must be an int >= 0; got {self.fd_cases!r}")
        return self

    def to_json(self):
        """The configuration as it is written into report.json."""
        return {"samples": self.samples, "ops": list(self.ops) if self.ops else None,
                "dtypes": list(self.dtypes), "seed": self.seed,
                "fd_steps": list(self.fd_steps), "fd_cases": self.fd_cases,
                "sources": list(self.sources), "quick": self.quick,
                "second_order": self.second_order, "dps": DPS,
                "kappa_well": KAPPA_WELL, "log_magnitudes": list(LOG_MAGNITUDES)}


# ---------------------------------------------------------------------------------------------
# number formats

def spacing(x, fmt):
    """The ULP of ``fmt`` at |x|: 2**(max(floor(log2|x|), emin) - p + 1), elementwise.

    ``x`` is a float64 array (the exact values, rounded); zero and subnormals get the
    subnormal spacing. Infinite entries give inf. The conformance suite's ``bounds.ulp``:
    one definition for both.
    """
    from reports.conformance.bounds import ulp

    return ulp(x, np.dtype(fmt))


def _as_f32_values(a):
    """Float arrays rounded to float32 (held as float64); integer arrays unchanged."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        return a.astype(np.float32).astype(np.float64)
    return a


# ---------------------------------------------------------------------------------------------
# cases

@dataclass
class Case:
    """One draw: inputs (float64 arrays; int64 class indices), params, the cotangent.

    ``dtypes`` are the dtypes the case is measured in: random cases hold float32 numbers and
    serve both; a special value meant for float64 only (1e-150) serves float64 alone.
    """

    source: str
    inputs: list
    params: dict
    grad: np.ndarray
    dtypes: tuple = DTYPES
    label: str = ""


def op_rng(seed, name):
    """A Generator for op ``name``: the same cases whichever other ops are measured."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def _output_shape(op, inputs, params):
    return tuple(op.check_shapes([np.shape(a) for a in inputs], params))


def _with_grad(op, source, inputs, params, rng):
    shape = _output_shape(op, inputs, params)
    grad = _as_f32_values(rng.uniform(-GRAD_RANGE, GRAD_RANGE, size=shape))
    return Case(source, [_as_f32_values(a) for a in inputs], dict(params), grad)


def _log_uniform(domain, shape, rng):
    """Magnitudes 10**U(LOG_MAGNITUDES) in ``domain``; None for domains kept as drawn."""
    mags = 10.0 ** rng.uniform(*LOG_MAGNITUDES, size=shape)
    if domain in ("real", "nonzero"):
        return mags * rng.choice([-1.0, 1.0], size=shape)
    if domain == "positive":
        return mags
    if domain == "unit_open":
        # Near 0 or near 1, on a log scale from 1e-6 to 1/2.
        t = 10.0 ** rng.uniform(-6.0, math.log10(0.5), size=shape)
        return np.where(rng.random(size=shape) < 0.5, t, 1.0 - t)
    return None     # unit_closed, distribution, class_index: the uniform draw is kept


def in_format(op, case, dtype):
    """A random case rounded to the 16-bit ``dtype`` (a case of that format alone).

    The same draw, every float input and the cotangent rounded to the format once; a
    probability kept inside (0, 1) and a distribution row made exact in the format
    (``strategies.representable``), so the format's case stays in the op's domain.
    """
    from reports.conformance.strategies import representable

    fmt = optable.formats.format_of(dtype)
    inputs = []
    for name, x in zip(op.inputs, case.inputs):
        domain = op.domains[name]
        if domain == "class_index":
            inputs.append(x)
            continue
        x = representable(x, domain, dtype)
        if domain == "unit_open":
            x = np.clip(x, fmt.smallest_subnormal, 1.0 - fmt.unit_roundoff)
        inputs.append(_rounded_to(x, dtype))
    return Case(case.source, inputs, dict(case.params), _rounded_to(case.grad, dtype), (dtype,),
                case.label)


def _rounded_to(a, dtype):
    """Float values rounded to ``dtype`` once (held as float64); exact from float32."""
    a = np.asarray(a, dtype=np.float64)
    return a.astype(np.float32).astype(optable.formats.dtype_of(dtype)).astype(np.float64)


def draw_cases(name, samples, rng, sources=SOURCES, dtypes=DTYPES):
    """The cases of op ``name``: ``samples`` per random source, then the special values.

    Parameters
    ----------
    name : str
        A registry op.
    samples : int
        Draws per random source (``uniform``, ``log_uniform``).
    rng : numpy.random.Generator
        The source of randomness.
    sources : sequence of str
        Which of ``SOURCES`` to draw from.
    dtypes : sequence of str
        The dtypes measured. Random draws hold float32 numbers and serve float32 and float64;
        each 16-bit format gets the same draws rounded to it (``in_format``), after them.

    Returns
    -------
    list of Case
        Uniform cases first, then log-uniform, their copies in each 16-bit format, then
        special (in the table's order).
    """
    import spec

    op = spec.OPS[name]
    cases = []
    if "uniform" in sources:
        for _ in range(samples):
            inputs, params = spec.sample_case(name, rng)
            cases.append(_with_grad(op, "uniform", inputs, params, rng))
    if "log_uniform" in sources:
        for _ in range(samples):
            inputs, params = spec.sample_case(name, rng)
            for i, iname in enumerate(op.inputs):
                drawn = _log_uniform(op.domains[iname], np.shape(inputs[i]), rng)
                if drawn is not None:
                    inputs[i] = np.asarray(drawn, dtype=np.float64)
            cases.append(_with_grad(op, "log_uniform", inputs, params, rng))
    drawn = list(cases)
    for dtype in (d for d in dtypes if d in STORAGE):
        cases.extend(in_format(op, c, dtype) for c in drawn)
    if "special" in sources:
        cases.extend(special_cases(name, dtypes))
    return cases


def special_cases(name, dtypes=DTYPES):
    """The special-values cases of op ``name``, from the conformance suite's table.

    ``reports.conformance.special_values`` lists saturation, extreme logits, tiny and huge
    magnitudes, zeros, kinks, ties, long reductions and a zero cotangent, per dtype. A case of
    the float32 list holds float32 numbers and serves both dtypes; a float64 case that is not
    also in the float32 list (1e-150 where float32 has 1e-15) serves float64 only; the list of
    each 16-bit format in ``dtypes`` serves that format alone. Empty when the table is not
    installed (the report's notes then say so).
    """
    try:
        from reports.conformance import special_values
    except ImportError:
        return []
    out, seen = [], set()
    # the float32 list first: its cases serve float64 too; each 16-bit format its own cases
    for dtype in DTYPES + tuple(d for d in dtypes if d in STORAGE):
        for ex in special_values.special_cases(name, optable.formats.dtype_of(dtype)):
            inputs = [np.asarray(x).astype(np.float64)
                      if optable.formats.is_float(np.asarray(x).dtype) else np.asarray(x)
                      for x in ex.inputs]
            key = (dtype in STORAGE and dtype, ex.label, repr(sorted(ex.params.items())),
                   tuple((a.shape, a.tobytes()) for a in inputs))
            if key in seen:
                continue
            seen.add(key)
            serves = DTYPES if dtype == "float32" else (dtype,)
            out.append(Case("special", inputs, dict(ex.params),
                            np.asarray(ex.grad).astype(np.float64), serves, ex.label))
    return out


# ---------------------------------------------------------------------------------------------
# exact values

@dataclass
class ExactTable:
    """Every differentiable VJP element of an op's cases, flattened in one order.

    Order: case by case; within a case, input by input (registry order, differentiable ones
    only); within an input, C order. ``slices[c][k]`` locates case c's input k.
    """

    op: str
    cases: list
    inputs: tuple                 # differentiable input positions
    slices: list                  # per case: {input position: slice}
    hi: np.ndarray                # exact value, rounded to float64
    lo: np.ndarray                # exact - hi, rounded to float64
    r32: np.ndarray               # exact value, correctly rounded to float32 (as float64)
    kappa: np.ndarray             # componentwise relative condition number
    magnitude: np.ndarray         # |input element| the VJP element belongs to
    source: np.ndarray            # the case's source, per element
    case_index: np.ndarray
    applies: dict                 # dtype -> bool per element: its case is measured in dtype
    exact: list                   # mpf values (for the worst-element details)
    rejected: list = field(default_factory=list)   # (source, reason) of cases spec rejected
    # each element's admissible error in eps units: the conformance suite's bound
    # (reports.conformance.bounds.admissible), judged by the same rule (bounds.entrywise)
    admissible: np.ndarray = None
    exacts: list = field(default_factory=list)    # per case: its oracle.Exact (both halves)
    nearest: dict = field(default_factory=dict)   # 16-bit format -> the floor, when first asked

    @property
    def size(self):
        return int(self.hi.size)

    def floor(self, dtype):
        """The best possible answer in ``dtype``: the exact value correctly rounded."""
        if dtype == "float32":
            return self.r32
        if dtype in STORAGE:
            if dtype not in self.nearest:
                self.nearest[dtype] = format_nearest(self.hi, self.lo, dtype)
            return self.nearest[dtype]
        return self.hi

    def flatten(self, case_index, grads, out):
        """Write engine results ``grads`` (one per input) of case ``case_index`` into ``out``."""
        for k, sl in self.slices[case_index].items():
            out[sl] = np.asarray(grads[k], dtype=np.float64).reshape(-1)


def exact_grads(name, inputs, grad, params):
    """The exact VJPs of one case as double-double pairs: ``[(hi, lo) or None, ...]``.

    From the conformance suite's oracle (``spec.evaluate`` at 50 digits, cached by content,
    so the special values it already evaluated cost nothing here). NOTE: spec.evaluate raises
    its working precision until the answer stops moving (``spec.precision``), so cancellations
    such as 1 - tanh(80)**2 come back right; hi + lo holds about 32 of those digits.
    """
    from reports.conformance.oracle import exact_vjp

    return list(exact_vjp(name, inputs, grad, params).grads)


def _mpf_array(a):
    """An object array of mpf holding the float64 (or int) entries of ``a`` exactly."""
    a = np.asarray(a)
    out = np.empty(a.shape, dtype=object)
    kind_int = a.dtype.kind in "iu"
    out.reshape(-1)[:] = [mpmath.mpf(int(v) if kind_int else float(v)) for v in a.reshape(-1)]
    return out


class _Formulas:
    """The registry's VJP formulas of one case, evaluated directly at a chosen precision.

    For the condition numbers: dozens of perturbed evaluations per case, each at the working
    precision at which the unperturbed VJP already matches ``spec.evaluate`` (the perturbed
    inputs differ by 2**-28 relative, so they cancel no deeper). This skips spec.evaluate's
    per-call validation and its precision search, which dominate the cost.
    """

    def __init__(self, op, case):
        from spec.backends import MPMATH

        self.op, self.case, self.M = op, case, MPMATH
        self.params = op.resolve_params(case.params)
        self.wp = None

    def vjp(self, inputs, grad):
        values = [np.asarray(x).astype(np.int64) if self.op.domains[n] == "class_index"
                  else _mpf_array(x) for n, x in zip(self.op.inputs, inputs)]
        with mpmath.workdps(self.wp):
            result = np.asarray(self.op.run_forward(self.M, values, self.params), dtype=object)
            return self.op.run_vjp(self.M, values, self.params, result, _mpf_array(grad))

    def settle(self, exact):
        """Find a working precision whose unperturbed VJP agrees with ``exact``; or None."""
        wp = DPS
        while wp <= MAX_DPS:
            self.wp = wp
            got = self.vjp(self.case.inputs, self.case.grad)
            if all(e is None or _agree(g, e, KAPPA_AGREEMENT_DIGITS, wp)
                   for g, e in zip(got, exact)):
                return wp
            wp *= 2
        self.wp = None
        return None


def _agree(a, b, digits, wp):
    """True when ``a`` (computed at ``wp`` digits) matches exact ``b`` to ``digits`` digits.

    An exact zero is matched by rounding noise below the array's scale times 10**(10 - wp)
    (a sum that cancels exactly leaves such noise at any finite precision).
    """
    tol = mpmath.mpf(10) ** -digits
    fa = np.asarray(a, dtype=object).reshape(-1)
    fb = np.asarray(b, dtype=object).reshape(-1)
    if fb.size == 0:
        return True
    noise = max(abs(y) for y in fb) * mpmath.mpf(10) ** (10 - wp)
    return all(abs(x - y) <= (tol * abs(y) if y != 0 else noise) for x, y in zip(fa, fb))


def _toward_interior(op, name, x, moved, other):
    """``moved`` where it stays in input ``name``'s domain, else ``other`` (the other side)."""
    from spec import domains

    outside = domains.out_of_domain(op.domains[name], moved)
    return np.where(outside, other, moved) if np.any(outside) else moved


def _perturbable(op, case):
    """How many non-zero float entries (inputs and cotangent) a case has."""
    arrays = [x for n, x in zip(op.inputs, case.inputs) if op.domains[n] != "class_index"]
    return sum(int(np.count_nonzero(a)) for a in arrays + [case.grad])


def _numerators_by_entry(f, exact):
    """sum_j |v_i(z + h z_j e_j) - v_i(z)| / h over every non-zero float entry z_j."""
    op, case = f.op, f.case
    num = {k: np.zeros(np.shape(g), dtype=object) for k, g in enumerate(exact) if g is not None}
    floats = [k for k, n in enumerate(op.inputs) if op.domains[n] != "class_index"]
    for k in floats + [None]:
        arr = np.asarray(case.grad if k is None else case.inputs[k], dtype=np.float64)
        for j in np.flatnonzero(arr.reshape(-1)):
            up, down = arr.copy(), arr.copy()
            up.reshape(-1)[j] *= 1 + KAPPA_STEP
            down.reshape(-1)[j] *= 1 - KAPPA_STEP
            inputs, grad = list(case.inputs), case.grad
            if k is None:
                grad = up
            else:
                inputs[k] = _toward_interior(op, op.inputs[k], arr, up, down)
            _add_moves(num, f.vjp(inputs, grad), exact)
    return num


def _numerators_by_directions(f, exact):
    """The numerators from KAPPA_DIRECTIONS random-sign moves of every entry at once.

    NOTE: for large cases (the 4096-entry long reductions) one evaluation per entry is too
    slow. Each direction moves every entry z_j to z_j (1 ± KAPPA_STEP), signs at random
    (flipped where the step would leave the domain); the largest |dv_i| / KAPPA_STEP over the
    directions stands for sum_j |dv_i/dz_j| |z_j|: a lower estimate, exact when each v_i depends
    on one entry or all its terms move together.
    """
    op, case = f.op, f.case
    rng = np.random.default_rng(0)
    num = {k: np.zeros(np.shape(g), dtype=object) for k, g in enumerate(exact) if g is not None}
    for _ in range(KAPPA_DIRECTIONS):
        inputs = list(case.inputs)
        for k, n in enumerate(op.inputs):
            if op.domains[n] != "class_index":
                x = np.asarray(case.inputs[k], dtype=np.float64)
                signs = rng.choice([-1.0, 1.0], size=x.shape)
                inputs[k] = _toward_interior(op, n, x, x * (1 + signs * KAPPA_STEP),
                                             x * (1 - signs * KAPPA_STEP))
        grad = case.grad * (1 + rng.choice([-1.0, 1.0], size=np.shape(case.grad)) * KAPPA_STEP)
        _add_moves(num, f.vjp(inputs, grad), exact, keep_max=True)
    return num


def _add_moves(num, grads, exact, keep_max=False):
    """Add |grads - exact| / KAPPA_STEP into ``num`` (or keep the larger with ``keep_max``)."""
    scale = mpmath.mpf(1) / KAPPA_STEP
    for k in num:
        move = np.asarray(np.abs(np.asarray(grads[k], dtype=object) - exact[k]) * scale,
                          dtype=object)
        num[k] = np.where(move > num[k], move, num[k]) if keep_max else num[k] + move


def _condition_numbers(op, case, exact):
    """kappa per differentiable input element: sum_j |d v_i / d z_j| |z_j| / |v_i|.

    z runs over every float input entry and every cotangent entry. Each derivative is a
    one-sided difference z_j -> z_j (1 ± KAPPA_STEP), toward the domain's interior. A zero v_i
    with a non-zero numerator gives inf (a point where the VJP cancels exactly: singular for any
    floating-point algorithm); a kink or tie crossed by the step gives a huge kappa (about
    1 / KAPPA_STEP). NaN where no working precision up to MAX_DPS reproduces the exact value.

    Returns
    -------
    dict
        input position -> float64 array of kappa, shaped like that input.
    """
    if op.category == "unary":
        distinct = _distinct_unary(case, exact)
        if distinct is not None:
            sub_case, sub_exact, inverse = distinct
            kappa = _condition_numbers(op, sub_case, sub_exact)
            return {k: v.reshape(-1)[inverse].reshape(np.shape(exact[k]))
                    for k, v in kappa.items()}
    f = _Formulas(op, case)
    diff = [k for k, g in enumerate(exact) if g is not None]
    if f.settle(exact) is None:
        return {k: np.full(np.shape(exact[k]), np.nan) for k in diff}
    with mpmath.workdps(f.wp):
        if op.category != "unary" and _perturbable(op, case) > KAPPA_MAX_ENTRIES:
            num = _numerators_by_directions(f, exact)
        elif op.category == "unary":
            # NOTE: a unary op is elementwise (v_i depends on x_i and grad_i only), so moving
            # every x at once gives every |dv_i/dx_i| |x_i|; the cotangent's share is |v_i|
            # itself, since v_i = grad_i f'(x_i) is linear in grad_i.
            x = np.asarray(case.inputs[0], dtype=np.float64)
            moved = _toward_interior(op, op.inputs[0], x, x * (1 + KAPPA_STEP),
                                     x * (1 - KAPPA_STEP))
            num = {0: np.zeros(np.shape(exact[0]), dtype=object)}
            _add_moves(num, f.vjp([moved], case.grad), exact)
            num[0] = num[0] + np.abs(exact[0])
        else:
            num = _numerators_by_entry(f, exact)
        kappa = {}
        for k in diff:
            v = np.asarray(np.abs(exact[k]), dtype=object).reshape(-1)
            n = np.asarray(num[k], dtype=object).reshape(-1)
            kappa[k] = np.array([0.0 if nk == 0 else (math.inf if vk == 0 else float(nk / vk))
                                 for nk, vk in zip(n, v)],
                                dtype=np.float64).reshape(np.shape(exact[k]))
    return kappa


def _distinct_unary(case, exact):
    """A unary case reduced to its distinct (x, cotangent) pairs, or None if all differ.

    NOTE: a unary op's VJP element depends on its own x and cotangent only, and so does its
    condition number, so a long case that repeats a short period (the special values' long
    elementwise case: 32,805 elements, 64 distinct pairs) is measured once per distinct pair
    and scattered back; the same numbers at a five-hundredth of the cost. Pairs are compared
    by their bits (-0.0 and 0.0 stay apart).

    Returns
    -------
    (Case, list, numpy.ndarray) or None
        The case of the distinct pairs (1-D), their exact VJPs, and the index of each original
        element's pair.
    """
    x = np.asarray(case.inputs[0], dtype=np.float64).reshape(-1)
    g = np.asarray(case.grad, dtype=np.float64).reshape(-1)
    if x.size != g.size or x.size < 2:
        return None
    bits = np.stack([x.view(np.int64), g.view(np.int64)], axis=1)
    _, first, inverse = np.unique(bits, axis=0, return_index=True, return_inverse=True)
    if first.size == x.size:
        return None
    sub = Case(case.source, [x[first].copy()], dict(case.params), g[first].copy(), case.dtypes,
               case.label)
    sub_exact = [None if e is None else np.asarray(e, dtype=object).reshape(-1)[first]
                 for e in exact]
    return sub, sub_exact, inverse.reshape(-1)


def format_nearest(hi, lo, dtype):
    """The exact values hi + lo correctly rounded to the format ``dtype`` (as float64).

    Round half to even on the format's spacing at |hi| (a power of two, so ``hi / q`` is
    exact), the remainder ``lo`` deciding where hi sits on a tie, and inf from the overflow
    threshold on (``optable.formats``): NumPy's cast to bfloat16 rounds float64 through
    float32, a double rounding this avoids.
    """
    fmt = optable.formats.format_of(dtype)
    hi = np.asarray(hi, dtype=np.float64)
    lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), hi.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        q = fmt.ulp(hi)
        r = np.round(hi / q) * q
        gap = np.abs(hi - r)
        tie = np.isfinite(hi) & (gap == q / 2) & (lo != 0)
        r = np.where(tie, hi + np.sign(lo) * gap, r)
        big = np.abs(hi) >= fmt.overflow
        r = np.where(big & np.isfinite(hi), np.copysign(np.inf, hi), r)
        r = np.where(np.abs(r) > fmt.max, np.copysign(np.inf, r), r)
    return np.where(np.isfinite(hi), r, hi)


def float32_nearest(hi, lo):
    """The exact values hi + lo correctly rounded to float32 (as float64), elementwise.

    NOTE: rounding hi alone is a double rounding, wrong exactly when hi sits halfway between
    two float32 numbers and lo is not zero; there the remainder's sign picks the neighbour.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        r32 = hi.astype(np.float32).astype(np.float64)
        gap = np.abs(hi - r32)
        tie = np.isfinite(r32) & (gap > 0) & (gap == spacing(r32, "float32") / 2) & (lo != 0)
    r32[tie] = hi[tie] + np.sign(lo[tie]) * gap[tie]
    return r32


def _as_mpf(hi, lo):
    """An object array of mpf hi + lo (exact sums at the ambient precision).

    NOTE: converting floats to mpf was a third of the exact side's time: the special values'
    long cases hold tens of thousands of entries but a few dozen distinct (hi, lo) pairs, so
    each distinct pair (by its bits) is converted once and the results are scattered back.
    """
    hi = np.asarray(hi, dtype=np.float64)
    lo = np.asarray(lo, dtype=np.float64)
    bits = np.stack([hi.reshape(-1).view(np.int64), lo.reshape(-1).view(np.int64)], axis=1)
    pairs, inverse = np.unique(bits, axis=0, return_inverse=True)
    values = np.empty(len(pairs), dtype=object)
    values[:] = [_mpf_pair(h, l) for h, l in pairs.view(np.float64)]
    return values[inverse.reshape(-1)].reshape(hi.shape)


def _mpf_pair(h, l):
    if not math.isfinite(h):
        return mpmath.mpf(float(h))
    if l == 0:
        return mpmath.mpf(float(h)) + 0       # the same rounding to the ambient precision
    return mpmath.mpf(float(h)) + mpmath.mpf(float(l))


def exact_table(name, cases):
    """Evaluate every case exactly; build the :class:`ExactTable` of op ``name``.

    A case that the exact oracle rejects (a value outside the op's domain) is dropped and
    listed in ``rejected``.
    """
    import spec

    op = spec.OPS[name]
    diff = tuple(k for k, n in enumerate(op.inputs) if op.vjp.get(n) is not None)
    kept, slices = [], []
    from reports.conformance import bounds as conform_bounds
    from reports.conformance.oracle import cached, exact_vjp

    cols = {key: [] for key in ("hi", "lo", "kappa", "magnitude", "source", "case",
                                "admissible") + FORMATS_ALL}
    exact_values, rejected, exacts = [], [], []
    offset = 0
    with mpmath.workdps(DPS + 10):
        for case in cases:
            try:
                pairs = exact_grads(name, case.inputs, case.grad, case.params)
            except ValueError as exc:
                rejected.append((case.source, str(exc)))
                continue
            exact = [None if p is None else _as_mpf(*p) for p in pairs]
            # NOTE: cached by content (as the exact values are): a case that the float32 and
            # float64 special lists share, or a second report in one process, costs nothing
            kappa = cached("kappa", name, list(case.inputs) + [case.grad], case.params,
                           lambda: _condition_numbers(op, case, exact))
            oracle = exact_vjp(name, case.inputs, case.grad, case.params)
            exacts.append(oracle)
            out_hi = oracle.out[0]
            _, a_grads = conform_bounds.admissible(name, case.inputs, case.grad, case.params,
                                                   out_hi, [None if p is None else p[0]
                                                            for p in pairs])
            ci = len(kept)
            kept.append(case)
            where = {}
            for k in diff:
                hi, lo = (np.asarray(a, dtype=np.float64).reshape(-1) for a in pairs[k])
                where[k] = slice(offset, offset + hi.size)
                offset += hi.size
                cols["hi"].append(hi)
                cols["lo"].append(lo)
                exact_values.extend(exact[k].reshape(-1))
                cols["kappa"].append(kappa[k].reshape(-1))
                cols["admissible"].append(np.asarray(a_grads[k], np.float64).reshape(-1))
                cols["magnitude"].append(np.abs(case.inputs[k]).reshape(-1).astype(np.float64))
                cols["source"].append(np.full(hi.size, case.source, dtype=object))
                cols["case"].append(np.full(hi.size, ci, dtype=np.int64))
                for dtype in FORMATS_ALL:
                    cols[dtype].append(np.full(hi.size, dtype in case.dtypes))
            slices.append(where)
    joined = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}
    return ExactTable(
        op=name, cases=kept, inputs=diff, slices=slices, hi=joined["hi"], lo=joined["lo"],
        r32=float32_nearest(joined["hi"], joined["lo"]), kappa=joined["kappa"],
        magnitude=joined["magnitude"], source=joined["source"].astype(object),
        case_index=joined["case"].astype(np.int64),
        applies={d: joined[d].astype(bool) for d in FORMATS_ALL},
        exact=exact_values, rejected=rejected, admissible=joined["admissible"], exacts=exacts)


# ---------------------------------------------------------------------------------------------
# per-element errors

# The state of each value a producer hands back (engines, finite differences).
MEASURED, SKIPPED, UNDEFINED = 0, 1, 2


def element_errors(values, table, dtype, state=None):
    """ULP and relative errors of ``values`` (float64 array, table order) in ``dtype``.

    Parameters
    ----------
    values : numpy.ndarray
        One value per element of ``table``.
    table : ExactTable
    dtype : str
    state : numpy.ndarray of int8, optional
        Per element: MEASURED (default), SKIPPED (not measured by design: a finite difference
        left out, a case not meant for this dtype) or UNDEFINED (the case raised, or the
        difference step left the op's domain).

    Returns
    -------
    dict of numpy.ndarray
        ``ulp``, ``rel`` (inf where a measured value is NaN or ±inf, or the exact value is 0
        and the value is not), ``correct`` (bool: equals the correctly rounded value),
        ``included`` (measured, and the exact value is in the dtype's range), ``nonfinite``.
    """
    values = np.asarray(values, dtype=np.float64)
    state = np.zeros(values.shape, np.int8) if state is None else np.asarray(state)
    floor = table.floor(dtype)
    in_range = np.isfinite(floor) & table.applies[dtype]
    defined = state == MEASURED
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs((values - table.hi) - table.lo)
        err = np.where(np.isfinite(values), err, np.inf)
        ulp = err / spacing(table.hi, dtype)
        exact_abs = np.abs(table.hi)
        rel = np.where(exact_abs > 0, err / np.where(exact_abs > 0, exact_abs, 1.0),
                       np.where(err == 0, 0.0, np.inf))
    return {"ulp": ulp, "rel": rel, "correct": values == floor,
            "included": in_range & defined, "nonfinite": defined & ~np.isfinite(values)}


# ---------------------------------------------------------------------------------------------
# producers: engines, floor, finite differences

@contextlib.contextmanager
def single_threaded():
    """Numba kernels (and torch, when loaded) on one thread while measuring; then restored.

    NOTE: the measured arrays are tiny, so fastlib runs one chunk whatever the thread count
    and torch does not split them either (results are identical); on a loaded machine a
    parallel region's thread hand-off costs milliseconds per call, a single thread
    microseconds.
    """
    restore = []
    try:
        import numba

        before = numba.get_num_threads()
        numba.set_num_threads(1)
        restore.append(lambda: numba.set_num_threads(before))
    except Exception:  # noqa: BLE001 - numba without a threading layer: nothing to pin
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        torch_before = torch.get_num_threads()
        torch.set_num_threads(1)
        restore.append(lambda: torch.set_num_threads(torch_before))
    try:
        yield
    finally:
        for undo in restore:
            undo()


def engine_values(engine, table, dtype):
    """Run ``engine.vjp`` on every case in ``dtype``; values in table order.

    Returns
    -------
    values : numpy.ndarray
    state : numpy.ndarray of int8
        MEASURED, SKIPPED (a case not meant for ``dtype``) or UNDEFINED (the case raised).
    errors : list of str
        One message per case that raised (engine errors are reported, not hidden).
    returned : set of str
        The dtypes the engine's results came back in.
    """
    np_dtype = optable.formats.dtype_of(dtype)
    values = np.full(table.size, np.nan)
    state = np.full(table.size, SKIPPED, dtype=np.int8)
    errors, returned = [], set()
    for ci, case in enumerate(table.cases):
        if dtype not in case.dtypes:
            continue
        inputs = [a.astype(np_dtype) if a.dtype.kind == "f" else a for a in case.inputs]
        try:
            grads = engine.vjp(table.op, inputs, case.grad.astype(np_dtype), **case.params)
            for k in table.inputs:
                g = np.asarray(grads[k])
                if g.shape != case.inputs[k].shape:
                    raise ValueError(f"VJP {k} has shape {g.shape}, input {case.inputs[k].shape}")
                returned.add(str(g.dtype))
        except NotImplementedError:
            raise
        except Exception as exc:  # reported in the row: a crash is a finding, not a skip
            errors.append(f"case {ci} ({case.source}): {type(exc).__name__}: {exc}")
            for sl in table.slices[ci].values():
                state[sl] = UNDEFINED
            continue
        table.flatten(ci, grads, values)
        for sl in table.slices[ci].values():
            state[sl] = MEASURED
    return values, state, errors, returned


def _forward_in(name, inputs, params, dtype):
    """The forward, correctly rounded to ``dtype``: reflib's float64 result cast to it.

    NOTE: for float32 this is within half an ULP of float32 (reflib is a few float64 ULPs from
    exact): the best float32 forward a finite-difference check could hope for.
    """
    import reflib

    out = np.asarray(reflib.forward(name, inputs, **params), dtype=np.float64)
    return out.astype(optable.formats.dtype_of(dtype)).astype(np.float64)


def fd_values(table, dtype, step, max_cases_per_source):
    """Central differences <grad, f(z + h e_j) - f(z - h e_j)> / 2h, h = step·max(1, |z_j|).

    Inputs z ± h are rounded to ``dtype`` (as a float32 check would store them); the division
    uses the nominal 2h, as gradient checks do. Only the first ``max_cases_per_source`` cases
    of each source with at most ``FD_MAX_ENTRIES`` entries per input are differenced (two
    reference forwards per entry and step add up); the other elements are SKIPPED.

    Returns
    -------
    values, state : numpy.ndarray
        As for :func:`engine_values` (UNDEFINED where a step leaves the op's domain).
    """
    np_dtype = optable.formats.dtype_of(dtype)
    values = np.full(table.size, np.nan)
    state = np.full(table.size, SKIPPED, dtype=np.int8)
    seen = {}
    for ci, case in enumerate(table.cases):
        if dtype not in case.dtypes or max(a.size for a in case.inputs) > FD_MAX_ENTRIES:
            continue
        seen[case.source] = seen.get(case.source, 0) + 1
        if seen[case.source] > max_cases_per_source:
            continue
        g = case.grad
        for k, sl in table.slices[ci].items():
            x = case.inputs[k]
            out = np.full(x.size, np.nan)
            got = np.full(x.size, UNDEFINED, dtype=np.int8)
            for j in range(x.size):
                xj = float(x.reshape(-1)[j])
                h = step * max(1.0, abs(xj))
                sides = []
                for sign in (1.0, -1.0):
                    moved = [a.copy() for a in case.inputs]
                    moved[k].reshape(-1)[j] = float(np_dtype.type(xj + sign * h))
                    try:
                        sides.append(_forward_in(table.op, moved, case.params, dtype))
                    except ValueError:   # the step left the op's domain: undefined there
                        break
                if len(sides) == 2:
                    out[j] = float(np.sum(g * (sides[0] - sides[1]))) / (2 * h)
                    got[j] = MEASURED
            values[sl] = out
            state[sl] = got
    return values, state


# ---------------------------------------------------------------------------------------------
# aggregation

def json_number(x):
    """A JSON number: float, ``"inf"`` for +infinity, None for undefined (no data)."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def as_float(x):
    """Inverse of the JSON encoding: ``"inf"`` -> inf, None -> NaN, numbers as they are."""
    if x is None:
        return math.nan
    if isinstance(x, str):
        return float(x)
    return float(x)


def _stats(v):
    if v.size == 0:
        return {"median": None, "p99": None, "max": None}
    return {"median": json_number(np.median(v)),
            "p99": json_number(np.percentile(v, 99, method="higher")),
            "max": json_number(np.max(v))}


def _brief(v):
    if v.size == 0:
        return {"n": 0, "median_ulp": None, "max_ulp": None}
    return {"n": int(v.size), "median_ulp": json_number(np.median(v)), "max_ulp": json_number(np.max(v))}


def _histogram(ulp):
    finite = ulp[np.isfinite(ulp)]
    positive = finite[finite > 0]
    counts, _ = np.histogram(positive, bins=np.array(HIST_EDGES[:-1] + (np.finfo(float).max,)))
    return {"zero": int(np.sum(finite == 0)), "counts": [int(c) for c in counts],
            "infinite": int(np.sum(~np.isfinite(ulp)))}


def _by_magnitude(ulp, mags):
    out = []
    edges = MAGNITUDE_EDGES
    zero = mags == 0
    out.append({"lo": 0.0, "hi": 0.0, **_brief(ulp[zero])})
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (mags > lo if lo == 0 else mags >= lo) & (mags < hi)
        out.append({"lo": json_number(lo), "hi": json_number(hi), **_brief(ulp[sel])})
    return out


WORST_MAX_ENTRIES = 64                       # larger arrays are summarised in "worst"


def _plain(a):
    """An array for the JSON: nested lists (exact: JSON floats round-trip float64), or, past
    WORST_MAX_ENTRIES entries, its shape and first entries (the case is then one of the
    special-values table's long reductions, reproducible from its label)."""
    a = np.asarray(a)
    if a.size <= WORST_MAX_ENTRIES:
        return a.tolist()
    return {"shape": list(a.shape), "first": a.reshape(-1)[:8].tolist(),
            "omitted": int(a.size - 8)}


def _worst(table, values, err, sel_idx):
    """Details of the element with the largest ULP error among ``sel_idx``."""
    if sel_idx.size == 0:
        return None
    i = int(sel_idx[np.argmax(err["ulp"][sel_idx])])
    ci = int(table.case_index[i])
    case = table.cases[ci]
    k, j = next((k, i - sl.start) for k, sl in table.slices[ci].items() if sl.start <= i < sl.stop)
    import spec

    op = spec.OPS[table.op]
    with mpmath.workdps(20):
        exact = mpmath.nstr(table.exact[i], 20)
    return {"case": ci, "source": case.source + (f": {case.label}" if case.label else ""),
            "input": op.inputs[k],
            "index": [int(t) for t in np.unravel_index(j, case.inputs[k].shape)],
            "inputs": {n: _plain(a) for n, a in zip(op.inputs, case.inputs)},
            "params": {p: list(v) if isinstance(v, tuple) else v for p, v in case.params.items()},
            "grad": _plain(case.grad), "computed": json_number(values[i]), "exact": exact,
            "ulp": json_number(err["ulp"][i]), "rel": json_number(err["rel"][i]),
            "kappa": json_number(table.kappa[i])}


def summarize(table, values, dtype, state=None, admissible=None):
    """The figures of one row (engine, floor or FD) from its values in table order.

    ``admissible`` (per element, eps units) replaces the table's general bound: a 16-bit
    engine's own bound (:func:`storage_admissible`).
    """
    state = np.zeros(table.size, np.int8) if state is None else state
    admissible = table.admissible if admissible is None else admissible
    err = element_errors(values, table, dtype, state)
    inc = err["included"]
    idx = np.flatnonzero(inc)
    ulp, rel = err["ulp"][inc], err["rel"][inc]
    well = inc & (table.kappa <= KAPPA_WELL)
    applies = table.applies[dtype]
    floor_in_range = np.isfinite(table.floor(dtype)) & applies
    beyond = 0
    if admissible is not None and idx.size:
        from reports.conformance.bounds import entrywise

        _, _, within = entrywise(values[idx], table.hi[idx], table.lo[idx],
                                 admissible[idx], dtype)
        beyond = int(np.sum(~within))
    return {
        "n": int(idx.size),
        "beyond_bound": beyond,
        "out_of_range": int(np.sum(applies & ~np.isfinite(table.floor(dtype)))),
        "undefined": int(np.sum(floor_in_range & (state == UNDEFINED))),
        "nonfinite": int(np.sum(err["nonfinite"] & inc)),
        "ulp": _stats(ulp),
        "rel": _stats(rel),
        "correctly_rounded": json_number(np.mean(err["correct"][inc])) if idx.size else None,
        "well_conditioned": _brief(err["ulp"][well]),
        "by_source": {s: _brief(err["ulp"][inc & (table.source == s)]) for s in SOURCES},
        "by_magnitude": _by_magnitude(ulp, table.magnitude[inc]),
        "histogram": _histogram(ulp),
        "worst": _worst(table, values, err, idx),
        "worst_well": _worst(table, values, err, np.flatnonzero(well)),
    }


# ---------------------------------------------------------------------------------------------
# one op, every row

def _row(kind, engine, dtype, **extra):
    return {"kind": kind, "engine": engine, "dtype": dtype, "status": "ok", "reason": "",
            **extra}


def storage_admissible(table, engine, dtype):
    """Each element's admissible error (eps units) for ``engine`` in the 16-bit ``dtype``: the
    conformance suite's bound from what the engine declares it computes and accumulates in
    (``properties.admissible_for``), so the report and ``verigrad conform`` judge alike."""
    from reports.conformance.properties import admissible_for

    out = np.array(table.admissible, dtype=np.float64, copy=True)
    for ci, case in enumerate(table.cases):
        if dtype not in case.dtypes:
            continue
        _, grads = admissible_for(engine, table.op, dtype, case.inputs, case.grad, case.params,
                                  table.exacts[ci], once=False)
        for k, sl in table.slices[ci].items():
            out[sl] = np.asarray(grads[k], dtype=np.float64).reshape(-1)
    return out


def measure_op(name, engines, config):
    """Every row of op ``name``: each engine × dtype, the floor, and FD per step and dtype.

    Parameters
    ----------
    name : str
        A registry op.
    engines : sequence
        Engine objects (``name``, ``dtypes``, ``supports``, ``vjp``; see
        ``reports.conformance.engines``).
    config : Config

    Returns
    -------
    dict
        ``{"category", "inputs", "cases", "rejected", "conditioning", "rows"}`` (JSON-ready).
    """
    import spec

    op = spec.OPS[name]
    cases = draw_cases(name, config.samples, op_rng(config.seed, name), config.sources,
                       config.dtypes)
    table = exact_table(name, cases)
    rows = []
    from reports.conformance.engines import supports_in

    for engine in engines:
        for dtype in config.dtypes:
            if optable.formats.dtype_of(dtype) not in [np.dtype(d) for d in engine.dtypes]:
                continue
            ok, reason = supports_in(engine, name, dtype)
            if not ok:
                rows.append(_row("engine", engine.name, dtype, status="unsupported",
                                 reason=reason))
                continue
            try:
                values, state, errors, returned = engine_values(engine, table, dtype)
            except NotImplementedError as exc:
                rows.append(_row("engine", engine.name, dtype, status="unsupported",
                                 reason=str(exc)))
                continue
            bound = storage_admissible(table, engine, dtype) if dtype in STORAGE else None
            row = _row("engine", engine.name, dtype, errors=len(errors),
                       first_error=errors[0] if errors else "",
                       returned_dtypes=sorted(returned),
                       **summarize(table, values, dtype, state, bound))
            if errors:
                row["status"] = "error"
                row["reason"] = f"{len(errors)} of {len(table.cases)} cases raised"
            elif returned and returned != {dtype}:
                row["reason"] = f"asked for {dtype}, returned {', '.join(sorted(returned))}"
            rows.append(row)
    for dtype in config.dtypes:
        rows.append(_row("floor", "exact, rounded", dtype,
                         **summarize(table, table.floor(dtype), dtype)))
        for step in config.fd_steps:
            values, state = fd_values(table, dtype, step, config.fd_cases)
            rows.append(_row("finite_difference", f"central FD h={step:g}", dtype, step=step,
                             **summarize(table, values, dtype, state)))
    kappa = table.kappa
    return {
        "category": op.category,
        "inputs": list(op.inputs),
        "differentiable": [op.inputs[k] for k in table.inputs],
        "cases": {s: int(sum(c.source == s for c in table.cases)) for s in SOURCES},
        "elements": table.size,
        "rejected": [{"source": s, "reason": r} for s, r in table.rejected],
        "conditioning": {"well": int(np.sum(kappa <= KAPPA_WELL)),
                         "ill": int(np.sum((kappa > KAPPA_WELL) & np.isfinite(kappa))),
                         "singular": int(np.sum(~np.isfinite(kappa)))},
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------------
# the whole report

PEER_DISTRIBUTIONS = {"paddle": "paddlepaddle", "tinygrad": "tinygrad", "mygrad": "mygrad",
                      "autograd": "autograd"}


def versions(engine_names=()):
    """Versions of everything measured: Python, platform, the numeric stack, engines."""
    out = {"python": sys.version.split()[0], "platform": platform.platform(),
           "machine": platform.machine()}
    try:
        out["verigrad"] = importlib.metadata.version("verigrad")
    except importlib.metadata.PackageNotFoundError:
        out["verigrad"] = "checkout (not installed)"
    packages = ["numpy", "mpmath", "sympy", "numba", "scipy"]
    packages += [p for p in ("torch", "jax", "jaxlib") if p in engine_names or
                 (p == "jaxlib" and "jax" in engine_names)]
    for name in packages:
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception:  # noqa: BLE001 - a package that is absent is reported as such
            out[name] = "not installed"
    for name, dist in PEER_DISTRIBUTIONS.items():   # peers: tinygrad has no __version__
        if name in engine_names:
            try:
                out[name] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                out[name] = "not installed"
    out["git_commit"] = _git_commit()
    return out


def _git_commit():
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        res = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if res.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                "spec", "reflib", "fastlib", "reports"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return res.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def measure_one(name, engines, config):
    """``measure_op`` as a report calls it, one op: ``(result, seconds)``.

    NOTE: special values make engines overflow on purpose (exp(80) in float32); their NumPy
    warnings would bury the progress bar, and every such value is in the figures anyway.
    """
    started = time.perf_counter()
    with single_threaded(), np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = measure_op(name, engines, config)
    return result, round(time.perf_counter() - started, 3)


def measure(config, engines, unavailable=(), on_op=None, measured=None):
    """Measure every op of ``config`` on ``engines``; the report as a JSON-ready dict.

    Parameters
    ----------
    config : Config
    engines : sequence
        Engine objects (see :func:`measure_op`).
    unavailable : sequence of (name, reason)
        Engines that were asked for or are registered but cannot run here (listed in the
        report with the reason).
    on_op : callable, optional
        Called as ``on_op(name, result)`` after each op (a progress bar's hook; the result
        is ``report["ops"][name]``, final, so its figure can be drawn meanwhile).
    measured : dict, optional
        Op name -> ``(result, seconds)`` already measured elsewhere (worker processes, a
        cluster: ``reports.local_workers``, ``reports.distributed.cluster``); taken as they
        are, ``on_op`` called for each in the registry's order.

    Returns
    -------
    dict
        Valid against ``reports.schema.SCHEMA``.
    """
    import spec

    config.validate()
    ops = list(config.ops or spec.OPS)
    started = time.perf_counter()
    if measured is None:
        measured = {}
        for name in ops:
            measured[name] = measure_one(name, engines, config)
            if on_op is not None:
                on_op(name, measured[name][0])
    elif on_op is not None:
        for name in ops:
            on_op(name, measured[name][0])
    # the registry's op order, whatever order the workers finished in
    results = {name: measured[name][0] for name in ops}
    timings = {name: measured[name][1] for name in ops}
    report = {
        "schema_version": SCHEMA_VERSION,
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_json(),
        "versions": versions([e.name for e in engines]),
        "engines": [{"name": e.name, "available": True, "reason": "",
                     "dtypes": [str(np.dtype(d)) for d in e.dtypes if str(np.dtype(d))
                                in config.dtypes],
                     "description": str(getattr(e, "description", ""))} for e in engines]
                   + [{"name": n, "available": False, "reason": r, "dtypes": [],
                       "description": ""} for n, r in unavailable],
        "histogram_edges": [json_number(e) for e in HIST_EDGES],
        "ops": results,
        "timing": {"total_seconds": round(time.perf_counter() - started, 3), "per_op": timings},
    }
    if getattr(config, "second_order", False):   # JVP and HVP ULPs (opt-in: they cost time)
        from reports import accuracy_second_order
        report["second_order"] = accuracy_second_order.measure(ops, engines, config.dtypes)
    report["summary"] = summary_rows(report)
    report["bar"] = bar(report)
    report["regressions"] = None
    report["notes"] = notes(report)
    return report


def notes(report):
    """What a reader should know beside the figures, as sentences."""
    out = []
    for e in report["engines"]:
        if not e["available"]:
            out.append(f"Engine {e['name']} was not measured: {e['reason']}.")
        else:
            missing = [d for d in report["config"]["dtypes"] if d not in e["dtypes"]]
            if missing:
                out.append(f"Engine {e['name']} does not compute in {', '.join(missing)}: "
                           f"not measured there.")
    sources = report["config"]["sources"]
    if "special" in sources and report["ops"] and \
            all(res["cases"]["special"] == 0 for res in report["ops"].values()):
        out.append("No special-value cases: reports.conformance.special_values is not "
                   "installed here.")
    for name, res in report["ops"].items():
        if res["rejected"]:
            out.append(f"{name}: {len(res['rejected'])} drawn case(s) left out by the exact "
                       f"oracle (first: {res['rejected'][0]['reason']}).")
        for r in res["rows"]:
            if r["kind"] != "engine":
                continue
            where = f"{name} on {r['engine']} {r['dtype']}"
            if r["status"] == "error":
                out.append(f"{where}: {r['reason']} (first: {r['first_error']}).")
            elif r["status"] == "unsupported":
                out.append(f"{where}: unsupported ({r['reason']}).")
            elif r["reason"]:
                out.append(f"{where}: {r['reason']}.")
    return out


#: The verdicts of a row, as the summary's ``verdict`` and the renderers' status column show
#: them: every element within the conformance suite's bound, some beyond it, cases that
#: raised, or an op the engine does not support.
VERDICTS = ("within bound", "beyond bound", "error", "unsupported")


def verdict(row):
    """Whether a row (engine, floor or finite difference) is within its bound: one of VERDICTS.

    NOTE: ``status`` says only whether the cases ran ("ok" on a row whose errors are 5e15
    ULPs); the verdict is what a reader of the status column wants: ``beyond bound`` when any
    element exceeds the conformance suite's own admissible error (``beyond_bound``, the rule
    of ``verigrad conform``), ``error`` when cases raised.
    """
    if row["status"] in ("unsupported", "error"):
        return row["status"]
    return "beyond bound" if row.get("beyond_bound", 0) > 0 else "within bound"


def summary_rows(report):
    """Engine rows of every op, worst first (median ULP, then max ULP): the summary table."""
    rows = []
    for name, res in report["ops"].items():
        for r in res["rows"]:
            if r["kind"] != "engine":
                continue
            row = {"op": name, "engine": r["engine"], "dtype": r["dtype"], "status": r["status"],
                   "reason": r["reason"], "verdict": verdict(r)}
            if r["status"] != "unsupported":
                row.update(median_ulp=r["ulp"]["median"], p99_ulp=r["ulp"]["p99"],
                           max_ulp=r["ulp"]["max"],
                           max_ulp_well=r["well_conditioned"]["max_ulp"],
                           correctly_rounded=r["correctly_rounded"], n=r["n"],
                           beyond_bound=r.get("beyond_bound", 0))
            rows.append(row)

    def key(row):
        med, mx = as_float(row.get("median_ulp")), as_float(row.get("max_ulp"))
        return (-(med if not math.isnan(med) else -1.0), -(mx if not math.isnan(mx) else -1.0),
                row["op"], row["engine"], row["dtype"])

    return sorted(rows, key=key)


def _find(report, op, engine, dtype):
    for r in report["ops"].get(op, {}).get("rows", ()):
        if r["kind"] == "engine" and r["engine"] == engine and r["dtype"] == dtype:
            return r
    return None


def _median_against(report, op, engine, rival, dtype):
    """One entry of the bar: ``engine``'s median ULP error in ``dtype`` against ``rival``'s on
    the same inputs (None when ``engine`` has no such row)."""
    mine_row, theirs_row = _find(report, op, engine, dtype), _find(report, op, rival, dtype)
    if mine_row is None or mine_row["status"] == "unsupported":
        return None
    mine = as_float(mine_row["ulp"]["median"])
    if theirs_row is None or theirs_row["status"] == "unsupported":
        return {"op": op, "dtype": dtype, "median_ulp": json_number(mine),
                "rival_median_ulp": None, "status": "not measured"}
    theirs = as_float(theirs_row["ulp"]["median"])
    ok = mine_row["status"] == "ok" and not mine > theirs
    return {"op": op, "dtype": dtype, "median_ulp": json_number(mine),
            "rival_median_ulp": json_number(theirs), "status": "pass" if ok else "fail"}


def bar(report, engine="fastlib", rival="torch"):
    """The accuracy bar for ``engine``, op by op.

    - ``float64``: max ULP error on well-conditioned elements <= ``FEW_ULPS``;
    - ``float32``: median ULP error <= the ``rival``'s on the same inputs (when measured);
    - ``storage``: the same in each 16-bit format measured (bfloat16, float16);
    - ``correct_rounding``: on ``SINGLE_ROUNDING_OPS``, every element correctly rounded (in
      every format measured).

    Returns
    -------
    dict
        ``{"engine", "rival", "float64": [...], "float32": [...], "storage": [...],
        "correct_rounding": [...]}``; each entry has ``op``, the figures compared and
        ``status`` (pass / fail / not measured).
    """
    out = {"engine": engine, "rival": rival, "few_ulps": FEW_ULPS, "kappa_well": KAPPA_WELL,
           "float64": [], "float32": [], "storage": [], "correct_rounding": []}
    for op in report["ops"]:
        r64 = _find(report, op, engine, "float64")
        if r64 is not None and r64["status"] != "unsupported":
            value = as_float(r64["well_conditioned"]["max_ulp"])
            status = "pass" if r64["status"] == "ok" and (math.isnan(value) or value <= FEW_ULPS) \
                else "fail"
            others = {r["engine"]: r["well_conditioned"]["max_ulp"]
                      for r in report["ops"][op]["rows"]
                      if r["kind"] == "engine" and r["dtype"] == "float64"
                      and r["engine"] != engine and r["status"] != "unsupported"}
            out["float64"].append({"op": op, "max_ulp_well": json_number(value),
                                   "max_ulp": r64["ulp"]["max"], "status": status,
                                   "others_max_ulp_well": others})
        entry = _median_against(report, op, engine, rival, "float32")
        if entry is not None:
            del entry["dtype"]
            out["float32"].append(entry)
        for dtype in STORAGE:
            entry = _median_against(report, op, engine, rival, dtype)
            if entry is not None:
                out["storage"].append(entry)
        if op in SINGLE_ROUNDING_OPS:   # in the 16-bit formats too: float32 inside, one rounding
            for dtype in DTYPES + tuple(STORAGE):
                r = _find(report, op, engine, dtype)
                if r is None or r["status"] == "unsupported":
                    continue
                share = as_float(r["correctly_rounded"])
                out["correct_rounding"].append({
                    "op": op, "dtype": dtype, "correctly_rounded": json_number(share),
                    "status": "pass" if r["status"] == "ok" and share == 1.0 else "fail"})
    return out


def compare(baseline, report, factor=REGRESSION_FACTOR, source=""):
    """Rows whose median or max ULP error grew by more than ``factor`` since ``baseline``.

    Both are report dicts (``source`` names the baseline's file). Engine rows are matched by (op, engine, dtype); a row absent from
    the baseline is not compared. NOTE: a baseline error below ``REGRESSION_FLOOR_ULP`` counts
    as that floor, so an op that was exact regresses once it is off by more than one ULP
    (twice half an ULP), not at the first rounding.

    Returns
    -------
    dict
        ``{"baseline", "factor", "baseline_generated", "config_differs": [field, ...], "compared": n,
        "flagged": [{"op", "engine", "dtype", "metric", "baseline", "current", "ratio"}]}``.
    """
    flagged, compared = [], 0
    for op, res in report["ops"].items():
        for r in res["rows"]:
            if r["kind"] != "engine" or r["status"] == "unsupported":
                continue
            old = _find(baseline, op, r["engine"], r["dtype"])
            if old is None or old["status"] == "unsupported":
                continue
            compared += 1
            for metric in ("median", "max"):
                new_v, old_v = as_float(r["ulp"][metric]), as_float(old["ulp"][metric])
                if math.isnan(new_v) or math.isnan(old_v) or math.isinf(old_v):
                    continue
                reference = max(old_v, REGRESSION_FLOOR_ULP)
                if new_v > factor * reference:
                    flagged.append({"op": op, "engine": r["engine"], "dtype": r["dtype"],
                                    "metric": f"{metric}_ulp", "baseline": json_number(old_v),
                                    "current": json_number(new_v), "ratio": json_number(new_v / reference)})
    differs = [k for k in ("samples", "seed", "sources", "dps")
               if baseline.get("config", {}).get(k) != report["config"].get(k)]
    return {"baseline": str(source), "factor": factor,
            "baseline_generated": baseline.get("generated"),
            "config_differs": differs, "compared": compared, "flagged": flagged}
