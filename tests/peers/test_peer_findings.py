"""Every finding in the peer table (docs/peer-findings.md), verified apart from the suite.

``findings.json`` (written by ``python -m reports.peers_findings``) holds, per failing call,
the worst element: the engine's value, the exact value and the error. Each test here rebuilds
that call, asks the engine again for that one element, recomputes the exact value with its
own mpmath formulas (``mp_reference``, nothing from spec or the suite's oracle), and asserts
the engine is as far from exact as recorded. Conventions are checked as conventions (the
input sits on the kink and the engine's value is a subgradient there); contract findings
(a raise, another dtype) must still happen. Second-order findings (``J t``, ``H t``) are
checked the same way: the engine's ``jvp``/``hvp`` at the stored tangents, the exact element
by finite differences of the forward formula at high precision (``mp_reference``).

Marked ``peers``: ``pytest -m peers tests/peers`` (each engine skips, with the reason and
the install command, where it is not installed or another version is).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import mpmath
import numpy as np
import pytest

from reports import peers_findings
from reports.conformance import engines as registry
import mp_reference  # tests/peers is on sys.path (rootdir-less dir)
from mp_reference import exact_element

pytestmark = pytest.mark.peers

DOC = json.loads(Path(__file__).with_name("findings.json").read_text(encoding="utf-8"))
FINDINGS = DOC["findings"]


SECOND_ORDER = [e for e in FINDINGS if e.get("derivative", "vjp") != "vjp"]
FINDINGS = [e for e in FINDINGS if e.get("derivative", "vjp") == "vjp"]


def _id(entry):
    return (f"{entry['engine']}-{entry.get('derivative', 'vjp')}-{entry['op']}-"
            f"{entry['dtype']}-{entry['check']}").replace(" ", "")


def _engine(name, monkeypatch):
    info = DOC["engines"][name]
    status = registry.engine_status(name)
    if not status.available:
        pytest.skip(f"{name} is not available here: {status.reason}")
    installed = peers_findings.engine_version(name)
    if installed != info["version"]:
        pytest.skip(f"the table was measured on {name} {info['version']}; {installed} is "
                    f"installed (regenerate with python -m reports.peers_findings)")
    if name == "tinygrad":   # the backend the table was measured on
        monkeypatch.setenv("DEV", info["description"].split("DEV=")[1].rstrip(")"))
    return registry.get_engine(name)


def _element(engine, ex, what, index):
    out, grads = peers_findings._engine_arrays(engine, ex)
    if what == "output":
        return float(np.asarray(out, np.float64)[tuple(index)])
    import spec

    k = spec.OPS[ex.name].inputs.index(what[3:])
    return float(np.asarray(grads[k], np.float64)[tuple(index)])


@pytest.mark.parametrize("entry", FINDINGS, ids=[_id(e) for e in FINDINGS])
def test_finding_holds(entry, monkeypatch):
    engine = _engine(entry["engine"], monkeypatch)
    ex = peers_findings.rebuild_case(entry["case"])
    if entry["kind"] == "contract":
        if "raises" in entry:
            with pytest.raises(Exception) as info:
                peers_findings._engine_arrays(engine, ex)
            assert type(info.value).__name__ == entry["raises"]
        else:
            out, grads = peers_findings._engine_arrays(engine, ex)
            got = out if entry["what"] == "output" else grads[
                __import__("spec").OPS[ex.name].inputs.index(entry["what"][3:])]
            assert np.asarray(got).dtype.name == entry["returns_dtype"]
            assert np.asarray(got).dtype != np.dtype(ex.dtype)
        return
    value = _element(engine, ex, entry["what"], entry["index"])
    recorded = entry["engine_value"]
    assert value == recorded or (math.isnan(value) and math.isnan(recorded)), \
        f"the engine now returns {value!r}, the table says {recorded!r}"
    if entry["kind"] == "convention":
        _check_convention(engine, entry, ex, value)
        return
    import spec

    what = "output" if entry["what"] == "output" else (
        "grad", spec.OPS[ex.name].inputs.index(entry["what"][3:]))
    exact = _on_kink(engine, ex, what, entry["index"])
    if exact is None:
        exact = exact_element(ex.name, ex.inputs, ex.grad, ex.params, what, entry["index"])
    # the table's exact value agrees with the independent one to ~30 digits
    _assert_recorded_failure(entry, exact, value, digits=28)


def _assert_recorded_failure(entry, exact, value, digits):
    """The finding's exact value agrees with the independent ``exact`` to ``digits`` digits,
    the engine's ``value`` is as far from it as recorded, and that is outside the error the
    suite admits at that element: a failure."""
    with mpmath.workdps(40):
        recorded_exact = mpmath.mpf(entry["exact_hi"]) + mpmath.mpf(entry["exact_lo"])
        assert abs(exact - recorded_exact) <= abs(exact) * mpmath.mpf(10) ** -digits + \
            mpmath.mpf(10) ** -300
        if not math.isfinite(value):
            assert not math.isfinite(entry["abs_error"])
            return
        error = float(abs(mpmath.mpf(value) - exact))
    assert math.isclose(error, entry["abs_error"], rel_tol=1e-6), \
        f"independent error {error!r}, table {entry['abs_error']!r}"
    assert error > entry["admissible_abs"], \
        f"error {error!r} is within the admissible {entry['admissible_abs']!r}"


def _check_convention(engine, entry, ex, value):
    idx = tuple(entry["index"])
    if ex.name == "maximum":
        share = float(entry["note"].split("sends ")[1].split(" ")[0])
        grads = peers_findings._engine_arrays(engine, ex)[1]
        assert peers_findings._maximum_split_matches(ex, grads, share), \
            "the engine no longer splits ties that way"
        return
    x = float(np.asarray(ex.inputs[0], np.float64)[idx])
    g = float(np.asarray(ex.grad, np.float64)[idx])
    slopes = {"relu": (0.0, 1.0), "abs": (-1.0, 1.0),
              "leaky_relu": (ex.params.get("negative_slope", 0.01), 1.0)}[ex.name]
    assert x == 0.0, "a convention finding must sit on the kink"
    lo, hi = sorted(slopes)
    assert lo <= value / g <= hi                       # a subgradient at the kink
    registry_value = {"relu": 0.0, "abs": 0.0}.get(ex.name, slopes[0])
    assert value != registry_value * g                 # and not the registry's choice


def _reduce_to(x, shape):
    x = np.asarray(x, dtype=object)
    while x.ndim > len(shape):
        x = np.asarray(x.sum(axis=0), dtype=x.dtype)
    for axis, n in enumerate(shape):
        if n == 1 and x.shape[axis] != 1:
            x = x.sum(axis=axis, keepdims=True)
    return x


def _on_kink(engine, ex, what, index):
    """The registry's value at an element on a kink (no derivative exists there), after
    checking that the engine's value is no subgradient at all; None off the kinks."""
    if what == "output" or ex.name not in ("relu", "abs", "leaky_relu", "maximum"):
        return None
    idx = tuple(index)
    if ex.name == "maximum":
        a, b = (np.asarray(x, np.float64) for x in ex.inputs)
        g = np.asarray(ex.grad, np.float64)
        af, bf = np.broadcast_arrays(a, b)
        if not (af == bf).any():
            return None
        da, db = (np.asarray(v, np.float64) for v in peers_findings._engine_arrays(engine, ex)[1])
        # every subgradient sends each entry's g to a or b in shares summing to 1
        assert not math.isclose(da.sum() + db.sum(), g.sum(),
                                rel_tol=peers_findings.tie_tolerance(ex, g.size)), \
            "the tie rule is a valid subgradient: this is a convention, not a failure"
        with mpmath.workdps(60):                             # sum the shares exactly
            gm = np.frompyfunc(mpmath.mpf, 1, 1)(g)
            registry_value = _reduce_to(gm * (af >= bf), a.shape) if what[1] == 0 else \
                _reduce_to(gm * (af < bf), b.shape)
            return mpmath.mpf(registry_value[idx])
    x = float(np.asarray(ex.inputs[0], np.float64)[idx])
    if x != 0.0:
        return None
    g = float(np.asarray(ex.grad, np.float64)[idx])
    slope = ex.params.get("negative_slope", 0.01)
    lo, hi = {"relu": (0.0, 1.0), "abs": (-1.0, 1.0), "leaky_relu": (slope, 1.0)}[ex.name]
    value = _element(engine, ex, f"d/d{__import__('spec').OPS[ex.name].inputs[0]}", idx)
    assert g == 0 or not lo <= value / g <= hi, "a subgradient: a convention, not a failure"
    with mpmath.workdps(60):    # the slope is the float passed in, times g, exactly
        return {"relu": 0, "abs": 0}.get(ex.name, mpmath.mpf(slope)) * mpmath.mpf(g)


# ---------------------------------------------------------------------------------------------
# second order


def _second_order_value(engine, ex, entry, tangents):
    got = peers_findings._second_order_arrays(engine, ex, entry["derivative"], tangents)
    if entry["derivative"] == "jvp2":
        return got
    return got[_hvp_input(ex, entry)]


def _hvp_input(ex, entry):
    """The input whose ``H t`` the finding reports (its ``what`` is ``"H t (d/dNAME)"``)."""
    import spec

    return spec.OPS[ex.name].inputs.index(entry["what"].split("d/d")[1].rstrip(")"))


@pytest.mark.parametrize("entry", SECOND_ORDER, ids=[_id(e) for e in SECOND_ORDER])
def test_second_order_finding_holds(entry, monkeypatch):
    import warnings

    engine = _engine(entry["engine"], monkeypatch)
    ex = peers_findings.rebuild_case(entry["case"])
    tangents = peers_findings.case_tangents(entry["case"])
    call = (lambda: _second_order_value(engine, ex, entry, tangents))
    if entry["kind"] == "contract":
        if "raises" in entry:
            with pytest.raises(Exception) as info:
                peers_findings._second_order_arrays(engine, ex, entry["derivative"], tangents)
            assert type(info.value).__name__ == entry["raises"]
            return
        got = call()
        if entry["returns_dtype"] == "None":
            assert got is None
        else:
            assert np.asarray(got).dtype.name == entry["returns_dtype"]
            assert np.asarray(got).dtype != np.dtype(ex.dtype)
        return
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = float(np.asarray(call(), np.float64)[tuple(entry["index"])])
    recorded = entry["engine_value"]
    assert value == recorded or (math.isnan(value) and math.isnan(recorded)), \
        f"the engine now returns {value!r}, the table says {recorded!r}"
    if entry["derivative"] == "jvp2":
        exact = mp_reference.exact_jvp_element(ex.name, ex.inputs, tangents, ex.params,
                                               entry["index"])
    else:
        exact = mp_reference.exact_hvp_element(ex.name, ex.inputs, ex.grad, tangents,
                                               ex.params, _hvp_input(ex, entry),
                                               entry["index"])
    # the table's exact value (spec's dual numbers) agrees with the finite differences
    _assert_recorded_failure(entry, exact, value, digits=25)
