"""Applying mutants to a temporary copy of fastlib and running the suite against each.

One mutant at a time: copy the ``fastlib`` package (with its Numba cache) into a fresh temporary
directory, replace the mutant's target text (which must occur exactly once: a refactor cannot
silently turn a mutant into a no-op), drop the Numba cache of the mutated module and of every
module that mentions it (Numba does not track calls across files, so a cached caller would keep
the old code), and run ``verigrad conform`` on the ``fastlib`` engine in a subprocess whose
working directory is the copy, so that ``import fastlib`` finds the mutated package first.

The long story: docs/reports-conformance.md, section ``reports/conformance/mutant_runner.py``.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MutantError", "MutantResult", "fastlib_source", "apply_mutant", "check_targets",
           "run_mutant", "run_control"]


class MutantError(ValueError):
    """A mutant whose target text is missing (or ambiguous) in the current fastlib source."""


@dataclass
class MutantResult:
    """The verdict on one mutant."""

    key: str
    what: str
    caught: bool
    seconds: float
    examples: int = 0
    failed_row: str = ""
    detail: str = ""


def fastlib_source():
    """The directory of the ``fastlib`` package these mutants target (the one importable here)."""
    import fastlib

    return Path(fastlib.__file__).resolve().parent


def _project_root():
    import reports

    return Path(reports.__file__).resolve().parent.parent


def apply_mutant(mutant, package_dir):
    """Patch the copy of fastlib at ``package_dir`` with ``mutant``; return the patched path.

    Raises
    ------
    MutantError
        When the target text does not occur exactly once in the file.
    """
    path = Path(package_dir) / mutant.path
    if not path.exists():
        raise MutantError(f"mutant {mutant.key}: fastlib/{mutant.path} does not exist")
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise MutantError(f"mutant {mutant.key}: its target text occurs {count} times in "
                          f"fastlib/{mutant.path} (expected exactly once); update the mutant to "
                          f"the current source")
    path.write_text(text.replace(mutant.old, mutant.new))
    return path


def check_targets(mutants, package_dir=None):
    """Problems with ``mutants`` against the source (each target exactly once, new != old)."""
    package_dir = Path(package_dir or fastlib_source())
    problems = []
    keys = set()
    for m in mutants:
        if m.key in keys:
            problems.append(f"mutant key {m.key!r} is used twice")
        keys.add(m.key)
        if _is_hook(m):
            problems += _hook_problems(m)
            continue
        if m.old == m.new:
            problems.append(f"mutant {m.key}: replacement equals the target (a no-op)")
        path = package_dir / m.path
        if not path.exists():
            problems.append(f"mutant {m.key}: fastlib/{m.path} does not exist")
            continue
        count = path.read_text().count(m.old)
        if count != 1:
            problems.append(f"mutant {m.key}: target text occurs {count} times in "
                            f"fastlib/{m.path}")
    return problems


def _is_hook(mutant):
    return hasattr(mutant, "module") and not hasattr(mutant, "old")


def _hook_problems(mutant):
    """A hook mutant must name an importable module whose ``MUTANTS`` has its key."""
    import importlib

    try:
        table = importlib.import_module(mutant.module).MUTANTS
    except (ImportError, AttributeError) as exc:
        return [f"mutant {mutant.key}: cannot load {mutant.module}.MUTANTS ({exc})"]
    if mutant.key not in table or not callable(getattr(table[mutant.key], "apply", None)):
        return [f"mutant {mutant.key}: {mutant.module}.MUTANTS has no such mutant with apply()"]
    return []


def _imported_names(text):
    """Every dotted component a module's import statements mention."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.update(alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            names.update((node.module or "").split("."))
            names.update(alias.name for alias in node.names)
    return names


def _drop_numba_cache(package_dir, mutated):
    """Delete the Numba cache of ``mutated`` and of every module importing it, transitively."""
    imports = {p: _imported_names(p.read_text()) for p in Path(package_dir).rglob("*.py")}
    stale, todo = set(), [Path(mutated)]
    while todo:
        current = todo.pop()
        if current in stale:
            continue
        stale.add(current)
        if current.stem != "__init__":
            todo += [p for p, names in imports.items() if p not in stale and current.stem in names]
    for source in stale:
        cache = source.parent / "__pycache__"
        if cache.is_dir():
            for f in cache.glob(f"{source.stem}.*.nb[ic]"):
                f.unlink()


def _copy_fastlib(workdir):
    target = Path(workdir) / "fastlib"
    shutil.copytree(fastlib_source(), target, copy_function=shutil.copy2)
    return target


# The subprocess of a hook mutant: plant the bug, then run the command line of ``_conform_args``.
_HOOK_SCRIPT = """\
import importlib, sys
from reports.cli import main
module, key = sys.argv[1:3]
with importlib.import_module(module).MUTANTS[key].apply():
    code = main(sys.argv[3:])
sys.exit(code)
"""


def _conform_args(profile, seed, first, out):
    """The ``verigrad conform`` arguments every mutant (of either kind) is judged by.

    One process (``--workers 1``): a hook mutant is applied in the process that runs the
    checks, which worker processes would not see, and a source mutant's mutated kernels would
    be compiled again in every worker."""
    args = ["conform", "--profile", profile, "--engines", "fastlib", "--no-proofs", "--fail-fast",
            "--no-progress", "--workers", "1", "--seed", str(seed), "--json", str(out)]
    return args + (["--first", *first] if first else [])


def _run_suite(workdir, profile, seed, first, cache_dir, timeout, hook=None):
    """Run the dev profile in a subprocess, in the mutated copy at ``workdir`` or, for a
    ``hook`` mutant, in the project root under its ``apply()``."""
    out = Path(workdir) / "conform.json"
    env = dict(os.environ)
    root = str(_project_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cache_dir:
        env["VERIGRAD_CONFORM_CACHE"] = str(cache_dir)
    args = _conform_args(profile, seed, first, out)
    if hook is None:
        check = subprocess.run([sys.executable, "-c", "import fastlib; print(fastlib.__file__)"],
                               cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
        imported = check.stdout.strip()
        if not imported.startswith(str(Path(workdir).resolve())) and not imported.startswith(
                str(workdir)):
            raise MutantError(f"the suite would import fastlib from "
                              f"{imported or check.stderr!r}, not from the mutated copy in "
                              f"{workdir}")
        cmd, cwd = [sys.executable, "-m", "reports", *args], workdir
    else:
        cmd, cwd = [sys.executable, "-c", _HOOK_SCRIPT, hook.module, hook.key, *args], root
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    seconds = time.perf_counter() - start
    payload = json.loads(out.read_text()) if out.exists() else None
    return proc, payload, seconds


def _verdict(key, what, proc, payload, seconds):
    if payload is None:
        # the suite could not even start (an import error in the mutated package): that is a
        # failure the user would see at once, so the mutant counts as caught
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return MutantResult(key, what, proc.returncode != 0, seconds, 0, "import",
                            " / ".join(tail))
    rows = payload["rows"]
    failed = [r for r in rows if r["status"] in ("FAIL", "error")]
    examples = sum(int(r["examples"]) for r in rows)
    if failed:
        r = failed[0]
        detail = r["detail"].strip().splitlines()[0] if r["detail"] else ""
        return MutantResult(key, what, True, seconds, examples,
                            f"{r['check']} {r['name']} [{r['dtype']}]", detail[:200])
    return MutantResult(key, what, False, seconds, examples, "", "survived every check")


# NOTE: one dev-profile run of every fastlib row (the control, or a mutant no row catches), the
# bfloat16 and float16 rows included, takes 20-40 minutes on a loaded two-core machine
RUN_TIMEOUT = 5400


def run_mutant(mutant, profile="dev", seed=0, cache_dir=None, timeout=RUN_TIMEOUT):
    """Apply ``mutant`` to a fresh copy of fastlib (or, for a ``HookMutant``, plant it with its
    ``apply()`` in the subprocess) and run the suite on it.

    Returns
    -------
    MutantResult
    """
    with tempfile.TemporaryDirectory(prefix=f"verigrad-mutant-{mutant.key}-") as workdir:
        if _is_hook(mutant):   # planted in the subprocess by apply(); fastlib itself unchanged
            problems = _hook_problems(mutant)
            if problems:
                raise MutantError(problems[0])
            proc, payload, seconds = _run_suite(workdir, profile, seed, mutant.first,
                                                cache_dir, timeout, hook=mutant)
            if payload is None:   # the harness itself broke (fastlib is intact): not a catch
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                return MutantResult(mutant.key, mutant.what, False, seconds, 0, "",
                                    "the run did not finish: " + " / ".join(tail))
            return _verdict(mutant.key, mutant.what, proc, payload, seconds)
        package = _copy_fastlib(workdir)
        patched = apply_mutant(mutant, package)
        _drop_numba_cache(package, patched)
        proc, payload, seconds = _run_suite(workdir, profile, seed, mutant.first, cache_dir,
                                            timeout)
        return _verdict(mutant.key, mutant.what, proc, payload, seconds)


def run_control(profile="dev", seed=0, cache_dir=None, timeout=RUN_TIMEOUT):
    """The unmutated copy through the same harness: it must pass (``caught`` False)."""
    with tempfile.TemporaryDirectory(prefix="verigrad-mutant-control-") as workdir:
        _copy_fastlib(workdir)
        proc, payload, seconds = _run_suite(workdir, profile, seed, (), cache_dir, timeout)
        return _verdict("control", "fastlib unchanged", proc, payload, seconds)
