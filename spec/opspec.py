"""``OpSpec``: one op, declared once (forward, one VJP per input, params, domains, shapes, kinks).

Vocabulary of the formulas (as in PyTorch's derivatives.yaml header). A formula is a function
whose argument names say what it needs; the caller passes exactly those:

- ``M``        the backend (``spec.backends``): ``M.exp``, ``M.where``, ``M.num(1, 2)``, ...
- an input name (``x``, ``a``, ``b``, ``logits``, ...): that input, an object array,
- a param name (``axis``, ``eps``, ...): its resolved value (plain Python),
- ``result``   (VJPs only) the forward's output,
- ``grad``     (VJPs only) the cotangent, shaped like ``result``.

The long story: docs/spec.md, section ``spec/opspec.py``.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import optable
from optable import REQUIRED, Param  # noqa: F401 (public names of spec.opspec)
from optable.signature import freeze, param_defaults




@dataclass(frozen=True)
class Example:
    """Input shapes (in input order) and the params to use with them: a case to prove and test."""

    shapes: tuple
    params: Mapping = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "shapes", tuple(tuple(s) for s in self.shapes))
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def describe(self, inputs):
        """``"a(2, 3) b(3,) axis=0"``: the shapes named by input, then the params."""
        parts = [f"{n}{optable.shapes.fmt(s)}" for n, s in zip(inputs, self.shapes)]
        parts += [f"{k}={v!r}" for k, v in self.params.items()]
        return " ".join(parts)


@dataclass(frozen=True)
class Kink:
    """Where the derivative is a convention, and which convention.

    ``kind`` is ``"zero"`` (the kink is where input ``inputs[0]`` equals 0) or ``"tie"`` (where
    the two inputs are equal). ``slopes(**params)`` gives the local derivative of the output with
    respect to each input at the kink, as the convention states it (used to test the rule).
    """

    kind: str
    inputs: tuple
    convention: str
    slopes: Callable

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))


@dataclass(frozen=True)
class OpSpec:
    """One registry entry. Frozen: build a changed copy with ``dataclasses.replace``."""

    name: str
    category: str
    inputs: tuple
    domains: Mapping            # input name -> domain name (spec.domains.DOMAINS)
    forward: Callable           # formula -> output object array
    vjp: Mapping                # input name -> formula, or None (not differentiable)
    shape_rule: Callable        # (op, shapes, params) -> output shape; ValueError if invalid
    examples: tuple             # Example(...), at least two
    params: tuple = ()          # Param(...)
    kinks: tuple = ()           # Kink(...)
    math: str = ""              # the forward in one line, for listings

    def __post_init__(self):
        freeze(self, tuples=("inputs", "examples", "params", "kinks"), mappings=("domains", "vjp"))

    # -- parameters ----------------------------------------------------------------------------

    @property
    def defaults(self):
        """``{param name: default}`` (``REQUIRED`` for a parameter without default)."""
        return param_defaults(self.params)

    @property
    def differentiable(self):
        """The names of the inputs that have a VJP."""
        return tuple(n for n in self.inputs if self.vjp.get(n) is not None)

    def resolve_params(self, params=None):
        """Defaults merged with ``params``, each checked; ``ValueError`` names the problem."""
        merged = optable.resolve_params(self.name, self.defaults, dict(params or {}))
        return {p.name: optable.shapes.PARAM_KINDS[p.kind](self.name, p.name, merged[p.name])
                for p in self.params}

    # -- shapes --------------------------------------------------------------------------------

    def check_shapes(self, shapes, params=None):
        """Validate input shapes (and params) and return the output shape.

        Parameters
        ----------
        shapes : sequence of tuple of int
            One shape per input, in input order.
        params : dict, optional
            Keyword parameters; defaults fill the rest.

        Returns
        -------
        tuple of int
            The output shape.

        Raises
        ------
        ValueError
            Wrong number of inputs, a malformed shape, shapes the op does not accept, or a bad
            parameter; the message names the shapes and the fix.
        """
        shapes = tuple(shapes)
        if len(shapes) != len(self.inputs):
            raise ValueError(f"{self.name}: takes {len(self.inputs)} input(s) "
                             f"({', '.join(self.inputs)}); got {len(shapes)}")
        clean = []
        for name, s in zip(self.inputs, shapes):
            try:
                s = tuple(int(n) for n in s)
            except (TypeError, ValueError):
                raise ValueError(f"{self.name}: shape of {name!r} must be a tuple of ints; "
                                 f"got {s!r}") from None
            if any(n < 0 for n in s):
                raise ValueError(f"{self.name}: shape of {name!r} has a negative length: {s}")
            clean.append(s)
        return tuple(self.shape_rule(self.name, tuple(clean), self.resolve_params(params)))

    # -- formulas ------------------------------------------------------------------------------

    def run_forward(self, M, arrays, params):
        """Apply the forward formula to ``arrays`` (input order) with resolved ``params``."""
        env = dict(zip(self.inputs, arrays))
        env.update(params)
        env["M"] = M
        return call_formula(self.forward, env)

    def run_vjp(self, M, arrays, params, result, grad):
        """One contribution per input (``None`` where not differentiable)."""
        env = dict(zip(self.inputs, arrays))
        env.update(params)
        env.update(M=M, result=result, grad=grad)
        return tuple(None if self.vjp.get(n) is None else call_formula(self.vjp[n], env)
                     for n in self.inputs)


#: shape-rule names of the op table -> the rules (``optable.shapes``, shared by every engine)
SHAPE_RULES = optable.shapes.SHAPE_RULES


def declare(name, *, forward, vjp, examples, kinks=(), math=""):
    """The ``OpSpec`` of op ``name``: its signature from the op table, spec's formulas added.

    Parameters
    ----------
    name : str
        An op of ``optable.OPS``; its category, inputs, domains, params and shape rule are
        read from there, so they are written once.
    forward, vjp, examples, kinks, math
        As for :class:`OpSpec`.

    Raises
    ------
    optable.UnknownOpError
        ``name`` is not in the op table (add its signature to optable/table.py first).
    """
    sig = optable.lookup(optable.OPS, name)
    if sig.shape not in SHAPE_RULES:
        raise ValueError(f"{name}: the op table names shape rule {sig.shape!r}, which spec does "
                         f"not have; add it to spec.opspec.SHAPE_RULES")
    return OpSpec(name=name, category=sig.category, inputs=sig.inputs, domains=sig.domains,
                  forward=forward, vjp=vjp, shape_rule=SHAPE_RULES[sig.shape],
                  examples=examples, params=sig.params, kinks=kinks, math=math)


@functools.lru_cache(maxsize=None)
def formula_arguments(fn):
    """The argument names a formula asks for (positional-or-keyword and keyword-only)."""
    sig = inspect.signature(fn)
    bad = [p.name for p in sig.parameters.values()
           if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY)]
    if bad:
        raise TypeError(f"formula {fn!r}: arguments must be named (no *args, **kwargs or "
                        f"positional-only); got {bad}")
    return tuple(sig.parameters)


def call_formula(fn, env):
    """Call ``fn`` with the entries of ``env`` that it names."""
    return fn(**{name: env[name] for name in formula_arguments(fn)})
