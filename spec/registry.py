"""Registry validation: a broken entry fails at import with a message that says what to fix.

``validate_op`` checks one ``OpSpec`` on its own; ``validate_registry`` checks a whole table
(unique names, every op valid) and returns the ``{name: OpSpec}`` mapping. Both are public so
tests can feed them broken entries. Checks are cheap (no SymPy): the proofs live in
``spec.prove``.
"""
from __future__ import annotations

import re
from types import MappingProxyType

import numpy as np

import optable
import optable.signature
import spec.domains as _domains
from optable.shapes import PARAM_KINDS
from spec.errors import RegistryError, did_you_mean
from spec.opspec import Example, Kink, OpSpec, Param, formula_arguments

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
KINK_KINDS = optable.signature.KINK_KINDS


def _fail(op_name, message):
    raise RegistryError(f"registry entry {op_name!r}: {message}")


def _check_formula(op, where, fn, allowed):
    if not callable(fn):
        _fail(op.name, f"{where} must be a function of its named arguments (e.g. "
                       f"`lambda M, grad, x: ...`); got {fn!r}")
    try:
        names = formula_arguments(fn)
    except (TypeError, ValueError) as exc:
        _fail(op.name, f"{where}: {exc}")
    for name in names:
        if name not in allowed:
            _fail(op.name, f"{where} asks for {name!r}, which is not in its vocabulary"
                           f"{did_you_mean(name, allowed)}; it may use {', '.join(sorted(allowed))}")


def validate_op(op):
    """Check one registry entry; raise ``RegistryError`` naming the entry and the fix.

    Parameters
    ----------
    op : OpSpec
        The entry to check.

    Returns
    -------
    OpSpec
        ``op`` itself, so the call can be chained.
    """
    if not isinstance(op, OpSpec):
        raise RegistryError(f"registry entries must be OpSpec instances; got {type(op).__name__}")
    if not isinstance(op.name, str) or not NAME.match(op.name):
        _fail(op.name, "name must be lower_snake_case (letters, digits, underscores)")
    if not op.inputs or len(set(op.inputs)) != len(op.inputs):
        _fail(op.name, f"inputs must be a non-empty tuple of distinct names; got {op.inputs!r}")
    param_names = []
    for p in op.params:
        if not isinstance(p, Param):
            _fail(op.name, f"params must be Param(name, default, kind) entries; got {p!r}")
        if p.kind not in PARAM_KINDS:
            _fail(op.name, f"param {p.name!r} has unknown kind {p.kind!r}"
                           f"{did_you_mean(p.kind, PARAM_KINDS)}")
        param_names.append(p.name)
    if len(set(param_names)) != len(param_names) or set(param_names) & set(op.inputs):
        _fail(op.name, "param names must be distinct and differ from the input names")
    reserved = {"M", "grad", "result"} & (set(param_names) | set(op.inputs))
    if reserved:
        _fail(op.name, f"{sorted(reserved)} are reserved formula words; rename the input/param")

    # Domains: one per input, each known and samplable.
    for name in op.inputs:
        if name not in op.domains:
            _fail(op.name, f"input {name!r} has no domain; add domains={{{name!r}: 'real'}} "
                           f"(one of {', '.join(_domains.DOMAINS)})")
        if op.domains[name] not in _domains.DOMAINS:
            _fail(op.name, f"input {name!r} has unknown domain {op.domains[name]!r}"
                           f"{did_you_mean(op.domains[name], _domains.DOMAINS)}; domains: "
                           f"{', '.join(_domains.DOMAINS)}")
    extra = set(op.domains) - set(op.inputs)
    if extra:
        _fail(op.name, f"domains name unknown inputs {sorted(extra)}; inputs are {op.inputs}")

    # VJPs: one per differentiable input, None exactly for the non-differentiable domains.
    extra = set(op.vjp) - set(op.inputs)
    if extra:
        _fail(op.name, f"vjp names unknown inputs {sorted(extra)}; inputs are {op.inputs}")
    vocabulary = {"M", *op.inputs, *param_names}
    _check_formula(op, "forward", op.forward, vocabulary)
    for name in op.inputs:
        differentiable = _domains.DOMAINS[op.domains[name]].differentiable
        if name not in op.vjp:
            _fail(op.name, f"input {name!r} has no VJP entry; add vjp={{{name!r}: lambda M, "
                           f"grad, ...: ...}}" + ("" if differentiable else " or None"))
        fn = op.vjp[name]
        if fn is None and differentiable:
            _fail(op.name, f"input {name!r} is differentiable (domain {op.domains[name]!r}) but "
                           f"its VJP is None; write its VJP, or give it a non-differentiable "
                           f"domain such as 'class_index'")
        if fn is not None and not differentiable:
            _fail(op.name, f"input {name!r} has domain {op.domains[name]!r}, which is not "
                           f"differentiable; set its VJP to None")
        if fn is not None:
            _check_formula(op, f"vjp[{name!r}]", fn, vocabulary | {"grad", "result"})
    if not callable(op.shape_rule):
        _fail(op.name, "shape_rule must be a function (op, shapes, params) -> output shape")

    # Examples: at least two, each accepted by the shape rule and samplable.
    if len(op.examples) < 2:
        _fail(op.name, f"needs at least two examples (small shapes to prove and test on); "
                       f"has {len(op.examples)}")
    rng = np.random.default_rng(0)
    for ex in op.examples:
        if not isinstance(ex, Example):
            _fail(op.name, f"examples must be Example(shapes, params); got {ex!r}")
        try:
            op.check_shapes(ex.shapes, ex.params)
        except ValueError as exc:
            _fail(op.name, f"example {ex.describe(op.inputs)} is rejected by its own shape "
                           f"rule: {exc}")
        for name, shape in zip(op.inputs, ex.shapes):
            num_classes = ex.shapes[0][-1] if ex.shapes[0] else None
            try:
                _domains.sample(op.domains[name], shape, rng, num_classes=num_classes)
            except (ValueError, TypeError) as exc:
                _fail(op.name, f"cannot sample input {name!r} of example "
                               f"{ex.describe(op.inputs)}: {exc}")

    # Kinks: known kind, real inputs, a convention written out, slopes for each input.
    for kink in op.kinks:
        if not isinstance(kink, Kink) or kink.kind not in KINK_KINDS:
            _fail(op.name, f"kinks must be Kink(kind in {KINK_KINDS}, ...); got {kink!r}")
        if not set(kink.inputs) <= set(op.inputs) or not kink.inputs:
            _fail(op.name, f"kink names inputs {kink.inputs}, not all in {op.inputs}")
        if kink.kind == "tie" and len(kink.inputs) != 2:
            _fail(op.name, "a 'tie' kink relates exactly two inputs")
        if not kink.convention.strip():
            _fail(op.name, "a kink must state its convention in words")
        _check_formula(op, "kink slopes", kink.slopes, set(param_names))
    signature = optable.OPS.get(op.name)
    if signature is not None and tuple(k.kind for k in op.kinks) != signature.kinks:
        _fail(op.name, f"kinks of kinds {[k.kind for k in op.kinks]} but the op table says "
                       f"{list(signature.kinks)}; make optable/table.py and the formulas agree")
    return op


def validate_registry(ops):
    """Validate every entry and the table as a whole; return a read-only ``{name: OpSpec}``.

    Raises
    ------
    RegistryError
        A duplicate name or a broken entry; the message says which and what to change.
    """
    table = {}
    for op in ops:
        validate_op(op)
        if op.name in table:
            raise RegistryError(f"registry entry {op.name!r} is declared twice; each op is "
                                f"declared once (remove or rename one)")
        table[op.name] = op
    return MappingProxyType(table)


def check_covers_table(table):
    """Raise ``RegistryError`` unless ``table`` declares exactly the op table's ops."""
    missing = [n for n in optable.OPS if n not in table]
    if missing:
        raise RegistryError(f"the op table lists {missing} but spec declares no formulas for "
                            f"them; add each to spec/ops/<family>.py with spec.opspec.declare")
