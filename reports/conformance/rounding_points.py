"""Where a mixed-precision step rounds, held step by step against a float64 replay.

The ``mixed MLP`` rows hold a 16-bit run to the exact trajectory within the format's roundoff,
which a run that skips a rounding also meets. Here the referee replays each epoch (two steps)
from fastlib's own masters before it, in float64, rounding (``ml_dtypes``, nearest even) where
docs/training.md says a step rounds; where fastlib rounds the same values, its masters after
the epoch equal the replay's to float32's update error, entry by entry, but for the rare value
float32 left within its own error of a 16-bit rounding boundary. A rounding skipped or added
moves a sixth or more of the entries (docs/conformance.md, "16-bit formats").
"""
from __future__ import annotations

import warnings

import numpy as np

import optable
from reports.conformance.mixed_training import scaled_peak
from reports.conformance.training_cases import EpochCase

__all__ = ["EPOCHS", "STEPS_PER_EPOCH", "FLIP_SHARE", "FLIP_FLOOR", "replay_step",
           "rounding_cases", "check_rounding_points", "rounding_rows"]

#: epochs per case, each of two steps (two batches of half the rows, in order): a compiled
#: epoch rounds the masters into the weights its next step reads inside the epoch
EPOCHS = 2
STEPS_PER_EPOCH = 2
#: entries allowed off the replay per epoch: FLIP_FLOOR + FLIP_SHARE of them. A correct step
#: moves an entry only where float32 rounded a value across a 16-bit boundary: about 2**-13
#: (float16) or 2**-16 (bfloat16) of the values per float32 rounding error in them, and each
#: such value feeds the gradient entries it reaches (30 random MLPs, 4 steps each: at most 3
#: of 284 entries off in float16, none in bfloat16). A skipped rounding moved at least a
#: sixth.
FLIP_SHARE = 0.05
FLIP_FLOOR = 2
#: float32 update error allowed per entry and step: w - lr * g rounds twice (2**-24 each,
#: relative to |w - lr g| and |lr g|), and a gradient that cancels exactly is float32's noise
#: in fastlib (below that of the largest step); four times that (the replay's masters are
#: rounded to float32 after each step, as fastlib's are)
_UPDATE_EPS = 2.0 ** -22


def _round(a, fmt):
    """``a`` rounded to ``fmt`` through float32 (as fastlib's values are), back in float64."""
    dtype = optable.formats.dtype_of(fmt)
    return np.asarray(a, np.float64).astype(np.float32).astype(dtype).astype(np.float64)


def replay_step(config, masters, x, y, loss, fmt, scale, lr):
    """One SGD step of the model ``config`` in mixed ``fmt``, in float64, from the float32
    ``masters`` (reflib's layers on its tape, the graph cut at every unit's output).

    The units are a ``Sequential``'s own layers, else the whole model. Rounded to ``fmt``: the
    parameters the forward and backward read, the float inputs, every unit's output, the loss
    cotangent times ``scale``, every unit's input cotangent (the first's is not computed) and
    every parameter gradient, which is then divided by ``scale``.

    Returns
    -------
    (dict, dict)
        The new masters (``masters - lr * gradient``) and the gradients, float64.
    """
    from reflib.losses import add_loss
    from reflib.models.config import from_config
    from reflib.models.containers import child_ids
    from reflib.tape import Tape

    model = from_config(config)
    model.load_parameters({k: _round(v, fmt) for k, v in masters.items()})
    nested = config["type"] == "Sequential"
    units = list(model.layers) if nested else [model]
    tape = Tape()
    ids = model.attach(tape, requires_grad=True)
    x = np.asarray(x)
    h = tape.leaf(x if x.dtype.kind in "iu" else _round(x, fmt), requires_grad=False)
    traced = []
    for i, unit in enumerate(units):
        own = child_ids(ids, i) if nested else ids
        out = unit.trace(tape, h, own)
        traced.append((h, out, own))
        # a fresh leaf holding the rounded output: the next unit reads what the format holds
        h = tape.leaf(_round(tape.value(out), fmt), requires_grad=True)
    g = _round(scale * tape.backward_scalar(add_loss(tape, h, y, loss))[h], fmt)
    grads = {}
    for i in range(len(units) - 1, -1, -1):
        h, out, own = traced[i]
        reached = tape.backward(out, g)
        for name, node in own.items():
            gradient = reached.get(node, np.zeros(tape.value(node).shape))
            grads[f"{i}.{name}" if nested else name] = _round(gradient, fmt) / scale
        if i > 0:
            g = _round(reached[h], fmt)
    return {k: np.asarray(v, np.float64) - lr * grads[k] for k, v in masters.items()}, grads


def rounding_cases(fmt, paths=("generic", "fused", "pieces", "general"), sequences=True):
    """Three Dense MLPs (one to three layers of tanh, sigmoid and linear; cross-entropy and
    mse), each trained on every one of ``paths`` (``("cuda",)``: the device), and with
    ``sequences`` five models of the other layer kinds (LSTM, causal attention with LayerNorm
    and SwiGLU, tokens into an RNN, a residual ``Parallel``, a concatenating one) per batch and
    compiled (the interpreter); :data:`EPOCHS` epochs of two SGD steps on half the rows each, unshuffled;
    float16 under a fixed loss scale (the MLPs' 8 to 16 times below the overflow of the first
    step; 2**8 for the others, whose backward is of order one)."""
    import fastlib

    rng = np.random.default_rng(20261129)
    shapes = (([5, 7, 4], ("tanh", "linear"), "cross_entropy", 12),
              ([6, 8, 6, 3], ("sigmoid", "tanh", "linear"), "mse", 10),
              ([4, 9, 7, 8, 5], ("tanh", "linear", "sigmoid", "linear"), "cross_entropy", 16))
    threshold = optable.formats.FORMATS["float16"].overflow
    cases = []

    def add(config, x, y, loss, seed, scale, on, label):
        for path in on:
            cases.append(EpochCase(config, x, y, loss, seed, "float32", "SGD", 0.1,
                                   len(x) // STEPS_PER_EPOCH, EPOCHS, False, path=path,
                                   mixed=fmt, loss_scale=scale, label=f"{label} {fmt} {path}"))

    for seed, (widths, acts, loss, n) in enumerate(shapes):
        config = {"type": "Sequential", "layers": [
            {"type": "Dense", "in_features": a, "out_features": b, "activation": act}
            for a, b, act in zip(widths[:-1], widths[1:], acts)]}
        x = rng.uniform(-2, 2, size=(n, widths[0]))
        y = (rng.integers(0, widths[-1], size=(n, 1)) if loss == "cross_entropy"
             else rng.uniform(-1, 1, size=(n, widths[-1])))
        scale = None
        if fmt == "float16":
            params = {k: np.asarray(v, np.float64) for k, v in fastlib.layers.from_config(
                config, dtype=np.float32, seed=seed).parameters().items()}
            peak = scaled_peak(config, params, x.astype(np.float32), y, loss)
            scale = {"init_scale": 2.0 ** int(np.floor(np.log2(threshold / (8.0 * peak)))),
                     "dynamic": False}
        add(config, x, y, loss, seed, scale, paths, f"MLP {'-'.join(map(str, widths))}")
    if not sequences:
        return cases
    from fastlib import layers as fl

    scale = {"init_scale": 2.0 ** 8, "dynamic": False} if fmt == "float16" else None
    on = ("generic", "compiled")
    add(fl.Sequential([fl.LSTM(3, 5, True), fl.Dense(5, 3, "tanh"), fl.Dense(3, 2)]
                      ).get_config(), rng.uniform(-2, 2, (8, 4, 3)),
        rng.uniform(-1, 1, (8, 4, 2)), "mse", 11, scale, on, "LSTM")
    add(fl.Sequential([fl.MultiHeadAttention(4, 2, True), fl.LayerNorm(4), fl.SwiGLU(4, 6, 4),
                       fl.Dense(4, 2)]).get_config(), rng.uniform(-2, 2, (8, 3, 4)),
        rng.uniform(-1, 1, (8, 3, 2)), "mse", 12, scale, on, "attention")
    add(fl.Sequential([fl.Embedding(7, 4), fl.RNN(4, 5), fl.Dense(5, 3)]).get_config(),
        rng.integers(0, 7, (8, 4)), rng.integers(0, 3, (8, 1)), "cross_entropy", 13, scale,
        on, "tokens RNN")
    add(fl.Sequential([fl.Dense(3, 4, "tanh"), fl.Parallel(
        [fl.Dense(4, 4), fl.Sequential([fl.RMSNorm(4), fl.SwiGLU(4, 5, 4)])], "add"),
        fl.Dense(4, 2)]).get_config(), rng.uniform(-2, 2, (8, 3)),
        rng.integers(0, 2, (8, 1)), "cross_entropy", 14, scale, on, "residual SwiGLU")
    # a unit two rows write (each branch its columns): rounded after the last of them
    add(fl.Sequential([fl.Dense(3, 4, "tanh"), fl.Parallel(
        [fl.Dense(4, 2, "tanh"), fl.Sequential([fl.RMSNorm(4), fl.Dense(4, 6)])], "concat"),
        fl.Dense(8, 3)]).get_config(), rng.uniform(-2, 2, (8, 3)),
        rng.integers(0, 3, (8, 1)), "cross_entropy", 15, scale, on, "concat Parallel")
    return cases


def _trained(case, model, x, y):
    """The masters before the run and after each of its epochs (float64 copies)."""
    from reports.conformance.training_rows import _train

    history = [{k: v.astype(np.float64) for k, v in model.parameters().items()}]

    def keep(epoch, logs):
        history.append({k: v.astype(np.float64) for k, v in model.parameters().items()})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run = _train(case, model, x, y, 0.0, callbacks=[keep])
    return run, history


def check_rounding_points(case):
    """``fastlib.train`` on ``case``, the masters after each epoch against
    :func:`replay_step`'s from fastlib's masters before it (module doc).

    Returns
    -------
    properties.Result
    """
    import fastlib

    from reports.conformance.oracle import Measure
    from reports.conformance.properties import Result

    result = Result()
    model = fastlib.layers.from_config(case.config, dtype=np.float32, seed=case.seed)
    x = np.asarray(case.x)
    x = x if x.dtype.kind in "iu" else x.astype(np.float32)
    y = np.asarray(case.y)
    y = y if y.dtype.kind in "iu" else y.astype(np.float32)
    try:
        run, history = _trained(case, model, x, y)
    except Exception as exc:
        return result.fail(f"fastlib.train raised {type(exc).__name__}: {exc}")
    if len(history) != EPOCHS + 1 or run.loss_scale_skips:
        return result.fail(f"fastlib.train ran {len(history) - 1} epochs of {EPOCHS} with "
                           f"{run.loss_scale_skips} steps skipped: the replay takes every one")
    if case.path == "cuda" and run.path != "cuda":
        result.fail(f"fastlib.train(device='cuda') trained on path {run.path!r}")
    elif case.path not in ("generic", "cuda") and not run.fused:
        result.fail(f"fastlib.train did not take a whole-epoch compiled path ({case.label})")
    if case.path == "general" and run.schedule != "general":
        result.fail(f"fastlib.train ran schedule {run.schedule!r}, not the general one")
    scale = 1.0 if case.loss_scale is None else float(case.loss_scale["init_scale"])
    lr = float(np.float32(case.lr))
    bs = case.batch_size
    for e in range(EPOCHS):
        want, moved = history[e], {k: 0.0 for k in history[e]}
        for j in range(STEPS_PER_EPOCH):
            rows = slice(j * bs, (j + 1) * bs)
            want, grads = replay_step(case.config, want, x[rows], y[rows], case.loss,
                                      case.mixed, scale, lr)
            want = {k: v.astype(np.float32).astype(np.float64) for k, v in want.items()}
            moved = {k: moved[k] + np.abs(lr * grads[k]) for k in moved}
        off, entries, first = 0, 0, None
        # a gradient that cancels to zero (attention's key bias) is float32's noise in fastlib:
        # below float32's error of the largest step any entry takes
        top = max(float(np.max(m, initial=0.0)) for m in moved.values())
        for k, w in want.items():
            got = history[e + 1][k]
            miss = np.abs(got - w) > _UPDATE_EPS * STEPS_PER_EPOCH * (np.abs(w) + moved[k] + top)
            off += int(miss.sum())
            entries += miss.size
            if miss.any() and first is None:
                i = np.unravel_index(int(np.argmax(miss)), miss.shape)
                first = f"{k}{list(i)}: fastlib {got[i]!r}, replay {w[i]!r}"
        bound = FLIP_FLOOR + FLIP_SHARE * entries
        note = "" if off <= bound else (
            f"epoch {e + 1}: {off} of {entries} master entries off the {case.mixed} replay "
            f"(at most {bound:.3g} may be: a rounding point skipped or added?), first {first}")
        result.measures.append(Measure(f"epoch {e + 1} entries off the replay", float(off),
                                       float(bound), off <= bound, note, unit="entries"))
    return result


def rounding_rows(engine, paths=("generic", "fused", "pieces", "general"), sequences=True):
    """The ``train`` rows ``rounding points [bfloat16|float16]`` of ``engine`` (``runner.Row``
    objects): :func:`rounding_cases` on ``paths``, each held by :func:`check_rounding_points`."""
    from reports.conformance.rows import Row, run_cases
    from reports.conformance.training_rows import reproduction

    return [Row("train", "rounding points", engine, fmt,
                lambda profile, seed, fmt=fmt: run_cases(
                    rounding_cases(fmt, paths, sequences), check_rounding_points,
                    lambda i, case: reproduction(case)))
            for fmt in ("bfloat16", "float16")]
