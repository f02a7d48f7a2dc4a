"""Example inputs for an op, drawn from its domains (``sample_inputs``, ``sample_case``).

Away from kinks by default: every entry at a ``"zero"`` kink is at least ``KINK_MARGIN`` from 0,
and every output position of a ``"tie"`` kink has ``|a - b| >= KINK_MARGIN``, so a float32 cast
cannot move a value across the kink. With ``near_kinks=True`` about a quarter of the entries
(at least one) sit exactly on the kink instead (0, or a == b), to test the conventions.
"""
from __future__ import annotations

import numpy as np

import spec.domains as _domains
from spec.evaluate import lookup

KINK_MARGIN = 1e-2
NEAR_KINK_FRACTION = 0.25


def _num_classes(op, shapes):
    first = shapes[0]
    return first[-1] if first else None


def _push_from_zero(x, rng):
    """Move entries closer than KINK_MARGIN to 0 out to ±[KINK_MARGIN, 2·KINK_MARGIN)."""
    close = np.abs(x) < KINK_MARGIN
    if np.any(close):
        sign = np.where(x[close] < 0, -1.0, 1.0)
        x[close] = sign * rng.uniform(KINK_MARGIN, 2 * KINK_MARGIN, size=int(close.sum()))
    return x


def _untie(a, b, rng):
    """Shift the entries of b so that |a - b| >= KINK_MARGIN at every broadcast position."""
    for _ in range(100):
        gap = np.abs(np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)) - b)
        if not np.any(gap < KINK_MARGIN):
            return b
        b = b + rng.choice([-1.0, 1.0]) * 3 * KINK_MARGIN * (rng.random(b.shape) + 0.5)
    raise RuntimeError("could not draw untied inputs")  # pragma: no cover - measure zero


def _place_zeros(x, rng):
    if x.size == 0:
        return x
    mask = np.array(rng.random(x.shape) < NEAR_KINK_FRACTION, dtype=bool)  # 0-d: an array too
    mask.reshape(-1)[rng.integers(x.size)] = True
    x[mask] = 0.0
    return x


def _place_ties(a, b, rng):
    """Set b equal to a at about a quarter (at least one) of the broadcast output positions."""
    out_shape = np.broadcast_shapes(a.shape, b.shape)
    size = int(np.prod(out_shape, dtype=np.int64))
    if size == 0:
        return b
    positions = [rng.integers(size)]
    positions += [p for p in range(size) if rng.random() < NEAR_KINK_FRACTION]
    for p in positions:
        index = np.unravel_index(p, out_shape)
        ia = tuple(0 if n == 1 else i for i, n in zip(index[len(index) - a.ndim:], a.shape))
        ib = tuple(0 if n == 1 else i for i, n in zip(index[len(index) - b.ndim:], b.shape))
        b[ib] = a[ia]
    return b


def _apply_kinks(op, arrays, rng, near_kinks):
    arrays = dict(arrays)
    for kink in op.kinks:
        if kink.kind == "zero":
            (name,) = kink.inputs
            x = np.array(arrays[name], dtype=np.float64)
            arrays[name] = _place_zeros(x, rng) if near_kinks else _push_from_zero(x, rng)
        else:
            a_name, b_name = kink.inputs
            a = np.asarray(arrays[a_name], dtype=np.float64)
            b = np.array(arrays[b_name], dtype=np.float64)
            arrays[b_name] = _place_ties(a, b, rng) if near_kinks else _untie(a, b, rng)
    return arrays


def sample_inputs(name, rng, shapes=None, params=None, *, near_kinks=False):
    """Draw one input array per input of op ``name`` from its domains.

    Parameters
    ----------
    name : str
        A registry op name.
    rng : numpy.random.Generator
        The source of randomness.
    shapes : sequence of tuple of int, optional
        One shape per input. Default: the shapes of one of the op's examples whose params
        agree with ``params`` (chosen with ``rng``).
    params : dict, optional
        The params the inputs are meant for (used to check ``shapes`` and to pick an example).
    near_kinks : bool, default False
        False: keep every value at least ``KINK_MARGIN`` from the op's kinks. True: put about a
        quarter of the entries exactly on the kinks.

    Returns
    -------
    list of numpy.ndarray
        float64 arrays (int64 for class indices), in the op's input order.
    """
    op = lookup(name)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)); "
                        f"got {type(rng).__name__}")
    if shapes is None:
        shapes = _pick_example(op, rng, params).shapes
    shapes = tuple(tuple(int(n) for n in s) for s in shapes)
    op.check_shapes(shapes, params)
    num_classes = _num_classes(op, shapes)
    arrays = {n: _domains.sample(op.domains[n], s, rng, num_classes=num_classes)
              for n, s in zip(op.inputs, shapes)}
    arrays = _apply_kinks(op, arrays, rng, near_kinks)
    return [np.asarray(arrays[n]) for n in op.inputs]


def _pick_example(op, rng, params):
    wanted = op.resolve_params(params) if _complete(op, params) else None
    fits = []
    for ex in op.examples:
        if wanted is not None and op.resolve_params(ex.params) == wanted:
            fits.append(ex)
    if not fits and params is not None:
        for ex in op.examples:
            try:
                op.check_shapes(ex.shapes, params)
                fits.append(ex)
            except ValueError:
                pass
    if not fits:
        raise ValueError(f"{op.name}: no example shape fits params {params!r}; pass shapes= "
                         f"explicitly (or use sample_case to get an example with its params)")
    return fits[int(rng.integers(len(fits)))]


def _complete(op, params):
    """True when ``params`` (with defaults) resolves, i.e. no required parameter is missing."""
    try:
        op.resolve_params(params)
        return True
    except ValueError:
        return False


def sample_case(name, rng, *, near_kinks=False):
    """A random example of op ``name``: ``(inputs, params)`` ready for ``evaluate``.

    Parameters
    ----------
    name : str
        A registry op name.
    rng : numpy.random.Generator
        The source of randomness (also picks the example).
    near_kinks : bool, default False
        As in ``sample_inputs``.

    Returns
    -------
    inputs : list of numpy.ndarray
    params : dict
        The example's params (only those it sets; defaults fill the rest).
    """
    op = lookup(name)
    ex = op.examples[int(rng.integers(len(op.examples)))]
    return sample_inputs(op, rng, ex.shapes, dict(ex.params), near_kinks=near_kinks), dict(ex.params)
