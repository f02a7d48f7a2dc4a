"""optable: the op table every engine and harness module reads, and the engine boundary.

Imports NumPy only (ml_dtypes when bfloat16's dtype is first asked for), so fastlib reads it
without SymPy. Each op's name, inputs, params and defaults, category, shape rule, domains, kink
kinds, bound family and flags; the activations with their kernel codes; the optimizers' names,
hyperparameters and state; the float formats (``optable.formats``); the checks every engine
makes before computing. docs/optable.md
describes the fields and how to add an op.

>>> import optable
>>> optable.OPS["leaky_relu"].defaults
{'negative_slope': 0.01}
"""
from __future__ import annotations

from types import MappingProxyType

from optable import formats
from optable.boundary import (check_class_index, check_grad, check_input_list, check_tangents,
                              common_dtype, float_dtype, float_format, lookup, resolve_params)
from optable.errors import UnknownOpError, close_names, did_you_mean
from optable.kernel_codes import require_branches
from optable.optimizers import OPTIMIZERS, OptimizerSignature
from optable.shapes import output_shape
from optable.signature import CATEGORIES, KINK_KINDS, REQUIRED, Activation, OpSignature, Param
from optable.table import ACTIVATION_LIST, SIGNATURES
from optable.targetprop import TargetPropConfig


def _check_signature(sig):
    """Raise a ValueError naming what to fix in one op's signature."""
    where = f"optable: op {sig.name!r}"
    if set(sig.domains) != set(sig.inputs):
        raise ValueError(f"{where}: domains name {sorted(sig.domains)}, inputs are "
                         f"{list(sig.inputs)}; give each input one domain")
    if sig.category not in CATEGORIES:
        raise ValueError(f"{where}: category {sig.category!r} is not one of {CATEGORIES}")
    bad = [k for k in sig.kinks if k not in KINK_KINDS]
    if bad:
        raise ValueError(f"{where}: kink kinds {bad} are not among {KINK_KINDS}")


def _index(entries, what):
    table = {}
    for e in entries:
        if e.name in table:
            raise ValueError(f"optable: {what} {e.name!r} is listed twice; list each once")
        if isinstance(e, OpSignature):
            _check_signature(e)
        table[e.name] = e
    codes = [e.code for e in entries]
    if len(set(codes)) != len(codes):
        raise ValueError(f"optable: two {what}s share a code; give each its own number")
    return MappingProxyType(table)


#: name -> OpSignature, in registry order.
OPS = _index(SIGNATURES, "op")
#: activation name -> Activation (name, code, op), in code order.
ACTIVATIONS = _index(ACTIVATION_LIST, "activation")
_unknown = [a.name for a in ACTIVATIONS.values() if a.op not in OPS]
if _unknown:
    raise ValueError(f"optable: activations {_unknown} apply ops that are not in the table")


def names(**where):
    """Op names, in table order, whose fields equal ``where`` (``names(category="unary")``)."""
    return tuple(n for n, s in OPS.items() if all(getattr(s, k) == v for k, v in where.items()))


def codes(op_names):
    """``{name: code}`` for ``op_names``: the integers a kernel switches on."""
    return {n: OPS[n].code for n in op_names}


def code_of(name, category, what):
    """The code of op ``name`` of ``category`` (what a kernel launcher switches on).

    Raises
    ------
    ValueError
        ``name`` is not an op of ``category``; the message names ``what`` asked and lists
        the category's ops.
    """
    sig = OPS.get(name) if isinstance(name, str) else None
    if sig is None or sig.category != category:
        raise ValueError(f"{what}: unknown {category} op {name!r}: not a {category} op of optable "
                         f"({category} ops: {', '.join(names(category=category))})")
    return sig.code


def activation_codes():
    """``{activation name: code}`` of every activation."""
    return {a.name: a.code for a in ACTIVATIONS.values()}


def loss_codes():
    """``{loss name: code}`` of every loss op: the codes the training kernels switch on
    (``optable.losses.LOSS_CODES``)."""
    from optable.losses import LOSS_CODES

    return dict(LOSS_CODES)


__all__ = ["OPS", "ACTIVATIONS", "OpSignature", "Param", "Activation", "REQUIRED", "names",
           "codes", "code_of", "activation_codes", "loss_codes", "require_branches",
           "UnknownOpError", "did_you_mean", "close_names", "lookup", "resolve_params",
           "check_input_list", "float_dtype", "common_dtype", "check_class_index", "check_grad",
           "check_tangents", "output_shape", "TargetPropConfig", "OPTIMIZERS", "OptimizerSignature",
           "formats", "float_format"]
