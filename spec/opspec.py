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
from typing import Any, Callable, Mapping

from spec import shapes as _shapes
from spec.errors import did_you_mean


class _Required:
    """Sentinel default of a parameter that must be given (``reshape``'s ``shape``)."""

    def __repr__(self):
        return "<required>"


REQUIRED = _Required()


@dataclass(frozen=True)
class Param:
    """A keyword parameter: name, default (or ``REQUIRED``) and kind (see ``shapes.PARAM_KINDS``)."""

    name: str
    default: Any
    kind: str


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
        parts = [f"{n}{_shapes.fmt(s)}" for n, s in zip(inputs, self.shapes)]
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
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "domains", MappingProxyType(dict(self.domains)))
        object.__setattr__(self, "vjp", MappingProxyType(dict(self.vjp)))
        object.__setattr__(self, "examples", tuple(self.examples))
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "kinks", tuple(self.kinks))

    # -- parameters ----------------------------------------------------------------------------

    @property
    def defaults(self):
        """``{param name: default}`` (``REQUIRED`` for a parameter without default)."""
        return {p.name: p.default for p in self.params}

    @property
    def differentiable(self):
        """The names of the inputs that have a VJP."""
        return tuple(n for n in self.inputs if self.vjp.get(n) is not None)

    def resolve_params(self, params=None):
        """Defaults merged with ``params``, each checked; ``ValueError`` names the problem."""
        params = dict(params or {})
        known = {p.name: p for p in self.params}
        for name in params:
            if name not in known:
                expected = ", ".join(known) if known else "none"
                raise ValueError(f"{self.name}: unknown parameter {name!r}"
                                 f"{did_you_mean(name, known)} (parameters: {expected})")
        out = {}
        for p in self.params:
            value = params.get(p.name, p.default)
            if value is REQUIRED:
                raise ValueError(f"{self.name}: parameter {p.name!r} is required, e.g. "
                                 f"{p.name}=(2, 3)")
            out[p.name] = _shapes.PARAM_KINDS[p.kind](self.name, p.name, value)
        return out

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
