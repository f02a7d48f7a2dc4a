"""The ``train`` rows: whole ``fastlib.train`` runs held, entry by entry, to exact trajectories.

The long story: docs/reports-training-checks.md, section ``reports/conformance/training_rows.py``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import mpmath
import numpy as np

from reports.conformance.training_cases import EpochCase

__all__ = ["check_epochs", "reference_run", "chain_ops", "depth_factor", "gradient_allowance",
           "loss_condition", "parameter_bounds", "run_bounds", "feedback", "check_train_step", "train_rows", "reproduction", "EXACT_DPS", "K_GRAD", "K_STEP",
           "K_ORDER", "EXAMPLES", "running_radius", "NARROW_NORM", "narrow_norm"]

EXACT_DPS = 30          # exact references: 30 digits, 14 beyond float64
K_GRAD = 16.0           # roundings per operation on the chain (module doc)
K_STEP = 32.0           # roundings per optimizer step (spec.optimizers' table: ~10 per element)
K_ORDER = 4.0           # times the running error bound of reflib's formulas: the bound
                        # assumes each rounding <= u |result| (correctly rounded); libm's
                        # exp, log, log1p, tanh, erf may be 2 ulp off, <= 4 u |result| (module doc)
EPS64 = 2.0 ** -52
TENSOR_ZERO = 1e-6      # a tensor below this fraction of its layer's scale is "0 as a whole"
LAYER_ZERO = 1e-4       # a layer below this fraction of the model's scale: its terms cancel
                        # (a two-wide LayerNorm downstream makes its output nearly constant)

NARROW_NORM = 4         # a LayerNorm / RMSNorm this wide or narrower: the row takes the
                        # adjoint radius, where the running one is loosest (docs/conformance.md)

# drawn examples per row and profile (the explicit boundary cases run on top)
EXAMPLES = {"dev": 3, "ci": 5, "thorough": 25}

_OPS = {"Dense": 3, "LayerNorm": 6, "RMSNorm": 5, "SwiGLU": 6, "MultiHeadAttention": 10,
        "Embedding": 1, "Softmax": 4}


def chain_ops(config, seq=1):
    """Operations on the longest chain of ``config`` (forward; the backward mirrors it)."""
    kind = config["type"]
    if kind == "Sequential":
        return sum(chain_ops(c, seq) for c in config["layers"])
    if kind == "Parallel":
        return 1 + max(chain_ops(c, seq) for c in config["layers"])
    if kind in ("RNN", "LSTM"):
        return (4 if kind == "RNN" else 8) * max(seq, 1)
    return _OPS[kind]


def _widths(config):
    out = []
    for key in ("in_features", "out_features", "d", "d_model", "hidden", "input_size",
                "hidden_size", "dim", "num"):
        if key in config:
            out.append(int(config[key]))
    for child in config.get("layers", ()):
        out += _widths(child)
    return out


def depth_factor(case, batch):
    """``D`` of the module doc: operations on the chain plus log2 of the longest sum."""
    x = np.asarray(case.x)
    seq = x.shape[1] if x.ndim == 3 or (x.ndim == 2 and x.dtype.kind in "iu") else 1
    longest = max([batch * seq] + _widths(case.config))
    return chain_ops(case.config, seq) + math.log2(1 + longest)


def loss_condition(loss, pred, y):
    """How much the loss's cotangent cancels, and the scale of its terms: ``Σ(|a| + |b|) /
    Σ|a − b|`` and ``mean(|a| + |b|)`` over its entries,
    where the cotangent is ``a − b`` (softmax or sigmoid of the logits, or the prediction,
    minus the target). Each entry of the cotangent is computed with an absolute error of a few
    eps times ``|a| + |b|``, so a fit that is already close (``a ≈ b``) hands every gradient
    that relative error times this factor."""
    pred = np.asarray(pred, np.float64)
    y = np.asarray(y)
    if loss in ("cross_entropy", "categorical_cross_entropy"):
        z = pred - np.max(pred, axis=-1, keepdims=True)
        a = np.exp(z) / np.sum(np.exp(z), axis=-1, keepdims=True)
        b = (np.eye(pred.shape[-1])[y.reshape(-1)] if loss == "cross_entropy"
             else np.asarray(y, np.float64))
    elif loss == "binary_cross_entropy_with_logits":
        a, b = 1.0 / (1.0 + np.exp(-pred)), np.asarray(y, np.float64)
    else:
        a, b = pred, np.asarray(y, np.float64)
    total = float(np.sum(np.abs(a - b)))
    terms = float(np.sum(np.abs(a) + np.abs(b)))
    return (terms / total if total > 0 else 1.0), terms / max(a.size, 1)


def _eps(dtype):
    """``eps`` of a dtype or a format's name (bfloat16 and float16 included)."""
    import optable

    return float(optable.formats.format_of(dtype).eps)


def gradient_format(case):
    """The format a run's gradients are computed in: a mixed run's 16-bit one (its forward
    and backward round to it), else the model's dtype."""
    return case.mixed or np.dtype(case.dtype).name


def _f(a):
    """float64 view of a float, int or mpf array."""
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype == object else np.asarray(a, np.float64)


def _rms(a):
    return float(np.sqrt(np.mean(np.square(a)))) if a.size else 0.0


def _layer(name):
    return name.rsplit(".", 1)[0] if "." in name else ""


# attention's query and key parameters: their gradients come out of the softmax's backward,
# P ∘ (dP − rowsum(P ∘ dP)), whose terms cancel (a causal first row: exactly), so they are
# judged at the scale of the terms, their layer's
BEHIND_SOFTMAX = frozenset(("w_q", "w_k", "b_q", "b_k"))


def layer_scaled(config, prefix=""):
    """Names of the parameters judged at their layer's scale: attention's query and key
    parameters (``BEHIND_SOFTMAX``) and the weights of LayerNorm / RMSNorm, ``Σ g · x̂``,
    whose terms are the size of the bias gradient's (two-wide norms cancel them)."""
    kind = config["type"]
    if kind in ("Sequential", "Parallel"):
        out = set()
        for i, child in enumerate(config["layers"]):
            out |= layer_scaled(child, f"{prefix}{i}.")
        return out
    if kind == "MultiHeadAttention":
        return {prefix + n for n in BEHIND_SOFTMAX}
    if kind in ("LayerNorm", "RMSNorm"):
        return {prefix + "weight"}
    return set()


def tensor_scales(grads, floor=0.0, at_layer=None):
    """``s_T`` per parameter: its RMS; its layer's largest RMS when it is 0 as a whole or sits
    behind attention's softmax (``BEHIND_SOFTMAX``); the model's largest when its whole layer
    is 0 (a layer under a one-wide LayerNorm, whose output is constant), where each engine
    keeps its own rounding residue; ``floor`` when the whole model's gradient is 0 (the loss's
    terms cancel exactly: pass their scale). ``at_layer``: the names judged at their layer's
    scale (``layer_scaled``; default: by ``BEHIND_SOFTMAX``'s names)."""
    rms = {k: _rms(_f(g)) for k, g in grads.items()}
    layer = {}
    for k, r in rms.items():
        layer[_layer(k)] = max(layer.get(_layer(k), 0.0), r)
    model = max(layer.values(), default=0.0)
    if model <= LAYER_ZERO * floor:
        model = floor
    cancelled = {name for name, s in layer.items() if s <= LAYER_ZERO * model}
    layer = {name: (model if name in cancelled else s) for name, s in layer.items()}
    if at_layer is None:
        at_layer = {k for k in rms if k.rsplit(".", 1)[-1] in BEHIND_SOFTMAX}
    return {k: (r if r > TENSOR_ZERO * layer[_layer(k)] and k not in at_layer
                and _layer(k) not in cancelled else layer[_layer(k)])
            for k, r in rms.items()}


def gradient_allowance(grads, dtype, depth, condition=(1.0, 0.0), radius=None,
                       at_layer=None):
    """Admissible error ``A`` of every gradient entry (module doc); ``condition`` is the
    batch's ``loss_condition`` (factor, terms' scale), ``radius`` the entries' running error
    bound at the dtype's unit roundoff (``running_radius``; None when there is none)."""
    condition, terms = condition
    scales = tensor_scales(grads, terms, at_layer)
    eps = _eps(dtype)
    out = {}
    for k, g in grads.items():
        a = K_GRAD * eps * (depth + condition) * (np.abs(_f(g)) + scales[k])
        if radius is not None:
            a = a + K_ORDER * radius[k]
        out[k] = a
    return out


# ---------------------------------------------------------------------------------------------
# the reference: reflib replaying the run

class _NumpyBackend:
    """What ``spec``'s optimizer formulas need, in float64 NumPy (float32 rows' referee)."""

    sqrt = staticmethod(np.sqrt)


def _spec_step(name, params, grads, state, t, lr, exact):
    """One optimizer step of the spec's engine form over every parameter."""
    if exact:
        from reflib import optim as ropt

        return ropt.step(name, params, grads, state, t=t, lr=lr, dps=EXACT_DPS)
    from spec.optimizers import lookup_optimizer

    opt = lookup_optimizer(name)
    hyper = {**opt.hyper, "lr": lr}
    slots = {} if state is None else state["slots"]
    new_params, new_slots = {}, {v: {} for v in opt.state}
    for k, w in params.items():
        st_ = {v: slots.get(v, {}).get(k, np.zeros(np.shape(w))) for v in opt.state}
        with np.errstate(all="ignore"):
            w_new, s_new = opt.apply(_NumpyBackend, np.asarray(w, np.float64),
                                     np.asarray(grads[k], np.float64), st_, t,
                                     {h: float(v) for h, v in hyper.items()}, engine=True)
        new_params[k] = np.asarray(w_new, np.float64)
        for v in opt.state:
            new_slots[v][k] = np.asarray(s_new[v], np.float64)
    return new_params, {"t": t, "slots": new_slots}


def clip_exact(grads, clip, mode, exact):
    """Clipping as ``fastlib.train`` documents it, in the referee's arithmetic."""
    if clip == 0.0:
        return grads
    if mode == "value":
        if exact:
            c = mpmath.mpf(clip)
            return {k: np.vectorize(lambda v: max(min(v, c), -c), otypes=[object])(g)
                    for k, g in grads.items()}
        return {k: np.clip(np.asarray(g, np.float64), -clip, clip) for k, g in grads.items()}
    if exact:
        with mpmath.workdps(EXACT_DPS):
            norm = mpmath.sqrt(mpmath.fsum(v * v for g in grads.values() for v in g.flat))
            if norm <= clip:
                return grads
            scale = mpmath.mpf(clip) / norm
            return {k: g * scale for k, g in grads.items()}
    norm = math.sqrt(sum(float(np.sum(np.square(np.asarray(g, np.float64))))
                         for g in grads.values()))
    if norm <= clip:
        return grads
    return {k: np.asarray(g, np.float64) * (clip / norm) for k, g in grads.items()}


def _exact_params(params, exact):
    if not exact:
        return {k: np.array(v, np.float64) for k, v in params.items()}
    out = {}
    for k, v in params.items():
        a = np.empty(np.shape(v), dtype=object)
        a.reshape(-1)[:] = [mpmath.mpf(float(e)) for e in np.asarray(v, np.float64).reshape(-1)]
        out[k] = a
    return out


@dataclass
class Reference:
    """The replayed run: per step the batch rows, loss, raw (unclipped) exact gradient and the
    parameters after the step (``skipped`` when float16's loss scale skipped it); per epoch the
    exact loss; the clipping threshold used; a loss-scaled run's replayed scale."""

    steps: list
    epoch_losses: list
    orders: list
    clip: float
    params: dict
    scale: object = None


def _inputs(case):
    x = np.asarray(case.x)
    if x.dtype.kind in "iu":
        return x
    x = x.astype(case.dtype)
    if case.mixed:      # a mixed run reads its inputs as the 16-bit format holds them
        import optable

        x = x.astype(optable.formats.dtype_of(case.mixed))
    return x.astype(np.float64)


def _targets(case):
    y = np.asarray(case.y)
    if y.dtype.kind in "iu":
        return y
    return y.astype(case.dtype).astype(np.float64)


def clip_threshold(case, first_grads):
    """The absolute threshold of ``case.clip`` (a fraction; see ``EpochCase``), as float32."""
    if not case.clip:
        return 0.0
    flat = np.concatenate([_f(g).reshape(-1) for g in first_grads.values()])
    scale = float(np.max(np.abs(flat))) if case.clip_mode == "value" else float(
        np.linalg.norm(flat))
    return float(np.float32(case.clip * scale)) if scale > 0 else 0.0


def reference_run(case, params0, exact):
    """Replay ``case``'s epochs in reflib from ``params0`` (see the module doc)."""
    import reflib.models
    from reflib.train import value_and_grad

    dps = EXACT_DPS if exact else None
    x, y = _inputs(case), _targets(case)
    n = len(x)
    bs = min(case.batch_size, n)
    model = reflib.models.from_config(case.config)
    params = _exact_params(params0, exact)
    model.load_parameters(params)
    rng = np.random.default_rng(case.seed)
    state, t, steps, losses, orders, clip = None, 0, [], [], [], None
    scale = None
    if case.mixed == "float16" and case.loss_scale is not None:
        from reports.conformance.mixed_training import ScaleReplay

        scale = ScaleReplay(case.loss_scale)
    for _ in range(case.epochs):
        order = rng.permutation(n) if case.shuffle else np.arange(n)
        orders.append(order)
        total = mpmath.mpf(0) if exact else 0.0
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            before = {k: _f(v) for k, v in params.items()}
            loss, grads = value_and_grad(model, x[idx], y[idx], case.loss, dps=dps)
            if clip is None:
                clip = clip_threshold(case, grads)
            skipped = scale is not None and scale.skips_step(
                case.config, before, x[idx], y[idx], case.loss, len(steps) + 1)
            if scale is not None:
                scale.update(skipped)
            if not skipped:     # a skipped step leaves the weights and the optimizer as they were
                t += 1
                clipped = clip_exact(grads, clip, case.clip_mode, exact)
                params, state = _spec_step(case.optimizer, params, clipped, state, t, case.lr,
                                           exact)
                model.load_parameters(params)
            total += loss * len(idx)
            step = {"rows": idx, "loss": float(loss), "grads": grads, "skipped": skipped,
                    "params": {k: _f(v) for k, v in params.items()},
                    "condition": _condition(case, before, x[idx], y[idx])}
            if exact:   # the rounding error bound of the same formulas (module doc)
                model.load_parameters(before)
                if narrow_norm(case.config):   # the adjoint radius, and the running one
                    (step["running_radius"], _), (step["radius"], step["loss_radius"]) = \
                        running_radius(model, x[idx], y[idx], case.loss,
                                       gradient_format(case), both=True)
                else:
                    step["radius"], step["loss_radius"] = running_radius(
                        model, x[idx], y[idx], case.loss, gradient_format(case))
                model.load_parameters(params)
            steps.append(step)
        losses.append(float(total / n))
    return Reference(steps, losses, orders, clip, params, scale)


def narrow_norm(config):
    """True when ``config`` holds a LayerNorm or RMSNorm at most ``NARROW_NORM`` wide."""
    if config["type"] in ("LayerNorm", "RMSNorm"):
        return int(config["d"]) <= NARROW_NORM
    return any(narrow_norm(c) for c in config.get("layers", ()))


def running_radius(model, x, y, loss, dtype, both=False):
    """The running error bound (``reflib.running_error``) of reflib's loss and gradient of
    ``model`` on one batch, at the unit roundoff of ``dtype``: ``({name: radii}, loss radius)``.
    It bounds, to first order, the rounding error of the same formulas evaluated in ``dtype``
    from the model's current parameters, entry by entry. ``both``: ``(running, adjoint)``,
    each such a pair, from one evaluation, the adjoint radius (``reflib.adjoint_error``) the
    same rounding sites carried through the exact adjoint, never larger. A radius that is not
    finite (a formula with no first-order bound there) counts as 0: it must not excuse every
    error."""
    from reflib.adjoint_error import AdjointError, adjoint_radii
    from reflib.running_error import RunningError, radii
    from reflib.train import value_and_grad

    def finite(r):
        return np.where(np.isfinite(r), r, 0.0)

    u = _eps(dtype) / 2
    numeric = AdjointError(u) if both else RunningError(u)
    with np.errstate(all="ignore"):
        loss_value, grads = value_and_grad(model, x, y, loss, dps=numeric)
    running = ({k: finite(radii(g)) for k, g in grads.items()},
               float(finite(np.array(loss_value.r))))
    if not both:
        return running
    names = list(grads)
    entries = [loss_value] + [e for k in names for e in np.asarray(grads[k]).reshape(-1)]
    flat = np.empty(len(entries), dtype=object)
    flat[:] = entries
    with np.errstate(all="ignore"):
        r = finite(adjoint_radii(numeric, flat))
    out, at = {}, 1
    for k in names:
        size = int(np.size(grads[k]))
        out[k] = r[at:at + size].reshape(np.shape(grads[k]))
        at += size
    return running, (out, float(r[0]))


def _condition(case, params, x, y):
    """``loss_condition`` of one batch at ``params`` (a float64 reflib forward)."""
    import reflib.models

    model = reflib.models.from_config(case.config)
    model.load_parameters(params)
    return loss_condition(case.loss, model(x), y)


def feedback(case, params, x, y, bound):
    """How much the gradient of a batch moves when the parameters move by their bound (each
    entry by ``+bound`` and, again, by ``-bound``): the first-order feedback of earlier
    errors into this step's gradient, from reflib in float64."""
    import reflib.models
    from reflib.train import value_and_grad

    model = reflib.models.from_config(case.config)
    out = None
    with np.errstate(all="ignore"):
        model.load_parameters(params)
        _, g0 = value_and_grad(model, x, y, case.loss)
        for sign in (1.0, -1.0):
            model.load_parameters({k: params[k] + sign * bound[k] for k in params})
            _, g = value_and_grad(model, x, y, case.loss)
            moved = {k: np.abs(g[k] - g0[k]) for k in g}
            out = moved if out is None else {k: np.maximum(out[k], moved[k]) for k in out}
    return out


def run_bounds(case, ref, params0, exact, share):
    """Per step of the replayed run ``ref``: the gradient allowances and the parameters'
    bounds after the step (module doc). A row with a narrow norm (its steps carry a
    ``running_radius`` beside the adjoint ``radius``) carries both allowances through the
    optimizer and keeps the smaller bound per entry: the replay is not monotone in the
    allowance it carries (Adam divides by ``sqrt(v)``, clipping rescales), and each is a
    bound on its own, so no bound exceeds the running radius's."""
    dtype = np.dtype(case.dtype)
    eps = _eps(dtype)       # the update's roundings: the (master) weights' dtype
    depth = depth_factor(case, min(case.batch_size, len(case.x)))
    at_layer = layer_scaled(case.config)

    def allow(key):
        return [gradient_allowance(s["grads"], gradient_format(case), depth, s["condition"],
                                   s.get(key), at_layer) for s in ref.steps]
    allowances = allow("radius")
    bounds = parameter_bounds(case, ref, params0, allowances, exact, eps, share)
    if "running_radius" in ref.steps[0]:
        other = parameter_bounds(case, ref, params0, allow("running_radius"), exact, eps,
                                 share)
        bounds = [{k: np.minimum(a[k], b[k]) for k in a} for a, b in zip(bounds, other)]
    return allowances, bounds


def parameter_bounds(case, ref, params0, allowances, exact, eps, share):
    """The bound of every parameter entry after every step (module doc): each step's gradient
    allowance, grown by the feedback of the previous bound, carried through the optimizer
    from the exact state with the gradients moved by ``+A`` and by ``-A`` (before clipping),
    plus the updates' own roundings."""
    from reports.conformance.properties import _bias_condition

    x, y = _inputs(case), _targets(case)
    runs = {sign: (_exact_params(params0, exact), None) for sign in (1.0, -1.0)}
    travelled = {k: np.zeros(np.shape(v)) for k, v in params0.items()}
    previous = {k: _f(v) for k, v in params0.items()}
    out = []
    t = 0
    for step, allow in zip(ref.steps, allowances):
        if step.get("skipped"):     # float16's loss scale skipped it: nothing moved
            out.append(out[-1] if out else {k: np.zeros(np.shape(v))
                                            for k, v in params0.items()})
            continue
        t += 1
        if out:
            fb = feedback(case, previous, x[step["rows"]], y[step["rows"]], out[-1])
            allow = {k: allow[k] + fb[k] for k in allow}
        dev = None
        for sign, (params, state) in runs.items():
            moved = {k: (g + sign * allow[k] if not exact else
                         g + np.vectorize(mpmath.mpf, otypes=[object])(sign * allow[k]))
                     for k, g in step["grads"].items()}
            moved = clip_exact(moved, ref.clip, case.clip_mode, exact)
            params, state = _spec_step(case.optimizer, params, moved, state, t, case.lr, exact)
            runs[sign] = (params, state)
            d = {k: np.abs(_f(params[k]) - step["params"][k]) for k in params}
            dev = d if dev is None else {k: np.maximum(dev[k], d[k]) for k in d}
        kappa = _bias_condition(case.optimizer, {}, t)
        bound = {}
        for k in params0:
            travelled[k] += (1 + kappa) * np.abs(step["params"][k] - previous[k])
            bound[k] = (2.0 * dev[k] + K_STEP * eps * (t * np.abs(step["params"][k])
                                                       + travelled[k])) * (1 + share)
        previous = step["params"]
        out.append(bound)
    return out


# ---------------------------------------------------------------------------------------------
# the check

def _measure(what, got, exact, bound, scale, eps):
    """A Measure for the worst entry of ``got`` against ``exact`` under per-entry ``bound``."""
    from reports.conformance.oracle import Measure

    got = np.asarray(got)
    exact = np.asarray(exact, np.float64)
    if got.shape != exact.shape:
        return Measure(what, math.inf, 0.0, False,
                       f"{what}: shape {got.shape}, expected {exact.shape}")
    g = got.astype(np.float64)
    if not np.all(np.isfinite(g)):
        i = np.unravel_index(int(np.argmin(np.isfinite(g))), g.shape)
        return Measure(what, math.inf, 0.0, False, f"{what}{list(i)}: {g[i]!r} (not finite)")
    err = np.abs(g - exact)
    bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    ref = np.broadcast_to(np.maximum(np.abs(exact) + scale, 1e-300), err.shape)
    if err.size == 0:
        return Measure(what, 0.0, 0.0, True)
    ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1.0),
                     np.where(err > 0, np.inf, 0.0))
    i = np.unravel_index(int(np.argmax(ratio)), err.shape)
    ok = bool(ratio[i] <= 1.0)
    note = "" if ok else (f"{what}{list(i)}: engine {g[i]!r}, exact {exact[i]!r}, error "
                          f"{err[i]:.3g} > bound {bound[i]:.3g} ({err[i] / max(abs(exact[i]), 1e-300):.3g} "
                          f"relative)")
    return Measure(what, float(err[i] / (eps * ref[i])), float(bound[i] / (eps * ref[i])), ok,
                   note)


class _Recorder:
    """Wraps a model's ``forward`` to record the input rows of each training batch."""

    def __init__(self, model):
        self.model, self.batches = model, []
        self._forward = model.forward

    def __enter__(self):
        def forward(x, *a, **k):
            self.batches.append(np.array(x, copy=True))
            return self._forward(x, *a, **k)
        self.model.forward = forward
        return self

    def __exit__(self, *exc):
        del self.model.forward


def _row_keys(rows):
    """One hashable key per sample (its bytes): batches are compared by content, so data with
    repeated rows (token sequences) is judged by what the model saw."""
    return [np.asarray(r).tobytes() for r in rows]


def _plan(case):
    """The piece plan ``case`` asks for: its own, the "pieces" path's, or None (the
    machine's)."""
    from reports.conformance.training_cases import PIECES_PATH_PLAN

    if case.pieces is not None:
        return case.pieces
    return PIECES_PATH_PLAN if case.path == "pieces" else None


def _train(case, model, x, y, clip, callbacks=()):
    from fastlib import config

    # the "general" path: the general schedule alone (fastlib.config.SCHEDULES)
    before = config.SCHEDULES
    if case.path == "general":
        config.SCHEDULES = ("general",)
    try:
        return _train_call(case, model, x, y, clip, callbacks)
    finally:
        config.SCHEDULES = before


def _train_call(case, model, x, y, clip, callbacks=()):
    import fastlib

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fastlib.train(model, x, y, case.epochs, case.batch_size, case.lr, case.loss,
                             optimizer=case.optimizer, gradient_clip=clip,
                             clip_mode=case.clip_mode, shuffle=case.shuffle, seed=case.seed,
                             verbose=False, fused=case.path != "generic",
                             device="cuda" if case.path == "cuda" else "cpu",
                             **({} if _plan(case) is None else {"pieces": _plan(case)}),
                             # the divergence rules' probe forwards would count as batches in
                             # the order check; they draw no RNG and change no weight
                             divergence=False, callbacks=callbacks, **_precision(case))


def _precision(case):
    """``train``'s precision keywords of ``case`` (none for a run in the model's dtype)."""
    if not case.mixed:
        return {}
    return {"dtype": case.mixed, "loss_scale": case.loss_scale or False}


def _train_inputs(case, dtype):
    """``case.x`` as the run is given it: in the model's dtype (a mixed run rounds it)."""
    x = np.asarray(case.x)
    return x if x.dtype.kind in "iu" else x.astype(dtype)


def check_epochs(case: EpochCase):
    """``fastlib.train`` on ``case`` against the exact replayed run (module doc).

    Returns
    -------
    properties.Result
    """
    import fastlib

    from reports.conformance.properties import Result

    result = Result()
    dtype = np.dtype(case.dtype)
    exact = case.referee == "exact"
    eps = _eps(gradient_format(case))
    model = fastlib.layers.from_config(case.config, dtype=dtype, seed=case.seed)
    if case.moved:
        from reports.conformance.training_cases import moved_parameters

        model.load_parameters(moved_parameters(model.parameters(), case.seed, dtype))
    params0 = {k: v.copy() for k, v in model.parameters().items()}
    x = _train_inputs(case, dtype)
    y = np.asarray(case.y)
    y = y if y.dtype.kind in "iu" else y.astype(dtype)
    n, bs = len(x), min(case.batch_size, len(x))
    try:
        ref = reference_run(case, params0, exact)
    except ValueError as exc:     # mixed_training.Undecided: a case the referee cannot judge
        from reports.conformance.mixed_training import Undecided

        if isinstance(exc, Undecided):
            return result.fail(f"the referee cannot replay this case: {exc}")
        raise
    depth = depth_factor(case, bs)
    # float32 rows: the float64 referee's own admissible error joins the bound
    ref_eps_share = 0.0 if exact else EPS64 / eps

    # 1. the gradient of the first batch of the run
    first = ref.steps[0]
    try:
        with np.errstate(all="ignore"):
            _, grads = fastlib.value_and_grad(model, x[first["rows"]], y[first["rows"]],
                                              case.loss)
    except Exception as exc:
        return result.fail(f"fastlib.value_and_grad raised {type(exc).__name__}: {exc}")
    at_layer = layer_scaled(case.config)
    allowances, bounds_after = run_bounds(case, ref, params0, exact, ref_eps_share)
    scales = tensor_scales(first["grads"], first["condition"][1], at_layer)
    for k, g in first["grads"].items():
        if k not in grads:
            return result.fail(f"gradient: {k!r} missing")
        result.measures.append(_measure(f"gradient {k}", grads[k], _f(g),
                                        allowances[0][k] * (1 + ref_eps_share), scales[k], eps))

    # 2. the run
    try:
        if case.path == "generic":
            # a mixed run feeds its layers one by one: the first one sees the batches
            with _Recorder(model.layers[0] if case.mixed else model) as rec:
                run = _train(case, model, x, y, ref.clip)
        else:
            rec = None
            run = _train(case, model, x, y, ref.clip)
    except Exception as exc:
        return result.fail(f"fastlib.train raised {type(exc).__name__}: {exc}")
    if _plan(case) is not None and run.piece_plan != {"pieces": _plan(case),
                                                      "source": "argument"}:
        result.fail(f"fastlib.train ran piece plan {run.piece_plan}, not {_plan(case)} pieces")
    if case.path == "cuda" and run.path != "cuda":
        result.fail(f"fastlib.train(device='cuda') trained on path {run.path!r}")
    if case.path not in ("generic", "cuda") and not run.fused:
        result.fail(f"fastlib.train did not take a whole-epoch compiled path ({case.label})")
    if case.path == "generic" and run.fused:
        result.fail("fastlib.train(fused=False) took the fused path")
    if case.path == "general" and run.schedule != "general":
        result.fail(f"fastlib.train ran schedule {run.schedule!r}, not the general one")
    if rec is not None:
        _check_order(result, case, ref, rec.batches, bs)
    _check_precision(result, case, ref, run)

    # 3. bounds of the parameters after each step: bounds_after, above

    # 4. the loss of every epoch
    per_epoch = -(-n // bs)
    zero = {k: np.zeros(np.shape(v)) for k, v in params0.items()}
    for e in range(min(case.epochs, len(run.loss_history) or case.epochs)):
        allowed = 0.0
        for j in range(per_epoch):
            s = e * per_epoch + j
            step = ref.steps[s]
            before = zero if s == 0 else bounds_after[s - 1]
            drift = sum(float(np.sum(np.abs(_f(step["grads"][k])) * before[k])) for k in before)
            allowed += len(step["rows"]) / n * (
                K_GRAD * eps * depth * abs(step["loss"]) + drift
                + K_ORDER * step.get("loss_radius", 0.0))
        got = run.loss_history[e] if e < len(run.loss_history) else math.nan
        result.measures.append(_measure(f"loss epoch {e + 1}", np.array(got),
                                        np.array(ref.epoch_losses[e]),
                                        allowed * (1 + ref_eps_share), 0.0, eps))
    if len(run.loss_history) != case.epochs:
        result.fail(f"fastlib.train ran {len(run.loss_history)} epochs of {case.epochs}")

    # 5. every parameter after the run
    final = model.parameters()
    last_scale = tensor_scales({k: _f(v) for k, v in ref.params.items()})
    for k in params0:
        result.measures.append(_measure(f"{k} after {len(ref.steps)} steps", final[k],
                                        ref.steps[-1]["params"][k], bounds_after[-1][k],
                                        last_scale[k], eps))
    return result


def _check_precision(result, case, ref, run):
    """A mixed run says its format; a loss-scaled one skipped the replay's steps and ends at
    its scale."""
    if run.precision != case.mixed:
        result.fail(f"fastlib.train reports precision {run.precision!r}, not {case.mixed!r}")
    if ref.scale is not None and (run.loss_scale_skips, run.loss_scale) != (
            ref.scale.skips, ref.scale.scale):
        result.fail(f"loss scale: fastlib skipped {run.loss_scale_skips} step(s) and ended at "
                    f"scale {run.loss_scale!r}; the replay skips {ref.scale.skips} and ends at "
                    f"{ref.scale.scale!r}")


def _check_order(result, case, ref, batches, bs):
    """Every sample exactly once per epoch, in the documented order, batches of ``bs``."""
    from collections import Counter

    x = np.asarray(case.x)
    x = x if x.dtype.kind in "iu" else x.astype(case.dtype)
    if case.mixed:
        from fastlib.training.mixed_precision import round_inputs

        x = round_inputs(x, case.mixed)
    n = len(x)
    per_epoch = -(-n // bs)
    seen = [_row_keys(b) for b in batches]
    expected = [_row_keys(x[o[s:s + bs]]) for o in ref.orders for s in range(0, n, bs)]
    if len(seen) != len(expected):
        result.fail(f"order: the model saw {len(seen)} training batches, expected "
                    f"{len(expected)} ({case.epochs} epochs of {per_epoch}, the last of each "
                    f"epoch {n - (per_epoch - 1) * bs} rows)")
        return
    everyone = Counter(_row_keys(x))
    for e in range(case.epochs):
        got = Counter(k for b in seen[e * per_epoch:(e + 1) * per_epoch] for k in b)
        if got != everyone:
            index = {k: i for i, k in enumerate(_row_keys(x))}
            missed = sorted(index[k] for k in everyone if got[k] < everyone[k])
            repeated = sorted(index.get(k, -1) for k in got if got[k] > everyone.get(k, 0))
            result.fail(f"order: epoch {e + 1} did not see every sample once (missed "
                        f"{missed}, repeated {repeated})")
            return
    if seen != expected:
        result.fail("order: the batches are not numpy.random.default_rng(seed).permutation's "
                    "order" if case.shuffle else "order: without shuffling the batches must be "
                    "the rows in order")


# ---------------------------------------------------------------------------------------------
# the single-step API kept for callers of the former check (a ModelCase, one epoch)

def check_train_step(case, optimizer, lr, steps=2, require_fused=False):
    """A ``strategies.ModelCase`` trained for one epoch of ``steps`` batches (no shuffling),
    through :func:`check_epochs`; ``require_fused`` asks for the fused path (plain MLPs),
    whole and cut into pieces."""
    from reports.conformance.properties import Result

    x, y = np.asarray(case.x), np.asarray(case.y)
    xs, ys = [x], [y]
    for k in range(1, steps):
        if x.dtype.kind in "iu":
            xs.append((xs[-1][::-1] + k) % case.config["layers"][0]["num"])
        else:
            xs.append(0.25 - 0.5 * xs[-1][::-1])
        ys.append(ys[-1][::-1].copy())
    base = EpochCase(case.config, np.concatenate(xs), np.concatenate(ys), case.loss, case.seed,
                     "float64", optimizer, lr, len(x), 1, False,
                     path="fused" if require_fused else "generic")
    out = Result()
    from dataclasses import replace as _replace

    for c in ([base, base.with_(path="pieces")] if require_fused else [base]):
        r = check_epochs(c)
        out.notes += [f"({c.path}) {n}" for n in r.notes]
        out.measures += [m if c.path != "pieces" else _replace(m, what=f"{m.what} (in pieces)")
                         for m in r.measures]
    return out


# ---------------------------------------------------------------------------------------------
# the rows

def reproduction(case):
    """Python that rebuilds ``case`` and runs the check again (pastes and runs as printed)."""
    from reports.conformance.repro import literal

    fields = ", ".join(f"{k}={literal(getattr(case, k))}" for k in (
        "config", "x", "y", "loss", "seed", "dtype", "optimizer", "lr", "batch_size", "epochs",
        "shuffle", "clip", "clip_mode", "path", "label", "referee", "moved", "mixed",
        "loss_scale"))
    return ("import numpy as np\nfrom reports.conformance.training_cases import EpochCase\n"
            "from reports.conformance.training_rows import check_epochs\n"
            f"case = EpochCase({fields})\nresult = check_epochs(case)\nprint(result)\n"
            "for m in result.measures:\n    print(m)\n")


def train_rows(kinds):
    """The rows of the ``train`` check (``runner.Row`` objects, engine fastlib)."""
    from hypothesis import strategies as st

    from reports.conformance import training_cases as tc
    from reports.conformance.rows import Row, run_cases, run_property

    def row(name, dtype, strategy):
        def run(profile, seed):
            n = EXAMPLES.get(profile.name, profile.train)
            return run_property(strategy(), check_epochs, n, seed, reproduction)
        return Row("train", name, "fastlib", dtype, run)

    def fixed(dtype, name="boundaries", cases=tc.boundary_cases):
        def run(profile, seed):
            return run_cases(cases(dtype), check_epochs, lambda i, case: reproduction(case))
        return Row("train", name, "fastlib", dtype, run)

    rows = [row(kind, "float64", lambda kind=kind: tc.epoch_cases(kind)) for kind in kinds]
    rows.append(row("fused MLP", "float64", lambda: st.sampled_from(["fused", "pieces"]).flatmap(
        lambda p: tc.fused_cases("float64", p))))
    rows.append(row("compiled recurrent", "float64", lambda: tc.recurrent_cases("float64")))
    rows.append(row("compiled attention", "float64", lambda: tc.attention_cases("float64")))
    rows.append(fixed("float64"))
    rows.append(row("compiled recurrent", "float32", lambda: tc.recurrent_cases("float32")))
    rows.append(row("fused MLP", "float32", lambda: st.sampled_from(["fused", "pieces"]).flatmap(
        lambda p: tc.fused_cases("float32", p))))
    rows.append(row("generic", "float32", lambda: st.sampled_from(list(kinds)).flatmap(
        lambda k: tc.epoch_cases(k, "float32"))))
    rows.append(row("compiled attention", "float32", lambda: tc.attention_cases("float32")))
    rows.append(fixed("float32"))
    for dtype in ("float64", "float32"):
        rows.append(fixed(dtype, "kinked Dense", tc.kinked_cases))
    for fmt in ("bfloat16", "float16"):
        rows.append(row("mixed MLP", fmt, lambda fmt=fmt: tc.mixed_cases(fmt)))
    rows.append(Row("train", "loss scale", "fastlib", "float16", lambda profile, seed: run_cases(
        tc.loss_scale_cases(), check_epochs, lambda i, case: reproduction(case))))
    from reports.conformance.layer_sums import bias_sum_rows
    return rows + bias_sum_rows()
