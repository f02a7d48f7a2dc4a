"""The record of one op's signature: what every engine and harness module shares about it.

Names, inputs, params and defaults, category and shape rule, domains, kink kinds, bound family
and the flags the harness reads. No formulas: the mathematics lives in each engine (spec's
SymPy formulas, reflib's reference code, fastlib's kernels). See docs/optable.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping


class _Required:
    """Sentinel default of a parameter that must be given (``reshape``'s ``shape``)."""

    def __repr__(self):
        return "<required>"

    def __reduce__(self):  # one object, also after pickling (Dask workers, checkpoints)
        return "REQUIRED"


REQUIRED = _Required()

#: Kink kinds: an input equals 0 (``"zero"``), or two inputs are equal (``"tie"``).
KINK_KINDS = ("zero", "tie")

#: Op categories.
CATEGORIES = ("unary", "binary", "reduction", "structure", "normalisation", "loss")

#: Domains whose inputs are not differentiable (they hold indices, not numbers).
NON_DIFFERENTIABLE_DOMAINS = frozenset({"class_index"})


def freeze(record, tuples=(), mappings=()):
    """Make a frozen dataclass's ``tuples`` fields tuples and its ``mappings`` fields read-only
    mappings (callers may pass lists and dicts)."""
    for name in tuples:
        object.__setattr__(record, name, tuple(getattr(record, name)))
    for name in mappings:
        object.__setattr__(record, name, MappingProxyType(dict(getattr(record, name))))


def param_defaults(params):
    """``{param name: default}`` of ``Param`` records (``REQUIRED`` where there is none)."""
    return {p.name: p.default for p in params}


@dataclass(frozen=True)
class Param:
    """A keyword parameter: name, default (or ``REQUIRED``) and kind (how its value is checked:
    ``axis axes int optional_int bool real positive shape``)."""

    name: str
    default: Any
    kind: str


@dataclass(frozen=True)
class OpSignature:
    """One op of the table.

    Attributes
    ----------
    name : str
        The op's name in every engine (lower_snake_case).
    code : int
        A stable integer, unique in the table; compiled kernels switch on it.
    category : str
        ``unary binary reduction structure normalisation loss``.
    shape : str
        The shape rule's name (``same_shape broadcast reduction matmul ...``); spec holds the rule.
    inputs : tuple of str
        Input names, in call order.
    domains : mapping
        Input name -> domain name (spec.domains describes each domain and samples it).
    params : tuple of Param
        Keyword parameters with their defaults.
    kinks : tuple of str
        Kink kinds, one per kink: ``"zero"`` (an input equals 0) or ``"tie"`` (two inputs equal).
    family : str
        The error-bound family of the conformance suite (reports/conformance/bounds.py).
    saturating : bool
        The function flattens out for large |x|: the special-values table probes its tails.
    scale_free : bool
        Exact up to scaling (copies, one rounding): the special-values table probes tiny and huge
        magnitudes and zeros.
    single_rounding : bool
        The VJP is exact or a single rounding of exact operands, so an engine can round every
        element correctly (the accuracy bar asks for it).
    edge : str
        How far the conformance suite's edge draws go: ``"full"`` (the dtype's whole range),
        ``"sum"`` (two decades below overflow), ``"square"`` (the square root of the range),
        ``"cube"`` (its cube root), ``"exp"`` (up to exp's overflow threshold).
    """

    name: str
    code: int
    category: str
    shape: str
    inputs: tuple
    domains: Mapping
    params: tuple = ()
    kinks: tuple = ()
    family: str = ""
    saturating: bool = False
    scale_free: bool = False
    single_rounding: bool = False
    edge: str = "full"

    def __post_init__(self):
        freeze(self, tuples=("inputs", "params", "kinks"), mappings=("domains",))

    @property
    def defaults(self):
        """``{param name: default}`` (``REQUIRED`` for a parameter without default)."""
        return param_defaults(self.params)

    @property
    def class_index(self):
        """The inputs that hold class indices (not differentiable), as a frozenset."""
        return frozenset(n for n in self.inputs
                         if self.domains[n] in NON_DIFFERENTIABLE_DOMAINS)


@dataclass(frozen=True)
class Activation:
    """An activation of the layers (Dense, RNN, TargetProp ...): its name, the stable code the
    fused kernels switch on, the op it applies (``linear`` is ``identity``), and ``values``,
    ``(low, high)`` bounds of every value it gives (``train`` refuses ``binary_cross_entropy``
    on a model whose output is not bounded to probabilities)."""

    name: str
    code: int
    op: str
    values: tuple = (-math.inf, math.inf)
