"""Add a parameterless activation (``hardtanh``: clip to [-1, 1]) to a scratch copy, end to end.

Measures what adding an op costs: copies the repository's tracked files to a scratch folder,
makes every edit the op needs (its signature in the op table, spec's formulas, reflib's
reference code, fastlib's scalar functions: value, first and second derivative, from which
fastlib's kernels, its second order and fastlib.cuda's device functions follow; the contract's
table), lists the files it touched, then runs spec's proofs (the VJP, the JVP and the HVP) and
``verigrad conform --ops hardtanh --profile dev`` for reflib and fastlib (forward, VJP, jvp2,
hvp) in the copy.

    python tools/add_activation.py [--keep DIR] [--no-conform] [--json FILE]

Prints the touched files and their count; exits 1 when a check fails. docs/optable.md walks
through the same edits by hand.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

# (file, anchor line already in the file, text inserted after it; None: see BEFORE)
EDITS = (
    ("optable/table.py",
     '    _unary("identity", 14, "copy", scale_free=True, single_rounding=True),\n',
     '    _unary("hardtanh", 15, "copy", saturating=True),\n'),
    ("spec/ops/elementwise.py",
     '           lambda M, grad: grad + 0),\n',
     '    _unary("hardtanh", "min(max(x, -1), 1)",\n'
     '           lambda M, x: M.maximum(-M.maximum(-x, M.num(-1)), M.num(-1)),\n'
     '           lambda M, grad, x: M.where(M.gt(x, -1), M.where(M.gt(-x, -1), grad, 0 * grad),\n'
     '                                      0 * grad)),\n'),
    ("reflib/_ops_elementwise.py",
     'def relu_vjp(F, x, out, g):\n',
     None),   # the functions go before relu's VJP (BEFORE); the name joins the list (REPLACE)
    ("fastlib/kernels/scalar.py",
     '# --- activations ---------------------------------------------------------------------------\n',
     '\n@scalar_source\n'
     'def hardtanh_f(x):\n'
     '    """hardtanh(x) = min(max(x, -1), 1); NaN propagates."""\n'
     '    return like(x, -1.0) if x <= -1 else (like(x, 1.0) if x >= 1 else x)\n\n\n'
     '@scalar_source\n'
     'def hardtanh_df(x):\n'
     '    """hardtanh\'(x): 1 inside (-1, 1), else 0."""\n'
     '    return like(x, 1.0) if -1 < x < 1 else like(x, 0.0)\n\n\n'
     '@scalar_source\n'
     'def hardtanh_d2f(x):\n'
     '    """hardtanh\'\'(x) = 0 (the derivative of the piece the value selects)."""\n'
     '    return like(x, 0.0)\n\n'),
)

BEFORE = {   # text inserted *before* the anchor
    ("reflib/_ops_elementwise.py", 'def relu_vjp(F, x, out, g):\n'):
        'def hardtanh(F, x):\n'
        '    return np.where(x >= 1, 1.0, np.where(x <= -1, -1.0, x))\n\n\n'
        'def hardtanh_vjp(F, x, out, g):\n'
        '    return (np.where((x > -1) & (x < 1), g, 0.0),)\n\n\n',
}

# (file, old text, new text): the op joins a list
REPLACE = (
    ("reflib/_ops_elementwise.py", '    "softplus identity"\n', '    "softplus identity hardtanh"\n'),
    ("docs/CONTRACTS.md",
     '| neg exp log sqrt square abs relu silu gelu gelu_tanh tanh sigmoid softplus identity |',
     '| neg exp log sqrt square abs relu silu gelu gelu_tanh tanh sigmoid softplus identity '
     'hardtanh |'),
)


def copy_repository(dest):
    """The files git tracks (and untracked, unignored ones), copied to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for rel in filter(None, listed):
        src = ROOT / rel.decode()
        if src.is_file():
            target = dest / rel.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def apply_edits(dest):
    """Make every edit; return the sorted relative paths of the files that changed."""
    touched = set()
    for rel, anchor, after in EDITS:
        text = _holding(dest, rel, anchor)
        if (rel, anchor) in BEFORE:
            text = text.replace(anchor, BEFORE[(rel, anchor)] + anchor, 1)
        if after is not None:
            text = text.replace(anchor, anchor + after, 1)
        (dest / rel).write_text(text, encoding="utf-8")
        touched.add(rel)
    for rel, old, new in REPLACE:
        text = _holding(dest, rel, old)
        (dest / rel).write_text(text.replace(old, new, 1), encoding="utf-8")
        touched.add(rel)
    return sorted(touched)


def _holding(dest, rel, anchor):
    """The text of ``rel``, which must hold ``anchor`` (else the tool is out of date)."""
    text = (dest / rel).read_text(encoding="utf-8")
    if anchor not in text:
        raise SystemExit(f"add_activation: {rel} no longer holds the line {anchor!r}; "
                         f"update tools/add_activation.py to the file's new form")
    return text


def _run(cmd, cwd, label):
    env = dict(os.environ, PYTHONPATH=str(cwd), NUMBA_CACHE_DIR=str(cwd / ".numba-cache"))
    print(f"$ {' '.join(cmd)}   ({label})", flush=True)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    print("\n".join(proc.stdout.strip().splitlines()[-15:]), flush=True)
    if proc.returncode:
        print("\n".join(proc.stderr.strip().splitlines()[-15:]), flush=True)
    return proc.returncode == 0


def run_checks(dest):
    """spec's proofs of hardtanh's VJP, JVP and HVP, then the conformance rows of reflib and
    fastlib (jvp2 and hvp included)."""
    py = sys.executable
    proof = _run([py, "-c", "import spec; rs = [spec.prove('hardtanh'), "
                  "*spec.prove_second('hardtanh')]; print(*rs, sep='\\n'); "
                  "raise SystemExit(0 if all(r.ok for r in rs) else 1)"], dest,
                 "spec's derivative proofs")
    conform = _run([py, "-m", "reports", "conform", "--ops", "hardtanh", "--profile", "dev",
                    "--engines", "reflib", "fastlib", "--no-proofs"], dest,
                   "conformance, reflib and fastlib")
    return {"proof": proof, "conform": conform}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=pathlib.Path, help="work in DIR and keep it")
    parser.add_argument("--no-conform", action="store_true", help="only make and list the edits")
    parser.add_argument("--json", type=pathlib.Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    scratch = args.keep or pathlib.Path(tempfile.mkdtemp(prefix="verigrad-add-activation-"))
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        copy_repository(scratch)
        touched = apply_edits(scratch)
        print(f"files touched to add hardtanh: {len(touched)}")
        for rel in touched:
            print(f"  {rel}")
        checks = {} if args.no_conform else run_checks(scratch)
        result = {"files": touched, "count": len(touched), "checks": checks}
        if args.json:
            args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
        return 0 if all(checks.values()) else 1
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
