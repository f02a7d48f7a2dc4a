"""The engine registry and protocol: names, availability with reasons, plugins, completeness
claims tested both ways, and the adapters held to the same standard.

Oracles: the registry's own op list (spec.OPS), hand-written engines with known defects, and
the exact values of ``reports.conformance.oracle`` (through ``properties``).
"""
from __future__ import annotations

import importlib.util
import sys
import textwrap

import numpy as np
import pytest

import spec
from reports.conformance import engines, properties
from reports.conformance.engines import (Engine, EngineUnavailableError, UnknownEngineError,
                                         UnsupportedOpError)
from reports.conformance.special_values import special_cases
from reports.conformance.strategies import OpExample, make_example


def test_registry_names_and_statuses():
    statuses = engines.available_engines()
    assert [s.name for s in statuses] == ["reflib", "fastlib", "fastlib-cuda", "torch", "jax",
                                          "paddle", "tinygrad", "mygrad", "autograd"]
    for s in statuses:
        assert s.available == (s.reason == ""), s
        assert s.description
    by_name = {s.name: s for s in statuses}
    assert by_name["reflib"].available and by_name["fastlib"].available


def test_unavailable_engines_raise_with_the_reason():
    for status in engines.available_engines():
        if status.available:
            engine = engines.get_engine(status.name)
            assert isinstance(engine, engines.EngineProtocol)
            continue
        with pytest.raises(EngineUnavailableError) as err:
            engines.get_engine(status.name)
        assert status.reason in str(err.value)


def test_fastlib_cuda_reason_comes_from_fastlib_cuda():
    import fastlib.cuda as fc

    status = engines.engine_status("fastlib-cuda")
    if fc.is_available():
        assert status.available
    else:
        assert not status.available and status.reason == fc.unavailable_reason()


def test_unknown_engine_lists_close_names():
    with pytest.raises(UnknownEngineError, match="did you mean 'fastlib'"):
        engines.get_engine("fastlb")
    with pytest.raises(UnknownEngineError, match="no attribute 'Engin'.*did you mean 'Engine'"):
        engines.get_engine("reports.conformance.engines:Engin")
    with pytest.raises(UnknownEngineError, match="cannot import module"):
        engines.get_engine("no_such_module_xyz:Engine")
    with pytest.raises(TypeError, match="string"):
        engines.get_engine(3)


def test_check_engine_names_every_missing_part():
    class Broken:
        name = ""
        dtypes = (np.int32,)

    with pytest.raises(TypeError) as err:
        engines.check_engine(Broken())
    message = str(err.value)
    for part in ("`name`", "`dtypes`", "`supports`", "`forward`", "`vjp`"):
        assert part in message


PLUGIN = textwrap.dedent('''
    import numpy as np
    import reflib
    from reports.conformance.engines import Engine, UnsupportedOpError

    class TinyEngine(Engine):
        """reflib's tanh and add only; every other op declared unsupported."""
        name = "tiny"
        dtypes = (np.dtype(np.float64),)

        def supports(self, op):
            if op in ("tanh", "add"):
                return True, ""
            return False, "tiny implements tanh and add only"

        def _forward(self, name, inputs, **params):
            return reflib.forward(name, inputs, **params)

        def _vjp(self, name, inputs, grad, **params):
            return reflib.vjp(name, inputs, grad, **params)

    def make():
        return TinyEngine()
''')


@pytest.fixture
def plugin_file(tmp_path, monkeypatch):
    path = tmp_path / "tiny_engine_mod.py"
    path.write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop("tiny_engine_mod", None)


def test_plugin_by_module_class_factory_and_file(plugin_file):
    for target in ("tiny_engine_mod:TinyEngine", "tiny_engine_mod:make",
                   f"{plugin_file}:TinyEngine"):
        engine = engines.get_engine(target)
        assert engine.name == "tiny"
        assert engine.supports("tanh") == (True, "")
        ok, reason = engine.supports("exp")
        assert not ok and "tanh and add" in reason


def test_completeness_claims_tested_both_ways(plugin_file):
    engine = engines.get_engine("tiny_engine_mod:TinyEngine")
    for name in spec.OPS:
        ok, _ = engine.supports(name)
        if ok:
            ex = spec.OPS[name].examples[0]
            made = make_example(name, ex.shapes, dict(ex.params), 0, np.float64)
            assert properties.check_call(engine, made).ok
        else:
            assert properties.check_unsupported(engine, name).ok
            with pytest.raises(UnsupportedOpError):
                engine.forward(name, [np.ones(3)])

    class Liar(Engine):
        """Declares exp unsupported but computes it anyway: the claim must be caught."""
        name = "liar"
        dtypes = (np.dtype(np.float64),)
        unsupported = {"exp": "pretends not to"}

        def forward(self, name, inputs, **params):
            import reflib
            return reflib.forward(name, inputs, **params)

        def vjp(self, name, inputs, grad, **params):
            import reflib
            return reflib.vjp(name, inputs, grad, **params)

    result = properties.check_unsupported(Liar(), "exp")
    assert not result.ok and "declared unsupported" in result.describe()


def test_builtin_engines_support_every_registry_op():
    for status in engines.available_engines():
        # the peers declare what they lack (MyGrad has no erf for gelu); tests/peers checks them
        if not status.available or status.name in ("paddle", "tinygrad", "mygrad", "autograd"):
            continue
        engine = engines.get_engine(status.name)
        for name in spec.OPS:
            assert engine.supports(name) == (True, ""), (status.name, name)


def test_optimizer_claims_tested_both_ways():
    fast = engines.get_engine("fastlib")
    for name in ("SGD", "Momentum", "NAG", "Adagrad", "RMSprop", "Adam", "AdamW"):
        assert fast.supports_optimizer(name) == (True, "")
    ref = engines.get_engine("reflib")
    w, s = ref.optimizer_step("Momentum", np.array([1.0]), np.array([0.5]), {}, 1, lr=0.25,
                              beta=0.5)
    # hand derivation: v = 0.5*0 + 0.5*0.5 = 0.25; w = 1 - 0.25*0.25 = 0.9375
    assert w[0] == 0.9375 and s["v"][0] == 0.25


@pytest.mark.parametrize("name", ["tanh", "matmul", "cross_entropy", "maximum"])
def test_engine_contract_violations_are_failures(name):
    ex = spec.OPS[name].examples[0]
    made = make_example(name, ex.shapes, dict(ex.params), 1, np.float32)

    class WrongDtype(Engine):
        """Computes in float64 whatever the inputs: the dtype contract is broken."""
        name = "wrong-dtype"
        dtypes = (np.dtype(np.float32),)

        def _forward(self, n, inputs, **params):
            import reflib
            return reflib.forward(n, [np.asarray(x, np.float64) if np.asarray(x).dtype.kind ==
                                      "f" else x for x in inputs], **params)

        def _vjp(self, n, inputs, grad, **params):
            import reflib
            return reflib.vjp(n, [np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f"
                                  else x for x in inputs], np.asarray(grad, np.float64),
                              **params)

    result = properties.check_call(WrongDtype(), made)
    assert not result.ok and "dtype float64, expected float32" in result.describe()


# ---------------------------------------------------------------------------------------------
# the adapters: PyTorch and JAX against the same standard

torch_available = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(not torch_available, reason="torch is not installed (pip install "
                    "'verigrad[torch]')")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_torch_adapter_passes_random_calls(dtype):
    engine = engines.get_engine("torch")
    rng = np.random.default_rng(5)
    for name in spec.OPS:
        for i, ex in enumerate(spec.OPS[name].examples):
            made = make_example(name, ex.shapes, dict(ex.params), int(rng.integers(2**31)),
                                dtype)
            result = properties.check_call(engine, made)
            assert result.ok, (name, result.describe())


@pytest.mark.skipif(not torch_available, reason="torch is not installed")
def test_suite_catches_stock_torch_conventions():
    """torch.maximum splits tied gradients and F.softplus linearises above 20: both break the
    registry's contract, and the suite says so (the adapter composes primitives instead)."""
    import torch

    from reports.conformance.adapters.torch import TORCH_OPS, TorchEngine

    class Stock(TorchEngine):
        name = "torch-stock"

    stock = Stock()
    patched = dict(TORCH_OPS, maximum=torch.maximum,
                   softplus=torch.nn.functional.softplus)
    import reports.conformance.adapters.torch as adapter
    original = adapter.TORCH_OPS
    adapter.TORCH_OPS = patched
    try:
        tie = OpExample("maximum", (np.array([1.0, 2.0]), np.array([1.0, 3.0])),
                        np.array([1.0, 1.0]), {})
        result = properties.check_call(stock, tie)
        assert not result.ok and "d/da" in result.describe()
        # stock softplus returns x itself above 20: off by log1p(exp(-25)) ~ 1.4e-11 at 25
        sat = [ex for ex in special_cases("softplus", np.float64)
               if ex.label == "saturation" and ex.inputs[0].item() == 25.0]
        result = properties.check_call(stock, sat[0])
        assert not result.ok and "output" in result.describe()
    finally:
        adapter.TORCH_OPS = original
    assert properties.check_call(engines.get_engine("torch"), tie).ok
    assert properties.check_call(engines.get_engine("torch"), sat[0]).ok


@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="jax is not installed (pip install 'verigrad[jax]')")
def test_jax_adapter_kinks_follow_the_registry():
    engine = engines.get_engine("jax")
    for name in ("relu", "abs", "leaky_relu", "maximum"):
        for seed in range(3):
            ex = spec.OPS[name].examples[0]
            made = make_example(name, ex.shapes, dict(ex.params), seed, np.float64,
                                near_kinks=True)
            result = properties.check_call(engine, made)
            assert result.ok, (name, result.describe())


def test_an_input_declared_without_gradient_is_skipped_and_the_others_checked():
    """``no_gradient`` = {op: {input: reason}}: that VJP may be None; the others are measured
    (a wrong logits gradient still fails)."""
    class NoTargetGrad(engines.FastlibEngine):
        name = "no-target-grad"
        no_gradient = {"categorical_cross_entropy": {"target": "labels take no gradient"}}
        scale = 1.0

        def _vjp(self, name, inputs, grad, **params):
            g = super()._vjp(name, inputs, grad, **params)
            if name == "categorical_cross_entropy":
                return (g[0] * self.scale, None)
            return g

    ex = spec.OPS["categorical_cross_entropy"].examples[0]
    made = make_example("categorical_cross_entropy", ex.shapes, dict(ex.params), 3,
                        np.float64)
    engine = NoTargetGrad()
    for check in (properties.check_call, properties.check_jvp):
        result = check(engine, made)
        assert result.ok, result.describe()
        assert result.skipped == ["d/dtarget: labels take no gradient"]
    assert [m.what for m in properties.check_call(engine, made).measures] == [
        "output", "output with the vjp", "d/dlogits"]
    engine.scale = 1 + 1e-6
    assert not properties.check_call(engine, made).ok
    assert not properties.check_jvp(engine, made).ok
    # without the declaration, None for a differentiable input is a failure that says how
    plain = NoTargetGrad()
    plain.no_gradient = {}
    result = properties.check_call(plain, made)
    assert not result.ok and "no_gradient" in result.describe()
