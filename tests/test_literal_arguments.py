"""No compiled kernel calls a parallel kernel with a constant argument.

Numba compiles a function called from another kernel once per distinct constant argument (a
literal ``True`` or ``-1`` is a type of its own), so constants at two call sites of one
parallel region compile it, and everything under it, twice: the Dense columns' epoch once
compiled its region three times per dtype that way (docs/performance.md, "Literal
arguments"). Read from the sources: a cold compile to count signatures would take a minute.
"""
import ast
import pathlib

KERNELS = pathlib.Path(__file__).resolve().parents[1] / "fastlib" / "kernels"


def _decorator_keywords(fn):
    """The keywords of each ``@njit(...)`` / ``@numba.njit(...)`` on ``fn`` (None: not one)."""
    for d in fn.decorator_list:
        call = d if isinstance(d, ast.Call) else None
        target = call.func if call else d
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
        if name == "njit":
            return {k.arg: k.value for k in (call.keywords if call else [])}
    return None


def _is_constant(node):
    return isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp)
                                              and isinstance(node.operand, ast.Constant))


def literal_calls(modules):
    """``(file, line, callee)`` of every call, inside a compiled function of ``modules`` (paths),
    to a ``parallel=True`` kernel of theirs with a constant positional or keyword argument."""
    functions = [(path, fn) for path in modules for fn in ast.walk(ast.parse(path.read_text()))
                 if isinstance(fn, ast.FunctionDef) and _decorator_keywords(fn) is not None]
    parallel = {fn.name for _, fn in functions
                if getattr(_decorator_keywords(fn).get("parallel"), "value", False) is True}
    found = []
    for path, fn in functions:
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            arguments = list(call.args) + [k.value for k in call.keywords]
            if name in parallel and any(_is_constant(a) for a in arguments):
                found.append((path.name, call.lineno, name))
    return found


def test_no_kernel_passes_a_constant_to_a_parallel_kernel():
    modules = sorted(KERNELS.glob("*.py"))
    assert any("_pair_region" in p.read_text() for p in modules)   # the scan sees the epochs
    assert literal_calls(modules) == []


def test_the_scan_finds_a_planted_constant(tmp_path):
    source = (KERNELS / "dense_columns.py").read_text()
    planted = source.replace("_pair_region(threads, layer, no, no,",
                             "_pair_region(threads, layer, False, no,", 1)
    assert planted != source
    (tmp_path / "dense_columns.py").write_text(planted)
    found = literal_calls([tmp_path / "dense_columns.py"])
    assert [name for _, _, name in found] == ["_pair_region"]
