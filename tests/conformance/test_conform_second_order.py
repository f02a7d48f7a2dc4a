"""The jvp2 / hvp checks: fastlib and torch pass, planted second-order bugs fail, an engine
without jvp/hvp is "not provided"."""
import numpy as np
import pytest

from reports.conformance.engines import Engine, ReflibEngine, get_engine
from reports.conformance.second_order import check_second_order, run_second_order
from tests.conformance.planted_engines import SECOND_ORDER_PLANTED


class FirstOrderOnly(Engine):
    """reflib's forward and VJP without its jvp/hvp: an engine that has no second order."""

    name = "first-order-only"
    _forward = ReflibEngine._forward
    _vjp = ReflibEngine._vjp


def test_fastlib_passes_jvp2_and_hvp_on_every_op():
    results = run_second_order(get_engine("fastlib"), seeds=(0,))
    assert results and all(r.status == "passed" for r in results), \
        [(r.op, r.check, r.dtype, r.detail) for r in results if r.status != "passed"]


@pytest.mark.parametrize("planted", SECOND_ORDER_PLANTED, ids=lambda c: c.name)
def test_planted_second_order_bugs_fail(planted):
    engine = planted()
    dtype = np.float64        # the float32 intermediate shows only where float64 is promised
    failed = [r for seed in (0, 1) for r in check_second_order(engine, engine.op, dtype, seed)
              if r.check == "hvp" and r.status == "failed"]
    assert failed, f"{engine.name} passed the hvp check"
    # the clean engine passes the same draws
    clean = [r for seed in (0, 1) for r in check_second_order(get_engine("fastlib"), engine.op,
                                                              dtype, seed)]
    assert all(r.status == "passed" for r in clean)


def test_an_engine_without_second_order_is_not_provided_not_failed():
    results = check_second_order(FirstOrderOnly(), "tanh", np.float64)
    assert [r.status for r in results] == ["not provided", "not provided"]


@pytest.mark.parametrize("name", ["tanh", "mul", "softmax", "layer_norm", "cross_entropy",
                                  "matmul", "logsumexp", "binary_cross_entropy"])
# jax compiles every (op, shape) it is given: seconds each, so its rows are the deep run's
@pytest.mark.parametrize("peer", ["torch", pytest.param("jax", marks=pytest.mark.slow)])
def test_torch_and_jax_pass_jvp2_and_hvp(name, peer):
    pytest.importorskip(peer)
    engine = get_engine(peer)
    for dtype in (np.float32, np.float64):
        for r in check_second_order(engine, name, dtype):
            assert r.status == "passed", (r.check, r.dtype, r.detail)
