"""Mixed-precision training: the 16-bit copies, the loss scale's dynamics, resumption, errors.

Expected values come from ml_dtypes (rounding), torch.amp.GradScaler (the scale's dynamics) and
a float64 NumPy backward of the model (which steps overflow float16); whole runs are held to
exact trajectories by the conformance suite's 16-bit train rows. The compiled MLP epoch is held
bit for bit to the per-batch mixed path (whose rounding points the first test watches), on
both kinds of its layers and through the loss scale's skips.
"""
import warnings

import ml_dtypes
import numpy as np
import pytest

import fastlib
from fastlib.training.loss_scale import LossScale

F16_OVERFLOW = 65520.0     # float16's max plus half an ulp: from here a value rounds to inf


def _mlp(seed=0, dtype=np.float32):
    return fastlib.layers.Sequential([fastlib.layers.Dense(4, 5, "tanh", dtype=dtype),
                                      fastlib.layers.Dense(5, 3, dtype=dtype)],
                                     dtype=dtype, seed=seed)


def _data(n=12, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 3, n)


def _run(model, x, y, epochs=2, **kw):
    kw.setdefault("optimizer", "SGD")
    kw.setdefault("verbose", False)
    return fastlib.train(model, x, y, epochs, kw.pop("batch_size", 4), kw.pop("lr", 0.1),
                         "cross_entropy", **kw)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_weights_and_activations_are_the_masters_rounded_to_nearest_even(fmt):
    model, (x, y) = _mlp(), _data()
    seen = []
    layers = model.layers

    def spy(layer, original):
        def forward(inp):
            seen.append((layer, np.array(inp), {k: v.copy() for k, v in
                                                layer.parameters().items()}))
            return original(inp)
        return forward

    before = {k: v.copy() for k, v in model.parameters().items()}
    for layer in layers:
        layer.forward = spy(layer, layer.forward)
    _run(model, x, y, epochs=1, batch_size=12, dtype=fmt, fused=False)   # layer by layer
    assert len(seen) >= 2
    dt = np.dtype(getattr(ml_dtypes, fmt) if fmt == "bfloat16" else np.float16)
    for i, (layer, inp, params) in enumerate(seen[:2]):
        for name, value in params.items():
            expect = before[f"{i}.{name}"].astype(dt).astype(np.float32)
            assert np.array_equal(value.view(np.uint32), expect.view(np.uint32)), name
        # the input of each layer (the data, then the layer below's output) is in the format
        assert np.array_equal(inp, inp.astype(dt).astype(np.float32))
    # the model keeps the float32 masters, updated by a float32 step (not 16-bit values)
    after = model.parameters()["0.weight"]
    assert not np.array_equal(after, after.astype(dt).astype(np.float32))


def _torch_scales(flags, **kw):
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", **kw)
    out = []
    for inf in flags:
        scaler.scale(torch.ones(()))             # the step's scaled loss (sets up the scale)
        p.grad = torch.tensor([float("inf") if inf else 1.0])
        scaler.step(opt)
        scaler.update()
        out.append(scaler.get_scale())
    return out


def test_loss_scale_dynamics_are_torch_gradscalers():
    rng = np.random.default_rng(3)
    flags = list(rng.random(60) < 0.15) + [False] * 9
    kw = dict(init_scale=2.0 ** 10, growth_factor=3.0, backoff_factor=0.25, growth_interval=4)
    scale, state = LossScale(**kw), {}
    scale.start(state)
    ours = []
    for inf in flags:
        scale.update(state, bool(inf))
        ours.append(state["loss_scale"])
    assert ours == _torch_scales(flags, **kw)
    assert state["loss_scale_skips"] == sum(flags)


def _scaled_peak(model, x, y):
    """The largest |value| of the unscaled backward (loss cotangent, the hidden cotangent,
    the parameter gradients) of the two-layer MLP, in float64 NumPy."""
    p = {k: v.astype(np.float64) for k, v in model.parameters().items()}
    x = x.astype(np.float64)
    h = np.tanh(x @ p["0.weight"] + p["0.bias"])
    z = h @ p["1.weight"] + p["1.bias"]
    s = np.exp(z - z.max(1, keepdims=True))
    s /= s.sum(1, keepdims=True)
    dz = (s - np.eye(3)[y]) / len(x)
    dh = dz @ p["1.weight"].T
    da = dh * (1 - h * h)
    parts = [dz, dh, da, h.T @ dz, dz.sum(0), x.T @ da, da.sum(0)]
    return max(float(np.max(np.abs(a))) for a in parts)


@pytest.mark.parametrize("fused", [True, False])
def test_float16_overflow_skips_steps_and_halves_the_scale(fused):
    model, (x, y) = _mlp(), _data()
    start = {k: v.copy() for k, v in model.parameters().items()}
    peak = _scaled_peak(model, x, y)
    init = 2.0 ** 40
    # the steps whose scaled backward overflows float16: scale * peak beyond the threshold
    skips = 0
    while init * 0.5 ** skips * peak >= F16_OVERFLOW:
        skips += 1
    ratio = init * 0.5 ** skips * peak / F16_OVERFLOW
    assert 0.55 < ratio < 0.95, "the data must keep the last clean scale clear of the edge"
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the scale's skips warn of nothing
        r = _run(model, x, y, epochs=skips, batch_size=12, dtype="float16",
                 loss_scale={"init_scale": init}, fused=fused)
    assert r.path == ("program" if fused else "generic")
    assert r.loss_scale_skips == skips and r.skipped_steps == skips
    assert r.loss_scale == init * 0.5 ** skips
    for k, v in model.parameters().items():     # every step skipped: the masters untouched
        assert np.array_equal(v, start[k]), k
    r = _run(model, x, y, epochs=1, batch_size=12, dtype="float16",
             loss_scale={"init_scale": init * 0.5 ** skips}, fused=fused)
    assert r.loss_scale_skips == 0
    assert not np.array_equal(model.parameters()["1.weight"], start["1.weight"])


@pytest.mark.parametrize("fused", [True, False])
def test_loss_scale_grows_after_its_interval(fused):
    model, (x, y) = _mlp(), _data()
    r = _run(model, x, y, epochs=3, batch_size=4, dtype="float16",
             loss_scale=LossScale(init_scale=64.0, growth_interval=4), fused=fused)
    assert r.loss_scale_skips == 0
    assert r.loss_scale == 64.0 * 2 ** (9 // 4)        # 9 clean steps: grown twice
    r = _run(_mlp(), x, y, epochs=3, dtype="bfloat16", fused=fused)
    assert r.loss_scale is None and r.precision == "bfloat16"
    assert (r.path, r.schedule) == (("program", "mlp") if fused else ("generic", None))


def _deep_mlp(seed=0):
    """Three Dense layers: the column epoch's two kinds of layer and a lone last column one."""
    return fastlib.layers.Sequential([fastlib.layers.Dense(4, 6, "relu"),
                                      fastlib.layers.Dense(6, 5, "sigmoid"),
                                      fastlib.layers.Dense(5, 3)], dtype=np.float32, seed=seed)


@pytest.mark.parametrize("fmt, loss_scale", [("bfloat16", None), ("float16", None),
                                             ("float16", {"init_scale": 2.0 ** 30}),
                                             ("bfloat16", 8.0)])
@pytest.mark.parametrize("make", [_mlp, _deep_mlp], ids=["two layers", "three layers"])
@pytest.mark.parametrize("schedule", ["mlp", "general"])
def test_the_compiled_mlp_epoch_is_the_per_batch_mixed_path_bit_for_bit(fmt, loss_scale, make,
                                                                        schedule, monkeypatch):
    # the per-batch path rounds layer by layer (the first test watches it); the compiled
    # epoch must round at the same points, unscale, skip and grow the scale the same way:
    # the MLP schedule's column epoch, and the interpreter (the general schedule alone), whose
    # one piece computes the very products of the per-batch path.
    # 2**30 makes the first steps overflow float16 (skipped, the scale halved each time)
    if schedule == "general":
        monkeypatch.setattr(fastlib.config, "SCHEDULES", ("general",))
    x, y = _data(14, seed=4)
    runs = []
    for fused in (True, False):
        model = make()
        r = _run(model, x, y, epochs=3, batch_size=4, dtype=fmt, loss_scale=loss_scale,
                 fused=fused, gradient_clip=0.5, clip_mode="norm", lr=0.3)
        runs.append((model.parameters(), r))
    (pa, ra), (pb, rb) = runs
    assert (ra.path, ra.schedule, rb.path) == ("program", schedule, "generic")
    assert ra.piece_plan["pieces"] == 1
    # the reported loss is summed in float64 by the kernel, in float32 per batch: float32's
    # roundoff over a batch of 4 (the gradients, which carry the run, are compared exactly)
    assert ra.loss_history == pytest.approx(rb.loss_history, rel=4 * 2.0 ** -24)
    assert (ra.skipped_steps, ra.loss_scale, ra.loss_scale_skips) == \
        (rb.skipped_steps, rb.loss_scale, rb.loss_scale_skips)
    if loss_scale == {"init_scale": 2.0 ** 30}:
        assert ra.loss_scale_skips > 0
    for k in pa:
        assert np.array_equal(pa[k].view(np.uint32), pb[k].view(np.uint32)), k


@pytest.mark.parametrize("fused", [True, False])
def test_resumed_run_continues_the_scale_bit_for_bit(tmp_path, fused):
    x, y = _data(16)
    kw = dict(batch_size=4, dtype="float16", optimizer="Adam", lr=1e-2,
              loss_scale={"init_scale": 2.0 ** 20, "growth_interval": 3}, fused=fused)
    whole = _mlp()
    full = _run(whole, x, y, epochs=4, **kw)
    ck = str(tmp_path / "run.ckpt")
    first = _mlp()
    _run(first, x, y, epochs=2, checkpoint=ck, **kw)
    resumed_model = _mlp(seed=5)
    resumed = _run(resumed_model, x, y, epochs=4, resume=ck, **kw)
    assert resumed.loss_scale == full.loss_scale
    assert resumed.loss_history == full.loss_history
    for k, v in whole.parameters().items():
        assert np.array_equal(v, resumed_model.parameters()[k]), k
    with pytest.raises(ValueError, match="settings differ"):
        _run(_mlp(), x, y, epochs=4, resume=ck, resume_mismatch="error",
             **{**kw, "dtype": "bfloat16", "loss_scale": None})


@pytest.mark.parametrize("kw, error, message", [
    ({"dtype": "bfloat61"}, ValueError, "did you mean 'bfloat16'"),
    ({"dtype": "half"}, ValueError, "unknown training dtype"),
    ({"dtype": 3}, TypeError, "dtype must be a name"),
    ({"dtype": "float64"}, ValueError, "model's parameters are float32"),
    ({"loss_scale": 128.0}, ValueError, "16-bit training only"),
    ({"dtype": "float16", "loss_scale": "static"}, ValueError, "unknown word"),
    ({"dtype": "float16", "loss_scale": {"init": 2.0}}, ValueError, "unknown field"),
    ({"dtype": "float16", "loss_scale": {"growth_factor": 0.5}}, ValueError, ">= 1"),
    ({"dtype": "float16", "loss_scale": {"backoff_factor": 2}}, ValueError, "<= 1"),
    ({"dtype": "float16", "loss_scale": {"growth_interval": 0}}, ValueError, ">= 1"),
    ({"dtype": "float16", "loss_scale": -1.0}, ValueError, "finite number > 0"),
    ({"dtype": "float16", "loss_scale": [2.0]}, TypeError, "loss_scale must be"),
    ({"dtype": "float16", "algorithm": "targetprop"}, ValueError, "algorithm='bp' only"),
])
def test_bad_precision_arguments_are_refused_clearly(kw, error, message):
    x, y = _data()
    with pytest.raises(error, match=message):
        _run(_mlp(), x, y, **kw)


def test_16bit_over_a_float64_model_is_refused():
    x, y = _data()
    with pytest.raises(ValueError, match="build it with dtype=np.float32"):
        _run(_mlp(dtype=np.float64), x, y, dtype="bfloat16")


def test_dtype_naming_the_models_own_is_the_plain_run():
    x, y = _data()
    a, b = _mlp(), _mlp()
    ra = _run(a, x, y, fused=False)
    rb = _run(b, x, y, dtype=np.float32, fused=False)
    assert ra.loss_history == rb.loss_history and rb.precision is None


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_rounding_in_float32_storage_is_ml_dtypes_rounding(fmt):
    from fastlib.kernels.half import CODES, round_float32, round_in_place

    rng = np.random.default_rng(11)
    random = rng.integers(0, 2 ** 32, size=200_000, dtype=np.uint64)
    # every value of the format, and near each: the midpoint to the next one (a tie) and the
    # float32 neighbours of both, for both signs (subnormals, the overflow edge, NaNs)
    dt = np.dtype(getattr(ml_dtypes, fmt) if fmt == "bfloat16" else np.float16)
    values = np.arange(2 ** 16, dtype=np.uint16).view(dt).astype(np.float32)
    step = 1 << (16 if fmt == "bfloat16" else 13)
    near = values.view(np.uint32).astype(np.uint64)
    near = np.concatenate([near + d for d in (0, 1, step // 2 - 1, step // 2, step // 2 + 1)])
    bits = np.concatenate([random, near % 2 ** 32]).astype(np.uint32)
    x = bits.view(np.float32)        # every kind of float32: NaNs, infs, subnormals, ties
    with np.errstate(all="ignore"):
        expect = x.astype(dt).astype(np.float32)
    got = round_float32(x, fmt)
    same = (got.view(np.uint32) == expect.view(np.uint32)) | (np.isnan(got) & np.isnan(expect))
    assert same.all()
    inplace = x.copy()
    assert round_float32(inplace, fmt, out=inplace) is inplace
    assert np.array_equal(inplace.view(np.uint32), got.view(np.uint32))
    # the compiled kernels' in-place rounding (of a slice, as they call it) is the same
    kernel = x.copy()
    round_in_place(CODES[fmt], kernel[3:])
    assert np.array_equal(kernel[3:].view(np.uint32), got[3:].view(np.uint32))
    assert np.array_equal(kernel[:3].view(np.uint32), x[:3].view(np.uint32))


def test_verigrad_train_takes_a_16bit_dtype(capsys):
    from reports.cli import main

    assert main(["train", "--dtype", "bfloat16", "--algorithm", "cd"]) == 2
    assert "drop --algorithm cd" in capsys.readouterr().err
    assert main(["train", "--dtype", "float16", "--epochs", "1", "--hidden", "8",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "float16 mixed" in out and "test accuracy" in out
    # float16's default scale, GradScaler's 2**16, does not grow within one epoch of digits
    assert "precision float16 over float32 master weights, loss scale 65536 at the end (" in out
    assert main(["train", "--dtype", "bfloat16", "--epochs", "1", "--hidden", "8",
                 "--no-progress"]) == 0
    assert "precision bfloat16 over float32 master weights, no loss scale" in \
        capsys.readouterr().out
