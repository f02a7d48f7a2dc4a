"""Train a list of compiled models here and in another checkout of the repository, and compare
every resulting array bit for bit.

Each case (model x optimizer x piece plan) trains two epochs in a subprocess whose
``PYTHONPATH`` is one checkout, and saves its parameters, loss history and the schedule that
ran it; the arrays of the two checkouts are compared with ``np.array_equal``, and where they
differ, by how many units in the last place of the array's largest entry. Usage::

    python tools/compare_training.py --against b3f9304 [--models lstm,attention]
        [--optimizers Adam,SGD] [--pieces machine,3] [--json FILE]

``--against`` is a revision of this repository (checked out into a temporary worktree for the
run, so the recorded command names no scratch path) or the root of another checkout.
``--json`` writes the rows in the envelope every docs/results/ file carries.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Each model: (build source, data source, loss, batch size, gradient clip, clip mode). The
# sources use the public API only, so every checkout runs them alike.
MODELS = {
    "mlp": ("fl.Sequential([fl.Dense(128, 256, 'relu'), fl.Dense(256, 10)], seed=0)",
            "rng.standard_normal((37, 128)).astype(np.float32), rng.integers(0, 10, (37, 1))",
            "cross_entropy", 8, 0.0, "value"),
    "mlp-deep": ("fl.Sequential([fl.Dense(12, 9, 'tanh'), fl.Dense(9, 7, 'leaky_relu'), "
                 "fl.Dense(7, 4, 'sigmoid')], dtype=np.float64, seed=0)",
                 "rng.standard_normal((37, 12)), rng.random((37, 4))", "mse", 5, 0.5, "norm"),
    "lstm": ("fl.Sequential([fl.LSTM(8, 16), fl.Dense(16, 4)], seed=0)",
             "rng.standard_normal((37, 6, 8)).astype(np.float32), rng.integers(0, 4, (37, 1))",
             "cross_entropy", 8, 0.5, "value"),
    "rnn-tokens": ("fl.Sequential([fl.Embedding(12, 8), fl.RNN(8, 16, return_sequences=True), "
                   "fl.LSTM(16, 8, return_sequences=True), fl.Dense(8, 3, 'tanh')], seed=0)",
                   "rng.integers(0, 12, (37, 5)), rng.standard_normal((37, 5, 3))"
                   ".astype(np.float32)", "mse", 8, 0.0, "value"),
    "attention": ("fl.Sequential([fl.MultiHeadAttention(16, 4, causal=True), fl.LayerNorm(16), "
                  "fl.SwiGLU(16, 32, 16)], seed=0)",
                  "rng.standard_normal((37, 8, 16)).astype(np.float32), "
                  "rng.standard_normal((37, 8, 16)).astype(np.float32)", "mse", 8, 1.0, "norm"),
    "transformer": ("fl.Sequential([fl.Embedding(11, 16), fl.Parallel([fl.Dense(16, 16), "
                    "fl.Sequential([fl.LayerNorm(16), fl.MultiHeadAttention(16, 2, causal=True)])"
                    "], combine='add'), fl.Parallel([fl.Dense(16, 16), fl.Sequential(["
                    "fl.LayerNorm(16), fl.SwiGLU(16, 24, 16)])], combine='add'), "
                    "fl.LayerNorm(16), fl.Dense(16, 11)], seed=0)",
                    "rng.integers(0, 11, (37, 8)), (rng.random((37, 8, 11)) > 0.8)"
                    ".astype(np.float32)", "binary_cross_entropy_with_logits", 8, 0.0, "value"),
    "mixed": ("fl.Sequential([fl.LSTM(6, 6, return_sequences=True), fl.RMSNorm(6), "
              "fl.Parallel([fl.Dense(6, 6, 'gelu'), fl.MultiHeadAttention(6, 3)], "
              "combine='add'), fl.Parallel([fl.SwiGLU(6, 5, 4), fl.Dense(6, 2, 'silu')], "
              "combine='concat'), fl.Dense(6, 3)], dtype=np.float64, seed=0)",
              "rng.standard_normal((37, 4, 6)), rng.standard_normal((37, 4, 3))", "mse", 8,
              0.0, "value"),
}
OPTIMIZERS = ("Adam", "SGD")
PIECES = ("machine", "3")

_DRIVER = """
import json, sys
import numpy as np
import fastlib as fl
case = json.loads(sys.argv[1])
rng = np.random.default_rng(7)
model = {build}
x, y = {data}
lr = {{"Adam": 1e-2, "SGD": 0.05}}[case["optimizer"]]
pieces = None if case["pieces"] == "machine" else int(case["pieces"])
r = fl.train(model, x, y, 2, case["batch"], lr, case["loss"], optimizer=case["optimizer"],
             seed=1, verbose=False, pieces=pieces, gradient_clip=case["clip"],
             clip_mode=case["clip_mode"])
arrays = {{"param:" + k: v for k, v in model.parameters().items()}}
arrays["loss_history"] = np.asarray(r.loss_history)
np.savez(case["out"], schedule=np.array(str(r.schedule)), **arrays)
"""


def run_case(tree, name, optimizer, pieces, out):
    """Train case (``name``, ``optimizer``, ``pieces``) with ``PYTHONPATH=tree``; its arrays go
    to ``out`` (an .npz)."""
    build, data, loss, batch, clip, mode = MODELS[name]
    case = {"optimizer": optimizer, "pieces": pieces, "batch": batch, "loss": loss, "clip": clip,
            "clip_mode": mode, "out": str(out)}
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, "-c", _DRIVER.format(build=build, data=data),
                    json.dumps(case)], env=env, check=True, cwd=tree)
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def _largest_change(here, there, keys):
    """The largest difference over the arrays ``keys``, relative to each array's largest
    magnitude (0.0 when none differs)."""
    return max([float(np.max(np.abs(here[k] - there[k])) / max(np.max(np.abs(there[k])), 1e-300))
                for k in keys if k in there and here[k].shape == there[k].shape] + [0.0])


def _ulps(here, there, keys):
    """The arrays ``keys`` by their largest difference in units in the last place of the array's
    largest entry (in the array's dtype), most first: ``"name 12; ..."`` ("" when none)."""
    found = []
    for k in keys:
        if k in there and here[k].shape == there[k].shape:
            big = np.abs(there[k]).max().astype(there[k].dtype)
            diff = np.abs(here[k].astype(np.float64) - there[k]).max()
            found.append((float(diff / np.spacing(big)) if big else float("inf"), k))
    return "; ".join(f"{k} {u:.3g}" for u, k in sorted(found, reverse=True))


def compare(against, names, optimizers, pieces, report=print):
    """Run every case in both trees; returns rows ``(case, schedule here, schedule there,
    arrays equal, arrays, first differing array or "", largest relative difference, differing
    arrays by ulps)``."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for opt in optimizers:
                for plan in pieces:
                    case = f"{name}/{opt}/pieces={plan}"
                    here = run_case(ROOT, name, opt, plan, pathlib.Path(tmp, "here.npz"))
                    there = run_case(against, name, opt, plan, pathlib.Path(tmp, "there.npz"))
                    keys = [k for k in here if k != "schedule"]
                    diff = [k for k in keys if k not in there or
                            not np.array_equal(here[k], there[k])]
                    rows.append((case, str(here["schedule"]), str(there["schedule"]),
                                 len(keys) - len(diff), len(keys), diff[0] if diff else "",
                                 f"{_largest_change(here, there, diff):.1e}",
                                 _ulps(here, there, diff)))
                    report(" | ".join(str(v) for v in rows[-1]))
    return rows


def _record(args, argv, rows, seconds, load_before):
    """The rows in the docs/results/ envelope; the other checkout named by its commit."""
    sys.path.insert(0, str(ROOT))
    from reports import provenance

    def commit(tree):
        return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()

    words, skip = [], False
    for word in (sys.argv[1:] if argv is None else argv):
        if skip or word.split("=", 1)[0] == "--json":
            skip = not skip and "=" not in word
            continue
        words.append(word)
    fields = ("case", "schedule_here", "schedule_there", "equal_arrays", "arrays",
              "first_differing", "largest_relative_difference", "differing_by_ulps")
    doc = {"command": " ".join(["python tools/compare_training.py", *words]),
           "date": provenance.now(), "machine": provenance.machine(),
           "versions": provenance.versions(), "load_before": load_before,
           "load_after": provenance.load_average(), "seconds": round(seconds, 1),
           "data": {"here": commit(ROOT), "there": commit(args.against),
                    "rows": [dict(zip(fields, r)) for r in rows]}}
    pathlib.Path(args.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _checkout(against):
    """The root of the tree to compare with: ``against`` itself where it is a folder, else a
    temporary git worktree of revision ``against`` (removed afterwards)."""
    path = pathlib.Path(against)
    if path.is_dir():
        yield path.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="compare-training-") as tmp:
        tree = pathlib.Path(tmp, "tree")
        made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                               against], capture_output=True, text=True)
        if made.returncode != 0:
            sys.exit(f"--against {against}: neither a folder nor a revision of this repository "
                     f"({made.stderr.strip()})")
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True,
                        help="a revision of this repository, or another checkout's root")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--pieces", default=",".join(PIECES))
    parser.add_argument("--json", help="write the rows, with their provenance, here")
    args = parser.parse_args(argv)
    load_before, t0 = round(os.getloadavg()[0], 2), time.perf_counter()
    print("case | schedule here | schedule there | equal arrays | arrays | first differing | "
          "largest relative difference | differing arrays by ulps of their largest entry")
    with _checkout(args.against) as there:
        args.against = there
        rows = compare(there, args.models.split(","), args.optimizers.split(","),
                       args.pieces.split(","))
        if args.json:
            _record(args, argv, rows, time.perf_counter() - t0, load_before)
    equal = sum(r[3] for r in rows)
    total = sum(r[4] for r in rows)
    print(f"{equal} of {total} arrays bit for bit equal over {len(rows)} cases")
    return 0 if equal == total else 1


if __name__ == "__main__":
    sys.exit(main())
