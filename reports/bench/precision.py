"""`verigrad bench train --dtypes`: the digits MLP trained in each precision, measured.

Per format: seconds per epoch (the median over every epoch but each run's first; the formats'
runs interleaved), the test accuracy after training (one run per seed, ``--repeats`` seeds),
the bytes the format needs for the parameters and the activations between layers (float32
masters included for a 16-bit run), and the peak of NumPy's allocations over one steady-state
epoch as ``tracemalloc`` traces it (what fastlib holds: its compiled epoch keeps 16-bit values
in float32 storage). Every format runs on the compiled program (the MLP schedule), so the ratios
are the cost of the format alone; ``--device cuda`` trains each on the device instead.
"""
from __future__ import annotations

import json
import os
import statistics
import time
import tracemalloc

import numpy as np

__all__ = ["run", "DEFAULTS", "case_names"]

#: ``verigrad train``'s defaults on the digits (64-128-10 ReLU MLP, Adam, batches of 32)
DEFAULTS = {"hidden": 128, "epochs": 20, "batch_size": 32, "lr": 1e-3, "optimizer": "Adam",
            "repeats": 3}
_WIDTH = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def case_names(dtypes):
    """``[(label, dtype, fused)]``: each format, on the compiled program."""
    return [(d, d, True) for d in dtypes]


def _model(dtype, seed):
    import fastlib

    model_dtype = np.float64 if dtype == "float64" else np.float32
    return fastlib.layers.Sequential([fastlib.layers.Dense(64, DEFAULTS["hidden"], "relu"),
                                      fastlib.layers.Dense(DEFAULTS["hidden"], 10)],
                                     dtype=model_dtype, seed=seed)


def _train(model, x, y, dtype, fused, epochs, seed, device="cpu", callbacks=None):
    import fastlib

    precision = dtype if dtype in ("bfloat16", "float16") else None
    return fastlib.train(model, x, y, epochs, DEFAULTS["batch_size"], DEFAULTS["lr"],
                         "cross_entropy", optimizer=DEFAULTS["optimizer"], seed=seed,
                         verbose=False, dtype=precision, fused=fused, device=device,
                         callbacks=callbacks)


def _accuracy(model, x, y, dtype):
    from fastlib import losses
    from fastlib.training import algorithms, mixed_precision

    # the targets as the loss reads them unchecked (train normalises its own once)
    y = losses.validate_targets("cross_entropy", np.zeros((len(y), 10), np.float32), y)
    if dtype in ("bfloat16", "float16"):
        return mixed_precision.evaluate(model, x, y, "cross_entropy", dtype)[1]
    return algorithms.evaluate_model(model, x.astype(model.dtype), y, "cross_entropy")[1]


def _stored_bytes(model, dtype, batch):
    """(parameter bytes, activation bytes per batch) the format needs: the parameters in the
    format (plus float32 masters for a 16-bit run), every layer's output at ``batch`` rows."""
    params = sum(v.size for v in model.parameters().values())
    acts = batch * sum(layer.out_width(None) for layer in model.layers)
    width = _WIDTH[dtype]
    masters = 4 * params if dtype in ("bfloat16", "float16") else 0
    return width * params + masters, width * acts


def _traced_peak(x, y, dtype, fused):
    """Peak bytes of NumPy's allocations (``tracemalloc``) over one epoch of a run in its steady
    state: from the end of its first epoch to the end of its second (what the run holds, its
    optimizer state and masters included, plus the epoch's own allocations); the run's set-up
    (its divergence probe on a few hundred rows) is not an epoch's cost."""
    model = _model(dtype, 0)
    _train(model, x, y, dtype, fused, 1, 0)      # compiled and warmed, outside the trace
    peaks = []

    def mark(epoch, logs):
        if not peaks:
            tracemalloc.reset_peak()
        peaks.append(tracemalloc.get_traced_memory()[1])

    tracemalloc.start()
    try:
        _train(_model(dtype, 1), x, y, dtype, fused, 2, 1, callbacks=[mark])
        return peaks[-1]
    finally:
        tracemalloc.stop()


def _measure(cases, data, repeats, progress, device="cpu", epochs=None):
    """One row per case. The runs are interleaved, seed by seed, every case in turn, so that a
    change in the machine's speed during the benchmark falls on every case alike. On
    ``device="cuda"`` no traced peak (the device's memory is not NumPy's): None."""
    epochs = epochs or DEFAULTS["epochs"]
    x, y, x_test, y_test = data
    runs = {label: {"seconds": [], "accuracy": [], "path": None} for label, _, _ in cases}
    for seed in range(repeats):
        for label, dtype, fused in cases:
            progress(f"{label} seed {seed}")
            model = _model(dtype, seed)
            result = _train(model, x, y, dtype, fused, epochs, seed, device)
            run = runs[label]
            run["seconds"] += list(result.epoch_times[1:])   # each run's first epoch compiles
            run["accuracy"].append(_accuracy(model, x_test, y_test, dtype))
            run["path"] = result.path
    rows = []
    for label, dtype, fused in cases:
        run = runs[label]
        params, acts = _stored_bytes(_model(dtype, 0), dtype, DEFAULTS["batch_size"])
        rows.append({"case": label, "dtype": dtype, "path": run["path"],
                     "s_per_epoch": statistics.median(run["seconds"]),
                     "test_accuracy": statistics.fmean(run["accuracy"]),
                     "test_accuracies": run["accuracy"], "parameter_bytes": params,
                     "activation_bytes": acts,
                     "traced_peak_bytes": (_traced_peak(x, y, dtype, fused)
                                           if device == "cpu" else None)})
    return rows


def _loadavg():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover - platforms without it
        return None


def run(args, dtypes) -> int:
    """Measure every format of ``dtypes`` on the digits; print the table (and ``--json``)."""
    from fastlib import datasets
    from reports.bench import environment
    from reports.commands.arguments import progress_enabled
    from reports.commands.progress import ProgressLine

    repeats = args.repeats or DEFAULTS["repeats"]
    split = datasets.load_digits(None)
    data = (split.x_train, split.y_train, split.x_test, split.y_test)
    line = ProgressLine(enabled=progress_enabled(args))
    load_start = _loadavg()
    start = time.perf_counter()
    rows = _measure(case_names(dtypes), data, repeats, line.update, args.device)
    line.finish("")
    base = next((r for r in rows if r["case"] == "float32"), None)
    for r in rows:
        if base is not None:
            r["time_over_float32"] = r["s_per_epoch"] / base["s_per_epoch"]
            r["accuracy_minus_float32"] = r["test_accuracy"] - base["test_accuracy"]
            r["bytes_over_float32"] = ((r["parameter_bytes"] + r["activation_bytes"])
                                       / (base["parameter_bytes"] + base["activation_bytes"]))
    report = {"model": f"digits MLP 64-{DEFAULTS['hidden']}-10 relu", "data": "digits",
              "settings": dict(DEFAULTS, repeats=repeats), "dtypes": list(dtypes),
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
    print(f"{'case':<18} {'path':<8} {'s/epoch':>8} {'x f32':>6} {'test acc':>8} "
          f"{'-f32 pts':>8} {'param+act KiB':>13} {'traced peak KiB':>15}")
    for r in report["results"]:
        ratio = r.get("time_over_float32")
        delta = r.get("accuracy_minus_float32")
        print(f"{r['case']:<18} {r['path']:<8} {r['s_per_epoch']:8.4f} "
              f"{'-' if ratio is None else format(ratio, '6.2f'):>6} "
              f"{100 * r['test_accuracy']:8.2f} "
              f"{'-' if delta is None else format(100 * delta, '+8.2f'):>8} "
              f"{(r['parameter_bytes'] + r['activation_bytes']) / 1024:13.1f} "
              f"{_kib(r['traced_peak_bytes']):>15}")


def _kib(n):
    return "-" if n is None else f"{n / 1024:.1f}"
