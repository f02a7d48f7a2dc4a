"""Measure the packages' shape at two commits: code lines, duplicated-block pairs, epoch
kernels, and how many package files name each optimizer and each activation.

Each commit's packages (fastlib, optable, reflib, spec, reports) are exported with
``git archive`` into a scratch folder; ``duplicates`` (a duplicate-block finder on PATH) runs
there. Usage::

    python tools/measure_structure.py --before REV [--after REV] [--seconds 120] [--json FILE]

Prints a table of the figures; ``--json`` writes them in the envelope every docs/results/ file
carries (the command, date, machine, versions, load before and after, seconds).
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import tokenize

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("fastlib", "optable", "reflib", "spec", "reports")
# the names at the head of the registries of the measured (after) tree; a name the before
# tree lacks simply counts zero files there
OPTIMIZERS = ("SGD", "Momentum", "NAG", "Adagrad", "RMSprop", "Adam", "AdamW")
# the peers' adapters map each name to another library's own class: they name every optimizer
PEER_ADAPTERS = "reports/conformance/adapters/"
ACTIVATIONS = ("relu", "leaky_relu", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh", "softplus",
               "softmax")


def export(rev, into):
    """Write the packages of commit ``rev`` under folder ``into``; returns the full hash."""
    full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], check=True,
                          capture_output=True, text=True).stdout.strip()
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", full, *PACKAGES],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return full


def python_files(tree):
    return sorted(p for pkg in PACKAGES for p in (tree / pkg).rglob("*.py"))


def code_lines(text):
    """``(lines, lines_without_docstrings)``: non-blank lines that are not only a comment; the
    second also leaves out the lines of docstrings (module, class and function)."""
    lines = [ln.strip() for ln in text.splitlines()]
    kept = {i + 1 for i, ln in enumerate(lines) if ln and not ln.startswith("#")}
    doc = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    getattr(body[0], "value", None), ast.Constant) and isinstance(
                    body[0].value.value, str):
                doc |= set(range(body[0].lineno, body[0].end_lineno + 1))
    return len(kept), len(kept - doc)


def epoch_kernels(tree):
    """``["module.epoch"]``: module-level functions named ``epoch`` compiled with ``njit`` in
    fastlib (each runs a whole epoch as one compiled call)."""
    found = []
    for path in sorted((tree / "fastlib").rglob("*.py")):
        for node in ast.parse(path.read_text("utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name == "epoch" and any(
                    "jit" in ast.unparse(d) for d in node.decorator_list):
                found.append(str(path.relative_to(tree).with_suffix("")).replace("/", ".")
                             + ".epoch")
    return found


def _snake(name):
    return name.lower()


def files_naming(tree, names, snake=True):
    """Per name: the package files that hold it as a whole word (case-sensitive), counting the
    class-style name and, when ``snake``, its lower-case spelling."""
    texts = {str(p.relative_to(tree)): p.read_text("utf-8") for p in python_files(tree)}
    out = {}
    for name in names:
        spellings = {name, _snake(name)} if snake else {name}
        word = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, sorted(spellings))) +
                          r")(?![\w])")
        out[name] = sorted(f for f, t in texts.items() if word.search(t))
    return out


def duplicate_pairs(tree, seconds):
    """The first line of ``duplicates`` run over the exported packages: the pair count."""
    line = subprocess.run(["duplicates", "--seconds", str(seconds), "--most", "200"], cwd=tree,
                          check=True, capture_output=True, text=True).stdout.splitlines()[0]
    match = re.match(r"(\d+) pairs?", line)
    return (int(match.group(1)) if match else 0), line


def measure(rev, seconds):
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp)
        full = export(rev, tree)
        files = python_files(tree)
        per_pkg = {pkg: [0, 0] for pkg in PACKAGES}
        for path in files:
            lines, bare = code_lines(path.read_text("utf-8"))
            pkg = path.relative_to(tree).parts[0]
            per_pkg[pkg][0] += lines
            per_pkg[pkg][1] += bare
        pairs, first_line = duplicate_pairs(tree, seconds)
        optim = files_naming(tree, OPTIMIZERS)
        act = files_naming(tree, ACTIVATIONS, snake=False)
        return {"rev": full, "python_files": len(files),
                "code_lines": sum(v[0] for v in per_pkg.values()),
                "code_lines_without_docstrings": sum(v[1] for v in per_pkg.values()),
                "code_lines_per_package": {k: v[0] for k, v in per_pkg.items()},
                "duplicate_pairs": pairs, "duplicates_first_line": first_line,
                "epoch_kernels": epoch_kernels(tree),
                "files_per_optimizer": {k: len(v) for k, v in optim.items()},
                "files_per_optimizer_without_peer_adapters": {
                    k: len([f for f in v if not f.startswith(PEER_ADAPTERS)])
                    for k, v in optim.items()},
                "optimizer_files": optim,
                "files_per_activation": {k: len(v) for k, v in act.items()},
                "activation_files": act}


def _provenance():
    sys.path.insert(0, str(ROOT))
    from reports import provenance
    return provenance


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the earlier commit")
    parser.add_argument("--after", default="HEAD", help="the later commit (default HEAD)")
    parser.add_argument("--seconds", type=int, default=120, help="duplicates' time limit")
    parser.add_argument("--json", help="write the figures, with their provenance, here")
    args = parser.parse_args(argv)
    load_before, t0 = round(os.getloadavg()[0], 2), time.perf_counter()
    data = {"packages": list(PACKAGES),
            "before": measure(args.before, args.seconds),
            "after": measure(args.after, args.seconds)}
    seconds = time.perf_counter() - t0
    b, a = data["before"], data["after"]
    rows = [("code lines", b["code_lines"], a["code_lines"]),
            ("code lines without docstrings", b["code_lines_without_docstrings"],
             a["code_lines_without_docstrings"]),
            ("duplicated-block pairs", b["duplicate_pairs"], a["duplicate_pairs"]),
            ("epoch kernels", len(b["epoch_kernels"]), len(a["epoch_kernels"]))]
    rows += [(f"files naming {k}", b["files_per_optimizer"][k], a["files_per_optimizer"][k])
             for k in OPTIMIZERS]
    rows += [(f"files naming {k}, peer adapters left out",
              b["files_per_optimizer_without_peer_adapters"][k],
              a["files_per_optimizer_without_peer_adapters"][k]) for k in OPTIMIZERS]
    rows += [(f"files naming {k}", b["files_per_activation"][k], a["files_per_activation"][k])
             for k in ACTIVATIONS]
    print(f"figure | before {b['rev'][:7]} | after {a['rev'][:7]}")
    for name, x, y in rows:
        print(f"{name} | {x} | {y}")
    if args.json:
        prov = _provenance()
        words = ["python", "tools/measure_structure.py", "--before", args.before]
        words += [] if args.after == "HEAD" else ["--after", args.after]
        words += [] if args.seconds == 120 else ["--seconds", str(args.seconds)]
        doc = {"command": " ".join(words), "date": prov.now(), "machine": prov.machine(), "versions": prov.versions(),
               "load_before": load_before, "load_after": prov.load_average(),
               "seconds": round(seconds, 1), "data": data}
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
