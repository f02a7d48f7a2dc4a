"""The import graph of spec, reflib, fastlib and reports has no cycles and keeps its arrows.

Every ``import`` statement in the packages counts, at module level and inside functions alike:
a function-level import only hides a cycle until the function runs. The graph is read from the
source with ``ast`` (nothing is imported), an edge per imported module of the repository
(``from a.b import c`` is an edge to ``a.b.c`` where that is a module, else to ``a.b``).
Imports under ``if TYPE_CHECKING:`` never run and do not count. docs/architecture.md states the
arrows.
"""
from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("spec", "reflib", "fastlib", "reports")
# package -> the packages it may import (docs/architecture.md, "The four packages")
ALLOWED = {"spec": {"spec"}, "reflib": {"reflib", "spec"}, "fastlib": {"fastlib"},
           "reports": set(PACKAGES)}


def module_name(path, root):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node):
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree, this, is_package):
    """(module, line) of every import statement that runs, relative ones resolved."""
    found = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = this.split(".") if is_package else this.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            found.extend((base, node.lineno, alias.name) for alias in node.names)
        visit(node)

    visit(tree)
    return found


def import_graph(root, packages=PACKAGES):
    """{module: {imported module: first line}} over the packages' ``.py`` files under root."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            files[module_name(path, root)] = path
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = graph.setdefault(name, {})
        for base, line, member in _imports(tree, name, path.name == "__init__.py"):
            target = f"{base}.{member}" if member and f"{base}.{member}" in files else base
            if target in files and target != name:
                edges.setdefault(target, line)
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def _describe(component, graph):
    members = set(component)
    return "; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in component
                     for b in sorted(graph[a]) if b in members)


# Cycles left to break, each named by one of its modules. Listed so that no new one can join
# them unseen; when one is broken, delete its entry (the test says so).
KNOWN_CYCLES = {}   # name -> why: a cycle accepted for now (none is)


@functools.lru_cache(maxsize=None)
def _graph():
    return import_graph(ROOT)


def test_no_import_cycles():
    graph = _graph()
    assert len(graph) > 100, "the source tree was not found"
    found = cycles(graph)
    new = [c for c in found if not KNOWN_CYCLES.keys() & set(c)]
    assert not new, "import cycles (break them: move the shared piece into a module both " \
        "can import):\n" + "\n".join(_describe(c, graph) for c in new)
    broken = [k for k in KNOWN_CYCLES if not any(k in c for c in found)]
    assert not broken, f"no longer in a cycle, delete from KNOWN_CYCLES: {broken}"


@pytest.mark.parametrize("pair", [("fastlib.io", "fastlib.layers.base"),
                                  ("fastlib.training.algorithms", "fastlib.training.mlp_schedule"),
                                  ("reports.conformance.mutants", "reports.commands.conform")])
def test_the_three_former_cycles_stay_broken(pair):
    from fastlib.training.schedules import SCHEDULE_MODULES

    # bp imports the program's schedules by name (importlib): count those edges too
    graph = {k: dict(v) for k, v in _graph().items()}
    graph["fastlib.training.schedules"].update({m: 0 for m in SCHEDULE_MODULES})
    assert all(m in graph for m in pair), pair
    assert not any(set(pair) <= set(c) for c in cycles(graph)), pair


def test_the_kernels_never_import_the_training_package():
    """The compiled program's instruction set and interpreter are kernels: fastlib.kernels
    reads nothing of fastlib.training (the schedules import the kernels, never the reverse)."""
    wrong = [f"{a} -> {b} (line {line})" for a, edges in _graph().items()
             if a.startswith("fastlib.kernels") for b, line in edges.items()
             if b == "fastlib.training" or b.startswith("fastlib.training.")]
    assert not wrong, "fastlib.kernels imports fastlib.training:\n" + "\n".join(wrong)


def test_the_package_arrows_point_one_way():
    graph = _graph()
    wrong = [f"{a} -> {b} (line {line})" for a, edges in graph.items()
             for b, line in edges.items() if b.split(".")[0] not in ALLOWED[a.split(".")[0]]]
    assert not wrong, "imports against the package arrows:\n" + "\n".join(wrong)


def _write(root, name, text):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_planted_function_level_cycle_is_found(tmp_path):
    _write(tmp_path, "fastlib/__init__.py", "")
    _write(tmp_path, "fastlib/a.py", "from fastlib import b\n")
    _write(tmp_path, "fastlib/b.py", "def f():\n    from . import c\n")
    _write(tmp_path, "fastlib/c.py", "def g():\n    import fastlib.a\n")
    _write(tmp_path, "fastlib/d.py", "from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from fastlib import a\n")
    _write(tmp_path, "fastlib/pkg/__init__.py", "from .e import x\n")
    _write(tmp_path, "fastlib/pkg/e.py", "from ..a import y\n")
    graph = import_graph(tmp_path, ("fastlib",))
    assert graph["fastlib.pkg"] == {"fastlib.pkg.e": 1}
    assert graph["fastlib.pkg.e"] == {"fastlib.a": 1}
    assert graph["fastlib.d"] == {}                        # TYPE_CHECKING only
    assert cycles(graph) == [["fastlib.a", "fastlib.b", "fastlib.c"]]
