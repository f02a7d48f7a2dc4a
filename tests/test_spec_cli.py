"""`verigrad spec` and `verigrad conform` (the spec part): output and exit codes."""
import io

import pytest

import spec
from reports.cli import main
from reports.commands.conform import ProgressLine, format_table


def _cells_text(out):
    """Every table cell's text, a wrapped cell's lines joined (a continuation line of a row
    has an empty first cell), one cell per line."""
    rows = []
    for line in out.splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip() for c in line.strip()[1:-1].split(" | ")]
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    return "\n".join(c for r in rows for c in r)


def test_spec_list_shows_every_op_and_optimizer(capsys):
    assert main(["spec", "--list"]) == 0
    out = capsys.readouterr().out
    for name in list(spec.OPS) + list(spec.OPTIMIZERS):
        assert f"| {name} " in out
    assert max(len(line) for line in out.splitlines()) <= 100   # fits a terminal
    assert "\\|" not in out                                     # no Markdown escapes
    text = _cells_text(out)
    assert "ties go to the first argument" in text      # kinks
    assert "axis=None, keepdims=False" in text             # params with defaults
    assert "target: class_index (nd)" in text              # domains, non-differentiable marked
    assert "NAG engine form" in out


def test_spec_prove_named_ops_and_optimizers(capsys):
    assert main(["spec", "--prove", "tanh", "maximum", "adam", "--no-progress"]) == 0
    out = capsys.readouterr().out
    cells = {tuple(c.strip() for c in line.split("|")[1:4]): line.split("|")[-2].strip()
             for line in out.splitlines() if line.startswith("| op ")
             or line.startswith("| optimizer ")}
    assert cells[("op", "tanh", "symbolic")] == "proven"
    assert cells[("op", "maximum", "piecewise")] == "proven on each piece"
    assert cells[("optimizer", "Adam", "symbolic")] == "proven"
    # forward mode and second order, each its own row
    assert cells[("op", "tanh jvp", "symbolic")] == "proven"
    assert cells[("op", "tanh hvp", "symbolic")] == "proven"
    assert cells[("op", "maximum hvp", "piecewise")] == "proven on each piece"
    assert "x(3,); x(2, 2); x()" in out                     # shapes tried
    assert "all 7 proven" in out


def test_spec_prove_fails_with_exit_1(monkeypatch, capsys):
    failing = spec.ProofResult(op="tanh", ok=False, method="sampling", shapes=("x(3,)",),
                               seconds=0.1, detail="VJP for 'x' differs")
    monkeypatch.setattr(spec, "prove", lambda name: failing)
    assert main(["spec", "--prove", "tanh", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: VJP for 'x' differs" in out and "FAILED: tanh" in out


def test_spec_unknown_name_and_missing_option_exit_2(capsys):
    assert main(["spec", "--prove", "tahn"]) == 2
    assert "did you mean 'tanh'" in capsys.readouterr().err
    assert main(["spec"]) == 2
    assert "--list or --prove" in capsys.readouterr().err


def _stub(ok_ops=True):
    def prove(name):
        return spec.ProofResult(op=name, ok=ok_ops or name != "relu", method="symbolic",
                                shapes=("x(3,)", "x(2, 2)"), seconds=0.01, detail="planted")

    def prove_optimizers(names):
        return [spec.ProofResult(op=n, ok=True, method="symbolic", shapes=("3 steps",),
                                 seconds=0.01, detail="equal") for n in names]
    return prove, prove_optimizers


def test_conform_runs_every_proof_and_prints_a_table(monkeypatch, capsys):
    prove, prove_optimizers = _stub()
    monkeypatch.setattr(spec, "prove", prove)
    monkeypatch.setattr(spec, "prove_optimizers", prove_optimizers)
    # every proof, beside the referee's float64 rows only (the other engines' rows have their
    # own tests, and this test is about the proofs): one process, where the stubbed proofs are
    # (worker processes prove with the real spec: tests/test_conform_workers.py)
    assert main(["conform", "--engines", "reflib", "--dtypes", "float64", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    # the proof table is the first table of the run (the engine checks' table follows it)
    proof_table = captured.out.split("\n\n")[0]
    rows = [line for line in proof_table.splitlines() if line.startswith("| op ")
            or line.startswith("| optimizer ")]
    assert len(rows) == len(spec.OPS) + len(spec.OPTIMIZERS)
    assert f"{len(rows)} proofs" in captured.out
    assert all(row.rstrip().endswith("proven |") for row in rows)


def test_conform_exits_1_on_a_failed_proof(monkeypatch, capsys):
    prove, prove_optimizers = _stub(ok_ops=False)
    monkeypatch.setattr(spec, "prove", prove)
    monkeypatch.setattr(spec, "prove_optimizers", prove_optimizers)
    assert main(["conform", "--no-progress", "--engines", "reflib", "--dtypes", "float64",
                 "--workers", "1"]) == 1
    captured = capsys.readouterr()
    assert "FAILED proofs: relu" in captured.out
    # stderr is quiet, apart from the one-line notice a cold Numba cache prints
    assert [line for line in captured.err.splitlines()
            if not line.startswith("verigrad conform: first run: compiling")] == []


def test_format_table_aligns_and_escapes():
    table = format_table(("a", "bb"), [("x|y", 1), ("long cell", 22)])
    lines = table.splitlines()
    assert len({len(line) for line in lines}) == 1
    assert "x\\|y" in lines[2]


def test_progress_line_rewrites_in_place_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    stream = Tty()
    p = ProgressLine(stream)
    p.update("[1/2] long name ...")
    p.update("[2/2] b")
    p.finish("done")
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.endswith("done" + " " * (len("[2/2] b") - 4) + "\n")


@pytest.mark.slow
def test_conform_end_to_end_proves_everything(capsys):
    assert main(["conform", "--no-progress"]) == 0
    assert "proven" in capsys.readouterr().out
