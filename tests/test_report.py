"""Gradient-accuracy reports (`verigrad report`, reports.accuracy, reports.render, schema).

Expected values come from outside the code under test: hand derivations (ULP spacings,
condition numbers of simple VJPs, the truncation error of a central difference), exact
arithmetic (mpmath at high precision, fractions), NumPy's own ``np.spacing``, and engines
written here whose errors are known by construction (one returning the correctly rounded
exact value, one a single ULP away, one with planted 1e-3 relative noise).
"""
import json
import math
import textwrap

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import spec
from reports import accuracy, schema
from reports.cli import main
from reports.commands.report import write_outputs
from reports.render import html as render_html
from reports.render import markdown as render_md

F32_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------------------------------------
# number formats


def test_spacing_by_hand():
    # ULP of the binade: 2**(floor(log2|x|) - p + 1), subnormal spacing at and below emin.
    assert accuracy.spacing(np.array([1.0]), "float32")[0] == 2.0 ** -23
    assert accuracy.spacing(np.array([-3.0]), "float64")[0] == 2.0 ** -51
    assert accuracy.spacing(np.array([0.0]), "float32")[0] == 2.0 ** -149
    assert accuracy.spacing(np.array([2.0 ** -130]), "float32")[0] == 2.0 ** -149
    assert accuracy.spacing(np.array([0.0]), "float64")[0] == 2.0 ** -1074
    assert np.isinf(accuracy.spacing(np.array([np.inf]), "float64")[0])


# np.spacing(|x|) is the gap to the next larger float: the ULP of |x|'s binade, except at the
# largest finite float, where the next one overflows (np.spacing says inf): left out.
@given(st.floats(min_value=-1e308, max_value=1e308))
def test_spacing_matches_numpy_float64(x):
    assert accuracy.spacing(np.array([x]), "float64")[0] == np.spacing(abs(x))


@given(st.floats(width=32, min_value=-(2.0 ** 127), max_value=2.0 ** 127))
def test_spacing_matches_numpy_float32(x):
    assert accuracy.spacing(np.array([x]), "float32")[0] == float(np.spacing(np.float32(abs(x))))


@st.composite
def near_float32_ties(draw):
    """An exact value hi + lo (float64 pair) at or near a float32 rounding boundary."""
    # Normal float32 magnitudes only: mpmath's 24-bit rounding below has no subnormals.
    a = np.float32(draw(st.floats(min_value=2.0 ** -100, max_value=2.0 ** 100, width=32))
                   * draw(st.sampled_from([1.0, -1.0])))
    half = float(np.spacing(np.abs(a))) / 2
    hi = float(a) + draw(st.sampled_from([half, -half, 0.0, half / 3]))
    lo = draw(st.sampled_from([0.0, 1e-300, -1e-300])) * max(abs(hi), 1.0)
    return hi, lo


def _nearest_float32_exact(hi, lo):
    """Round hi + lo to float32 with mpmath at 24 bits (ties to even), from the exact sum."""
    with mpmath.workprec(2000):
        exact = mpmath.mpf(hi) + mpmath.mpf(lo)
    with mpmath.workprec(24):
        return float(+exact)


@given(near_float32_ties())
def test_float32_nearest_breaks_ties_with_the_remainder(pair):
    hi, lo = pair
    got = accuracy.float32_nearest(np.array([hi]), np.array([lo]))[0]
    assert got == _nearest_float32_exact(hi, lo)


def test_float32_nearest_by_hand():
    mid = 1.0 + 2.0 ** -24                     # halfway between 1 and 1 + 2**-23
    got = accuracy.float32_nearest(np.array([mid, mid, mid]), np.array([1e-30, -1e-30, 0.0]))
    assert got.tolist() == [1.0 + 2.0 ** -23, 1.0, 1.0]   # up, down, tie to even
    assert np.isinf(accuracy.float32_nearest(np.array([2.0 * F32_MAX]), np.array([0.0]))[0])


# ---------------------------------------------------------------------------------------------
# the exact table: condition numbers against hand derivations


def _case(inputs, grad, params=None):
    return accuracy.Case("uniform", [np.asarray(x, dtype=np.float64) for x in inputs],
                         dict(params or {}), np.asarray(grad, dtype=np.float64))


def test_condition_numbers_by_hand():
    # mul: v_a = g·b, each of g and b moves v_a by its own relative step -> kappa = 2.
    # add with b broadcast over rows: v_b[j] = g[0,j] + g[1,j] -> (|g0|+|g1|) / |g0+g1|.
    # tanh: v = g·(1 - tanh²x); x dv/dx / v = -2 x tanh x -> kappa = 1 + 2|x tanh x|.
    g = np.array([[0.5, -0.25, 1.5], [0.375, 0.25, -1.0]])
    cases = {
        "mul": _case([[1.5, -2.0], [0.75, 3.0]], [0.5, -1.25]),
        "add": _case([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [0.5, 0.25, 1.0]], g),
        "tanh": _case([[0.5, -2.0, 3.0]], [1.0, -0.5, 0.25]),
    }
    tables = {name: accuracy.exact_table(name, [case]) for name, case in cases.items()}
    mul = tables["mul"]
    np.testing.assert_allclose(mul.kappa, 2.0, rtol=1e-6)
    add = tables["add"]
    with np.errstate(divide="ignore"):  # column 1 cancels exactly: kappa is infinite there
        want_b = (np.abs(g[0]) + np.abs(g[1])) / np.abs(g[0] + g[1])
    assert np.isinf(want_b[1])
    np.testing.assert_allclose(add.kappa[add.slices[0][1]], want_b, rtol=1e-6)
    np.testing.assert_allclose(add.kappa[add.slices[0][0]], 1.0, rtol=1e-6)
    x = np.array([0.5, -2.0, 3.0])
    np.testing.assert_allclose(tables["tanh"].kappa, 1 + 2 * np.abs(x * np.tanh(x)), rtol=1e-6)


def test_exact_values_and_rounding_by_hand():
    # d/dx exp at x = 1 with grad 1 is e: hi is e rounded to float64, r32 e rounded to float32.
    table = accuracy.exact_table("exp", [_case([[1.0]], [1.0])])
    with mpmath.workdps(40):
        e = mpmath.e
        assert table.hi[0] == float(e)
        assert abs(mpmath.mpf(table.hi[0]) + mpmath.mpf(table.lo[0]) - e) < mpmath.mpf(10) ** -30
    assert table.r32[0] == float(np.float32(math.e))


# ---------------------------------------------------------------------------------------------
# per-element errors through engines whose errors are known by construction


class RoundedExact:
    """An engine returning the exact VJP rounded once to the dtype (an independent floor)."""

    name = "rounded-exact"
    dtypes = (np.dtype(np.float32), np.dtype(np.float64))
    shift = 0                                   # ULPs to move away from the rounded value

    def supports(self, op):
        return True, ""

    def forward(self, name, inputs, **params):  # pragma: no cover - the reports use vjp only
        raise NotImplementedError

    def vjp(self, name, inputs, grad, **params):
        dtype = np.asarray(grad).dtype
        as64 = [np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f" else np.asarray(x)
                for x in inputs]
        _, grads = spec.evaluate(name, as64, np.asarray(grad, np.float64), params, dps=60)
        out = []
        for gi in grads:
            if gi is None:
                out.append(None)
                continue
            # float(mpf) rounds to nearest float64; the float32 cast of that is a double
            # rounding, wrong only on exact float32 ties (not met on these random draws).
            v = np.array([float(t) for t in np.asarray(gi).reshape(-1)]).astype(dtype)
            for _ in range(self.shift):
                v = np.nextafter(v, np.asarray(np.inf, dtype))
            out.append(v.reshape(np.shape(gi)))
        return tuple(out)


class OneUlpUp(RoundedExact):
    name = "one-ulp-up"
    shift = 1


class Picky(RoundedExact):
    """Declares exp unsupported (the report must say so, not skip it silently)."""

    name = "picky"

    def supports(self, op):
        return (False, "no exp in this engine") if op == "exp" else (True, "")


class Flaky(RoundedExact):
    """Raises on every other mul call (a crash is a finding: the row says how many)."""

    name = "flaky"

    def __init__(self):
        self.calls = 0

    def vjp(self, name, inputs, grad, **params):
        self.calls += 1
        if name == "mul" and self.calls % 2:
            raise RuntimeError("boom")
        return super().vjp(name, inputs, grad, **params)


def _config(**kw):
    base = dict(samples=3, ops=("exp", "mul"), fd_steps=(1e-3,), fd_cases=2,
                sources=("uniform", "log_uniform"))
    base.update(kw)
    return accuracy.Config(**base)


class NaNFirst(RoundedExact):
    """Returns NaN for the first entry of every VJP: an infinite error, never left out."""

    name = "nan-first"

    def vjp(self, name, inputs, grad, **params):
        out = super().vjp(name, inputs, grad, **params)
        for g in out:
            g.reshape(-1)[0] = np.nan
        return out


@pytest.fixture(scope="module")
def known_report():
    engines = [RoundedExact(), OneUlpUp(), Picky(), Flaky(), NaNFirst()]
    return accuracy.measure(_config(), engines)


def _row(report, op, engine, dtype, kind="engine"):
    return next(r for r in report["ops"][op]["rows"]
                if r["kind"] == kind and r["engine"] == engine and r["dtype"] == dtype)


@pytest.mark.parametrize("op", ["exp", "mul"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_errors_of_engines_with_known_error(known_report, op, dtype):
    exact = _row(known_report, op, "rounded-exact", dtype)
    # Correct rounding: at most half an ULP, every element equal to the rounded value.
    assert exact["n"] > 0
    assert accuracy.as_float(exact["ulp"]["max"]) <= 0.5
    assert exact["correctly_rounded"] == 1.0
    up = _row(known_report, op, "one-ulp-up", dtype)
    # One ULP up from the rounded value: between 0.5 and 1.5 ULPs (2.5 where the step
    # crosses into a binade twice as wide), never correctly rounded (zeros move to the
    # smallest subnormal, far from the subnormal-free exact zero only in relative terms).
    ulps = accuracy.as_float(up["ulp"]["median"])
    assert 0.5 <= ulps <= 1.5
    assert accuracy.as_float(up["ulp"]["max"]) <= 2.5
    assert up["correctly_rounded"] == 0.0
    floor = _row(known_report, op, "exact, rounded", dtype, kind="floor")
    assert floor["correctly_rounded"] == 1.0


def test_unsupported_ops_and_raising_engines_are_reported(known_report):
    picky = _row(known_report, "exp", "picky", "float32")
    assert picky["status"] == "unsupported" and picky["reason"] == "no exp in this engine"
    flaky = _row(known_report, "mul", "flaky", "float64")
    cases = sum(known_report["ops"]["mul"]["cases"].values())
    assert flaky["status"] == "error" and 0 < flaky["errors"] < cases
    assert "RuntimeError: boom" in flaky["first_error"]
    assert any("mul on flaky" in n and "boom" in n for n in known_report["notes"])
    assert any(r["engine"] == "picky" and r["status"] == "unsupported"
               for r in known_report["summary"])
    assert schema.validate(json.loads(json.dumps(known_report))) == []


def test_nan_results_count_as_infinite_errors(known_report):
    row = _row(known_report, "exp", "nan-first", "float64")
    exact = _row(known_report, "exp", "rounded-exact", "float64")
    cases = sum(known_report["ops"]["exp"]["cases"].values())
    assert row["n"] == exact["n"] and row["nonfinite"] == cases
    assert row["ulp"]["max"] == "inf" and row["rel"]["max"] == "inf"
    assert row["histogram"]["infinite"] == cases


def test_finite_difference_truncation_error_by_hand():
    # exp at x with grad 1: (e^(x+h) - e^(x-h)) / 2h = e^x sinh(h)/h, relative error
    # sinh(h)/h - 1 = h²/6 + O(h⁴), here h = 1e-2 · max(1, |x|) = 1e-2 (|x| < 1); float64
    # rounding adds ~1e-16/h, far below the 1.7e-5 truncation.
    x = np.array([0.25, -0.5, 0.75])
    table = accuracy.exact_table("exp", [_case([x], [1.0, 1.0, 1.0])])
    fd, state = accuracy.fd_values(table, "float64", 1e-2, 10)
    assert (state == accuracy.MEASURED).all()
    h = 1e-2
    np.testing.assert_allclose(fd, np.exp(x) * math.sinh(h) / h, rtol=1e-12)
    rel = accuracy.element_errors(fd, table, "float64", state)["rel"]
    np.testing.assert_allclose(rel, h * h / 6, rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# regressions


def _fake_report(rows, samples=8):
    return {"config": {"samples": samples, "seed": 0, "sources": ["uniform"], "dps": 50},
            "generated": "then",
            "ops": {op: {"rows": [{"kind": "engine", "engine": "e", "dtype": "float32",
                                   "status": "ok", "ulp": {"median": med, "max": mx}}]}
                    for op, (med, mx) in rows.items()}}


def test_compare_flags_growth_beyond_twice():
    base = _fake_report({"a": (1.0, 4.0), "b": (1.0, 4.0), "c": (0.0, 0.0), "d": (0.0, 0.0),
                         "e": (1.0, "inf")})
    now = _fake_report({"a": (2.5, 4.0), "b": (1.9, 7.9), "c": (0.9, 0.9), "d": (0.3, 1.2),
                        "e": (1.0, "inf")}, samples=16)
    got = accuracy.compare(base, now, source="old.json")
    flagged = {(f["op"], f["metric"]) for f in got["flagged"]}
    # a: median 1 -> 2.5 (> 2x); b: 1.9x and 1.975x (not); c: 0 counts as 0.5, 0.9 < 1;
    # d: max 0 -> 1.2 > 2 * 0.5; e: an infinite baseline cannot regress.
    assert flagged == {("a", "median_ulp"), ("d", "max_ulp")}
    assert got["compared"] == 5
    assert got["config_differs"] == ["samples"]
    assert got["baseline"] == "old.json"


# ---------------------------------------------------------------------------------------------
# the schema and its validator


def test_validator_reports_each_problem_with_its_path(known_report):
    doc = json.loads(json.dumps(known_report))
    assert schema.validate(doc) == []
    bad = json.loads(json.dumps(known_report))
    del bad["config"]["seed"]
    bad["ops"]["exp"]["rows"][0]["ulp"]["max"] = "huge"
    bad["ops"]["exp"]["rows"][0]["n"] = -1
    bad["surprise"] = 1
    problems = schema.validate(bad)
    assert any("$.config: missing required field 'seed'" in p for p in problems)
    assert any(p.startswith("$.ops.exp.rows[0].ulp.max:") for p in problems)
    assert any("$.ops.exp.rows[0].n: -1 is below the minimum 0" in p for p in problems)
    assert any("unexpected field 'surprise'" in p for p in problems)
    nan = json.loads(json.dumps(known_report))
    nan["ops"]["exp"]["rows"][0]["rel"]["max"] = float("nan")
    with pytest.raises(ValueError, match=r"\$\.ops\.exp\.rows\[0\]\.rel\.max"):
        schema.check(nan)


def test_schema_is_a_json_schema_document():
    doc = json.loads(schema.dumps())
    assert doc["$schema"].startswith("https://json-schema.org/")
    assert "summary" in doc["required"] and doc["properties"]["ops"]["type"] == "object"


# ---------------------------------------------------------------------------------------------
# the command: a tiny configuration, all three formats, and a planted regression

PLANTED = textwrap.dedent('''
    """A test engine: fastlib, with {noise} relative noise planted in {op}'s VJP."""
    import numpy as np
    from reports.conformance.engines import get_engine

    class Planted:
        name = "planted"
        dtypes = (np.dtype(np.float32), np.dtype(np.float64))

        def __init__(self):
            self.inner = get_engine("fastlib")
            self.rng = np.random.default_rng(0)

        def supports(self, op):
            return self.inner.supports(op)

        def forward(self, name, inputs, **params):
            return self.inner.forward(name, inputs, **params)

        def vjp(self, name, inputs, grad, **params):
            grads = self.inner.vjp(name, inputs, grad, **params)
            if name != "{op}" or {noise} == 0:
                return grads
            return tuple(None if g is None else
                         (g * (1 + {noise} * self.rng.uniform(-1, 1, g.shape))).astype(g.dtype)
                         for g in grads)
''')

TINY = ["--ops", "tanh", "mul", "--samples", "3", "--quick", "--no-progress"]


def _plugin(tmp_path, filename, noise):
    path = tmp_path / filename
    path.write_text(PLANTED.format(noise=noise, op="tanh"))
    return f"{path}:Planted"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A clean run (the baseline), then the planted run compared against it."""
    tmp = tmp_path_factory.mktemp("report")
    clean = _plugin(tmp, "clean_engine.py", 0)
    noisy = _plugin(tmp, "noisy_engine.py", 1e-3)
    codes = {}
    codes["clean"] = main(["report", *TINY, "--engines", "fastlib", clean,
                           "--out", str(tmp / "clean")])
    codes["noisy"] = main(["report", *TINY, "--engines", "fastlib", noisy,
                           "--out", str(tmp / "noisy"),
                           "--baseline", str(tmp / "clean" / "report.json"),
                           "--fail-on-regression"])
    return tmp, codes


def test_tiny_configuration_renders_all_three_formats(runs):
    tmp, codes = runs
    out = tmp / "clean"
    assert codes["clean"] == 0
    report = json.loads((out / "report.json").read_text())
    assert schema.validate(report) == []
    assert list(report["ops"]) == ["tanh", "mul"]
    assert {(e["name"], e["available"]) for e in report["engines"]} == \
        {("fastlib", True), ("planted", True)}
    md = (out / "report.md").read_text()
    assert "| op | fastlib float32 | fastlib float64 | planted float32 | planted float64 |" in md
    assert "| `tanh` |" in md and "| `mul` |" in md and "## The bar" in md
    page = (out / "report.html").read_text()
    # Self-contained: figures inline, no external resource, the sorting script present.
    assert page.count("data:image/png;base64,") == 3          # overview + one per op
    assert 'src="http' not in page and 'href="http' not in page and "<link" not in page
    assert 'id="summary"' in page and "function sortTable" in page
    assert 'id="op-tanh"' in page and 'id="op-mul"' in page
    for name in ("overview", "tanh", "mul"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "report_schema.json").read_text())["title"]


def test_planted_noise_is_the_worst_row_and_trips_fail_on_regression(runs):
    tmp, codes = runs
    assert codes["noisy"] == 1
    report = json.loads((tmp / "noisy" / "report.json").read_text())
    worst = report["summary"][0]
    assert (worst["op"], worst["engine"]) == ("tanh", "planted")
    # 1e-3 relative noise is ~2**23 * 5e-4 ≈ 4e3 float32 ULPs at the median; nothing clean
    # comes near (fastlib's own tanh is within a few ULPs).
    assert accuracy.as_float(worst["median_ulp"]) > 1e3
    flagged = {(f["op"], f["engine"], f["dtype"]) for f in report["regressions"]["flagged"]}
    assert flagged == {("tanh", "planted", "float32"), ("tanh", "planted", "float64")}
    md = (tmp / "noisy" / "report.md").read_text()
    assert "## Regressions" in md and "`tanh` | planted" in md


def test_regressions_without_the_flag_exit_zero(runs, capsys):
    tmp, _ = runs
    code = main(["report", *TINY, "--engines", "fastlib", "--out", str(tmp / "again"),
                 "--baseline", str(tmp / "noisy" / "report.json")])
    # fastlib against the noisy run: nothing of fastlib grew, so nothing is flagged.
    assert code == 0
    assert "0 regression(s)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--fail-on-regression"], "--fail-on-regression needs --baseline"),
    (["--ops", "tanhh"], "did you mean 'tanh'"),
    (["--dtypes", "float128"], "invalid choice: 'float128'"),
    (["--engines", "fastlb"], "did you mean 'fastlib'"),
    (["--samples", "0"], "--samples: expects an integer >= 1"),
    (["--baseline", "no/such/file.json"], "cannot read baseline"),
])
def test_bad_arguments_exit_two_with_a_message(argv, message, capsys, tmp_path):
    code = main(["report", "--out", str(tmp_path), "--no-progress", *argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_baseline_that_is_not_a_report_is_refused(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"ops": {}}))
    assert main(["report", "--baseline", str(path), "--out", str(tmp_path)]) == 2
    assert "is not a verigrad report" in capsys.readouterr().err


def test_renderers_work_from_the_json_alone(known_report, tmp_path):
    # Any saved report.json can be rendered again, unsupported and failing rows included.
    doc = json.loads(json.dumps(known_report))
    md = render_md.render(doc)
    assert md.count("\n| `") >= 2 and "rounded-exact float32" in md
    assert "| `exp` |" in md and "unsupported" in md and "(errors)" in md
    page = render_html.render(doc)
    assert page.startswith("<!DOCTYPE html>") and "one-ulp-up" in page
    written = write_outputs(doc, tmp_path)
    assert {p.name for p in written} >= {"report.md", "report.html", "report.json",
                                        "report_schema.json", "exp.png", "mul.png",
                                        "overview.png"}


def _summary_html_row(page, op, engine, dtype):
    import re

    body = page.split('id="summary"', 1)[1].split("</table>", 1)[0]
    for tr in re.findall(r"<tr>(.*?)</tr>", body):
        if f'href="#op-{op}"' in tr and f">{engine}<" in tr and f">{dtype}<" in tr:
            return tr
    raise AssertionError(f"no summary row for {op} {engine} {dtype}")


def test_status_column_says_whether_each_row_is_within_its_bound(known_report):
    # nan-first returns NaN for one entry per case: an infinite error, beyond any bound; the
    # correctly rounded engine is within its bound on every element. Both cases ran ("ok").
    doc = json.loads(json.dumps(known_report))
    bad = _row(doc, "exp", "nan-first", "float64")
    good = _row(doc, "exp", "rounded-exact", "float64")
    assert bad["status"] == good["status"] == "ok"
    assert bad["beyond_bound"] > 0 and good["beyond_bound"] == 0
    page = render_html.render(doc)
    failing = _summary_html_row(page, "exp", "nan-first", "float64")
    assert f'<td class="l bad">beyond bound: {bad["beyond_bound"]} of {bad["n"]} elements' \
        in failing
    assert '<td class="l">within bound</td>' in _summary_html_row(page, "exp", "rounded-exact",
                                                                  "float64")
    assert "bad\">ok" not in page and ">ok<" not in page        # "ok" says nothing of a bound
    # the Markdown and JSON twins say the same
    summary = {(r["op"], r["engine"], r["dtype"]): r for r in doc["summary"]}
    assert summary[("exp", "nan-first", "float64")]["verdict"] == "beyond bound"
    assert summary[("exp", "rounded-exact", "float64")]["verdict"] == "within bound"
    assert summary[("exp", "picky", "float32")]["verdict"] == "unsupported"
    assert summary[("mul", "flaky", "float64")]["verdict"] == "error"
    md = render_md.render(doc)
    assert f"({bad['beyond_bound']} beyond bound)" in md
    assert "beyond bound: " in md
    assert schema.validate(doc) == []


@pytest.mark.slow     # ~30 s of CPU (torch's import and three ops' exact values)
def test_quick_bar_on_the_ops_it_once_missed():
    # The bar lines `verigrad report --quick` prints, on a tiny subset: silu and a broadcast
    # sum (add) were 7-9 ULPs off in float64 on well-conditioned elements, exp's float32
    # median was farther from exact than PyTorch's. The figures come from spec's exact values.
    pytest.importorskip("torch", reason="the float32 bar compares with PyTorch (verigrad[torch])")
    from reports.commands.report import _bar_lines
    from reports.conformance.engines import get_engine

    config = accuracy.Config.quick_config(ops=("silu", "add", "exp"), fd_steps=())
    report = accuracy.measure(config, [get_engine("fastlib"), get_engine("torch")])
    lines = _bar_lines(report)
    assert lines == ["  fastlib float64 within 4 ULPs (well-conditioned): 3/3 ops",
                     "  fastlib float32 median <= torch float32: 3/3 ops"]
    for op in ("silu", "add", "exp"):
        row = _row(report, op, "fastlib", "float64")
        assert accuracy.as_float(row["well_conditioned"]["max_ulp"]) <= accuracy.FEW_ULPS
        assert row["well_conditioned"]["n"] > 0 and row["beyond_bound"] == 0
