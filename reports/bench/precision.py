"""`verigrad bench train --dtypes`: one model trained in each precision, measured.

The digits MLP (``verigrad train``'s), or with ``--model lstm|attention|transformer`` that
benchmark model on its generated data (a fifth more held out for the test). Per format: seconds
per epoch (median over every epoch but each run's first; the formats' runs interleaved), the
test loss and accuracy after training (one run per seed), the bytes the format needs for the
parameters and the activations between the model's layers (float32 masters included for a
16-bit run), and the peak of NumPy's allocations over one steady-state epoch (``tracemalloc``:
what fastlib holds; its compiled epochs keep 16-bit values in float32 storage). Every format
runs on the compiled program, so the ratios are the cost of the format alone; ``--device cuda``
trains each on the device instead.
"""
from __future__ import annotations

import json
import os
import statistics
import time
import tracemalloc
import types
from typing import NamedTuple

import numpy as np

__all__ = ["run", "DEFAULTS", "SEQUENCE_EPOCHS", "case_names"]

#: ``verigrad train``'s defaults on the digits (64-128-10 ReLU MLP, Adam, batches of 32)
DEFAULTS = {"hidden": 128, "epochs": 20, "batch_size": 32, "lr": 1e-3, "optimizer": "Adam",
            "repeats": 3}
#: epochs per run for a sequence model (its epoch is a hundred digits epochs)
SEQUENCE_EPOCHS = 4
_WIDTH = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


class Subject(NamedTuple):
    """What the runs train: ``build(dtype, seed)`` makes the model, trained on ``train`` and
    tested on ``test`` (each ``(x, y)``) with ``loss`` for ``epochs`` epochs."""
    description: str
    data: str
    build: object
    loss: str
    train: tuple
    test: tuple
    epochs: int


def case_names(dtypes):
    """``[(label, dtype, fused)]``: each format, on the compiled program."""
    return [(d, d, True) for d in dtypes]


def subject(model_name=None, samples=None):
    """The digits MLP (``model_name`` None or ``"mlp"``), else the benchmark model of that name
    with ``samples`` training sequences (its default when None)."""
    if model_name in (None, "mlp"):
        from fastlib import datasets

        split = datasets.load_digits(None)
        return Subject(f"digits MLP 64-{DEFAULTS['hidden']}-10 relu", "digits", _digits_mlp,
                       "cross_entropy", (split.x_train, split.y_train),
                       (split.x_test, split.y_test), DEFAULTS["epochs"])
    from reports.bench.models import load

    module = load(model_name)
    n = samples or module.SAMPLES
    x, y, source = module.data(types.SimpleNamespace(samples=n + max(n // 5, 1), data_dir=None))

    def build(dtype, seed):
        return module.build(seed, dtype=np.float64 if dtype == "float64" else np.float32)

    return Subject(module.DESCRIPTION, source, build, module.LOSS, (x[:n], y[:n]),
                   (x[n:], y[n:]), SEQUENCE_EPOCHS)


def _digits_mlp(dtype, seed):
    import fastlib

    model_dtype = np.float64 if dtype == "float64" else np.float32
    return fastlib.layers.Sequential([fastlib.layers.Dense(64, DEFAULTS["hidden"], "relu"),
                                      fastlib.layers.Dense(DEFAULTS["hidden"], 10)],
                                     dtype=model_dtype, seed=seed)


def _train(model, subj, dtype, fused, epochs, seed, device="cpu", callbacks=None):
    import fastlib

    precision = dtype if dtype in ("bfloat16", "float16") else None
    x, y = subj.train
    return fastlib.train(model, x, y, epochs, DEFAULTS["batch_size"], DEFAULTS["lr"],
                         subj.loss, optimizer=DEFAULTS["optimizer"], seed=seed,
                         verbose=False, dtype=precision, fused=fused, device=device,
                         callbacks=callbacks)


def _outputs(model, shape):
    """The shape of each of ``model``'s layers' outputs (a Sequential's own layers; else the
    model's output) for an input of ``shape``."""
    layers = getattr(model, "layers", None) or [model]
    shapes = []
    for layer in layers:
        shape = layer.infer_shape(shape)
        shapes.append(shape)
    return shapes


def _evaluate(model, subj, dtype):
    """(test loss, test accuracy or None) of the trained ``model``, in the run's format."""
    from fastlib import losses
    from fastlib.training import algorithms, mixed_precision

    x, y = subj.test
    # the targets as the loss reads them unchecked (train normalises its own once)
    out = _outputs(model, x.shape)[-1]
    y = losses.validate_targets(subj.loss, np.zeros(out, np.float32), y)
    if dtype in ("bfloat16", "float16"):
        return mixed_precision.evaluate(model, x, y, subj.loss, dtype)
    if x.dtype.kind == "f":
        x = x.astype(model.dtype)
    return algorithms.evaluate_model(model, x, y, subj.loss)


def _stored_bytes(model, dtype, batch, sample_shape):
    """(parameter bytes, activation bytes per batch) the format needs: the parameters in the
    format (plus float32 masters for a 16-bit run), every layer's output at ``batch`` rows."""
    params = sum(v.size for v in model.parameters().values())
    acts = sum(int(np.prod(s)) for s in _outputs(model, (batch,) + tuple(sample_shape)))
    width = _WIDTH[dtype]
    masters = 4 * params if dtype in ("bfloat16", "float16") else 0
    return width * params + masters, width * acts


def _traced_peak(subj, dtype, fused):
    """Peak bytes of NumPy's allocations (``tracemalloc``) over one epoch of a run in its steady
    state: from the end of its first epoch to the end of its second (what the run holds, its
    optimizer state and masters included, plus the epoch's own allocations); the run's set-up
    (its divergence probe on a few hundred rows) is not an epoch's cost."""
    _train(subj.build(dtype, 0), subj, dtype, fused, 1, 0)   # compiled and warmed, untraced
    peaks = []

    def mark(epoch, logs):
        if not peaks:
            tracemalloc.reset_peak()
        peaks.append(tracemalloc.get_traced_memory()[1])

    tracemalloc.start()
    try:
        _train(subj.build(dtype, 1), subj, dtype, fused, 2, 1, callbacks=[mark])
        return peaks[-1]
    finally:
        tracemalloc.stop()


def _measure(cases, subj, repeats, progress, device="cpu"):
    """One row per case. The runs are interleaved, seed by seed, every case in turn, so that a
    change in the machine's speed during the benchmark falls on every case alike. On
    ``device="cuda"`` no traced peak (the device's memory is not NumPy's): None."""
    runs = {label: {"seconds": [], "loss": [], "accuracy": [], "path": None}
            for label, _, _ in cases}
    for seed in range(repeats):
        for label, dtype, fused in cases:
            progress(f"{label} seed {seed}")
            model = subj.build(dtype, seed)
            result = _train(model, subj, dtype, fused, subj.epochs, seed, device)
            run = runs[label]
            run["seconds"] += list(result.epoch_times[1:])   # each run's first epoch compiles
            loss, accuracy = _evaluate(model, subj, dtype)
            run["loss"].append(float(loss))
            run["accuracy"].append(accuracy)
            run["path"] = result.path
    rows = []
    for label, dtype, fused in cases:
        run = runs[label]
        params, acts = _stored_bytes(subj.build(dtype, 0), dtype, DEFAULTS["batch_size"],
                                     subj.train[0].shape[1:])
        scored = None not in run["accuracy"]
        rows.append({"case": label, "dtype": dtype, "path": run["path"],
                     "s_per_epoch": statistics.median(run["seconds"]),
                     "test_loss": statistics.fmean(run["loss"]), "test_losses": run["loss"],
                     "test_accuracy": statistics.fmean(run["accuracy"]) if scored else None,
                     "test_accuracies": run["accuracy"] if scored else None,
                     "parameter_bytes": params, "activation_bytes": acts,
                     "traced_peak_bytes": (_traced_peak(subj, dtype, fused)
                                           if device == "cpu" else None)})
    return rows


def _loadavg():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover - platforms without it
        return None


def run(args, dtypes) -> int:
    """Measure every format of ``dtypes`` on the digits MLP (or ``--model``'s benchmark model);
    print the table (and ``--json``)."""
    from reports.bench import environment
    from reports.commands.arguments import progress_enabled
    from reports.commands.progress import ProgressLine

    repeats = args.repeats or DEFAULTS["repeats"]
    subj = subject(getattr(args, "model", None), getattr(args, "samples", None))
    line = ProgressLine(enabled=progress_enabled(args))
    load_start = _loadavg()
    start = time.perf_counter()
    rows = _measure(case_names(dtypes), subj, repeats, line.update, args.device)
    line.finish("")
    base = next((r for r in rows if r["case"] == "float32"), None)
    for r in rows:
        if base is not None:
            r["time_over_float32"] = r["s_per_epoch"] / base["s_per_epoch"]
            r["test_loss_over_float32"] = r["test_loss"] / base["test_loss"]
            r["accuracy_minus_float32"] = (None if r["test_accuracy"] is None
                                           else r["test_accuracy"] - base["test_accuracy"])
            r["bytes_over_float32"] = ((r["parameter_bytes"] + r["activation_bytes"])
                                       / (base["parameter_bytes"] + base["activation_bytes"]))
    report = {"model": subj.description, "data": subj.data,
              "settings": dict(DEFAULTS, epochs=subj.epochs, repeats=repeats,
                               samples=len(subj.train[0]), test_samples=len(subj.test[0])),
              "dtypes": list(dtypes),
              "threads": args.threads[0] if args.threads else None, "device": args.device,
              "environment": environment.environment(),
              "load_average": {"start": load_start, "end": _loadavg()},
              "seconds": time.perf_counter() - start, "results": rows}
    _print(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return 0


def _print(report):
    print(f"{report['model']}, {report['settings']['epochs']} epochs of batches of "
          f"{report['settings']['batch_size']}, {report['settings']['repeats']} seeds; load "
          f"average {report['load_average']['start']} -> {report['load_average']['end']}")
    print(f"{'case':<18} {'path':<8} {'s/epoch':>8} {'x f32':>6} {'test loss':>9} "
          f"{'test acc':>8} {'-f32 pts':>8} {'param+act KiB':>13} {'traced peak KiB':>15}")
    for r in report["results"]:
        ratio = r.get("time_over_float32")
        delta = r.get("accuracy_minus_float32")
        acc = r["test_accuracy"]
        print(f"{r['case']:<18} {r['path']:<8} {r['s_per_epoch']:8.4f} "
              f"{'-' if ratio is None else format(ratio, '6.2f'):>6} "
              f"{r['test_loss']:9.4f} "
              f"{'-' if acc is None else format(100 * acc, '8.2f'):>8} "
              f"{'-' if delta is None else format(100 * delta, '+8.2f'):>8} "
              f"{(r['parameter_bytes'] + r['activation_bytes']) / 1024:13.1f} "
              f"{_kib(r['traced_peak_bytes']):>15}")


def _kib(n):
    return "-" if n is None else f"{n / 1024:.1f}"
