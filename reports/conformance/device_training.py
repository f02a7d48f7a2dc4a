"""Conformance ``train`` rows of ``fastlib-cuda``: training on the device against the CPU and the
referee.

Each case (a random small model of a layer type, or a plain MLP, from the same strategies as
fastlib's own train rows) is trained for one epoch of ``steps`` different batches three ways,
from the same initial weights:

- ``fastlib.train(..., device="cuda")``: the device step (``fastlib.cuda.training``);
- ``fastlib.train(...)`` on the CPU (for plain MLPs, its whole-epoch fused path);
- reflib's ``train_step`` in float64 on the same (dtype-rounded) weights and inputs.

The long story: docs/reports-training-checks.md, section ``reports/conformance/device_training.py``.
"""
from __future__ import annotations

import math

import numpy as np

from reports.conformance.properties import Result, _call

# float64: normwise, relative to the largest of the reference's and the initial weights' norms
# (the CPU rows' bound for a step of float64 arithmetic in engines that share no code)
TRAIN_TOL = 1e-9


def _another_batch(case, batch, k):
    """A batch unlike ``batch``: rows reversed and values moved (tokens shifted by k)."""
    x, y = batch
    if np.asarray(x).dtype.kind in "iu":
        num = case.config["layers"][0]["num"]
        x2 = (x[::-1] + k) % num
    else:
        x2 = 0.25 - 0.5 * x[::-1]
    return x2, y[::-1].copy()

__all__ = ["check_device_train", "device_train_rows", "float32_bound"]

ENGINE = "fastlib-cuda"


def _leaves(config):
    """Number of leaf layers of a config (containers count their children)."""
    if config["type"] in ("Sequential", "Parallel"):
        return sum(_leaves(c) for c in config["layers"])
    return 1


def float32_bound(config, steps):
    """The float32 floor ``4 (L + 1) k`` in eps (see the module docstring)."""
    return 4.0 * (_leaves(config) + 1) * steps


def _error(got, ref, floor, dtype):
    """Worst normwise relative error over the parameters, in eps of ``dtype``, and its name."""
    eps = float(np.finfo(dtype).eps)
    worst, where = 0.0, ""
    for key, r in ref.items():
        g = np.asarray(got[key], float)
        r = np.asarray(r, float)
        if g.shape != r.shape or not np.all(np.isfinite(g)):
            return math.inf, key
        err = float(np.linalg.norm(g - r)) / (eps * max(float(np.linalg.norm(r)), floor, 1e-300))
        if err > worst:
            worst, where = err, key
    return worst, where


def check_device_train(case, optimizer, lr, dtype="float64", steps=2, mlp=False):
    """Train ``case`` on the device, on the CPU and with reflib; measure the device's weights.

    Parameters
    ----------
    case : strategies.ModelCase
    optimizer : str
    lr : float
    dtype : {"float32", "float64"}
    steps : int
        Batches in the epoch (each a different batch, so a stale input would show).
    mlp : bool
        The case is a plain MLP: the CPU run must take its fused whole-epoch path.

    Returns
    -------
    properties.Result
    """
    import fastlib
    import reflib.models
    from reflib.train import train_step

    from reports.conformance.oracle import Measure

    dt = np.dtype(dtype)
    result = Result()
    base = fastlib.layers.from_config(case.config, dtype=dt, seed=case.seed)
    start = {k: v.copy() for k, v in base.parameters().items()}
    batches = [(case.x, case.y)]
    for k in range(1, steps):
        batches.append(_another_batch(case, batches[-1], k))
    n = len(case.x)
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    if x.dtype.kind == "f":
        x = x.astype(dt)  # every engine sees the same rounded inputs
    runs = {}
    for where in ("cpu", "cuda"):
        model = fastlib.layers.from_config(case.config, dtype=dt, seed=case.seed)
        model.load_parameters(start)
        run = _call(result, f"fastlib.train(device={where!r})", lambda model=model, where=where:
                    fastlib.train(model, x, y, 1, n, lr, case.loss, optimizer=optimizer,
                                  shuffle=False, verbose=False, device=where))
        if run is None:
            return result
        runs[where] = (model.parameters(), run)
    if mlp and not runs["cpu"][1].fused:
        result.fail("fastlib.train on the CPU did not take the fused path for a plain MLP")
    ref = reflib.models.from_config(case.config)
    ref.load_parameters({k: v.astype(np.float64) for k, v in start.items()})
    state = None
    for i in range(steps):
        xb, yb = x[i * n:(i + 1) * n], y[i * n:(i + 1) * n]
        xb = xb.astype(np.float64) if xb.dtype.kind == "f" else xb
        _, _, new, state = train_step(ref, xb, yb, case.loss, optimizer, state, lr=lr)
        ref.load_parameters(new)
    floor = max(float(np.linalg.norm(v.astype(np.float64))) for v in start.values())
    ref_params = ref.parameters()
    device_params, cpu_params = runs["cuda"][0], runs["cpu"][0]
    dev_ref, key1 = _error(device_params, ref_params, floor, dt)
    dev_cpu, key2 = _error(device_params, cpu_params, floor, dt)
    if dt == np.float64:
        b_ref = b_cpu = TRAIN_TOL / float(np.finfo(dt).eps)
    else:
        cpu_ref, _ = _error(cpu_params, ref_params, floor, dt)
        lo = float32_bound(case.config, steps)
        b_ref, b_cpu = max(lo, 2.0 * cpu_ref), max(lo, 3.0 * cpu_ref)
    result.measures.append(Measure(f"device vs reflib after {steps} steps: {key1}", dev_ref,
                                   b_ref, dev_ref <= b_ref))
    result.measures.append(Measure(f"device vs fastlib CPU after {steps} steps: {key2}", dev_cpu,
                                   b_cpu, dev_cpu <= b_cpu))
    dev_run, cpu_run = runs["cuda"][1], runs["cpu"][1]
    if len(dev_run.loss_history) != 1 or not math.isfinite(dev_run.loss_history[0]):
        result.fail(f"device run: loss history {dev_run.loss_history}")
    else:
        loss_err = abs(dev_run.loss_history[0] - cpu_run.loss_history[0]) / (
            float(np.finfo(dt).eps) * max(abs(cpu_run.loss_history[0]), 1e-300))
        lo = b_cpu
        result.measures.append(Measure("epoch loss, device vs CPU", loss_err, lo, loss_err <= lo))
    return result


def _reproduce(case_and_more, dtype, mlp):
    from reports.conformance import repro

    text = repro.train(case_and_more)
    return text.replace("from reports.conformance import training_rows\n",
                        "from reports.conformance import device_training\n").replace(
        "training_rows.check_train_step(case, ", "device_training.check_device_train(case, ").replace(
        "))\n", f", dtype={dtype!r}, mlp={mlp!r}))\n")


def _explicit_examples(kind):
    """Cases run before the drawn ones: a causal attention over 3 steps, where a mask that is
    off by one position changes the result (short random draws may not reach it)."""
    if kind != "MultiHeadAttention":
        return ()
    from reports.conformance.strategies import ModelCase

    rng = np.random.default_rng(0)
    config = {"type": "Sequential", "layers": [
        {"type": "MultiHeadAttention", "d_model": 2, "heads": 1, "causal": True},
        {"type": "Dense", "in_features": 2, "out_features": 2, "activation": "linear"}]}
    case = ModelCase(config, rng.uniform(-2, 2, (2, 3, 2)), rng.uniform(-1, 1, (2, 3, 2)),
                     "mse", 0, frozenset({"MultiHeadAttention", "Dense", "Sequential"}))
    return ((case, "SGD", 0.1),)


def device_train_rows(kinds):
    """The ``train`` rows of ``fastlib-cuda``: one per layer kind and dtype, and the fused MLP."""
    from hypothesis import strategies as st

    from reports.conformance.rows import Row, run_property
    from reports.conformance.strategies import OPTIMIZER_NAMES, mlp_cases, model_cases

    rows = []
    for dtype in ("float32", "float64"):
        for kind in kinds:
            def run(profile, seed, kind=kind, dtype=dtype):
                strategy = st.tuples(model_cases(kind), st.sampled_from(OPTIMIZER_NAMES),
                                     st.sampled_from([0.01, 0.1]))
                return run_property(strategy, lambda c: check_device_train(*c, dtype=dtype),
                                    profile.train, seed, lambda c: _reproduce(c, dtype, False),
                                    examples=_explicit_examples(kind))
            rows.append(Row("train", kind, ENGINE, dtype, run))

        def run_mlp(profile, seed, dtype=dtype):
            strategy = st.tuples(mlp_cases(), st.sampled_from(OPTIMIZER_NAMES),
                                 st.sampled_from([0.01, 0.1]))
            return run_property(strategy,
                                lambda c: check_device_train(*c, dtype=dtype, mlp=True),
                                profile.train, seed, lambda c: _reproduce(c, dtype, True))
        rows.append(Row("train", "fused MLP", ENGINE, dtype, run_mlp))
    return rows + mixed_rows()


def mixed_rows():
    """The device's mixed-precision ``train`` rows: drawn Dense MLPs in bfloat16 and float16
    and the loss-scale runs that skip, back off and grow, held against the exact replayed run
    exactly as fastlib's own (``training_rows.check_epochs``, path ``"cuda"``), and each step's
    rounding points against the float64 replay (``rounding_points``)."""
    from reports.conformance import training_cases as tc
    from reports.conformance.rows import Row, run_cases, run_property
    from reports.conformance.training_rows import check_epochs, reproduction

    rows = []
    for fmt in ("bfloat16", "float16"):
        def run(profile, seed, fmt=fmt):
            return run_property(tc.mixed_cases(fmt, paths=("cuda",)), check_epochs,
                                profile.train, seed, reproduction)
        rows.append(Row("train", "mixed MLP", ENGINE, fmt, run))
    rows.append(Row("train", "loss scale", ENGINE, "float16", lambda profile, seed: run_cases(
        tc.loss_scale_cases(paths=("cuda",)), check_epochs, lambda i, case: reproduction(case))))
    from reports.conformance.rounding_points import rounding_rows
    return rows + rounding_rows(ENGINE, ("cuda",), sequences=False)
