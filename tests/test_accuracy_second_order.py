"""``verigrad report``'s second-order figures: JVP and HVP ULPs per engine, "not provided" rows."""
import numpy as np

from reports import accuracy_second_order
from reports.conformance.engines import ReflibEngine, get_engine
from tests.conformance.planted_engines import TanhFloat32Intermediate
from tests.conformance.test_conform_second_order import FirstOrderOnly


def test_fastlib_rows_and_not_provided_rows():
    rows = accuracy_second_order.measure_op(
        "tanh", [get_engine("fastlib"), ReflibEngine(), FirstOrderOnly()], ("float32", "float64"))
    fast = [r for r in rows if r["engine"] == "fastlib"]
    assert {(r["dtype"], r["kind"]) for r in fast} == {
        (d, k) for d in ("float32", "float64") for k in ("jvp", "hvp")}
    # measured, finite figures (1 - tanh² cancels near ±1: tens of ULPs of the small exact
    # value are the conditioning, not a bug; the planted test below shows what a bug looks like)
    assert all(r["status"] == "ok" and np.isfinite(r["max_ulp"]) and r["entries"] > 0
               for r in fast)
    ref = [r for r in rows if r["engine"] == "reflib"]
    assert ref and all(r["status"] == "ok" and np.isfinite(r["max_ulp"]) for r in ref)
    without = [r for r in rows if r["engine"] == FirstOrderOnly.name]
    assert without and all(r["status"] == "not provided" for r in without)


def test_a_float32_intermediate_shows_in_float64_ulps():
    rows = accuracy_second_order.measure_op("tanh", [TanhFloat32Intermediate()], ("float64",))
    hvp = next(r for r in rows if r["kind"] == "hvp")
    # tanh kept in float32: an error of about 2^-24 relative, i.e. ~2^28 float64 ULPs
    assert hvp["max_ulp"] > 1e6


def test_report_flag_measures_second_order_beside_the_first_order_figures():
    """``verigrad report --second-order``: the config carries it, report.json validates, the
    Markdown and HTML pages show each VJP cell beside its JVP and HVP cells; off by default."""
    from reports import accuracy, schema
    from reports.cli import build_parser
    from reports.commands.report import _config
    from reports.render import html, markdown

    parser = build_parser()
    off = _config(parser.parse_args(["report", "--quick", "--ops", "mul"]))
    on = _config(parser.parse_args(["report", "--quick", "--ops", "mul", "--second-order"]))
    assert (off.second_order, on.second_order) == (False, True)
    assert on.quick and on.to_json()["second_order"] is True
    fastlib = get_engine("fastlib")
    small = dict(ops=("mul",), samples=1, dtypes=("float64",), fd_steps=())
    report = accuracy.measure(accuracy.Config(second_order=True, **small), [fastlib], [])
    schema.check(report)
    rows = report["second_order"]["mul"]
    assert {r["kind"] for r in rows} == {"jvp", "hvp"}
    text = markdown.render(report)
    assert "## Second order: VJP, JVP and HVP" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| `mul` |") and "JVP" in ln)
    assert "VJP " in line and "HVP " in line
    assert "Second order: VJP, JVP and HVP" in html.render(report)
    plain = accuracy.measure(accuracy.Config(**small), [fastlib], [])
    assert "second_order" not in plain and "Second order" not in markdown.render(plain)
