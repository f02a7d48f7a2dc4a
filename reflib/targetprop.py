"""Reference Target Propagation: the steps of ``fastlib.targetprop``, slow and exact.

The rules are those of ``spec.targetprop`` (its module docstring has the table); this module
implements them independently: each layer is traced on its own ``reflib.Tape`` (float64, or
exact mpmath with ``dps``), so the chain-rule signal ``J_xᵀ g`` and the local update
``J_θᵀ (t − y) / B`` come from the registry ops' VJPs, and the pure-mode routes are written out
with NumPy (object arrays of mpf when exact).

Usage (Loom's pattern) and the long story: docs/reflib.md, section ``reflib/targetprop.py``.
"""
from __future__ import annotations

import numpy as np

from optable.targetprop import (LOSS_TYPES, SUPPORTED_LAYERS, TargetPropConfig,  # noqa: F401
                                check_apply, check_fresh, check_loss_type,
                                flatten_layers)
from reflib import ops
from reflib.models.base import Layer, input_array
from reflib.numeric import numeric_for
from reflib.tape import Tape

__all__ = ["TargetPropConfig", "TargetPropState", "targetprop_forward", "targetprop_backward",
           "apply_targetprop_gaps", "output_target", "flatten", "route"]

SUPPORTED = SUPPORTED_LAYERS


def flatten(model):
    """``[(prefix, depth, layer)]``: the leaf layers in forward order (Sequential flattened).

    Raises
    ------
    ValueError
        A layer TargetProp does not train (Parallel, norms, Embedding, Softmax).
    """
    if not isinstance(model, Layer):
        raise TypeError(f"reflib TargetProp needs a reflib model, got {type(model).__name__}; "
                        "use reflib.models.twin(model) for a fastlib model")
    return flatten_layers(model, lambda layer: type(layer).__name__, lambda seq: seq.layers)


class TargetPropState:
    """What TargetProp knows about one batch (Loom's TargetPropState), per layer ℓ.

    Attributes
    ----------
    forward_acts : list
        y_ℓ, what layer ℓ produced (``targetprop_forward``).
    layer_inputs : list
        x_ℓ, what layer ℓ received.
    backward_targets : list
        t_ℓ, what it should have produced (``targetprop_backward``).
    gradients : list
        Chain-rule mode: the chained signal at y_ℓ (``target − y`` at the last layer); pure
        mode: t_ℓ − y_ℓ.
    input_target : ndarray or None
        The target of the model's input, when asked for.
    link_budgets, gaps : list of float
        (cos(y_ℓ, t_ℓ) + 1)/2 and RMS(y_ℓ − t_ℓ), in float64 (``calculate_link_budgets``).
    updated, layer_rates : list
        Whether each layer passed the gate, and its rate (0 when gated), from the last apply.
    velocities : dict
        Momentum state keyed by dotted parameter name (zeros at first).
    config : TargetPropConfig
    dps : int or None
        None: float64; an int: exact mpmath arithmetic.
    """

    def __init__(self, model, config=None, dps=None):
        self.config = TargetPropConfig() if config is None else config
        if not isinstance(self.config, TargetPropConfig):
            raise TypeError(f"config must be a reflib TargetPropConfig, got "
                            f"{type(self.config).__name__}")
        self.num = numeric_for(dps)
        self.dps = self.num.dps
        self.layers = flatten(model)
        if self.config.update == "loom":
            for prefix, _, layer in self.layers:
                if type(layer).__name__ != "Dense":
                    raise ValueError(f"TargetProp: update='loom' (Loom's delta = lr·input·gap) "
                                     f"is a Dense rule; layer {type(layer).__name__!r} at "
                                     f"{prefix.rstrip('.') or 'the model'!r} has none: use "
                                     "update='gradient' for this model")
        self.velocities = {name: self.num.zeros(np.shape(v))
                           for name, v in model.parameters().items()}
        self.forward_acts, self.layer_inputs = [], []
        self.backward_targets, self.gradients = [], []
        self.link_budgets, self.gaps, self.updated, self.layer_rates = [], [], [], []
        self.input_target = None
        self.applied = False   # True after apply: the forward history is then stale
        self._tapes = []

    def calculate_link_budgets(self):
        """Fill ``link_budgets`` and ``gaps`` from the acts and targets; return the budgets.

        NOTE: computed in float64 (exact when ``dps`` is set, then rounded once), and 0 when
        either vector has norm 0.
        """
        if len(self.backward_targets) != len(self.forward_acts) or not self.forward_acts:
            raise RuntimeError("calculate_link_budgets needs targetprop_forward and "
                               "targetprop_backward first")
        self.link_budgets, self.gaps = [], []
        with self.num.context():
            for y, t in zip(self.forward_acts, self.backward_targets):
                self.link_budgets.append(link_budget(self.num, y, t))
                self.gaps.append(rms_gap(self.num, y, t))
        return list(self.link_budgets)


def link_budget(num, y, t):
    """(cos(y, t) + 1) / 2 as a float (0 when a norm is 0)."""
    a, b = np.asarray(y).reshape(-1), np.asarray(t).reshape(-1)
    dot, na, nb = np.sum(a * b), np.sum(a * a), np.sum(b * b)
    if na == 0 or nb == 0:
        return 0.0
    cos = dot / (num.sqrt(np.asarray(na)) * num.sqrt(np.asarray(nb)))
    return float(min(1.0, max(0.0, float((cos + 1) / 2))))


def rms_gap(num, y, t):
    """sqrt(mean((y − t)²)) as a float."""
    d = (np.asarray(y) - np.asarray(t)).reshape(-1)
    return float(num.sqrt(np.asarray(np.sum(d * d) / d.size)))


# ---------------------------------------------------------------------------------------------
# forward, backward

def targetprop_forward(model, state, x):
    """Run the model layer by layer, each on its own tape; record inputs and outputs.

    Returns
    -------
    ndarray
        The model's output (float64, or object array of mpf when exact).
    """
    _check_state(model, state)
    cur = input_array(x, "targetprop_forward")
    state.forward_acts, state.layer_inputs, state._tapes = [], [], []
    state.backward_targets, state.gradients, state.input_target = [], [], None
    state.link_budgets, state.gaps, state.applied = [], [], False
    for _, _, layer in state.layers:
        tape = Tape(dps=state.dps)
        x_id = tape.leaf(cur, requires_grad=True)
        ids = layer.attach(tape, requires_grad=True)
        out = layer.trace(tape, x_id, ids)
        state.layer_inputs.append(tape.value(x_id))
        cur = tape.value(out)
        state.forward_acts.append(cur)
        state._tapes.append((tape, x_id, ids, out))
    return cur


def _check_state(model, state):
    if not isinstance(state, TargetPropState):
        raise TypeError(f"state must be a reflib TargetPropState, got {type(state).__name__}")
    layers = flatten(model)
    if [id(l) for _, _, l in layers] != [id(l) for _, _, l in state.layers]:
        raise ValueError("this state was built for another model; make TargetPropState(model)")


def _vjp(tape, out, seed, node, num):
    grads = tape.backward(out, np.asarray(seed))
    value = grads.get(node)
    return num.zeros(np.shape(tape.value(node))) if value is None else value


def targetprop_backward(model, state, target, input_target=False):
    """Every layer's target, last to first (chain-rule or pure mode, by ``state.config``).

    Parameters
    ----------
    target : array_like
        The output layer's target (shape of the model's output).
    input_target : bool
        Also compute ``state.input_target``, the target of the model's input.
    """
    _check_state(model, state)
    if not state.forward_acts:
        raise RuntimeError("targetprop_backward needs targetprop_forward first")
    check_fresh(state)
    cfg, num = state.config, state.num
    y_last = state.forward_acts[-1]
    with num.context():
        t = num.asarray(target, "target")
        if t.shape != np.shape(y_last):
            raise ValueError(f"target has shape {t.shape} but the model's output has "
                             f"{np.shape(y_last)}; pass a target shaped like the output")
        if not np.all(num.isfinite(t)):
            raise ValueError("target holds NaN or Inf")
        L = len(state.layers)
        targets, gradients = [None] * L, [None] * L
        targets[-1], gradients[-1] = t, t - y_last
        scale = num.const(cfg.gradient_scale)
        threshold = num.const(cfg.weight_threshold)
        for l in range(L - 1, -1 if input_target else 0, -1):
            x, y = state.layer_inputs[l], state.forward_acts[l]
            if cfg.use_chain_rule:
                tape, x_id, _, out = state._tapes[l]
                g_in = _vjp(tape, out, gradients[l], x_id, num)
                t_in = x + scale * g_in
            else:
                _, _, layer = state.layers[l]
                t_in = pure_target(layer, x, y, targets[l], threshold, num, cfg.normalisation)
                g_in = t_in - x
            if l > 0:
                targets[l - 1], gradients[l - 1] = t_in, g_in
            else:
                state.input_target = t_in
    state.backward_targets, state.gradients = targets, gradients
    return targets


# ---------------------------------------------------------------------------------------------
# pure mode

def route(W, v, threshold, normalisation="row"):
    """N(W, v)[..., i] = Σ_j W[i,j] v[..., j] / Σ_j |W[i,j]| if that sum > θ, else 0 (row);
    with ``normalisation="column"``, Σ_j W[i,j] v[..., j] / Σ_k |W[k,j]| over the columns whose
    sum is > θ."""
    W = np.asarray(W)
    if normalisation == "column":
        den = np.sum(np.abs(W), axis=0)
        keep = np.asarray(den > threshold, dtype=bool)
        v = np.asarray(v)
        shared = np.where(keep, v / np.where(keep, den, 1), 0 * v)
        return np.matmul(shared, W.T)
    den = np.sum(np.abs(W), axis=1)
    keep = np.asarray(den > threshold, dtype=bool)
    num = np.matmul(np.asarray(v), W.T)
    safe = np.where(keep, den, 1)
    return np.where(keep, num / safe, 0 * num)


def _tile(d, gates):
    return np.concatenate([d] * gates, axis=-1) if gates > 1 else d


def _exact_params(layer, num):
    """The layer's parameters in the state's arithmetic (float64, or mpf when exact)."""
    return {k: num.asarray(v, f"parameter {k!r}") for k, v in layer.parameters().items()}


def _recurrent_target(layer, x, y, t_out, threshold, num, gates, normalisation):
    p = _exact_params(layer, num)
    batch, steps, _ = np.shape(x)
    e = np.asarray(t_out) - np.asarray(y)
    if layer.return_sequences:
        gaps = [e[:, t, :] for t in range(steps)]
    else:
        gaps = [num.zeros(e.shape) for _ in range(steps - 1)] + [e]
    D = [None] * steps
    D[-1] = gaps[-1]
    for t in range(steps - 2, -1, -1):
        D[t] = gaps[t] + route(p["w_hh"], _tile(D[t + 1], gates), threshold, normalisation)
    shift = np.stack([route(p["w_ih"], _tile(D[t], gates), threshold, normalisation)
                      for t in range(steps)], axis=1)
    return np.asarray(x) + shift


def attention_probabilities(layer, x, num):
    """P (batch, heads, seq, seq) of a MultiHeadAttention layer on input ``x``."""
    p = _exact_params(layer, num)
    x = np.asarray(x)
    batch, steps, d = x.shape
    dh = d // layer.heads
    q = np.matmul(x, p["w_q"]) + p["b_q"]
    k = np.matmul(x, p["w_k"]) + p["b_k"]
    root = num.sqrt(np.asarray(num.const(dh)))
    P = num.zeros((batch, layer.heads, steps, steps))
    for h in range(layer.heads):
        cols = slice(h * dh, (h + 1) * dh)
        scores = np.matmul(q[:, :, cols], np.swapaxes(k[:, :, cols], 1, 2)) / root
        for t in range(steps):
            stop = t + 1 if layer.causal else steps
            P[:, h, t, :stop] = ops.forward("softmax", [scores[:, t, :stop]], axis=-1,
                                            dps=num.dps)
    return P


def _attention_target(layer, x, y, t_out, threshold, num, normalisation):
    p = _exact_params(layer, num)
    x = np.asarray(x)
    batch, steps, d = x.shape
    dh = d // layer.heads
    P = attention_probabilities(layer, x, num)
    dA = route(p["w_o"], np.asarray(t_out) - np.asarray(y), threshold, normalisation)
    dV = num.zeros((batch, steps, d))
    for b in range(batch):
        for h in range(layer.heads):
            cols = slice(h * dh, (h + 1) * dh)
            dV[b, :, cols] = route(P[b, h].T, dA[b, :, cols].T, threshold, normalisation).T
    return x + route(p["w_v"], dV, threshold, normalisation)


def _swiglu_target(layer, x, y, t_out, threshold, num, normalisation):
    p = _exact_params(layer, num)
    dH = route(p["w_down"], np.asarray(t_out) - np.asarray(y), threshold, normalisation)
    both = np.concatenate([p["w_gate"], p["w_up"]], axis=1)
    return np.asarray(x) + route(both, np.concatenate([dH, dH], axis=-1), threshold,
                                 normalisation)


def pure_target(layer, x, y, t_out, threshold, num, normalisation="row"):
    """The pure-mode target of ``layer``'s input (spec's ``pure_*`` rules)."""
    kind = type(layer).__name__
    if kind == "Dense":
        return route(_exact_params(layer, num)["weight"], t_out, threshold, normalisation)
    if kind == "RNN":
        return _recurrent_target(layer, x, y, t_out, threshold, num, 1, normalisation)
    if kind == "LSTM":
        return _recurrent_target(layer, x, y, t_out, threshold, num, 4, normalisation)
    if kind == "MultiHeadAttention":
        return _attention_target(layer, x, y, t_out, threshold, num, normalisation)
    return _swiglu_target(layer, x, y, t_out, threshold, num, normalisation)


# ---------------------------------------------------------------------------------------------
# the update

def local_updates(state):
    """Per layer, ``{dotted name: d_θ}``: d_θ = J_θᵀ (t − y) / B from the layer's tape, or
    with ``update="loom"`` Loom's d_W = xᵀ (t − y) / B, d_b = Σ (t − y) / B written out."""
    if state.config.update == "loom":
        return _loom_updates(state)
    out = []
    with state.num.context():
        for (prefix, _, _), (tape, _, ids, node), y, t in zip(
                state.layers, state._tapes, state.forward_acts, state.backward_targets):
            grads = tape.backward(node, np.asarray(t - y))
            batch = np.shape(y)[0]
            out.append({prefix + name: (grads[i] / batch if i in grads else
                                        state.num.zeros(np.shape(tape.value(i))))
                        for name, i in ids.items()})
    return out


def _loom_updates(state):
    out = []
    with state.num.context():
        for (prefix, _, _), x, y, t in zip(state.layers, state.layer_inputs, state.forward_acts,
                                           state.backward_targets):
            x, gap = np.asarray(x), np.asarray(t) - np.asarray(y)
            rows_x = x.reshape(-1, x.shape[-1])
            rows_g = gap.reshape(-1, gap.shape[-1])
            batch = x.shape[0]
            out.append({prefix + "weight": np.matmul(rows_x.T, rows_g) / batch,
                        prefix + "bias": np.sum(rows_g, axis=0) / batch})
    return out


def apply_targetprop_gaps(model, state, lr):
    """Update every layer that passes the gate: rate, momentum, parameters (exact when ``dps``).

    For layer ℓ with link budget b >= τ: r = lr·(0.5 + 0.5 b)·F^ℓ; for each of its parameters
    v ← μ v + (1 − μ)·r·d_θ and θ ← θ + v. A layer with b < τ keeps its parameters and
    velocities. Link budgets are computed first when missing.

    Returns
    -------
    dict
        The new parameters (also loaded into ``model``).
    """
    _check_state(model, state)
    check_apply(state, lr)
    if len(state.link_budgets) != len(state.layers):
        state.calculate_link_budgets()
    cfg, num = state.config, state.num
    params = model.parameters()
    updates = local_updates(state)
    new = {}
    state.updated, state.layer_rates = [], []
    with num.context():
        mu = num.const(cfg.momentum)
        for (prefix, depth, _), budget, d in zip(state.layers, state.link_budgets, updates):
            ok = budget >= cfg.budget_threshold  # NOTE: a NaN budget gates the layer
            state.updated.append(ok)
            if not ok:
                state.layer_rates.append(0.0)
                continue
            half = num.const(0.5)
            r = (num.const(lr) * (half + half * num.const(budget)) *
                 num.const(cfg.depth_scale_factor) ** depth)
            state.layer_rates.append(float(r))
            for name, d_theta in d.items():
                vel = mu * state.velocities[name] + (1 - mu) * (r * d_theta)
                state.velocities[name] = vel
                new[name] = params[name] + vel
    if new:
        model.load_parameters(new, strict=False)
    state.applied = True
    return new


def output_target(loss_type, pred, y, dps=None):
    """The output layer's target from labels (spec's ``output_target`` rule).

    mse and binary_cross_entropy: ``y``; cross_entropy (class indices) and
    categorical_cross_entropy: ``pred + onehot − softmax(pred)``;
    binary_cross_entropy_with_logits: ``pred + y − sigmoid(pred)``.
    """
    check_loss_type(loss_type)
    num = numeric_for(dps)
    with num.context():
        p = num.asarray(pred, "pred")
        if loss_type == "cross_entropy":
            idx = np.asarray(y).reshape(-1).astype(np.int64)
            yy = num.zeros(p.shape)
            yy[np.arange(p.shape[0]), idx] = num.const(1)
        else:
            yy = num.asarray(y, "y")
        if loss_type in ("mse", "binary_cross_entropy"):
            return yy
        if loss_type == "binary_cross_entropy_with_logits":
            return p + (yy - ops.forward("sigmoid", [p], dps=dps))
        return p + (yy - ops.forward("softmax", [p], axis=-1, dps=dps))
