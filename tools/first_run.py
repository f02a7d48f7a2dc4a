"""Measure the first `verigrad conform` (an empty Numba cache) and the next one, and record both.

Both runs use one fresh ``NUMBA_CACHE_DIR`` and one fresh folder of exact values
(``VERIGRAD_CONFORM_CACHE``): the first compiles every kernel it calls and computes every exact
value, the second loads them, as a user's first and second runs do. Every process of a run (the
command and its workers) counts its Numba compilations by the kernel's module (a Numba event
listener, installed from a temporary ``sitecustomize``), so the record says where the first
run's time went. The file carries the envelope of every docs/results/ file (command, date,
machine, versions, load, seconds, data) and renders as the ``first-run`` tables of
docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "results" / "first-run.json"
#: what a first run may take on a two-core machine, and the next one (seconds): the record
#: says whether each run met its target
TARGETS = {"cold": 180, "warm": 90}

#: Installed in every process of a measured run: the compile time of each kernel by module,
#: without the time of the kernels it compiled on the way (those count for their own module).
PROBE = '''
import atexit, json, os, time
from collections import defaultdict
_out = os.environ.get("VERIGRAD_FIRST_RUN_PROBE")
if _out:
    _stats, _stack, _kernels = defaultdict(lambda: [0, 0.0]), [], []
    def _listen():
        from numba.core import event
        class _Compiles(event.Listener):
            def on_start(self, ev):
                _stack.append([time.perf_counter(), 0.0])
            def on_end(self, ev):
                start, inner = _stack.pop()
                took = time.perf_counter() - start
                if _stack:
                    _stack[-1][1] += took
                func = ev.data["dispatcher"].py_func
                entry = _stats[getattr(func, "__module__", "?")]
                entry[0] += 1
                entry[1] += took - inner
                _kernels.append([f"{getattr(func, '__module__', '?')}."
                                 f"{getattr(func, '__qualname__', '?')}{ev.data.get('args')}",
                                 took - inner])
        event.register("numba:compile", _Compiles())
    def _dump():
        with open(f"{_out}.{os.getpid()}.json", "w") as fh:
            out = {m: {"kernels": n, "seconds": s} for m, (n, s) in _stats.items()}
            json.dump(dict(out, __kernels__=_kernels), fh)
    _listen()   # every process of a conform run imports Numba anyway
    atexit.register(_dump)
'''


def _load():
    return round(os.getloadavg()[0], 2)


def compiled_again(by_kernel):
    """Seconds of compiling a process did although another compiled the same kernel and
    signature: per kernel, every process's time but the longest one's.

    ``by_kernel`` maps a kernel and signature to ``{process: seconds}``.
    """
    return sum(sum(times.values()) - max(times.values()) for times in by_kernel.values())


def run_once(args, cache_dir, scratch, label):
    """One ``verigrad conform`` with ``args`` over ``cache_dir`` (its Numba cache and, beside
    it, its exact values): its figures (a dict)."""
    probe_dir = scratch / "probe"
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    rows_file = scratch / f"{label}.json"
    prefix = scratch / f"{label}-compiles"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), VERIGRAD_FIRST_RUN_PROBE=str(prefix),
               VERIGRAD_CONFORM_CACHE=str(cache_dir.parent / "exact-values"),
               PYTHONPATH=os.pathsep.join([str(probe_dir), str(ROOT)]
                                          + ([os.environ["PYTHONPATH"]]
                                             if os.environ.get("PYTHONPATH") else [])))
    load_before = _load()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "reports", "conform", *args, "--json",
                           str(rows_file)], cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # NOTE: the processor time of the command and its workers (every waited-for descendant):
    # what the run cost, whatever else the machine was running
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    if proc.returncode not in (0, 1) or not rows_file.is_file():
        raise SystemExit(f"verigrad conform {' '.join(args)} exited {proc.returncode}:\n"
                         f"{proc.stderr[-3000:]}")
    doc = json.loads(rows_file.read_text())
    modules, processes, by_kernel = {}, 0, {}
    for part in scratch.glob(f"{prefix.name}.*.json"):
        processes += 1
        found = json.loads(part.read_text())
        for kernel, took in found.pop("__kernels__", []):
            per_process = by_kernel.setdefault(kernel, {})
            per_process[part.name] = per_process.get(part.name, 0.0) + took
        for module, entry in found.items():
            total = modules.setdefault(module, {"kernels": 0, "seconds": 0.0})
            total["kernels"] += entry["kernels"]
            total["seconds"] += entry["seconds"]
    statuses = {}
    for row in doc["rows"]:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    by_kind = {}
    for row in doc["rows"]:
        by_kind[row["check"]] = round(by_kind.get(row["check"], 0.0) + row["seconds"], 2)
    notice = [line for line in proc.stderr.splitlines() if "compiling" in line]
    return {"cache": label, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
            "load_before": load_before,
            "load_after": _load(), "exit": proc.returncode, "workers": doc.get("workers"),
            "processes": processes, "checks": len(doc["rows"]), "statuses": statuses,
            "proofs": len(doc["proofs"]),
            "proof_seconds": round(sum(p["seconds"] for p in doc["proofs"]), 2),
            "row_seconds": by_kind,
            "kernels_compiled": doc.get("kernels_compiled", 0),
            "compile_seconds": round(sum(m["seconds"] for m in modules.values()), 2),
            "compiled_again_seconds": round(compiled_again(by_kernel), 2),
            "compiles": {m: {"kernels": e["kernels"], "seconds": round(e["seconds"], 2)}
                         for m, e in sorted(modules.items(), key=lambda kv: -kv[1]["seconds"])},
            "notice": notice, "summary": proc.stdout.strip().splitlines()[-1:]}


def recorded(argv, data, seconds, load_before):
    """``data`` in the envelope every file under docs/results/ carries (its output path left
    out of the command)."""
    sys.path.insert(0, str(ROOT))
    from reports import provenance
    from reports.results_tables import without_outputs

    return {"command": " ".join(["python tools/first_run.py", *without_outputs(argv)]),
            "date": provenance.now(), "machine": provenance.machine(),
            "versions": provenance.versions(), "load_before": load_before,
            "load_after": _load(), "seconds": round(seconds, 1), "data": data}


def main(argv=None):
    """Run the cold and the warm ``verigrad conform``, print their times, write the record."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python tools/first_run.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help="the results file to write (default: docs/results/first-run.json)")
    parser.add_argument("conform_args", nargs="*",
                        help="arguments of verigrad conform (after --), e.g. -- --workers 1")
    args = parser.parse_args(argv)
    load_before = _load()
    start = time.perf_counter()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="verigrad-first-run-"))
    try:
        cache = scratch / "numba-cache"
        cache.mkdir()
        runs = []
        for label in ("cold", "warm"):
            runs.append(run_once(args.conform_args, cache, scratch, label))
            run = runs[-1]
            print(f"{label}: {run['seconds']} s, {run['checks']} checks {run['statuses']}, "
                  f"{run['kernels_compiled']} kernels compiled, load {run['load_before']} -> "
                  f"{run['load_after']}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    data = {"conform_args": args.conform_args, "cores": os.cpu_count(), "targets": TARGETS,
            "runs": runs}
    doc = recorded(argv, data, time.perf_counter() - start, load_before)
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
