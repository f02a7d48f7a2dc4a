"""Adding a parameterless activation end to end: how many files it takes, and that it conforms.

tools/add_activation.py makes the edits in a scratch copy; the count is the measure of how
widely one op's knowledge is spread (the op table holds everything that is not mathematics).
The added op's own checks (spec's proofs of its VJP, JVP and HVP, and its conformance rows in
reflib and fastlib, jvp2 and hvp included) run in the default suite: fastlib compiles each
unary op's kernels on their own, so the copy compiles hardtanh's and little else.
"""
import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the files a new activation needs: its signature, spec's formulas, reflib's reference code,
# fastlib's scalar functions (value, first and second derivative: fastlib's kernels, second
# order and fastlib.cuda's device functions follow from them), the contract
EXPECTED = {"optable/table.py", "spec/ops/elementwise.py", "reflib/_ops_elementwise.py",
            "fastlib/kernels/scalar.py", "docs/CONTRACTS.md"}
MOST_PYTHON_FILES = 4


def _tool():
    spec = importlib.util.spec_from_file_location("add_activation",
                                                  ROOT / "tools" / "add_activation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_adding_an_activation_touches_at_most_four_python_files(tmp_path):
    out = tmp_path / "result.json"
    assert _tool().main(["--keep", str(tmp_path / "copy"), "--no-conform",
                         "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["files"]) == EXPECTED
    assert result["count"] == len(EXPECTED)
    assert len([f for f in result["files"] if f.endswith(".py")]) <= MOST_PYTHON_FILES


def test_the_added_activation_is_proven_and_conforms(tmp_path):
    out = tmp_path / "result.json"
    status = _tool().main(["--keep", str(tmp_path / "copy"), "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["checks"] == {"proof": True, "conform": True}
    assert status == 0
