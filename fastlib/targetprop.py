"""Target Propagation: Loom's alternative to back-propagation, with the rules of spec.targetprop.

Each layer gets a *target* (what it should have produced) instead of a gradient; each layer
then moves its own output toward its target with a local update, gated and scaled by how well
its output and target agree (the link budget).

Usage (as Loom's) and the long story: docs/fastlib-training.md, section ``fastlib/targetprop.py``.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import fields

import numpy as np

from optable.targetprop import (LOSS_TYPES, NORMALISATIONS, TargetPropConfig,  # noqa: F401
                                check_apply, check_fresh, check_loss_type,
                                flatten_layers)
from fastlib.kernels import dense as dense_kernels
from fastlib.kernels import targetprop as kernels
from fastlib.layers.attention import MultiHeadAttention
from fastlib.layers.base import Layer
from fastlib.layers.dense import Dense
from fastlib.layers.recurrent import LSTM, RNN
from fastlib.layers.swiglu import SwiGLU
from fastlib.training.algorithms import BatchResult, correct_count, register_algorithm

__all__ = ["TargetPropConfig", "TargetPropState", "targetprop_forward", "targetprop_backward",
           "apply_targetprop_gaps", "output_target", "pure_target", "route", "flatten",
           "targetprop_train_one_batch"]

SUPPORTED = (Dense, RNN, LSTM, MultiHeadAttention, SwiGLU)


def flatten(model):
    """``[(prefix, depth, layer)]``: the leaf layers in forward order (Sequential flattened).

    Raises
    ------
    TypeError
        ``model`` is not a fastlib layer.
    ValueError
        A layer TargetProp does not train (Parallel, norms, Embedding, Softmax, RBM).
    """
    if not isinstance(model, Layer):
        raise TypeError(f"TargetProp needs a fastlib model, got {type(model).__name__}")
    return flatten_layers(model, lambda layer: type(layer).__name__, lambda seq: seq.layers)


class TargetPropState:
    """What TargetProp knows about one batch (Loom's TargetPropState), per layer ℓ.

    Parameters
    ----------
    model : fastlib model
        Dense, RNN, LSTM, MultiHeadAttention, SwiGLU, or a (nested) Sequential of them.
    config : TargetPropConfig, optional
    velocities : dict, optional
        Momentum state to continue from (keyed by parameter name; arrays are used in place).

    Attributes
    ----------
    forward_acts : list of ndarray
        y_ℓ, what each layer produced (``targetprop_forward``).
    layer_inputs : list of ndarray
        x_ℓ, what each layer received.
    backward_targets : list of ndarray
        t_ℓ, what each layer should have produced (``targetprop_backward``).
    gradients : list of ndarray
        Chain-rule mode: the chained signal at y_ℓ (t − y at the last layer); pure mode:
        t_ℓ − y_ℓ.
    input_target : ndarray or None
        Target of the model's input, when ``targetprop_backward(..., input_target=True)``.
    link_budgets, gaps : list of float
        Per layer, from :meth:`calculate_link_budgets` (float64).
    updated, layer_rates : list
        Per layer, whether the last apply updated it and at which rate (0 when gated).
    velocities : dict of ndarray
        Momentum state, keyed like ``model.parameters()``.
    config : TargetPropConfig
    """

    def __init__(self, model, config=None, velocities=None):
        self.config = TargetPropConfig() if config is None else config
        if not isinstance(self.config, TargetPropConfig):
            raise TypeError(f"config must be a TargetPropConfig, got {type(self.config).__name__}")
        self.layers = flatten(model)
        _check_update(self.layers, self.config.update)
        params = model.parameters()
        self.velocities = {}
        for name, p in params.items():
            given = None if velocities is None else velocities.get(name)
            if given is not None and (given.shape != p.shape or given.dtype != p.dtype):
                raise ValueError(f"velocity {name!r} has shape {given.shape} and dtype "
                                 f"{given.dtype}; the parameter has {p.shape}, {p.dtype}")
            self.velocities[name] = np.zeros_like(p) if given is None else given
        self.forward_acts, self.layer_inputs = [], []
        self.backward_targets, self.gradients = [], []
        self.link_budgets, self.gaps, self.updated, self.layer_rates = [], [], [], []
        self.input_target = None
        self.applied = False   # True after apply: the forward history is then stale

    def calculate_link_budgets(self):
        """Fill ``link_budgets`` and ``gaps`` (float64) from the acts and targets; return the
        budgets. A budget is (cos(y, t) + 1)/2 over all entries, 0 when either norm is 0."""
        if not self.forward_acts or len(self.backward_targets) != len(self.forward_acts):
            raise RuntimeError("calculate_link_budgets needs targetprop_forward and "
                               "targetprop_backward first")
        self.link_budgets, self.gaps = [], []
        for y, t in zip(self.forward_acts, self.backward_targets):
            b, g = kernels.budget_and_gap(np.ascontiguousarray(y).reshape(-1),
                                          np.ascontiguousarray(t).reshape(-1))
            self.link_budgets.append(float(b))
            self.gaps.append(float(g))
        return list(self.link_budgets)


def _check_update(layers, update):
    """``update="loom"`` is Loom's Dense rule: refuse a model with another layer type."""
    if update != "loom":
        return
    for prefix, _, layer in layers:
        if not isinstance(layer, Dense):
            where = prefix.rstrip(".") or "the model"
            raise ValueError(f"TargetProp: update='loom' (Loom's delta = lr·input·gap) is a "
                             f"Dense rule; layer {type(layer).__name__!r} at {where!r} has none: "
                             "use update='gradient' for this model")


def _check_state(model, state):
    if not isinstance(state, TargetPropState):
        raise TypeError(f"state must be a TargetPropState, got {type(state).__name__}")
    layers = flatten(model)
    if [id(l) for _, _, l in layers] != [id(l) for _, _, l in state.layers]:
        raise ValueError("this TargetPropState was built for another model; make "
                         "TargetPropState(model) for this one")


# ---------------------------------------------------------------------------------------------
# forward and backward

def targetprop_forward(model, state, x):
    """Run the model layer by layer, recording each layer's input and output.

    Parameters
    ----------
    model : fastlib model
    state : TargetPropState
    x : array_like
        The input batch (validated: dtype, NaN/Inf, shapes).

    Returns
    -------
    ndarray
        The model's output.
    """
    _check_state(model, state)
    return _forward(state, model.check_input(x))


def _forward(state, cur):
    state.forward_acts, state.layer_inputs = [], []
    state.backward_targets, state.gradients, state.input_target = [], [], None
    state.link_budgets, state.gaps, state.applied = [], [], False
    for _, _, layer in state.layers:
        state.layer_inputs.append(cur)
        cur = layer.forward(cur)
        state.forward_acts.append(cur)
    return cur


def targetprop_backward(model, state, target, input_target=False):
    """Every layer's target, from the last layer to the first.

    Parameters
    ----------
    model : fastlib model
    state : TargetPropState
        After ``targetprop_forward``.
    target : array_like
        The output layer's target, shaped like the output (``output_target`` makes it from
        labels). It becomes ``backward_targets[-1]``.
    input_target : bool, default False
        Also compute ``state.input_target``, the target of the model's input.

    Returns
    -------
    list of ndarray
        ``state.backward_targets``.
    """
    _check_state(model, state)
    if not state.forward_acts:
        raise RuntimeError("targetprop_backward needs targetprop_forward first")
    check_fresh(state)
    y_last = state.forward_acts[-1]
    t = np.asarray(target)
    if t.dtype.kind not in "fiu":
        raise TypeError(f"target must be a real array, got dtype {t.dtype}")
    if t.shape != y_last.shape:
        raise ValueError(f"target has shape {t.shape} but the model's output has "
                         f"{y_last.shape}; pass a target shaped like the output")
    if not np.all(np.isfinite(t)):
        raise ValueError("target holds NaN or Inf; it must be finite")
    _backward(state, np.ascontiguousarray(t, dtype=y_last.dtype), input_target)
    return state.backward_targets


def _backward(state, t, input_target):
    cfg = state.config
    L = len(state.layers)
    targets, gradients = [None] * L, [None] * L
    targets[-1], gradients[-1] = t, t - state.forward_acts[-1]
    for l in range(L - 1, -1 if input_target else 0, -1):
        _, _, layer = state.layers[l]
        x, y = state.layer_inputs[l], state.forward_acts[l]
        if cfg.use_chain_rule:
            g_in, _ = layer.backward(gradients[l], need_input_grad=True)
            t_in = x + x.dtype.type(cfg.gradient_scale) * g_in
        else:
            t_in = pure_target(layer, x, y, targets[l], cfg.weight_threshold, cfg.normalisation)
            g_in = t_in - x
        if l > 0:
            targets[l - 1], gradients[l - 1] = t_in, g_in
        else:
            state.input_target = t_in
    state.backward_targets, state.gradients = targets, gradients


# ---------------------------------------------------------------------------------------------
# pure mode

def route(W, v, threshold, normalisation="row"):
    """N(W, v): ``v (..., out)`` routed back through ``W (in, out)`` to ``(..., in)``.

    ``"row"`` (Loom's engine): ``N(W, v)[..., i] = Σ_j W[i, j] v[..., j] / Σ_j |W[i, j]|``
    when that denominator exceeds ``threshold``, else 0. ``"column"`` (Loom's document):
    ``N(W, v)[..., i] = Σ_j W[i, j] v[..., j] / Σ_k |W[k, j]|`` over the columns whose
    denominator exceeds ``threshold``.
    """
    W = np.ascontiguousarray(W)
    v = np.asarray(v, dtype=W.dtype)
    if v.shape[-1] != W.shape[1]:
        raise ValueError(f"route: v has {v.shape[-1]} entries on its last axis but W routes "
                         f"{W.shape[1]} outputs (W shape {W.shape})")
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"route: normalisation must be 'row' or 'column', got {normalisation!r}")
    if normalisation == "column":
        # each output's entry shared out over its inputs: scale v's columns, then route
        scales = np.empty(W.shape[1], dtype=np.float64)
        kernels.route_scales(np.ascontiguousarray(W.T), float(threshold), scales)
        rows = np.ascontiguousarray(v.reshape(-1, W.shape[1]))
        shared = np.empty_like(rows)
        kernels.scale_columns(rows, scales, shared)
        return np.dot(shared, W.T).reshape(v.shape[:-1] + (W.shape[0],))
    scales = np.empty(W.shape[0], dtype=np.float64)
    kernels.route_scales(W, float(threshold), scales)
    num = np.dot(v.reshape(-1, W.shape[1]), W.T)
    out = np.empty_like(num)
    kernels.scale_columns(num, scales, out)
    return out.reshape(v.shape[:-1] + (W.shape[0],))


def _tile(d, gates):
    return np.concatenate([d] * gates, axis=-1) if gates > 1 else d


def _recurrent_target(layer, x, y, t_out, threshold, gates, normalisation):
    p = layer.parameters()
    batch, steps, _ = x.shape
    e = t_out - y
    gaps = e if layer.return_sequences else None
    D = np.empty((batch, steps, layer.hidden_size), dtype=x.dtype)
    D[:, -1] = gaps[:, -1] if gaps is not None else e
    for t in range(steps - 2, -1, -1):
        back = route(p["w_hh"], _tile(D[:, t + 1], gates), threshold, normalisation)
        D[:, t] = back if gaps is None else gaps[:, t] + back
    # every step's route through w_ih at once: (B*T, gates*H) @ w_ihᵀ
    return x + route(p["w_ih"], _tile(D, gates), threshold, normalisation)


def _attention_target(layer, x, y, t_out, threshold, normalisation):
    p = layer.parameters()
    q, k, _, lse, scale = layer._cache
    dA = np.ascontiguousarray(route(p["w_o"], t_out - y, threshold, normalisation))
    dV = np.empty_like(dA)
    kernels.attention_value_route(q, k, lse, dA, layer.heads, float(scale), layer.causal,
                                  float(threshold), normalisation == "column", dV)
    return x + route(p["w_v"], dV, threshold, normalisation)


def _swiglu_target(layer, x, y, t_out, threshold, normalisation):
    p = layer.parameters()
    dH = route(p["w_down"], t_out - y, threshold, normalisation)
    both = np.concatenate([p["w_gate"], p["w_up"]], axis=1)
    return x + route(both, np.concatenate([dH, dH], axis=-1), threshold, normalisation)


def pure_target(layer, x, y, t_out, threshold=0.01, normalisation="row"):
    """The pure-mode target of ``layer``'s input, from its last forward (spec's ``pure_*``).

    - Dense: ``N(W, t_out)`` (Loom's engine, exactly);
    - RNN: with E_t the output gap t_out − y at step t (0 at steps not returned),
      D_{T−1} = E_{T−1}, D_t = E_t + N(w_hh, D_{t+1}); t_in[:, t] = x[:, t] + N(w_ih, D_t);
    - LSTM: the same with each gap tiled over the four gates (one normalisation over 4H);
    - MultiHeadAttention: δA = N(w_o, t_out − y); per head δV[s] = Σ_t P[t,s] δA[t] / Σ_t P[t,s]
      (if > threshold); t_in = x + N(w_v, δV);
    - SwiGLU: δH = N(w_down, t_out − y); t_in = x + N([w_gate | w_up], [δH | δH]).

    N normalises per input row (``normalisation="row"``) or per output column (``"column"``;
    the attention probabilities' route then divides by each query's Σ_s P[t,s]).
    ``x`` and ``y`` must be the input and output of the layer's last forward.
    """
    if isinstance(layer, Dense):
        return route(layer.parameters()["weight"], t_out, threshold, normalisation)
    if isinstance(layer, RNN):
        return _recurrent_target(layer, x, y, t_out, threshold, 1, normalisation)
    if isinstance(layer, LSTM):
        return _recurrent_target(layer, x, y, t_out, threshold, 4, normalisation)
    if isinstance(layer, MultiHeadAttention):
        return _attention_target(layer, x, y, t_out, threshold, normalisation)
    if isinstance(layer, SwiGLU):
        return _swiglu_target(layer, x, y, t_out, threshold, normalisation)
    raise ValueError(f"pure_target: {type(layer).__name__} has no pure TargetProp rule")


# ---------------------------------------------------------------------------------------------
# the update

def apply_targetprop_gaps(model, state, lr):
    """Update each layer that passes the gate: its rate, momentum, and parameters (in place).

    For layer ℓ with link budget b >= budget_threshold: r = lr·(0.5 + 0.5 b)·F^ℓ, and for each
    of its parameters v ← μ v + (1 − μ)·r·d_θ, θ ← θ + v, where d_θ = J_θᵀ(t_ℓ − y_ℓ)/B comes
    from the layer's own backward of its gap (``update="gradient"``), or is Loom's Dense delta
    d_W = xᵀ(t_ℓ − y_ℓ)/B, d_b = Σ(t_ℓ − y_ℓ)/B (``update="loom"``). A gated layer (b < threshold, or a non-finite b)
    keeps its parameters and velocities. Link budgets are computed first when missing.

    Returns
    -------
    list of bool
        ``state.updated``.
    """
    _check_state(model, state)
    check_apply(state, lr)
    if len(state.backward_targets) != len(state.layers) or state.backward_targets[0] is None:
        raise RuntimeError("apply_targetprop_gaps needs targetprop_backward first")
    if len(state.link_budgets) != len(state.layers):
        state.calculate_link_budgets()
    cfg = state.config
    params = model.parameters()
    state.updated, state.layer_rates = [], []
    for (prefix, depth, layer), budget, x, y, t in zip(state.layers, state.link_budgets,
                                                        state.layer_inputs, state.forward_acts,
                                                        state.backward_targets):
        ok = budget >= cfg.budget_threshold  # NOTE: a NaN budget fails this and gates the layer
        state.updated.append(bool(ok))
        if not ok:
            state.layer_rates.append(0.0)
            continue
        rate = float(lr) * (0.5 + 0.5 * budget) * cfg.depth_scale_factor ** depth
        state.layer_rates.append(rate)
        gap = np.ascontiguousarray(t - y)
        if cfg.update == "loom":
            grads = _loom_delta(layer, x, gap)
        else:
            _, grads = layer.backward(gap, need_input_grad=False)
        coef = rate / y.shape[0]
        for name, g in grads.items():
            key = prefix + name
            kernels.momentum_step(_flat(params[key], key), _flat(state.velocities[key], key),
                                  np.ascontiguousarray(g).reshape(-1), coef, cfg.momentum)
    state.applied = True
    return list(state.updated)


def _loom_delta(layer, x, gap):
    """Loom's Dense delta before the rate and the 1/B: ``{weight: xᵀ gap, bias: Σ gap}``
    over every leading axis (no activation derivative)."""
    x2 = np.ascontiguousarray(x).reshape(-1, layer.in_features)
    g2 = np.ascontiguousarray(gap).reshape(-1, layer.out_features)
    bias = np.empty(layer.out_features, dtype=g2.dtype)
    dense_kernels.column_sums(g2, bias)       # the Dense backward's own bias sum
    return {"weight": np.dot(x2.T, g2), "bias": bias}


def _flat(arr, name):
    """A flat view of ``arr`` that writes through (the kernel updates it in place)."""
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError(f"{name!r} must be a writable C-contiguous array to be updated in "
                         "place; load values with model.load_parameters instead of replacing "
                         "the arrays")
    return arr.reshape(-1)


def output_target(loss_type, pred, y):
    """The output layer's target from labels (spec's ``output_target`` rule).

    ``mse`` and ``binary_cross_entropy``: ``y`` itself; ``cross_entropy`` (class indices
    ``(N,)`` or ``(N, 1)``) and ``categorical_cross_entropy``: ``pred + onehot(y) −
    softmax(pred)``; ``binary_cross_entropy_with_logits``: ``pred + y − sigmoid(pred)``. Each
    target − pred is a descent direction of the loss (its negative gradient times N, for the
    softmax/sigmoid losses).
    """
    from fastlib.ops import forward

    check_loss_type(loss_type)
    pred = np.asarray(pred)
    if loss_type == "cross_entropy":
        idx = np.asarray(y).reshape(-1).astype(np.int64)
        yy = np.zeros_like(pred)
        yy[np.arange(pred.shape[0]), idx] = 1
    else:
        yy = np.asarray(y, dtype=pred.dtype)
        if yy.shape != pred.shape:
            raise ValueError(f"output_target: y has shape {yy.shape}, pred {pred.shape}")
    if loss_type in ("mse", "binary_cross_entropy"):
        return np.ascontiguousarray(yy)
    if loss_type == "binary_cross_entropy_with_logits":
        return pred + (yy - forward("sigmoid", [pred]))
    return pred + (yy - forward("softmax", [pred], axis=-1))


# ---------------------------------------------------------------------------------------------
# train(..., algorithm="targetprop")

_VELOCITY = "targetprop_velocity/"


def _config_from(extra):
    options = dict(extra)
    given = options.pop("targetprop_config", None)
    names = [f.name for f in fields(TargetPropConfig)]
    for key in options:
        if key not in names:
            close = difflib.get_close_matches(key, names + ["targetprop_config"], n=2)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise ValueError(f"train(algorithm='targetprop'): unknown option {key!r}{hint}; "
                             f"options: targetprop_config or {', '.join(names)}")
    if given is not None and not isinstance(given, TargetPropConfig):
        raise TypeError(f"targetprop_config must be a TargetPropConfig, got "
                        f"{type(given).__name__}")
    base = given or TargetPropConfig()
    return TargetPropConfig(**{n: options.get(n, getattr(base, n)) for n in names})


def _run_state(ctx):
    """The run's TargetPropState, its velocities kept in ``ctx.state`` (checkpointed)."""
    state = ctx.scratch.get("targetprop")
    if state is None:
        velocities = {}
        for name, p in ctx.params.items():
            saved = ctx.state.get(_VELOCITY + name)
            velocities[name] = (np.zeros_like(p) if saved is None
                                else np.ascontiguousarray(saved, dtype=p.dtype))
            ctx.state[_VELOCITY + name] = velocities[name]
        state = TargetPropState(ctx.model, _config_from(ctx.config.extra), velocities)
        ctx.scratch["targetprop"] = state
    return state


def targetprop_train_one_batch(ctx, x, y):
    """One TargetProp step: forward, loss (for the record), targets, budgets, gated update.

    The optimizer and gradient clipping of ``train`` are not used: TargetProp's update is its
    own (depth-scaled, gated, with momentum).
    """
    from fastlib import losses

    state = _run_state(ctx)
    pred = _forward(state, x)
    loss = float(losses.loss_value(ctx.loss_type, pred, y, check=False))
    correct = correct_count(ctx.loss_type, pred, y)
    if not math.isfinite(loss):
        return BatchResult(loss, correct, False)
    _backward(state, np.ascontiguousarray(output_target(ctx.loss_type, pred, y),
                                          dtype=pred.dtype), False)
    state.calculate_link_budgets()
    apply_targetprop_gaps(ctx.model, state, ctx.lr)
    return BatchResult(loss, correct, False)


def _init(ctx):
    _run_state(ctx)


# its options declared, so train() takes every field by name (a field close to one of train's
# own keywords, gradient_scale to gradient_clip, was refused as a misspelling)
register_algorithm("targetprop", targetprop_train_one_batch, init=_init, overwrite=True,
                   options=("targetprop_config",) + tuple(f.name for f in fields(
                       TargetPropConfig)))
