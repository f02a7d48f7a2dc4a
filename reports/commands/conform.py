"""`verigrad conform`: run every proof of the spec (ops and optimizers) and print a table.

Exit code 0 when everything is proven, 1 when anything fails. Later issues add the engines; the
pieces here (``format_table``, ``ProgressLine``, ``proof_rows``, ``run_spec_proofs``) are meant to
be reused for that.
"""
from __future__ import annotations

import sys
import time


def add_arguments(parser):
    """Options of ``verigrad conform``."""
    parser.add_argument("--no-progress", action="store_true",
                        help="do not show the one-line progress display")


def format_table(headers, rows):
    """A Markdown pipe table with aligned columns (readable in a terminal and in a .md file).

    Parameters
    ----------
    headers : sequence of str
    rows : sequence of sequence
        Cells are converted with ``str``; ``|`` inside a cell is escaped.

    Returns
    -------
    str
    """
    cells = [[str(h) for h in headers]] + [[str(c).replace("|", "\\|") for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


class ProgressLine:
    """A single status line on stderr, rewritten in place on a terminal.

    Off a terminal (CI logs) nothing is written until ``finish``, which prints one line.
    """

    def __init__(self, stream=None, enabled=True):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._width = 0

    def update(self, text):
        """Replace the line with ``text`` (terminal only)."""
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self._width = len(text)

    def finish(self, text):
        """End the line with a final message."""
        if not self.enabled:
            return
        if self.tty:
            self.update(text)
            self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def proof_rows(results, kind, full_shapes=False):
    """Table rows (kind, name, method, cases, seconds, result) for a list of ProofResult."""
    rows = []
    for r in results:
        cases = "; ".join(r.shapes) if full_shapes else f"{len(r.shapes)} case(s)"
        verdict = "proven" if r.ok else "FAILED: " + r.detail
        rows.append((kind, r.op, r.method, cases, f"{r.seconds:.2f}", verdict))
    return rows


PROOF_HEADERS = ("kind", "name", "method", "cases tried", "seconds", "result")


def run_spec_proofs(progress=None, ops=None, optimizers=None):
    """Prove the given ops and optimizers (default: all), updating ``progress`` as it goes.

    Returns
    -------
    (list of ProofResult, list of ProofResult)
        Op proofs, optimizer proofs.
    """
    import spec

    ops = list(spec.OPS) if ops is None else list(ops)
    optimizers = list(spec.OPTIMIZERS) if optimizers is None else list(optimizers)
    total = len(ops) + len(optimizers)

    def show(i, name, what):
        if progress is not None:
            progress.update(f"[{i + 1:>3}/{total}] {what} {name} ...")

    op_results = []
    for i, name in enumerate(ops):
        show(i, name, "proving op")
        op_results.append(spec.prove(name))
    opt_results = []
    for j, name in enumerate(optimizers):
        show(len(ops) + j, name, "proving optimizer")
        opt_results.extend(spec.prove_optimizers([name]))
    return op_results, opt_results


def run(args) -> int:
    """Run all spec proofs, print the table and a summary; 1 if anything failed."""
    start = time.perf_counter()
    progress = ProgressLine(enabled=not args.no_progress)
    progress.update("loading spec ...")
    op_results, opt_results = run_spec_proofs(progress)
    results = op_results + opt_results
    failed = [r for r in results if not r.ok]
    elapsed = time.perf_counter() - start
    progress.finish(f"proved {len(results) - len(failed)}/{len(results)} in {elapsed:.1f} s")
    rows = proof_rows(op_results, "op") + proof_rows(opt_results, "optimizer")
    print(format_table(PROOF_HEADERS, rows))
    print()
    if failed:
        print(f"FAILED: {len(failed)} of {len(results)} ({', '.join(r.op for r in failed)})")
        return 1
    exact = sum(r.method == "symbolic" for r in results)
    print(f"all {len(results)} proven ({len(op_results)} ops, {len(opt_results)} optimizers; "
          f"{exact} by exact simplification, {len(results) - exact} by high-precision sampling) "
          f"in {elapsed:.1f} s")
    return 0
