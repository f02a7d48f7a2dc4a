"""The peer machinery without the peers (runs in the default suite, in milliseconds).

The registry names each peer and says how to install a missing one; the findings script's
convention rule accepts another subgradient at a kink and rejects a gradient that is not one
(mygrad dropping a tied gradient, a doubled one); the independent mpmath reference the peer
tests rely on gets known derivatives right.
"""
from __future__ import annotations

import importlib.util

import mpmath
import numpy as np
import pytest

from mp_reference import exact_element, exact_hvp_element, exact_jvp_element
from reports import peers_findings
from reports.conformance import engines as registry
from reports.conformance.strategies import OpExample

PEERS = {"paddle": "paddle", "tinygrad": "tinygrad", "mygrad": "mygrad",
         "autograd": "autograd"}


@pytest.mark.parametrize("name", sorted(PEERS))
def test_a_missing_peer_is_unavailable_with_its_install_command(name, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda pkg, *a: None if pkg == PEERS[name] else real(pkg, *a))
    status = registry.engine_status(name)
    assert not status.available
    assert f"pip install 'verigrad[{name}]'" in status.reason
    with pytest.raises(registry.EngineUnavailableError, match=f"verigrad\\[{name}\\]"):
        registry.get_engine(name)


def _maximum_case(a, b, g):
    return OpExample("maximum", (np.array(a), np.array(b)), np.array(g), {}, 0, False, "ties")


@pytest.mark.parametrize("grads, kind", [
    (([0.5, 2.0], [0.5, 0.0]), "convention"),     # split ties evenly (torch, paddle)
    (([0.0, 2.0], [1.0, 0.0]), "convention"),     # all to the second argument
    (([0.0, 2.0], [0.0, 0.0]), "failure"),        # the tied gradient dropped
    (([1.0, 2.0], [1.0, 0.0]), "failure"),        # the tied gradient doubled
])
def test_maximum_ties_are_a_convention_only_when_the_split_sums_to_one(grads, kind):
    ex = _maximum_case([3.0, 5.0], [3.0, 1.0], [1.0, 2.0])
    da, db = (np.array(g) for g in grads)
    found = peers_findings._convention(ex, "d/da", (0,), float(da[0]), (da, db))
    assert found.get("kind", "failure") == kind


@pytest.mark.parametrize("op, x, value, kind", [
    ("relu", 0.0, 1.0, "convention"), ("relu", 0.0, 0.5, "convention"),
    ("relu", 0.0, 2.0, "failure"), ("abs", 0.0, -1.0, "convention"),
    ("leaky_relu", 0.0, 1.0, "convention"), ("leaky_relu", 0.0, 0.0, "failure"),
    ("relu", 1e-300, 0.0, "failure"),           # off the kink nothing is a convention
])
def test_kinks_accept_exactly_the_subgradients(op, x, value, kind):
    ex = OpExample(op, (np.array([x]),), np.array([1.0]), {}, 0, False, "kinks")
    found = peers_findings._convention(ex, "d/dx", (0,), value, (np.array([value]),))
    assert found.get("kind", "failure") == kind


@pytest.mark.parametrize("op, inputs, grad, what, index, expected", [
    ("sigmoid", [np.array([0.0])], np.array([1.0]), ("grad", 0), (0,), mpmath.mpf(1) / 4),
    # BCE with logits at z = 0: d/dz = (sigmoid(0) - t) / N = (0.5 - 0.3) / 2
    ("binary_cross_entropy_with_logits", [np.array([0.0, 1.0]), np.array([0.3, 0.7])],
     np.array(1.0), ("grad", 0), (0,), mpmath.mpf("0.1")),
    ("log_softmax", [np.array([[-1e4, 1e4]])], None, "output", (0, 0), mpmath.mpf(-2e4)),
    ("sum", [np.full(4096, 2.0 ** -54)], None, "output", (), mpmath.mpf(2) ** -42),
])
def test_the_independent_reference_gets_known_values(op, inputs, grad, what, index, expected):
    got = exact_element(op, inputs, grad, {}, what, index)
    assert abs(got - expected) <= abs(expected) * mpmath.mpf(10) ** -30 + mpmath.mpf(10) ** -70


def _sigma(v):
    return 1 / (1 + mpmath.exp(-mpmath.mpf(v)))


# hand derivations: tanh' = 1 - tanh², softplus'' = σ(x)σ(-x) (1e-304 at 700, beside a
# softplus of 700: the reference must find the digits), mul's cross term d²(ab)/da db = 1,
# relu's J t on its kink is the registry's 0, and a piecewise-linear op has no curvature
@pytest.mark.parametrize("kind, op, inputs, grad, tangents, k, index, expected", [
    ("jvp", "tanh", [np.array([0.5, -2.0])], None, [np.array([1.0, 3.0])], 0, (1,),
     lambda: 3 * (1 - mpmath.tanh(-2) ** 2)),
    ("jvp", "relu", [np.array([0.0, 2.0])], None, [np.array([5.0, 1.0])], 0, (0,), 0),
    ("jvp", "mul", [np.array([2.0]), np.array([3.0])], None,
     [np.array([1.0]), np.array([-1.0])], 0, (0,), mpmath.mpf(1)),       # 3·1 + 2·(-1)
    ("hvp", "softplus", [np.array([700.0])], np.array([2.0]), [np.array([0.5])], 0, (0,),
     lambda: 2 * mpmath.mpf("0.5") * _sigma(700) * _sigma(-700)),
    ("hvp", "mul", [np.array([2.0]), np.array([3.0])], np.array([1.5]),
     [np.array([0.25]), np.array([4.0])], 0, (0,), mpmath.mpf(6)),        # g · t_b
    ("hvp", "tanh", [np.array([0.0])], np.array([1.0]), [np.array([1.0])], 0, (0,), 0),
    ("hvp", "abs", [np.array([0.0])], np.array([1.0]), [np.array([1.0])], 0, (0,), 0),
])
def test_the_independent_second_order_reference_gets_known_values(kind, op, inputs, grad,
                                                                  tangents, k, index,
                                                                  expected):
    if kind == "jvp":
        got = exact_jvp_element(op, inputs, tangents, {}, index)
    else:
        got = exact_hvp_element(op, inputs, grad, tangents, {}, k, index)
    with mpmath.workdps(60):     # the hand values and the comparison at 60 digits
        want = expected() if callable(expected) else mpmath.mpf(expected)
        assert abs(got - want) <= abs(want) * mpmath.mpf(10) ** -30 + mpmath.mpf(10) ** -300


def _part(engine, version, derivative, examples=10):
    finding = {"engine": engine, "op": "tanh", "dtype": "float32", "kind": "failure"}
    if derivative:
        finding["derivative"] = derivative
    return {"profile": {"examples": examples, "seed": 0},
            "engines": {engine: {"available": True, "version": version,
                                 "seconds": {derivative or "vjp": 1.0}}},
            "findings": [finding]}


def test_a_split_run_merges_in_engine_and_derivative_order():
    doc = peers_findings.merge([_part("torch", "2", "hvp"), _part("autograd", "1", "jvp2"),
                                _part("autograd", "1", None)])
    assert [(f["engine"], f["derivative"]) for f in doc["findings"]] == [
        ("autograd", "vjp"), ("autograd", "jvp2"), ("torch", "hvp")]
    assert doc["engines"]["autograd"]["seconds"] == {"jvp2": 1.0, "vjp": 1.0}


@pytest.mark.parametrize("parts, message", [
    ([_part("autograd", "1", "vjp"), _part("autograd", "1", "hvp", examples=20)],
     "different profiles"),
    ([_part("autograd", "1", "vjp"), _part("autograd", "2", "hvp")], "versions 1 and 2"),
])
def test_parts_of_different_runs_do_not_merge(parts, message):
    with pytest.raises(ValueError, match=message):
        peers_findings.merge(parts)


def test_a_first_order_part_does_not_pin_the_second_order_settings():
    first, second = _part("autograd", "1", None), _part("autograd", "1", "hvp")
    first["profile"]["second_order_tables"] = True        # set, but nothing of it ran
    second["profile"]["second_order_tables"] = False
    assert peers_findings.merge([first, second])["profile"]["second_order_tables"] is False


# ---------------------------------------------------------------------------------------------
# every findings file says how it was made

def test_the_findings_file_records_its_command_date_machine_and_runs():
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "findings.json").read_text(encoding="utf-8"))
    assert doc["command"].startswith("python -m reports.peers_findings ")
    assert doc["date"] and doc["machine"]["cpus"]
    assert doc["runs"]
    for run in doc["runs"]:
        assert "reports.peers_findings" in run["command"] and run["date"]
        assert run["machine"]["cpus"] and run["versions"]
    # every engine of the file was measured by some run that names its version
    measured = {(e, v) for run in doc["runs"] for e, v in run["versions"].items()}
    for name, info in doc["engines"].items():
        if info.get("available", True):
            assert (name, info["version"]) in measured, name


def test_a_run_and_a_merge_write_their_records(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("DEV", "PYTHON")
    part = _part("autograd", "1", None)
    monkeypatch.setattr(peers_findings, "find", lambda *a, **k: json.loads(json.dumps(part)))
    monkeypatch.setattr(peers_findings, "markdown", lambda doc: "")
    monkeypatch.setattr(peers_findings, "engine_version", lambda name: "1")
    out = tmp_path / "p1.json"
    assert peers_findings.main(["--engines", "autograd", "--json", str(out)]) == 0
    run = json.loads(out.read_text())
    assert run["command"] == f"DEV=PYTHON python -m reports.peers_findings --engines autograd " \
                             f"--json {out}"
    assert run["environment"] == {"DEV": "PYTHON"} and run["machine"]["cpus"]
    assert run["date"].endswith("UTC") and "numpy" in run["versions"]
    second = tmp_path / "p2.json"
    second.write_text(json.dumps(_part("torch", "2", "hvp")), encoding="utf-8")
    merged = tmp_path / "all.json"
    assert peers_findings.main(["--merge", str(out), str(second), "--json", str(merged)]) == 0
    doc = json.loads(merged.read_text())
    assert "--merge" in doc["command"] and "versions" not in doc
    assert doc["runs"][0]["command"] == run["command"]     # the part's own record, kept
    assert len(doc["runs"]) == 1                           # the other part recorded nothing
