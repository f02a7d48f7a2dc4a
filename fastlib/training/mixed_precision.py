"""Mixed-precision training: 16-bit weights and activations over float32 master weights.

``train(..., dtype="bfloat16")`` (or ``"float16"``) keeps the model's float32 parameters as the
masters the optimizer updates. Each step rounds them and its batch of inputs to the format
(nearest even; the data set is never copied), runs the forward with every layer's output
rounded, the loss in float32, and the backward on the (scaled) loss cotangent with every input
cotangent and parameter gradient rounded; the gradients are unscaled in float32, checked,
clipped and applied to the masters. Layers compute in float32 between those points. A model
the compiled program takes runs its epochs compiled, rounding at the same points
(``TrainingResult.path`` ``"program"``: the MLP schedule's column epoch or the interpreter);
``fused=False`` goes batch by batch (``"generic"``); ``device="cuda"`` rounds there
(``fastlib.cuda.mixed``). docs/training.md, section "Mixed precision".
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

import numpy as np

from fastlib import losses
from fastlib.kernels import half
from fastlib.training.algorithms import BatchResult, correct_count, evaluate_model
from fastlib.training.clipping import clip_gradients
from fastlib.training.epochs import run_batches
from fastlib.training.loss_scale import LossScale, resolve_loss_scale
from optable.formats import FORMATS as FORMATS_BY_NAME

__all__ = ["FORMATS", "MixedPrecision", "check_dtype_name", "resolve", "attach", "round_to",
           "forward16", "evaluate", "round_inputs", "round_batch", "check_inputs",
           "input_chunks"]

#: the 16-bit formats a run may train in (the masters are float32)
FORMATS = ("bfloat16", "float16")
_NAMES = ("float32", "float64") + FORMATS


def check_dtype_name(dtype) -> str | None:
    """``TrainOptions.dtype`` as a format name (None: the model's own dtype).

    Raises
    ------
    TypeError, ValueError
        Not a name or dtype, or an unknown one (with a did-you-mean).
    """
    if dtype is None:
        return None
    if isinstance(dtype, str):
        name = dtype.strip().lower()
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise TypeError(f"dtype must be a name ({', '.join(_NAMES)}) or a NumPy dtype, got "
                            f"{type(dtype).__name__}") from None
    if name not in _NAMES:
        close = difflib.get_close_matches(name, _NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown training dtype {dtype!r}{hint}; train takes "
                         f"{', '.join(repr(n) for n in _NAMES)}: a 16-bit one trains in mixed "
                         "precision over the float32 model's master weights")
    return name


@dataclass(frozen=True)
class MixedPrecision:
    """A run's 16-bit format and its loss scale (None: unscaled)."""

    fmt: str
    scale: LossScale | None

    @property
    def dtype(self) -> np.dtype:
        """The format's NumPy dtype (``ml_dtypes``'s bfloat16, or float16)."""
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16 if self.fmt == "bfloat16" else np.float16)

    def settings(self) -> dict:
        """What decides the trajectory (a checkpoint compares it on resume)."""
        return {"dtype": self.fmt,
                "loss_scale": None if self.scale is None else self.scale.settings()}


def resolve(dtype_name, loss_scale, model_dtype) -> MixedPrecision | None:
    """The run's :class:`MixedPrecision`, or None when it trains in the model's dtype.

    Raises
    ------
    ValueError
        A float32/float64 ``dtype`` other than the model's, a 16-bit one for a float64 model,
        or ``loss_scale`` without a 16-bit ``dtype``.
    """
    model_name = np.dtype(model_dtype).name
    if dtype_name is None or dtype_name not in FORMATS:
        if dtype_name is not None and dtype_name != model_name:
            raise ValueError(f"dtype={dtype_name!r} but the model's parameters are "
                             f"{model_name}: build the model with dtype=np.{dtype_name}, or "
                             f"pass dtype='bfloat16' / 'float16' for mixed precision")
        if loss_scale not in (None, False):
            raise ValueError("loss_scale applies to 16-bit training only: pass dtype='float16' "
                             "(or 'bfloat16') with it, or leave loss_scale out")
        return None
    if model_name != "float32":
        raise ValueError(f"dtype={dtype_name!r} trains in mixed precision over float32 master "
                         f"weights, but the model is {model_name}: build it with "
                         "dtype=np.float32")
    return MixedPrecision(dtype_name, resolve_loss_scale(loss_scale, dtype_name))


def round_to(a, fmt, out=None) -> np.ndarray:
    """float32 ``a`` rounded to the 16-bit format ``fmt`` (nearest even), as float32 (into
    ``out``, which may be ``a`` itself)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return half.round_float32(a, fmt, out)


def _units(model):
    """The pieces whose outputs are rounded: a Sequential's children, else the whole model."""
    from fastlib.layers.containers import Sequential

    return list(model.layers) if isinstance(model, Sequential) else [model]


def forward16(model, x, fmt) -> np.ndarray:
    """The 16-bit forward of ``model`` (its parameters already rounded): every unit's output
    rounded to ``fmt``."""
    for unit in _units(model):
        x = round_to(unit.forward(x), fmt)
    return x


def _backward16(model, cotangent, fmt) -> dict:
    """Parameter gradients of the last :func:`forward16`, each rounded to ``fmt``, every
    unit's input cotangent rounded to ``fmt`` before the unit below reads it."""
    units = _units(model)
    sequential = len(units) > 1 or units[0] is not model
    grads = {}
    g = cotangent
    for i in range(len(units) - 1, -1, -1):
        g, own = units[i].backward(g, i > 0)
        if i > 0:
            g = round_to(g, fmt)
        for name, value in own.items():
            grads[f"{i}.{name}" if sequential else name] = round_to(value, fmt)
    return grads


class _Rounded:
    """Within ``with``: the model's parameters hold their 16-bit values; the masters after."""

    def __init__(self, params, fmt):
        self.params, self.fmt = params, fmt

    def __enter__(self):
        self.masters = {k: v.copy() for k, v in self.params.items()}
        for v in self.params.values():
            round_to(v, self.fmt, out=v)
        return self

    def __exit__(self, *exc):
        for k, v in self.params.items():
            np.copyto(v, self.masters[k])


def _train_one_batch(ctx, x, y) -> BatchResult:
    """One mixed-precision step (module doc); the scale's state is in ``ctx.state``."""
    mp = ctx.scratch["mixed_precision"]
    fmt, scaler = mp.fmt, mp.scale
    scale = 1.0 if scaler is None else float(ctx.state["loss_scale"])
    x = round_batch(x, fmt)
    with _Rounded(ctx.params, fmt):
        pred = forward16(ctx.model, x, fmt)
        loss, dpred = losses.loss_value_and_grad(ctx.loss_type, pred, y, check=False)
        loss = float(loss)
        correct = correct_count(ctx.loss_type, pred, y)
        if not np.isfinite(loss):
            return BatchResult(loss, correct, False)
        scaled = round_to(np.asarray(dpred, np.float32) * np.float32(scale), fmt)
        grads = _backward16(ctx.model, scaled, fmt)
    # as torch.amp.GradScaler.unscale_: the reciprocal in double, rounded once to float32
    inverse = np.float32(1.0 / scale)
    grads = {k: np.ascontiguousarray(grads[k] * inverse, dtype=np.float32) for k in ctx.params}
    found_inf = not all(np.isfinite(g).all() for g in grads.values())
    if scaler is not None:
        scaler.update(ctx.state, found_inf)
    if found_inf:
        return BatchResult(loss, correct, True, grads)
    info = clip_gradients(grads, ctx.config.gradient_clip, ctx.config.clip_mode)
    if not info.finite:
        return BatchResult(loss, correct, True, grads)
    ctx.opt_state = ctx.optimizer.update(ctx.params, grads, ctx.opt_state, lr=ctx.lr)
    return BatchResult(loss, correct, False, grads)


class _Forward16:
    """A model whose ``forward`` is the 16-bit one (for the shared evaluation)."""

    def __init__(self, model, fmt):
        self.model, self.fmt = model, fmt

    def forward(self, x):
        return forward16(self.model, round_to(x, self.fmt), self.fmt)

    def clear_history(self):
        self.model.clear_history()


def evaluate(model, x, y, loss_type, fmt):
    """Mean loss and accuracy of ``model`` on ``(x, y)`` (targets normalised) in the 16-bit
    forward of ``fmt``: what a mixed-precision run's validation reports."""
    with _Rounded(model.parameters(), fmt):
        return evaluate_model(_Forward16(model, fmt), x, y, loss_type)


def attach(ctx, algo, mp: MixedPrecision, data_parallel):
    """The algorithm that trains ``ctx``'s run in ``mp``'s precision (``bp`` only). On
    ``device="cuda"`` the device run reads ``ctx.scratch["mixed_precision"]`` and rounds at
    the same points in its recorded step (``fastlib.cuda.mixed``).

    Raises
    ------
    ValueError
        Another algorithm, or data-parallel training.
    """
    if algo.name != "bp":
        raise ValueError(f"dtype={mp.fmt!r} (mixed precision) trains with algorithm='bp' only; "
                         f"got {algo.name!r}: train it in float32 or float64")
    if data_parallel is not None:
        raise ValueError(f"dtype={mp.fmt!r} (mixed precision) with distributed=True is not "
                         "supported: train on one process")
    ctx.scratch["mixed_precision"] = mp

    def run_epoch(ctx, x, y, order):
        if mp.scale is not None:     # a fresh run's first scale (a resumed one has its own)
            mp.scale.start(ctx.state)
        before = int(ctx.state.get("loss_scale_skips", 0))
        # bp's own epoch: compiled when a schedule takes the model in mixed precision, else
        # None
        stats = algo.run_epoch(ctx, x, y, order)
        if stats is None:
            stats = run_batches(ctx, inner, x, y, order)
        stats.scaler_skips = int(ctx.state.get("loss_scale_skips", 0)) - before
        return stats

    def evaluate16(model, x, y, loss_type):
        return evaluate(model, x, y, loss_type, mp.fmt)

    inner = replace(algo, train_one_batch=_train_one_batch, run_epoch=None)
    return replace(inner, run_epoch=run_epoch, evaluate=evaluate16)


def round_inputs(x, fmt, what="inputs") -> np.ndarray:
    """A run's float inputs as the format holds them (integer indices unchanged).

    Raises
    ------
    ValueError
        A finite input beyond the format's range (it would round to Inf), naming ``what``, the
        format's largest finite value and the fix.
    """
    x = np.asarray(x)
    rounded = round_batch(x, fmt)
    if rounded is not x:
        _check_range(x, rounded, fmt, what)
    return rounded


def round_batch(x, fmt) -> np.ndarray:
    """One batch of a run's inputs as the format holds them (float32; integer indices
    unchanged): a run rounds its inputs batch by batch, never the whole data set at once."""
    x = np.asarray(x)
    return x if x.dtype.kind in "iu" else round_to(x, fmt)


#: rows per chunk of :func:`input_chunks` (at most about this many values at a time)
_CHUNK_VALUES = 1 << 16


def input_chunks(x, fmt):
    """``(row slice, rounded float32 rows)`` over the float array ``x``, a few rows at a time:
    what a whole-set pass (range check, fingerprint) reads without a rounded copy of it."""
    x = np.asarray(x)
    row = max(1, int(np.prod(x.shape[1:], dtype=np.int64)))
    step = max(1, _CHUNK_VALUES // row)
    for start in range(0, max(x.shape[0], 1), step):
        rows = slice(start, min(start + step, x.shape[0]))
        yield rows, round_to(x[rows], fmt)


def check_inputs(x, fmt, what="inputs") -> None:
    """Refuse float inputs that the 16-bit format ``fmt`` cannot hold (checked chunk by chunk;
    integer indices pass).

    Raises
    ------
    ValueError
        A finite input beyond the format's range, as :func:`round_inputs` names it.
    """
    x = np.asarray(x)
    if x.dtype.kind in "iu":
        return
    count, first = 0, None
    for rows, rounded in input_chunks(x, fmt):
        overflow = _overflow(x[rows], rounded)
        if overflow.any():
            count += int(overflow.sum())
            if first is None:
                at = tuple(int(i) for i in np.argwhere(overflow)[0])
                first = (at[0] + rows.start,) + at[1:]
    if count:
        _refuse(x, count, first, fmt, what)


def _overflow(x, rounded):
    # NOTE: an input rounded to Inf makes the first loss Inf, and the run would stop blaming
    # the learning rate; the data is what must change
    return np.isinf(rounded) & np.isfinite(x)


def _check_range(x, rounded, fmt, what):
    overflow = _overflow(x, rounded)
    if overflow.any():
        _refuse(x, int(overflow.sum()), tuple(int(i) for i in np.argwhere(overflow)[0]), fmt,
                what)


def _refuse(x, count, at, fmt, what):
    wider = ("train in dtype='bfloat16' (float32's range)" if fmt == "float16"
             else "train in float32 (leave dtype out)")
    raise ValueError(f"{what}: {count} value(s) are beyond {fmt}'s range "
                     f"(largest finite {FORMATS_BY_NAME[fmt].max:g}), the first at index {at} "
                     f"({x[at]:g}); scale the data (e.g. standardise it), or {wider}")
