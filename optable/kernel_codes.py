"""The import-time check that a kernel has a branch for every table code it claims to run.

A compiled kernel switches on the op table's codes (``if code == CE: ...``); a code the table
adds, or a branch lost in an edit, would otherwise surface as silent garbage or a late error.
:func:`require_branches` reads the kernel's own source, collects the codes its switch variable
is compared with (module constants, attributes of imported modules or literals) and raises
``ImportError`` naming every claimed code without a branch.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

__all__ = ["branch_codes", "require_branches"]


def _value(node, namespace):
    """The value an expression of names, attributes and literals stands for, or None."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _value(node.value, namespace)
        return getattr(owner, node.attr, None) if owner is not None else None
    return None


def branch_codes(function, switch):
    """The codes ``function`` compares its variable ``switch`` with (``switch == X`` or
    ``X == switch``), resolved in its globals; a Numba dispatcher's ``py_func`` is read."""
    fn = getattr(function, "py_func", function)
    found = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and \
                isinstance(node.ops[0], ast.Eq):
            sides = (node.left, node.comparators[0])
            for mine, other in (sides, sides[::-1]):
                if isinstance(mine, ast.Name) and mine.id == switch:
                    found.add(_value(other, fn.__globals__))
    found.discard(None)
    return found


def require_branches(function, switch, codes, what):
    """Raise ImportError unless ``function`` has a branch on ``switch`` for every code.

    Parameters
    ----------
    function : callable or numba dispatcher
        The kernel that switches.
    switch : str
        The name of its variable holding the code.
    codes : dict
        ``{name: code}``: what the kernel claims to run (from the op table, e.g.
        ``optable.loss_codes()``).
    what : str
        Who asks, for the message (``"fastlib.cuda.loss"``).
    """
    missing = {name: code for name, code in codes.items()
               if code not in branch_codes(function, switch)}
    if missing:
        raise ImportError(f"{what}: {getattr(function, '__name__', function)} has no branch on "
                          f"{switch!r} for {missing}: add one for each (the kernels switch on "
                          f"the op table's codes)")
