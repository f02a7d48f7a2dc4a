"""Proofs on each piece of a piecewise expression, and the conventions at an op's kinks.

The long story: docs/spec.md, section ``spec/pieces.py``.
"""
from __future__ import annotations

import itertools

import numpy as np

from spec.backends import SYMPY
from spec.opspec import call_formula

# More switches in one entry than this (3^8 pieces with boundaries) are left to sampling.
MAX_SWITCHES = 8


class Undecided(Exception):
    """The pieces could not be separated (a switch no input symbol can be solved for)."""


class ConventionError(Exception):
    """A kink's stated VJP is not its convention, or the convention is outside the
    subdifferential."""


def _switches(expr):
    """The distinct switch arguments of ``expr`` (up to sign), in a deterministic order."""
    sp = SYMPY.sp
    found = []
    for atom in sp.preorder_traversal(expr):
        if isinstance(atom, (sp.Heaviside, sp.sign, sp.Abs)):
            found.append(atom.args[0])
        elif isinstance(atom, (sp.Max, sp.Min)):
            found += [a - b for a, b in itertools.combinations(atom.args, 2)]
        elif isinstance(atom, sp.core.relational.Relational) and not isinstance(
                atom, (sp.Eq, sp.Ne)):
            found.append(atom.lhs - atom.rhs)
    distinct = []
    for e in found:
        e = sp.expand(e)
        if e.is_number:
            continue
        if not any(sp.expand(e - d) == 0 or sp.expand(e + d) == 0 for d in distinct):
            distinct.append(e)
    return distinct


def _solve_for(e, avoid):
    """(symbol x, coefficient c) with ``e`` = c·x + (terms without x), c a nonzero number."""
    sp = SYMPY.sp
    for x in sorted(e.free_symbols - avoid, key=lambda s: s.name):
        if x.is_positive or x.is_nonnegative:
            continue            # solving for it would break its assumptions
        c = sp.diff(e, x)
        if c.is_number and c != 0:
            return x, c
    return None, None


def _piece(expr, switches, signs, fresh):
    """``expr`` on the piece where switch k has sign ``signs[k]``; None if the piece is empty."""
    sp = SYMPY.sp
    subs = {}
    for k, (e, s) in enumerate(zip(switches, signs)):
        e = sp.expand(e.xreplace(subs))
        known = e.is_positive, e.is_negative, e.is_zero
        if e.is_number or any(v is not None for v in known):
            # this switch is already fixed by the previous ones: the piece exists only if the
            # sign agrees
            sign = 1 if e.is_positive else -1 if e.is_negative else 0 if e.is_zero else None
            if sign is None:
                raise Undecided(f"cannot tell the sign of {e}")
            if sign != s:
                return None
            continue
        x, c = _solve_for(e, set(fresh))
        if x is None:
            raise Undecided(f"no input symbol to solve {e} = {s}·p for")
        value = (s * fresh[k] - (e - c * x)) / c
        subs = {key: v.xreplace({x: value}) for key, v in subs.items()}
        subs[x] = value
    return expr.xreplace(subs)


def zero_on_pieces(expr, is_zero, *, boundaries):
    """The number of pieces on which ``expr`` is proven 0, or 0 if some piece is not.

    Parameters
    ----------
    expr : sympy.Expr
        A difference holding branches.
    is_zero : callable
        ``is_zero(expr)`` -> True only when ``expr`` is proven to be exactly 0.
    boundaries : bool
        Also prove the pieces where a switch is exactly 0 (see the module docstring).

    Raises
    ------
    Undecided
        When the switches cannot be separated, or there are more than ``MAX_SWITCHES``.
    """
    sp = SYMPY.sp
    switches = _switches(expr)
    if len(switches) > MAX_SWITCHES:
        raise Undecided(f"{len(switches)} switches")
    fresh = [sp.Symbol(f"p_{k}", positive=True) for k in range(len(switches))]
    proven = 0
    for signs in itertools.product((1, -1, 0) if boundaries else (1, -1), repeat=len(switches)):
        piece = _piece(expr, switches, signs, fresh)
        if piece is None:
            continue
        if piece.has(sp.Piecewise, sp.Heaviside, sp.Max, sp.Min, sp.sign, sp.Abs) and \
                _switches(piece):
            raise Undecided(f"branches left on the piece {signs}")
        if not is_zero(piece):
            return 0
        proven += 1
    return proven


def _as_number(value):
    """A slope from a kink's ``slopes`` as an exact SymPy number."""
    return SYMPY.param(value)


def _hull_weight(convention, left, right):
    """λ in [0, 1] with convention = λ·left + (1 - λ)·right (vectors), or None."""
    sp = SYMPY.sp
    lam = None
    for c, lo, hi in zip(convention, left, right):
        if sp.simplify(lo - hi) != 0:
            lam = sp.simplify((c - hi) / (lo - hi))
            break
    if lam is None:         # both sides agree: the derivative exists, the convention must be it
        ok = all(sp.simplify(c - lo) == 0 for c, lo in zip(convention, left))
        return sp.Integer(1) if ok else None
    if not all(sp.simplify(c - (lam * lo + (1 - lam) * hi)) == 0
               for c, lo, hi in zip(convention, left, right)):
        return None
    return lam if (lam >= 0) == sp.true and (lam <= 1) == sp.true else None


def kink_conventions(op, is_zero):
    """Prove each of ``op``'s kink conventions on 0-d inputs; return a list of sentences.

    At the kink (x = 0, or a = b = c for a tie) with a symbolic cotangent ``grad``, the stated
    VJP of each input of the kink must be ``slope · grad`` with the slopes of the registry's
    ``Kink``, and the slopes must be a convex combination of the one-sided derivatives of the
    forward (the limits from either side). Raises ``ConventionError`` naming what fails.
    """
    sp = SYMPY.sp
    if not op.kinks:
        return []
    params = op.resolve_params({})
    op.check_shapes([()] * len(op.inputs), params)
    sentences = []
    for kink in op.kinks:
        base = {n: sp.Symbol(f"{n}_k", real=True) for n in op.inputs}
        p = sp.Symbol("p", positive=True)
        at, sides = dict(base), []
        if kink.kind == "zero":
            (name,) = kink.inputs
            at[name] = sp.Integer(0)
            sides = [{**base, name: p}, {**base, name: -p}]
        else:
            a, b = kink.inputs
            at[a] = base[b]
            sides = [{**base, a: base[b] + p}, {**base, a: base[b] - p}]
        grad = sp.Symbol("grad_k", real=True)

        def arrays(values):
            return [np.asarray(values[n], dtype=object) for n in op.inputs]

        out = np.asarray(op.run_forward(SYMPY, arrays(at), params), dtype=object)
        stated = op.run_vjp(SYMPY, arrays(at), params, out, np.asarray(grad, dtype=object))
        env = {**params}
        slopes = call_formula(kink.slopes, env)
        convention = [_as_number(slopes[n]) for n in kink.inputs]
        for n, slope in zip(kink.inputs, convention):
            got = sp.sympify(np.asarray(stated[op.inputs.index(n)], dtype=object)[()])
            if not is_zero(got - slope * grad):
                raise ConventionError(f"at the kink ({kink.convention}) the stated VJP for {n!r} "
                                     f"is {got}, the convention says {slope}·grad")
        # one-sided derivatives of the forward: d/d(input) on each side, then p -> 0+
        forward = sp.sympify(np.asarray(op.run_forward(
            SYMPY, arrays(base), params), dtype=object)[()])
        one_sided = []
        for side in sides:
            derivs = [sp.diff(forward, base[n]).xreplace(
                {base[m]: side[m] for m in op.inputs}) for n in kink.inputs]
            one_sided.append([sp.limit(d, p, 0, "+") for d in derivs])
        lam = _hull_weight(convention, *one_sided)
        if lam is None:
            raise ConventionError(
                f"the convention at the kink ({kink.convention}) gives {convention}, outside the "
                f"subdifferential between the one-sided derivatives {one_sided[0]} and "
                f"{one_sided[1]}")
        sentences.append(f"at the kink {kink.convention}: holds, in the subdifferential "
                         f"(one-sided {one_sided[0]} and {one_sided[1]})")
    return sentences


__all__ = ["Undecided", "ConventionError", "zero_on_pieces", "kink_conventions",
           "MAX_SWITCHES"]
