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
