"""The command line checks its arguments before it works: a usage error is exit 2, a message
naming the option and the fix, no traceback, and no proof, measurement or training first."""
from __future__ import annotations

import json

import pytest

from reports.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return code, out.err


@pytest.mark.parametrize("argv, words", [
    (["--ops", "nosuchop"], ["--ops: unknown name 'nosuchop'", "tanh", "Adam", "softmax"]),
    (["--ops", "tanhh"], ["did you mean 'tanh'?"]),
    (["--engines", "nosuchengine"], ["unknown engine 'nosuchengine'", "fastlib", "reflib"]),
    (["--engines", "no_such_module:Engine"], ["--engines"]),
    (["--ops", "tanh", "--first", "nosuch"], ["--first: unknown name 'nosuch'"]),
])
def test_conform_refuses_unknown_names_before_any_proof(capsys, nothing_runs, argv, words):
    code, err = _run(capsys, "conform", "--no-progress", *argv)
    assert code == 2
    for w in words:
        assert w in err, err


def test_conform_refuses_a_request_that_selects_nothing(capsys, nothing_runs):
    # "train" is a real name (fastlib's training rows), but reflib has no such row
    code, err = _run(capsys, "conform", "--ops", "train", "--engines", "reflib", "--no-progress")
    assert code == 2 and "selects no check" in err and "valid names" in err and "tanh" in err


def test_conform_refuses_an_unwritable_json_path(capsys, nothing_runs, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    code, err = _run(capsys, "conform", "--ops", "tanh", "--json", str(blocker / "rows.json"))
    assert code == 2 and "--json" in err and "does not exist" in err


@pytest.mark.parametrize("make", [
    lambda p: (p / "file").write_text("x") and p / "file" / "sub",   # a file in the way
    lambda p: (p / "file2").write_text("x") and p / "file2",         # --out is a file
])
def test_report_refuses_an_unwritable_out_before_measuring(capsys, nothing_runs, tmp_path,
                                                           make):
    out = make(tmp_path)
    code, err = _run(capsys, "report", "--quick", "--out", str(out), "--no-progress")
    assert code == 2 and "--out" in err and str(out) in err


@pytest.mark.parametrize("content, words", [
    ("[" * 5000 + "]" * 5000, ["nested 5000 deep"]),
    ("{not json", ["not JSON"]),
    ('{"a": 1}', ["not a verigrad report", "missing required field"]),
    ("42", ["not a verigrad report", "expected object"]),
    (b"\xff\xfe", ["not UTF-8"]),
])
def test_report_refuses_a_bad_baseline_naming_the_file(capsys, nothing_runs, tmp_path,
                                                        content, words):
    path = tmp_path / "old.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    code, err = _run(capsys, "report", "--quick", "--baseline", str(path), "--out",
                     str(tmp_path / "out"), "--no-progress")
    assert code == 2 and str(path) in err
    for w in words:
        assert w in err, err


def test_the_baseline_loader_raises_one_error_type(tmp_path):
    from fastlib.errors import CorruptFileError
    from reports import schema

    doc_path = tmp_path / "r.json"
    doc_path.write_text(json.dumps({"not": "a report"}))
    with pytest.raises(CorruptFileError, match="missing required field"):
        schema.load(doc_path)
    with pytest.raises(FileNotFoundError):
        schema.load(tmp_path / "missing.json")


@pytest.mark.parametrize("argv, words", [
    (["--save", "{tmp}/no/m.npz"], ["--save", "does not exist"]),
    (["--checkpoint", "{tmp}"], ["--checkpoint", "is a folder"]),
    (["--plot", "{tmp}/no/c.png"], ["--plot"]),
    (["--resume", "{tmp}/missing.npz"], ["--resume", "does not exist"]),
    (["--data", "mnist", "--data-dir", "{tmp}/nowhere"], ["--data-dir", "does not exist"]),
])
def test_train_checks_its_paths_before_reading_data(capsys, tmp_path, monkeypatch, argv,
                                                    words):
    from reports.commands import train

    monkeypatch.setattr(train, "_run", lambda args: pytest.fail("trained before checking"))
    code, err = _run(capsys, "train", *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2
    for w in words:
        assert w in err, err


def test_a_corrupt_model_file_is_a_message_not_a_traceback(capsys, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 certainly not a zip archive")
    code, err = _run(capsys, "train", "--resume", str(bad), "--epochs", "1")
    assert code in (1, 2) and str(bad) in err and "not a readable .npz" in err


@pytest.mark.parametrize("argv, words", [
    (["ops", "--json", "{tmp}/no/rows.json"], ["--json", "does not exist"]),
    (["train", "--data-dir", "{tmp}/nowhere"], ["--data-dir", "does not exist"]),
])
def test_bench_checks_its_paths_before_timing(capsys, tmp_path, monkeypatch, argv, words):
    from reports.bench import ops, train

    for suite in (ops, train):
        monkeypatch.setattr(suite, "run", lambda args: pytest.fail("timed before checking"))
    code, err = _run(capsys, "bench", *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2
    for w in words:
        assert w in err, err
