"""bfloat16 and float16 under the suite: the bounds follow what an engine declares, fastlib meets
its declaration on every op's special and edge calls, and the classic 16-bit bugs fail.

Expected values come from the exact oracle (spec at 50 digits) and from hand derivations of
the 16-bit bound (docs/conformance.md, "16-bit formats"): a result computed in float32 and
rounded once to the format is within half an ulp of it plus the float32 bound in the format's
units; a sum accumulated in float32 is within half an ulp plus ``P(m)`` float32 roundings of
the summed magnitudes. The planted bugs are the hook mutants of
``reports.conformance.lowp_mutants`` and a truncating conversion (a plug-in engine here).
"""
from __future__ import annotations

import numpy as np
import pytest

import optable
import spec
from fastlib.kernels import half
from reports.conformance import bounds, engines, lowp_mutants, properties
from reports.conformance.edge_cases import edge_cases
from reports.conformance.oracle import exact_vjp
from reports.conformance.rows import run_cases
from reports.conformance.special_values import nonfinite_cases, special_cases
from reports.conformance.strategies import OpExample, make_example

BF16, F16 = engines.BFLOAT16, engines.FLOAT16
FORMATS = (BF16, F16)


def _special_row(engine, name, dtype):
    cases = special_cases(name, dtype) + nonfinite_cases(name, dtype) + edge_cases(name, dtype)

    def check(ex):
        if ex.label == "non-finite":
            return properties.check_nonfinite(engine, ex)
        return properties.check_call(engine, ex)
    return run_cases(cases, check)


class Declared(engines.FastlibEngine):
    """fastlib with the declarations a test gives it (the same kernels)."""

    name = "declared"

    def __init__(self, computes_in=None, accumulates=None):
        self._computes_in = computes_in or {}
        self.accumulates = accumulates or {}

    @property
    def computes_in(self):
        return self._computes_in


class Truncating(engines.FastlibEngine):
    """fastlib's float32 kernels with results narrowed to bfloat16 by truncation (the top 16
    bits of float32, rounding toward zero): the classic conversion bug."""

    name = "truncating"

    def _narrowed(self, value, dtype):
        if value is None or np.dtype(dtype) != BF16:
            return value
        bits = np.ascontiguousarray(np.asarray(value, np.float32)).view(np.uint32)
        return (bits >> 16).astype(np.uint16).view(BF16).reshape(np.shape(value))

    def _wide(self, inputs):
        return [half.widen(x) if np.asarray(x).dtype == BF16 else x for x in inputs]

    def _forward(self, name, inputs, **params):
        import fastlib

        dtype = next(np.asarray(x).dtype for x in inputs if optable.formats.is_float(
            np.asarray(x).dtype))
        return self._narrowed(fastlib.forward(name, self._wide(inputs), **params), dtype)

    def _vjp(self, name, inputs, grad, **params):
        import fastlib

        dtype = np.asarray(grad).dtype
        g = half.widen(grad) if dtype == BF16 else grad
        return tuple(self._narrowed(v, dtype) for v in fastlib.vjp(name, self._wide(inputs), g,
                                                                    **params))


# ---------------------------------------------------------------------------------------------
# the bound, derived by hand


def test_computed_in_float32_and_rounded_once_is_half_an_ulp_plus_float32s_bound():
    x = np.array([0.5, -3.0, 1e-3], dtype=BF16)
    g = np.array([1.0, 0.25, -2.0], dtype=BF16)
    exact = exact_vjp("tanh", [x], g)
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    a_out, a_grads = bounds.storage("tanh", [x64], g64, {}, exact.out[0],
                                    [exact.grads[0][0]], BF16, computes_in="float32")
    general, general_grads = bounds.admissible("tanh", [x64], g64, {}, exact.out[0],
                                               [exact.grads[0][0]])
    fmt, wide = optable.formats.FORMATS["bfloat16"], optable.formats.FORMATS["float32"]
    # by hand: (eps32 / eps16)(1 + u16) A32 + |y| / 2 + (tiny32 + the subnormal) / eps16
    floors = (wide.tiny + fmt.smallest_subnormal) / fmt.eps
    want = 2.0 ** -16 * (1 + 2.0 ** -8) * general + 0.5 * np.abs(exact.out[0]) + floors
    np.testing.assert_allclose(a_out, want, rtol=1e-15)
    # the correctly rounded value passes; one ulp further does not
    nearest = exact.out[0].astype(np.float32).astype(BF16)
    error, allowed, ok = bounds.entrywise(nearest, exact.out[0], exact.out[1], a_out, BF16)
    assert ok.all()
    off = (nearest.astype(np.float64) + np.sign(exact.out[0]) * optable.formats.FORMATS[
        "bfloat16"].ulp(nearest)).astype(BF16)
    assert not bounds.entrywise(off, exact.out[0], exact.out[1], a_out, BF16)[2].any()
    assert np.all(np.asarray(a_grads[0]) >= 0.5 * np.abs(exact.grads[0][0]))


def test_accumulating_in_float32_scales_only_the_sums():
    v = np.full(4096, 2.0 ** -9)
    v[0] = 1.0
    x = v.astype(BF16)
    exact = exact_vjp("sum", [x], np.asarray(1.0, BF16))
    args = ("sum", [x.astype(np.float64)], np.float64(1.0), {}, exact.out[0],
            [exact.grads[0][0]], BF16)
    storage_sum, _ = bounds.storage(*args)                       # sums in bfloat16
    float32_sum, _ = bounds.storage(*args, accumulates="float32")
    total = np.sum(np.abs(v))
    p = bounds.pairwise(4096)
    assert float(storage_sum) == pytest.approx(p * total)                     # P(m) eps16 S
    assert float(float32_sum) == pytest.approx(2.0 ** -16 * p * total
                                               + 0.5 * abs(float(exact.out[0])))
    # blocked pairwise in bfloat16 (128 terms one after another, then a tree): the first block
    # stays 1 (1 + 2**-9 rounds to 1), the others are 0.25 each: 8.75 for 8.998. Within P(m)
    # bfloat16 roundings, far outside float32 accumulation and one rounding.
    blocks = [np.add.reduce(x[i:i + bounds.BLOCK], dtype=BF16)
              for i in range(0, x.size, bounds.BLOCK)]
    while len(blocks) > 1:
        blocks = [(np.asarray(a, BF16) + np.asarray(b, BF16)).astype(BF16)
                  for a, b in zip(blocks[::2], blocks[1::2])] + blocks[len(blocks) // 2 * 2:]
    pairwise = np.asarray(blocks[0], BF16)
    assert float(pairwise) == 8.75
    judged = [bounds.entrywise(pairwise, exact.out[0], exact.out[1], a, BF16)[2]
              for a in (storage_sum, float32_sum)]
    assert judged[0] and not judged[1]
    # a bfloat16 running sum loses every 2**-9: 1, outside both
    running = np.add.reduce(x, dtype=BF16)
    assert float(running) == 1.0
    assert not bounds.entrywise(running, exact.out[0], exact.out[1], storage_sum, BF16)[2]


def test_a_declaration_must_name_a_listed_storage_format_and_a_wider_one():
    with pytest.raises(TypeError, match="`computes_in` names 'float32'"):
        engines.check_engine(Declared(computes_in={"float32": "float64"}))
    with pytest.raises(TypeError, match="declares 'bfloat16' for float16: declare a float "
                                        "format at least as wide"):
        engines.check_engine(Declared(accumulates={"float16": "bfloat16"}))
    assert engines.check_engine(Declared(accumulates={"bfloat16": {"sum": "float32",
                                                                   "*": "float64"}}))
    engine = Declared(accumulates={"bfloat16": {"sum": "float32"}})
    assert properties.declared_working(engine, "accumulates", "sum", BF16) == "float32"
    assert properties.declared_working(engine, "accumulates", "mean", BF16) is None


def test_engines_list_the_formats_they_store_and_what_they_compute_in():
    fastlib = engines.get_engine("fastlib")
    assert BF16 in fastlib.dtypes and F16 in fastlib.dtypes
    assert dict(fastlib.computes_in) == {"bfloat16": "float32", "float16": "float32"}
    assert engines.get_engine("reflib").dtypes == (engines.FLOAT64,)


# ---------------------------------------------------------------------------------------------
# fastlib's rows


@pytest.mark.parametrize("dtype", FORMATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(spec.OPS))
def test_fastlib_passes_every_special_and_edge_call_in_16_bits(name, dtype):
    result = _special_row(engines.get_engine("fastlib"), name, dtype)
    assert result.status == "pass", result.detail
    assert result.examples > 0


@pytest.mark.parametrize("dtype", FORMATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", ["tanh", "div", "logsumexp", "matmul", "layer_norm",
                                  "binary_cross_entropy"])
def test_fastlib_passes_drawn_calls_in_16_bits(name, dtype):
    engine = engines.get_engine("fastlib")
    rng = np.random.default_rng(16)
    for edges in (False, True):
        for seed in rng.integers(0, 2**32, 3):
            op = spec.OPS[name]
            ex = make_example(name, [s for s in op.examples[0].shapes],
                              dict(op.examples[0].params), int(seed), dtype, edges=edges)
            assert properties.check_call(engine, ex).ok, properties.check_call(engine, ex)
            assert properties.check_jvp(engine, ex, int(seed)).ok


def test_drawn_16_bit_values_are_numbers_of_the_format_in_the_ops_domain():
    rng = np.random.default_rng(5)
    for dtype in FORMATS:
        for name in ("categorical_cross_entropy", "binary_cross_entropy", "div", "log"):
            op = spec.OPS[name]
            for edges in (False, True):
                ex = make_example(name, op.examples[0].shapes, dict(op.examples[0].params),
                                  int(rng.integers(2**32)), dtype, edges=edges)
                for iname, x in zip(op.inputs, ex.inputs):
                    if op.domains[iname] != "class_index":
                        assert x.dtype == np.dtype(dtype)
                exact_vjp(name, ex.inputs, ex.grad, ex.params)     # inside every domain


# ---------------------------------------------------------------------------------------------
# the planted bugs fail


def test_a_truncating_conversion_fails():
    x = np.linspace(-3.0, 3.0, 61).astype(BF16)
    ex = OpExample("tanh", (x,), np.ones(61, BF16), {}, 0, False, "planted")
    truncated = properties.check_call(Truncating(), ex)
    assert not truncated.ok and "ulp" in truncated.describe()
    assert properties.check_call(engines.get_engine("fastlib"), ex).ok


def test_a_bfloat16_sum_accumulated_in_bfloat16_fails():
    engine = engines.get_engine("fastlib")
    (long,) = [c for c in special_cases("sum", BF16) if c.label == "long reduction"
               and c.inputs[0].ndim == 1]
    with lowp_mutants.MUTANTS["bfloat16-sum-in-bfloat16"].apply():
        planted = properties.check_call(engine, long)
    assert not planted.ok and "output" in planted.describe()
    assert properties.check_call(engine, long).ok          # the patch is undone


def test_a_float16_softmax_without_its_shift_fails():
    engine = engines.get_engine("fastlib")
    cases = [c for c in special_cases("softmax", F16) if c.label == "logits ±1e4"]
    with lowp_mutants.MUTANTS["float16-softmax-unshifted"].apply():
        planted = [properties.check_call(engine, c) for c in cases]
    assert not any(r.ok for r in planted)
    assert any("non-finite" in r.describe() for r in planted)
    assert all(properties.check_call(engine, c).ok for c in cases)


# ---------------------------------------------------------------------------------------------
# an engine whose kernels exist in some formats only


class SomeFormats(engines.FastlibEngine):
    """fastlib, claiming (as Paddle's CPU build does) that tanh has no bfloat16 kernel."""

    name = "some-formats"

    def supports_in(self, op, dtype):
        if op == "tanh" and np.dtype(dtype) == BF16:
            return False, "no bfloat16 kernel of tanh"
        return self.supports(op)

    def _forward(self, name, inputs, **params):
        if name == "tanh" and np.asarray(inputs[0]).dtype == BF16:
            raise engines.UnsupportedOpError("no bfloat16 kernel of tanh")
        return super()._forward(name, inputs, **params)

    def _vjp(self, name, inputs, grad, **params):
        if name == "tanh" and np.asarray(inputs[0]).dtype == BF16:
            raise engines.UnsupportedOpError("no bfloat16 kernel of tanh")
        return super()._vjp(name, inputs, grad, **params)


class ClaimsTooMuch(SomeFormats):
    """The same claim, but tanh runs in bfloat16 anyway: the completeness row must say so."""

    name = "claims-too-much"

    def _forward(self, name, inputs, **params):
        return engines.FastlibEngine._forward(self, name, inputs, **params)


def test_an_op_a_format_lacks_is_unsupported_there_and_must_raise():
    from reports.conformance.runner import plan_rows

    engine = SomeFormats()
    assert engines.supports_in(engine, "tanh", BF16) == (False, "no bfloat16 kernel of tanh")
    assert engines.supports_in(engine, "tanh", F16) == (True, "")
    rows, _ = plan_rows([f"{__name__}:SomeFormats"], ops=["tanh"])
    by = {(r.kind, r.dtype): r for r in rows}
    assert by[("exact", "bfloat16")].result.status == "unsupported"
    assert by[("exact", "float16")].result is None          # planned, to run
    completeness = [r for r in plan_rows([f"{__name__}:SomeFormats"])[0]
                    if r.kind == "completeness"][0]
    assert completeness.run(None, 0).status == "pass"
    claim = [r for r in plan_rows([f"{__name__}:ClaimsTooMuch"])[0]
             if r.kind == "completeness"][0].run(None, 0)
    assert claim.status == "FAIL" and "declared unsupported in bfloat16" in claim.detail


def test_the_report_measures_16_bit_formats_in_their_own_ulps():
    from reports import accuracy

    config = accuracy.Config.quick_config(dtypes=("float32", "bfloat16", "float16"),
                                          ops=("tanh",), fd_steps=())
    result = accuracy.measure_op("tanh", [engines.get_engine("fastlib")], config)
    rows = {r["dtype"]: r for r in result["rows"] if r["kind"] == "engine"}
    assert set(rows) == {"float32", "bfloat16", "float16"}
    for dtype in ("bfloat16", "float16"):
        assert rows[dtype]["status"] == "ok" and rows[dtype]["beyond_bound"] == 0
        assert rows[dtype]["returned_dtypes"] == [dtype]
        # computed in float32, rounded once: within half an ulp and a hair, correctly
        # rounded but where the float32 value sits on a 16-bit rounding boundary
        assert accuracy.as_float(rows[dtype]["ulp"]["max"]) < 0.51
        assert rows[dtype]["n"] > 0


def test_the_bar_holds_single_rounding_ops_correctly_rounded_in_16_bits():
    # square's VJP 2 x g of 16-bit x and g is exact in float32 (at most 22 significant bits):
    # one rounding to the format gives the nearest 16-bit number on every element, and a
    # truncating conversion misses some
    from reports import accuracy

    config = accuracy.Config.quick_config(dtypes=("bfloat16", "float16"), ops=("square",),
                                          fd_steps=())
    report = {"ops": {"square": accuracy.measure_op(
        "square", [engines.get_engine("fastlib"), Truncating()], config)}}
    fastlib_bar = accuracy.bar(report)["correct_rounding"]
    assert {(e["dtype"], e["status"]) for e in fastlib_bar} == {("bfloat16", "pass"),
                                                               ("float16", "pass")}
    truncated = {e["dtype"]: e for e in accuracy.bar(report, "truncating")["correct_rounding"]}
    assert truncated["bfloat16"]["status"] == "fail"
    assert accuracy.as_float(truncated["bfloat16"]["correctly_rounded"]) < 1.0


def test_the_floor_rounds_the_exact_value_once_to_the_format():
    from reports import accuracy

    rng = np.random.default_rng(2)
    hi = rng.standard_normal(4000) * 10.0 ** rng.uniform(-6, 4, 4000)
    lo = hi * rng.uniform(-1e-17, 1e-17, 4000)
    # float16: NumPy rounds float64 to float16 directly, to nearest even
    got = accuracy.format_nearest(hi, np.zeros_like(lo), "float16")
    assert np.array_equal(got, hi.astype(np.float16).astype(np.float64))
    # a tie broken by the remainder: 1 + 2**-8 is halfway between two bfloat16 numbers
    ties = np.array([1 + 2.0 ** -8, 1 + 2.0 ** -8, 1 + 2.0 ** -8])
    got = accuracy.format_nearest(ties, np.array([0.0, 1e-30, -1e-30]), "bfloat16")
    assert got.tolist() == [1.0, 1 + 2.0 ** -7, 1.0]
    # from the overflow threshold on, inf (65520 in float16)
    got = accuracy.format_nearest(np.array([65519.9, 65520.0, -7e4]), np.zeros(3), "float16")
    assert got[0] == 65504.0 and np.isposinf(got[1]) and np.isneginf(got[2])


# ---------------------------------------------------------------------------------------------
# what JAX sums in, read from the programs it traces


def _storage_sums(jax, jaxpr):
    """The reduce_sum equations of a traced program (sub-programs included) that sum
    bfloat16 values into bfloat16."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "reduce_sum" and str(eqn.outvars[0].aval.dtype) == "bfloat16":
            found.append(eqn)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", None)
            if inner is not None:
                found += _storage_sums(jax, getattr(inner, "jaxpr", inner))
    return found


def test_jax_declares_float32_sums_exactly_where_its_programs_have_them():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from reports.conformance.adapters import jax as adapter

    engine = engines.get_engine("jax")
    ops = adapter.jax_ops(jax, jnp)
    rng = np.random.default_rng(0)
    for name in adapter.FLOAT32_SUMS + adapter.STORAGE_SUMS:
        op = spec.OPS[name]
        shapes = ([(3, 1), (1, 4)] if op.category == "binary"      # a broadcast call
                  else op.examples[0].shapes)
        params = {} if op.category == "binary" else dict(op.examples[0].params)
        inputs = spec.sample_inputs(name, rng, shapes=shapes, params=params)
        fixed = adapter.CLASS_INDEX.get(name)
        arrays = [jnp.asarray(np.asarray(x).astype(np.int64 if i == fixed else BF16))
                  for i, x in enumerate(inputs)]

        def value_and_vjp(*free, name=name, fixed=fixed, arrays=arrays, params=params):
            def call(*args):
                args = list(args)
                if fixed is not None:
                    args.insert(fixed, arrays[fixed])
                return ops[name](*args, **params)
            y, pull = jax.vjp(call, *free)
            return y, pull(jnp.ones_like(y))

        free = [a for i, a in enumerate(arrays) if i != fixed]
        sums = _storage_sums(jax, jax.make_jaxpr(value_and_vjp)(*free).jaxpr)
        declared = properties.declared_working(engine, "accumulates", name, BF16)
        assert bool(sums) == (name in adapter.STORAGE_SUMS), (name, sums)
        assert declared == ("float32" if name in adapter.FLOAT32_SUMS else None), name
    # the dot: a bfloat16 accumulator stops at 1 (1 + 2**-9 rounds to 1), float32's reaches 9
    a = np.concatenate([[1.0], np.full(4095, 2.0 ** -9)]).astype(BF16)
    dot = engine.forward("matmul", [a.reshape(1, -1), np.ones((4096, 1), BF16)])
    assert float(dot[0, 0]) == 9.0
