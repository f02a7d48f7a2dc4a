"""Input domains: what values an input may hold, how to draw them, how to check them.

Domains are named by the strings of docs/CONTRACTS.md. Every sampler draws from an explicit
``numpy.random.Generator`` and returns float64 (``class_index``: int64). Draws are chosen so that
they stay exact when cast to float32 where it matters: ``distribution`` rows are multiples of
1/1024 (so a row sums to exactly 1 in float32, float64 and exact arithmetic).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> bool(sample("positive", (2, 3), rng).min() > 0)
True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from spec.errors import did_you_mean

# Ranges: small enough that every op is well conditioned, wide enough to reach saturation of
# tanh/sigmoid and both branches of every kink.
REAL_SCALE = 3.0
POSITIVE_RANGE = (0.1, 4.0)
NONZERO_RANGE = (0.5, 3.0)
UNIT_OPEN_RANGE = (0.05, 0.95)
DISTRIBUTION_QUANTUM = 1024     # rows are k / 1024 with integer k, summing to 1024 / 1024


@dataclass(frozen=True)
class Domain:
    """A named set of values, a sampler for it and a membership test."""

    name: str
    description: str
    differentiable: bool
    draw: Callable          # (shape, rng, num_classes) -> ndarray
    bad: Callable           # (float64 array) -> boolean mask of out-of-domain entries


def _real(shape, rng, num_classes):
    return rng.uniform(-REAL_SCALE, REAL_SCALE, size=shape)


def _positive(shape, rng, num_classes):
    return rng.uniform(*POSITIVE_RANGE, size=shape)


def _nonzero(shape, rng, num_classes):
    return rng.uniform(*NONZERO_RANGE, size=shape) * rng.choice([-1.0, 1.0], size=shape)


def _unit_open(shape, rng, num_classes):
    return rng.uniform(*UNIT_OPEN_RANGE, size=shape)


def _unit_closed(shape, rng, num_classes):
    # A quarter of the entries sit exactly on 0 or 1 (binary targets are the common case).
    x = rng.uniform(0.0, 1.0, size=shape)
    ends = rng.random(size=shape) < 0.25
    return np.where(ends, rng.integers(0, 2, size=shape).astype(np.float64), x)


def _class_index(shape, rng, num_classes):
    if num_classes is None or num_classes < 1:
        raise ValueError("class_index: pass num_classes >= 1 (the number of columns of the "
                         "logits)")
    return rng.integers(0, num_classes, size=shape, dtype=np.int64)


def _distribution(shape, rng, num_classes):
    if len(shape) == 0 or shape[-1] < 1:
        raise ValueError(f"distribution: needs a non-empty last axis (the classes); got shape "
                         f"{tuple(shape)}")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    c = shape[-1]
    out = np.zeros((rows, c))
    for r in range(rows):
        if rng.random() < 0.5:
            out[r, rng.integers(c)] = 1.0                     # one-hot
        else:
            cuts = np.sort(rng.integers(0, DISTRIBUTION_QUANTUM + 1, size=c - 1))
            counts = np.diff(np.concatenate([[0], cuts, [DISTRIBUTION_QUANTUM]]))
            out[r] = counts / DISTRIBUTION_QUANTUM          # exact: a power-of-two denominator
    return out.reshape(shape)


def _distribution_bad(x):
    if x.ndim == 0:
        return np.ones((), dtype=bool)
    # NOTE: rows may miss 1 by float32 rounding (softmax outputs used as targets); 1e-3 still
    # catches class indices or unnormalised scores passed by mistake.
    row_bad = np.abs(x.sum(axis=-1, keepdims=True) - 1.0) > 1e-3
    return (x < 0) | np.broadcast_to(row_bad, x.shape)


DOMAINS = {
    d.name: d
    for d in (
        Domain("real", "finite reals", True, _real, lambda x: np.zeros(x.shape, dtype=bool)),
        Domain("positive", "x > 0", True, _positive, lambda x: ~(x > 0)),
        Domain("nonzero", "|x| > 0", True, _nonzero, lambda x: x == 0),
        Domain("unit_open", "0 < x < 1", True, _unit_open, lambda x: ~((x > 0) & (x < 1))),
        Domain("unit_closed", "0 <= x <= 1", True, _unit_closed,
               lambda x: ~((x >= 0) & (x <= 1))),
        Domain("class_index", "integers in [0, C)", False, _class_index,
               lambda x: (x < 0) | (x != np.floor(x))),
        Domain("distribution", "rows >= 0 summing to 1 along the last axis", True,
               _distribution, _distribution_bad),
    )
}


def get(name):
    """The ``Domain`` called ``name``; ``ValueError`` with close names otherwise."""
    try:
        return DOMAINS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown domain {name!r}{did_you_mean(name, DOMAINS)} (domains: "
                         f"{', '.join(DOMAINS)})") from None


def sample(domain, shape, rng, *, num_classes=None):
    """Draw an array of ``shape`` from ``domain``.

    Parameters
    ----------
    domain : str
        A domain name from ``DOMAINS``.
    shape : tuple of int
        The array's shape.
    rng : numpy.random.Generator
        The source of randomness (explicit, so runs can be replayed).
    num_classes : int, optional
        Required for ``class_index``: draws are in ``[0, num_classes)``.

    Returns
    -------
    numpy.ndarray
        float64 (int64 for ``class_index``).
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)); "
                        f"got {type(rng).__name__}")
    return np.asarray(get(domain).draw(tuple(int(n) for n in shape), rng, num_classes))


def out_of_domain(domain, x):
    """Boolean mask of the entries of float64 array ``x`` that are outside ``domain``."""
    return np.asarray(get(domain).bad(np.asarray(x, dtype=np.float64)), dtype=bool)
