"""Kernels that switch on a table's code, generated with one branch per entry.

The elementwise kernels (one branch per unary op of the op table) and the optimizer updates
(one per optimizer of the registry) are written as the text of one ``if code == ...`` chain,
built here from the table and compiled for the target (Numba's CPU ``njit`` or CUDA device
functions): an entry added to the table gets its branch without an edit to the kernel, and
nothing is written once per entry outside the module that holds the entry's own code.
"""
from __future__ import annotations

__all__ = ["switch_source", "compile_switch"]


def switch_source(name, params, switch, cases, head=(), tail=()):
    """The text of ``def name(params)``: ``head``, one ``if switch == code:`` branch per case,
    then ``tail``.

    Parameters
    ----------
    name, params : str
        The function's name and its parameter list (``"op, x, out, slope"``).
    switch : str
        The parameter holding the code.
    cases : iterable of (int, str, list of str)
        ``(code, comment, lines)``: the branch's code, a comment naming the entry, and its
        body (unindented).
    head, tail : sequence of str
        Lines before the first branch and after the last (indented as the function body).
    """
    lines = [f"def {name}({params}):", *head]
    for k, (code, comment, body) in enumerate(cases):
        lines.append(f"    {'if' if k == 0 else 'elif'} {switch} == {code}:  # {comment}")
        lines += ["        " + line for line in body]
    return "\n".join(lines + list(tail)) + "\n"


def compile_switch(source, name, namespace, jit):
    """Execute the generated ``source`` over ``namespace`` (the names its branches call) and
    return ``jit`` applied to the function ``name`` it defines."""
    namespace = dict(namespace)
    exec(compile(source, f"<generated {name}>", "exec"), namespace)
    return jit(namespace[name])
