"""`verigrad spec --list | --prove [NAME ...]`: show the registry, or prove its derivatives.

``--list`` prints every op (inputs with domains, params with defaults, kinks) and every
optimizer (hyperparameters, state, equations). ``--prove`` proves the named ops (their VJP, and
their JVP and HVP, ``spec.prove_second_order``, each its own row) and optimizers (default: all) and prints per item the method, the shapes tried, the seconds and the result:
"proven" (SymPy reduced every difference to 0), "proven on each piece" (branches and kink
conventions, ``spec.pieces``) or "checked at N points" (sampled only: never called proven);
exit code 1 when any proof fails, 2 for an unknown name.
"""
from __future__ import annotations

import sys
import time

from reports.commands.arguments import progress_enabled
from reports.commands.conform import PROOF_HEADERS, ProgressLine, proof_count, proof_rows
from reports.commands.tables import terminal_table


def add_arguments(parser):
    """Options of ``verigrad spec``."""
    from reports.commands import arguments as shared

    group = parser.add_mutually_exclusive_group()
    group.add_argument("--list", action="store_true",
                       help="list the ops (inputs, params, domains, kinks) and the optimizers")
    prove = group.add_argument("--prove", nargs="*", metavar="NAME",
                               help="prove these ops / optimizers, spaces or commas")
    prove.default_text = "all of them (--prove alone)"
    shared.add_progress(parser, "one-line progress display")


def validate(args):
    """``--list`` or ``--prove``, and every name known (None), or the usage error."""
    if not args.list and args.prove is None:
        return "give --list or --prove [NAME ...] (see verigrad spec --help)"
    if args.prove:
        args.prove = [p.strip() for n in args.prove for p in n.split(",") if p.strip()]
        return _split_names(args.prove)[2]
    return None


def _op_rows(ops):
    rows = []
    for op in ops.values():
        inputs = ", ".join(f"{n}: {op.domains[n]}" + ("" if op.vjp.get(n) else " (nd)")
                           for n in op.inputs)
        params = ", ".join(f"{p.name}={p.default!r}" for p in op.params) or "-"
        kinks = "; ".join(k.convention for k in op.kinks) or "-"
        rows.append((op.name, op.category, inputs, params, op.math, kinks))
    return rows


def _optimizer_rows(optimizers):
    rows = []
    for opt in optimizers.values():
        hyper = ", ".join(f"{k}={v!r}" for k, v in opt.hyper.items())
        state = ", ".join(opt.state) or "-"
        rows.append((opt.name, hyper, state, opt.equations))
    return rows


def list_registry(out=None):
    """Print the op and optimizer tables."""
    import spec

    out = out or sys.stdout
    rows = _op_rows(spec.OPS)
    print(f"{len(spec.OPS)} ops: their inputs ((nd) = not differentiable)\n", file=out)
    print(terminal_table(("op", "family", "inputs: domain", "params"),
                         [r[:4] for r in rows]), file=out)
    print(f"\n{len(spec.OPS)} ops: what they compute\n", file=out)
    print(terminal_table(("op", "forward", "kinks (the derivative's convention)"),
                         [(r[0],) + r[4:] for r in rows]), file=out)
    print(f"\n{len(spec.OPTIMIZERS)} optimizers (names are case-insensitive; t starts at 1; "
          f"state starts at 0)\n", file=out)
    print(terminal_table(("optimizer", "hyperparameters", "state", "update"),
                         _optimizer_rows(spec.OPTIMIZERS)), file=out)
    print("\nNAG engine form: store w̃ = w − β·v, g = ∇f(w̃); v_new = β·v + η·g;\n"
          "                 w̃ ← w̃ − η·g − β·v_new (see spec.optimizers)", file=out)


def _split_names(names):
    """Sort requested names into ops and optimizers; (ops, optimizers, error message or None)."""
    import spec
    from spec.errors import did_you_mean

    if not names:
        return list(spec.OPS), list(spec.OPTIMIZERS), None
    opt_by_lower = {n.lower(): n for n in spec.OPTIMIZERS}
    ops, optimizers = [], []
    for name in names:
        if name in spec.OPS:
            ops.append(name)
        elif name.lower() in opt_by_lower:
            optimizers.append(opt_by_lower[name.lower()])
        else:
            choices = list(spec.OPS) + list(spec.OPTIMIZERS)
            return None, None, (f"unknown op or optimizer {name!r}"
                                f"{did_you_mean(name, choices)} (see `verigrad spec --list`)")
    return ops, optimizers, None


def run(args) -> int:
    """List or prove; see the module docstring for exit codes."""
    if args.list:
        list_registry()
        return 0
    problem = None if getattr(args, "_validated", False) else validate(args)
    if problem:
        print(f"verigrad spec: {problem}", file=sys.stderr)
        return 2
    import spec
    from reports.commands.conform import run_spec_proofs

    ops, optimizers, _ = _split_names(args.prove)
    start = time.perf_counter()
    progress = ProgressLine(enabled=progress_enabled(args))
    op_results, opt_results = run_spec_proofs(progress, ops, optimizers)
    # forward mode and second order of every op proven beside its VJP (spec.prove_second)
    second_results = []
    for i, name in enumerate(ops):
        progress.update(f"[{i + 1:>3}/{len(ops)}] proving JVP and HVP of {name} ...")
        second_results.extend(spec.prove_second(name))
    op_results = op_results + second_results
    results = op_results + opt_results
    failed = [r for r in results if not r.ok]
    elapsed = time.perf_counter() - start
    progress.finish(f"{proof_count(results)} in {elapsed:.1f} s")
    rows = proof_rows(op_results, "op", full_shapes=True)
    rows += proof_rows(opt_results, "optimizer", full_shapes=True)
    print(terminal_table(PROOF_HEADERS, rows))
    for r in results:
        if r.ok and r.method != "symbolic":
            print(f"  {r.op}: {r.detail}")
    if failed:
        print(f"\nFAILED: {', '.join(r.op for r in failed)}")
        return 1
    sampled = [r for r in results if r.method == "sampling"]
    if sampled:
        # a sampled check is evidence, not a proof: say so, and which
        print(f"\n{len(results) - len(sampled)} of {len(results)} proven, "
              f"{len(sampled)} only checked at sampled points ({', '.join(r.op for r in sampled)})"
              f" in {elapsed:.1f} s")
    else:
        print(f"\nall {len(results)} proven in {elapsed:.1f} s")
    return 0
