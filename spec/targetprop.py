"""Target Propagation as math: every rule of the algorithm, stated once.

Each rule is a formula written against a backend ``M`` (``spec.backends``): the SymPy backend
gives its symbolic statement (``TARGETPROP_RULES[name].symbolic()``), the mpmath backend
evaluates it exactly. The layers' forwards are composed from the registry's own op formulas
(``spec.OPS``), and the two quantities that need a derivative of a layer (the chain-rule signal
``J_xᵀ g`` and the local update ``J_θᵀ e``) are taken by high-precision numerical
differentiation (``mpmath.diff``) of those forwards, independent of any engine's backward.

The long story: docs/spec.md, section ``spec/targetprop.py``.
"""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import mpmath
import numpy as np

import optable
from optable.targetprop import (LOSS_TYPES, NORMALISATIONS, SUPPORTED_LAYERS,  # noqa: F401
                                UPDATES, check_loss_type, flatten_layers)
from spec.backends import MPMATH, SYMPY
from spec.evaluate import _check_dps, _mpf_array, as_array, GUARD_DIGITS
from spec.opspec import call_formula
from spec.prove import ProofResult, worst_at_points

# Defaults of TargetPropConfig (fastlib and reflib take the same names).
TARGETPROP_DEFAULTS = MappingProxyType({
    "use_chain_rule": True, "gradient_scale": 0.1, "depth_scale_factor": 1.1,
    "budget_threshold": 0.2, "momentum": 0.9, "weight_threshold": 0.01,
    "update": "gradient", "normalisation": "row",
})
# The choices of the two named settings (first = default), the layer types TargetProp trains
# and the losses it forms output targets for are optable.targetprop's (UPDATES, NORMALISATIONS,
# SUPPORTED_LAYERS, LOSS_TYPES), shared with the engines.


# ---------------------------------------------------------------------------------------------
# The registry's ops as building blocks.

def _op(M, name, *arrays, **params):
    """The registry forward of op ``name`` (the formula ``spec.prove`` proves)."""
    from spec.catalog import OPS

    op = OPS[name]
    out = op.run_forward(M, [np.asarray(a, dtype=object) for a in arrays],
                         op.resolve_params(params))
    return np.asarray(out, dtype=object)


def _scalar(x):
    return np.asarray(x, dtype=object).reshape(-1)[0]


# ---------------------------------------------------------------------------------------------
# The rules (formulas on a backend M; arrays are object arrays).

def route(M, W, v, weight_threshold, normalisation="row"):
    """N(W, v): v (..., out) back through W (in, out), normalised per input row (default) or
    per output column.

    NOTE: ``"row"`` divides by the row's absolute sum over the outputs it feeds, and a row whose
    sum is at most θ routes nothing (0), which keeps a near-dead input from amplifying the
    target. ``"column"`` divides each output's entry by its column's absolute sum over the
    inputs that feed it, and a column whose sum is at most θ contributes nothing.
    """
    W = np.asarray(W, dtype=object)
    v = np.asarray(v, dtype=object)
    if normalisation == "column":
        den = M.sum(M.abs(W), axis=0)                    # (out,)
        keep = M.gt(den, weight_threshold)
        safe = M.where(keep, den, M.num(1))
        shared = np.asarray(M.where(keep, v / safe, M.num(0)), dtype=object)
        return np.asarray(np.matmul(shared, W.T), dtype=object)
    den = M.sum(M.abs(W), axis=1)                        # (in,)
    keep = M.gt(den, weight_threshold)
    safe = M.where(keep, den, M.num(1))
    num = np.matmul(v, W.T)                              # (..., in)
    return np.asarray(M.where(keep, num / safe, M.num(0)), dtype=object)


def _output_target(M, pred, y, loss_type):
    if loss_type in ("mse", "binary_cross_entropy"):
        return y + 0
    if loss_type == "binary_cross_entropy_with_logits":
        return pred + (y - _op(M, "sigmoid", pred))
    if loss_type in ("cross_entropy", "categorical_cross_entropy"):
        return pred + (y - _op(M, "softmax", pred, axis=-1))
    raise ValueError(f"output_target: unknown loss_type {loss_type!r}; use one of {LOSS_TYPES}")


def _chain_rule_target(M, x, g_in, gradient_scale):
    return x + gradient_scale * g_in


def _pure_dense(M, W, t_out, weight_threshold, normalisation="row"):
    return route(M, W, t_out, weight_threshold, normalisation)


def _recurrent(M, x, y, t_out, w_ih, w_hh, gates, return_sequences, weight_threshold,
               normalisation="row"):
    """The pure_rnn (gates=1) and pure_lstm (gates=4) input targets."""
    x = np.asarray(x, dtype=object)
    batch, steps, _ = x.shape
    e = np.asarray(t_out, dtype=object) - np.asarray(y, dtype=object)
    hidden = e.shape[-1]
    if return_sequences:
        gaps = [e[:, t, :] for t in range(steps)]
    else:
        gaps = [M.zeros((batch, hidden)) for _ in range(steps - 1)] + [e]

    def tile(d):
        return np.concatenate([d] * gates, axis=-1) if gates > 1 else d

    D = [None] * steps
    D[-1] = gaps[-1]
    for t in range(steps - 2, -1, -1):
        D[t] = gaps[t] + route(M, w_hh, tile(D[t + 1]), weight_threshold, normalisation)
    shift = np.stack([route(M, w_ih, tile(D[t]), weight_threshold, normalisation)
                      for t in range(steps)], axis=1)
    return x + shift


def _pure_rnn(M, x, y, t_out, w_ih, w_hh, return_sequences, weight_threshold,
              normalisation="row"):
    return _recurrent(M, x, y, t_out, w_ih, w_hh, 1, return_sequences, weight_threshold,
                      normalisation)


def _pure_lstm(M, x, y, t_out, w_ih, w_hh, return_sequences, weight_threshold,
               normalisation="row"):
    return _recurrent(M, x, y, t_out, w_ih, w_hh, 4, return_sequences, weight_threshold,
                      normalisation)


def _pure_attention(M, x, y, t_out, P, w_o, w_v, heads, weight_threshold, normalisation="row"):
    x = np.asarray(x, dtype=object)
    batch, steps, d = x.shape
    dh = d // heads
    dA = route(M, w_o, np.asarray(t_out, dtype=object) - np.asarray(y, dtype=object),
               weight_threshold, normalisation)
    dV = M.zeros((batch, steps, d))
    for b in range(batch):
        for h in range(heads):
            cols = slice(h * dh, (h + 1) * dh)
            # the map v[s] -> a[t] has weight P[t, s]: route the per-position gaps through Pᵀ
            dV[b, :, cols] = route(M, np.asarray(P)[b, h].T, dA[b, :, cols].T,
                                   weight_threshold, normalisation).T
    return x + route(M, w_v, dV, weight_threshold, normalisation)


def _pure_swiglu(M, x, y, t_out, w_gate, w_up, w_down, weight_threshold, normalisation="row"):
    dH = route(M, w_down, np.asarray(t_out, dtype=object) - np.asarray(y, dtype=object),
               weight_threshold, normalisation)
    both = np.concatenate([np.asarray(w_gate, dtype=object), np.asarray(w_up, dtype=object)],
                          axis=1)
    return np.asarray(x, dtype=object) + route(M, both, np.concatenate([dH, dH], axis=-1),
                                               weight_threshold, normalisation)


def _link_budget(M, actual, target):
    a = np.asarray(actual, dtype=object).reshape(-1)
    t = np.asarray(target, dtype=object).reshape(-1)
    dot = _scalar(M.sum(a * t))
    nn = _scalar(M.sum(a * a)) * _scalar(M.sum(t * t))
    nonzero = M.gt(nn, M.num(0))
    cos = dot / M.sqrt(M.where(nonzero, nn, M.num(1)))
    return M.where(nonzero, (cos + 1) / 2, M.num(0))


def _gap(M, actual, target):
    diff = (np.asarray(actual, dtype=object) - np.asarray(target, dtype=object)).reshape(-1)
    return M.sqrt(_scalar(M.sum(diff * diff)) / diff.size)


def _gate(M, budget, budget_threshold):
    return M.ge(budget, budget_threshold)


def _layer_rate(M, lr, budget, depth_scale_factor, depth):
    return lr * (M.num(1, 2) + M.num(1, 2) * budget) * depth_scale_factor ** depth


def _local_update(M, jt_gap, batch):
    # jt_gap = J_θᵀ (t − y): the parameter VJP of the gap through this layer only
    return np.asarray(jt_gap, dtype=object) / batch


def _loom_update(M, x, gap, batch):
    """Loom's Dense delta rule: (d_W, d_b) = (xᵀ gap / B, Σ gap / B), every leading axis of
    ``x (..., in)`` and ``gap (..., out)`` summed (no activation derivative)."""
    x = np.asarray(x, dtype=object)
    gap = np.asarray(gap, dtype=object)
    rows_x = x.reshape(-1, x.shape[-1])
    rows_g = gap.reshape(-1, gap.shape[-1])
    d_w = np.matmul(rows_x.T, rows_g) / batch
    d_b = M.sum(rows_g, axis=0) / batch
    return np.asarray(d_w, dtype=object), np.asarray(d_b, dtype=object)


def _momentum(M, w, vel, update, rate, momentum):
    vel_new = momentum * vel + (1 - momentum) * (rate * update)
    return w + vel_new, vel_new


@dataclass(frozen=True)
class TargetPropRule:
    """One rule: its statement in words, its formula, and a small example to state it in SymPy.

    ``arrays`` maps the formula's array arguments to example shapes; ``scalars`` names its
    real scalar arguments (positive symbols); ``options`` fixes its non-numeric arguments.
    """

    name: str
    equation: str
    formula: Callable
    arrays: Mapping = field(default_factory=dict)
    scalars: tuple = ()
    options: Mapping = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "arrays", MappingProxyType(dict(self.arrays)))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def apply(self, M, **arguments):
        """Evaluate the formula on backend ``M`` with the named arguments."""
        return call_formula(self.formula, dict(arguments, M=M))

    def symbolic(self):
        """The rule as SymPy on its example: ``(arguments, result)`` with symbol arrays."""
        sp = SYMPY.sp
        args = {}
        for name, shape in self.arrays.items():
            flat = [sp.Symbol(f"{name}_{i}", real=True) for i in range(int(np.prod(shape)))]
            args[name] = np.array(flat, dtype=object).reshape(shape)
        for name in self.scalars:
            args[name] = sp.Symbol(name, positive=True)
        args.update(self.options)
        return args, self.apply(SYMPY, **args)


_R = TargetPropRule
TARGETPROP_RULES = MappingProxyType({r.name: r for r in (
    _R("output_target", "t = y (mse, binary_cross_entropy); ŷ + onehot(y) − softmax(ŷ) "
       "(cross_entropy, categorical); ŷ + y − σ(ŷ) (with_logits)", _output_target,
       {"pred": (1, 3), "y": (1, 3)}, options={"loss_type": "categorical_cross_entropy"}),
    _R("output_signal", "g = t − y", lambda M, target, actual: target - actual,
       {"target": (2,), "actual": (2,)}),
    _R("chain_rule_target", "t_in = x + s · g_in,  g_in = J_xᵀ g_out", _chain_rule_target,
       {"x": (2,), "g_in": (2,)}, ("gradient_scale",)),
    _R("route", "N(W, v)[i] = Σ_j W[i,j] v[j] / Σ_j |W[i,j]| if Σ_j |W[i,j]| > θ else 0",
       lambda M, W, v, weight_threshold: route(M, W, v, weight_threshold),
       {"W": (2, 2), "v": (1, 2)}, ("weight_threshold",)),
    _R("route_column", "N(W, v)[i] = Σ_j W[i,j] v[j] / Σ_k |W[k,j]| (columns with Σ_k |W[k,j]| "
       "<= θ left out)",
       lambda M, W, v, weight_threshold: route(M, W, v, weight_threshold, "column"),
       {"W": (2, 2), "v": (1, 2)}, ("weight_threshold",)),
    _R("pure_dense", "t_in = N(W, t_out)", _pure_dense, {"W": (2, 2), "t_out": (1, 2)},
       ("weight_threshold",), {"normalisation": "row"}),
    _R("pure_rnn", "D_t = E_t + N(w_hh, D_{t+1}); t_in[:, t] = x[:, t] + N(w_ih, D_t)",
       _pure_rnn, {"x": (1, 2, 1), "y": (1, 2), "t_out": (1, 2), "w_ih": (1, 2),
                   "w_hh": (2, 2)}, ("weight_threshold",),
       {"return_sequences": False, "normalisation": "row"}),
    _R("pure_lstm", "D_t = E_t + N(w_hh, [D_{t+1}]×4); t_in[:, t] = x[:, t] + N(w_ih, [D_t]×4)",
       _pure_lstm, {"x": (1, 2, 1), "y": (1, 1), "t_out": (1, 1), "w_ih": (1, 4),
                    "w_hh": (1, 4)}, ("weight_threshold",),
       {"return_sequences": False, "normalisation": "row"}),
    _R("pure_attention", "δA = N(w_o, t − y); δV_h = N(P_hᵀ, δA_h); t_in = x + N(w_v, δV)",
       _pure_attention, {"x": (1, 2, 1), "y": (1, 2, 1), "t_out": (1, 2, 1),
                         "P": (1, 1, 2, 2), "w_o": (1, 1), "w_v": (1, 1)},
       ("weight_threshold",), {"heads": 1, "normalisation": "row"}),
    _R("pure_swiglu", "δH = N(w_down, t − y); t_in = x + N([w_gate | w_up], [δH | δH])",
       _pure_swiglu, {"x": (1, 2), "y": (1, 1), "t_out": (1, 1), "w_gate": (2, 1),
                      "w_up": (2, 1), "w_down": (1, 1)}, ("weight_threshold",),
       {"normalisation": "row"}),
    _R("link_budget", "b = (cos(y, t) + 1)/2, 0 when |y|·|t| = 0 (rounded to float64)",
       _link_budget, {"actual": (2,), "target": (2,)}),
    _R("gap", "RMS(y − t)", _gap, {"actual": (2,), "target": (2,)}),
    _R("gate", "updated iff b >= τ", _gate, {}, ("budget", "budget_threshold")),
    _R("layer_rate", "r = lr · (0.5 + 0.5 b) · F^depth", _layer_rate, {},
       ("lr", "budget", "depth_scale_factor"), {"depth": 2}),
    _R("local_update", "d_θ = (1/B) J_θᵀ (t − y)", _local_update, {"jt_gap": (2,)},
       ("batch",)),
    _R("loom_update", "Dense: d_W = (1/B) xᵀ (t − y), d_b = (1/B) Σ (t − y)", _loom_update,
       {"x": (2, 2), "gap": (2, 2)}, ("batch",)),
    _R("momentum", "v ← μ v + (1 − μ) r d ; θ ← θ + v", _momentum,
       {"w": (1,), "vel": (1,), "update": (1,)}, ("rate", "momentum")),
)})


# ---------------------------------------------------------------------------------------------
# Configuration and models (config dicts and parameter dicts, as get_config()/parameters()).

def resolve_config(config=None):
    """The TargetProp settings as a dict: defaults, overridden by a dict or an object's fields.

    Raises
    ------
    ValueError
        An unknown setting, or a value out of range (scale and factor > 0, 0 <= μ < 1, ...).
    """
    out = dict(TARGETPROP_DEFAULTS)
    if config is None:
        return out
    given = dict(config) if isinstance(config, Mapping) else {
        k: getattr(config, k) for k in TARGETPROP_DEFAULTS if hasattr(config, k)}
    for key, value in given.items():
        if key not in TARGETPROP_DEFAULTS:
            from spec.errors import did_you_mean
            raise ValueError(f"TargetProp: unknown setting {key!r}"
                             f"{did_you_mean(key, TARGETPROP_DEFAULTS)}; settings: "
                             f"{', '.join(TARGETPROP_DEFAULTS)}")
        out[key] = value
    if not isinstance(out["use_chain_rule"], (bool, np.bool_)):
        raise TypeError(f"TargetProp: use_chain_rule must be True or False, got "
                        f"{out['use_chain_rule']!r}")
    for key, choices in (("update", UPDATES), ("normalisation", NORMALISATIONS)):
        if out[key] not in choices:
            raise ValueError(f"TargetProp: {key} must be one of {', '.join(map(repr, choices))}, "
                             f"got {out[key]!r}")
    for key in ("gradient_scale", "depth_scale_factor", "budget_threshold", "momentum",
                "weight_threshold"):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(float(v)):
            raise ValueError(f"TargetProp: {key} must be a finite real number, got {v!r}")
    if out["gradient_scale"] <= 0 or out["depth_scale_factor"] <= 0:
        raise ValueError("TargetProp: gradient_scale and depth_scale_factor must be > 0")
    if not 0 <= out["momentum"] < 1:
        raise ValueError(f"TargetProp: momentum must be in [0, 1), got {out['momentum']}")
    if out["weight_threshold"] < 0 or out["budget_threshold"] < 0:
        raise ValueError("TargetProp: weight_threshold and budget_threshold must be >= 0")
    return out


@dataclass(frozen=True)
class Leaf:
    """One layer of the flattened chain: its dotted prefix, depth and config."""

    prefix: str
    depth: int
    config: Mapping

    @property
    def kind(self):
        return self.config["type"]


def leaves(model_config):
    """The model's layers in forward order (nested ``Sequential`` flattened depth first).

    Raises
    ------
    ValueError
        A layer type TargetProp does not support (``Parallel``, norms, ``Embedding``, ...).
    """
    return [Leaf(prefix, depth, dict(cfg)) for prefix, depth, cfg in
            flatten_layers(model_config, _config_type, lambda seq: seq["layers"])]


def _config_type(cfg):
    if not isinstance(cfg, Mapping) or "type" not in cfg:
        raise TypeError(f"TargetProp: a model config is a dict with a 'type' key, got {cfg!r}")
    return cfg["type"]


def _local_params(leaf, params):
    p = leaf.prefix
    return {k[len(p):]: v for k, v in params.items() if k.startswith(p) and "." not in k[len(p):]}


# ---------------------------------------------------------------------------------------------
# Layer forwards, composed from registry op formulas.

# activation name -> registry op (None: no op at all), from the op table's activations
_ACTIVATION_OPS = {a.name: None if a.op == "identity" else a.op
                   for a in optable.ACTIVATIONS.values()}


def _affine(M, x, W, b=None):
    y = _op(M, "matmul", x, W)
    return y if b is None else _op(M, "add", y, b)


def attention_probabilities(M, p, x, heads, causal):
    """P (batch, heads, seq, seq): P[b, h, t, s] = softmax_s(q_t · k_s / sqrt(dh)), s <= t if
    causal (masked keys are left out of the softmax, exactly 0)."""
    batch, steps, d = x.shape
    dh = d // heads
    q = _affine(M, x, p["w_q"], p["b_q"])
    k = _affine(M, x, p["w_k"], p["b_k"])
    root = M.sqrt(M.num(dh))
    P = M.zeros((batch, heads, steps, steps))
    for h in range(heads):
        cols = slice(h * dh, (h + 1) * dh)
        scores = np.matmul(q[:, :, cols], np.swapaxes(k[:, :, cols], 1, 2)) / root
        for t in range(steps):
            stop = t + 1 if causal else steps
            P[:, h, t, :stop] = _op(M, "softmax", scores[:, t, :stop], axis=-1)
    return P


def layer_forward(M, kind, cfg, p, x):
    """Output of one layer (``kind``/``cfg``/local params ``p``) on object array ``x``."""
    if kind == "Dense":
        y = _affine(M, x, p["weight"], p["bias"])
        act = _ACTIVATION_OPS[cfg.get("activation", "linear")]
        if act is None:
            return y
        return _op(M, act, y, axis=-1) if act == "softmax" else _op(M, act, y)
    if kind == "SwiGLU":
        h = _op(M, "mul", _op(M, "silu", _affine(M, x, p["w_gate"])), _affine(M, x, p["w_up"]))
        return _affine(M, h, p["w_down"])
    if kind == "MultiHeadAttention":
        heads = cfg["heads"]
        P = attention_probabilities(M, p, x, heads, cfg.get("causal", False))
        v = _affine(M, x, p["w_v"], p["b_v"])
        dh = x.shape[-1] // heads
        att = np.concatenate([np.matmul(P[:, h], v[:, :, h * dh:(h + 1) * dh])
                              for h in range(heads)], axis=-1)
        return _affine(M, att, p["w_o"], p["b_o"])
    if kind in ("RNN", "LSTM"):
        return _recurrent_forward(M, kind, cfg, p, x)
    raise ValueError(f"layer_forward: unsupported layer {kind!r}")


def _recurrent_forward(M, kind, cfg, p, x):
    batch, steps, _ = x.shape
    H = cfg["hidden_size"]
    h = M.zeros((batch, H))
    c = M.zeros((batch, H))
    states = []
    for t in range(steps):
        z = _op(M, "add", _op(M, "add", _op(M, "matmul", x[:, t, :], p["w_ih"]),
                              _op(M, "matmul", h, p["w_hh"])), p["b"])
        if kind == "RNN":
            h = _op(M, "tanh", z)
        else:
            i, f, o = (_op(M, "sigmoid", z[:, k * H:(k + 1) * H]) for k in (0, 1, 3))
            g = _op(M, "tanh", z[:, 2 * H:3 * H])
            c = f * c + i * g
            h = o * _op(M, "tanh", c)
        states.append(h)
    return np.stack(states, axis=1) if cfg.get("return_sequences", False) else h


# ---------------------------------------------------------------------------------------------
# Exact evaluation of the algorithm (mpmath), the oracle the engines are held to.

def _exact(arr, what):
    a = as_array(arr, what)
    if a.dtype != object and not np.all(np.isfinite(a)):
        raise ValueError(f"{what} holds NaN or Inf; it must be finite")
    return _mpf_array(a)


def _dot(a, b):
    return mpmath.fsum(u * v for u, v in zip(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)))


def numeric_vjp(fn, arrays, wrt, cotangent):
    """∂⟨fn(*arrays), cotangent⟩/∂arrays[wrt], entry by entry, by ``mpmath.diff``.

    The derivative of an analytic function is computed to the working precision (mpmath raises
    its own precision and picks the step); at a kink of relu-like activations it would give the
    average of the two sides, so callers sample away from kinks.
    """
    base = arrays[wrt]
    out = np.empty(base.shape, dtype=object)
    for idx in np.ndindex(base.shape):
        def f(value, idx=idx):
            moved = base.copy()
            moved[idx] = value
            args = list(arrays)
            args[wrt] = moved
            return _dot(fn(*args), cotangent)
        out[idx] = mpmath.diff(f, base[idx])
    return out


@dataclass
class Trace:
    """The exact forward of a model: its leaves, each layer's input and output, extras."""

    leaves: list
    params: dict          # per leaf: local name -> object array
    inputs: list
    outputs: list
    probabilities: list   # per leaf: attention probabilities P, or None


def _forward(model_config, params, x):
    chain = leaves(model_config)
    exact = {k: _exact(v, f"parameter {k!r}") for k, v in params.items()}
    local = [_local_params(leaf, exact) for leaf in chain]
    cur = _exact(x, "x")
    inputs, outputs, probs = [], [], []
    for leaf, p in zip(chain, local):
        inputs.append(cur)
        cur = layer_forward(MPMATH, leaf.kind, leaf.config, p, cur)
        outputs.append(cur)
        probs.append(attention_probabilities(MPMATH, p, inputs[-1], leaf.config["heads"],
                                             leaf.config.get("causal", False))
                     if leaf.kind == "MultiHeadAttention" else None)
    return Trace(chain, local, inputs, outputs, probs)


def _round(arrays, dps):
    with mpmath.workdps(dps):
        return [None if a is None else np.asarray(np.frompyfunc(lambda v: +v, 1, 1)(a),
                                                  dtype=object).reshape(np.shape(a))
                for a in arrays]


def forward(model_config, params, x, dps=50):
    """Each layer's output (the state's ``forward_acts``), exactly.

    Parameters
    ----------
    model_config : dict
        ``get_config()`` of a fastlib or reflib model (Dense, RNN, LSTM, MultiHeadAttention,
        SwiGLU, nested Sequential).
    params : dict
        ``parameters()`` of that model (float arrays, or object arrays of mpf).
    x : array_like
        The input batch.
    dps : int
        Decimal digits of the results.

    Returns
    -------
    list of object arrays of mpf, one per layer.
    """
    dps = _check_dps(dps)
    with mpmath.workdps(dps + GUARD_DIGITS):
        trace = _forward(model_config, params, x)
    return _round(trace.outputs, dps)


def pure_input_target(M, kind, cfg, p, x, y, t_out, weight_threshold, P=None,
                      normalisation="row"):
    """The pure-mode target of a layer's input, by layer type (the ``pure_*`` rules)."""
    if kind == "Dense":
        return _pure_dense(M, p["weight"], t_out, weight_threshold, normalisation)
    if kind in ("RNN", "LSTM"):
        fn = _pure_rnn if kind == "RNN" else _pure_lstm
        return fn(M, x, y, t_out, p["w_ih"], p["w_hh"], cfg.get("return_sequences", False),
                  weight_threshold, normalisation)
    if kind == "MultiHeadAttention":
        return _pure_attention(M, x, y, t_out, P, p["w_o"], p["w_v"], cfg["heads"],
                               weight_threshold, normalisation)
    if kind == "SwiGLU":
        return _pure_swiglu(M, x, y, t_out, p["w_gate"], p["w_up"], p["w_down"],
                            weight_threshold, normalisation)
    raise ValueError(f"pure_input_target: unsupported layer {kind!r}")


def _backward(trace, target, cfg, input_target):
    L = len(trace.leaves)
    targets, gradients = [None] * L, [None] * L
    targets[-1] = target
    gradients[-1] = target - trace.outputs[-1]
    below = None
    for l in range(L - 1, -1 if input_target else 0, -1):
        leaf, p, x = trace.leaves[l], trace.params[l], trace.inputs[l]
        if cfg["use_chain_rule"]:
            def fn(xx, leaf=leaf, p=p):
                return layer_forward(MPMATH, leaf.kind, leaf.config, p, xx)
            g_in = numeric_vjp(fn, [x], 0, gradients[l])
            t_in = _chain_rule_target(MPMATH, x, g_in, mpmath.mpf(cfg["gradient_scale"]))
        else:
            t_in = pure_input_target(MPMATH, leaf.kind, leaf.config, p, x, trace.outputs[l],
                                     targets[l], mpmath.mpf(cfg["weight_threshold"]),
                                     trace.probabilities[l], cfg["normalisation"])
            g_in = t_in - x
        if l > 0:
            targets[l - 1], gradients[l - 1] = t_in, g_in
        else:
            below = t_in
    return targets, gradients, below


def backward(model_config, params, x, target, config=None, dps=50, input_target=False):
    """Every layer's target and signal, exactly (``targetprop_forward`` + ``_backward``).

    Parameters
    ----------
    model_config, params, x :
        As for :func:`forward`.
    target : array_like
        The target of the model's output (``output_target`` gives it from labels).
    config : dict or object, optional
        TargetProp settings (:data:`TARGETPROP_DEFAULTS`).
    dps : int
    input_target : bool
        Also return the target of the model's input (the first layer's input target).

    Returns
    -------
    dict
        ``forward_acts``, ``backward_targets``, ``gradients`` (lists, one per layer, object
        arrays of mpf) and ``input_target`` (or None). In chain-rule mode ``gradients[l]`` is the
        chained signal at layer l's output (``target − y`` at the last); in pure mode it is
        ``backward_targets[l] − forward_acts[l]``.
    """
    dps = _check_dps(dps)
    cfg = resolve_config(config)
    with mpmath.workdps(dps + GUARD_DIGITS):
        trace = _forward(model_config, params, x)
        t = _exact(target, "target")
        if t.shape != trace.outputs[-1].shape:
            raise ValueError(f"target has shape {t.shape} but the model's output has "
                             f"{trace.outputs[-1].shape}")
        targets, gradients, below = _backward(trace, t, cfg, input_target)
    acts, targets, gradients, (below,) = (_round(trace.outputs, dps), _round(targets, dps),
                                          _round(gradients, dps), _round([below], dps))
    return {"forward_acts": acts, "backward_targets": targets, "gradients": gradients,
            "input_target": below}


def link_budget(actual, target, dps=50):
    """(cos(actual, target) + 1) / 2 over all entries, rounded to float64; 0 for a zero norm."""
    with mpmath.workdps(_check_dps(dps) + GUARD_DIGITS):
        return float(_link_budget(MPMATH, _exact(actual, "actual"), _exact(target, "target")))


def gap(actual, target, dps=50):
    """Root-mean-square of actual − target, rounded to float64."""
    with mpmath.workdps(_check_dps(dps) + GUARD_DIGITS):
        return float(_gap(MPMATH, _exact(actual, "actual"), _exact(target, "target")))


def _exact_rate(lr, budget, depth, cfg):
    """(updated, rate as mpf at the working precision, or 0)."""
    if not bool(_gate(MPMATH, mpmath.mpf(budget), mpmath.mpf(cfg["budget_threshold"]))):
        return False, mpmath.mpf(0)
    return True, _layer_rate(MPMATH, mpmath.mpf(lr), mpmath.mpf(budget),
                             mpmath.mpf(cfg["depth_scale_factor"]), int(depth))


def layer_rate(lr, budget, depth, config=None):
    """``(updated, rate)`` of a layer at ``depth`` with float64 link budget ``budget``.

    The gate compares the float64 budget with τ; the rate is exact, rounded to float64.
    """
    with mpmath.workdps(60):
        ok, r = _exact_rate(lr, budget, depth, resolve_config(config))
    return ok, float(r)


def check_update(chain, update):
    """Refuse ``update="loom"`` for a chain with a layer other than Dense (Loom's delta rule
    is stated for a weight matrix fed by the layer's input)."""
    if update == "loom":
        for leaf in chain:
            if leaf.kind != "Dense":
                where = leaf.prefix.rstrip(".") or "the model"
                raise ValueError(f"TargetProp: update='loom' (Loom's delta = lr·input·gap) is "
                                 f"a Dense rule; layer {leaf.kind!r} at {where!r} has none: use "
                                 "update='gradient' for this model")


def local_updates(model_config, params, x, backward_targets, dps=50, config=None):
    """Per layer, ``{local param name: d_θ}``, exactly: d_θ = (1/B) J_θᵀ (t − y) with
    ``update="gradient"`` (default), Loom's d_W = (1/B) xᵀ (t − y), d_b = (1/B) Σ (t − y) with
    ``update="loom"`` (Dense layers only).

    ``backward_targets`` are the layers' output targets (e.g. from :func:`backward`).
    """
    dps = _check_dps(dps)
    update = resolve_config(config)["update"]
    check_update(leaves(model_config), update)
    out = []
    with mpmath.workdps(dps + GUARD_DIGITS):
        trace = _forward(model_config, params, x)
        for leaf, p, xi, y, t in zip(trace.leaves, trace.params, trace.inputs, trace.outputs,
                                     backward_targets):
            e = _exact(t, "target") - y
            if update == "loom":
                d_w, d_b = _loom_update(MPMATH, xi, e, xi.shape[0])
                out.append({"weight": d_w, "bias": d_b})
                continue
            names = list(p)

            def fn(*values, leaf=leaf, xi=xi, names=names):
                return layer_forward(MPMATH, leaf.kind, leaf.config, dict(zip(names, values)), xi)
            values = [p[n] for n in names]
            out.append({n: _local_update(MPMATH, numeric_vjp(fn, values, i, e), xi.shape[0])
                        for i, n in enumerate(names)})
    return [dict(zip(d, _round(list(d.values()), dps))) for d in out]


def apply(model_config, params, x, backward_targets, velocities, lr, config=None, dps=50):
    """One ``apply_targetprop_gaps`` exactly: budgets, gates, rates, momentum, new parameters.

    Parameters
    ----------
    velocities : dict or None
        Keyed like ``params`` (missing: zeros).
    lr : float

    Returns
    -------
    dict
        ``params`` and ``velocities`` (new, object arrays of mpf, keyed like ``params``),
        ``link_budgets`` and ``gaps`` (float64 lists), ``updated`` (bools) and ``rates``
        (float64, 0 where gated).
    """
    dps = _check_dps(dps)
    cfg = resolve_config(config)
    chain = leaves(model_config)
    acts = forward(model_config, params, x, dps)
    budgets = [link_budget(a, t, dps) for a, t in zip(acts, backward_targets)]
    gaps = [gap(a, t, dps) for a, t in zip(acts, backward_targets)]
    updates = local_updates(model_config, params, x, backward_targets, dps, cfg)
    velocities = dict(velocities or {})
    new_params, new_vel, updated, rates = {}, {}, [], []
    with mpmath.workdps(dps + GUARD_DIGITS):
        for leaf, b, d in zip(chain, budgets, updates):
            ok, rate = _exact_rate(lr, b, leaf.depth, cfg)
            updated.append(ok)
            rates.append(float(rate))
            for name, d_theta in d.items():
                key = leaf.prefix + name
                w = _exact(params[key], key)
                v = (_exact(velocities[key], f"velocity {key!r}") if velocities.get(key)
                     is not None else MPMATH.zeros(w.shape))
                if ok:
                    w, v = _momentum(MPMATH, w, v, d_theta, rate, mpmath.mpf(cfg["momentum"]))
                new_params[key], new_vel[key] = w, v
    keys = list(new_params)
    return {"params": dict(zip(keys, _round([new_params[k] for k in keys], dps))),
            "velocities": dict(zip(keys, _round([new_vel[k] for k in keys], dps))),
            "link_budgets": budgets, "gaps": gaps, "updated": updated, "rates": rates}


def output_target(loss_type, pred, y, dps=50):
    """The output layer's target from labels ``y`` (the ``output_target`` rule), exactly.

    ``cross_entropy`` takes class indices ``(N,)`` or ``(N, 1)``; the other losses take ``y``
    shaped like ``pred``.
    """
    check_loss_type(loss_type)
    dps = _check_dps(dps)
    with mpmath.workdps(dps + GUARD_DIGITS):
        p = _exact(pred, "pred")
        if loss_type == "cross_entropy":
            idx = np.asarray(y).reshape(-1).astype(np.int64)
            onehot = MPMATH.zeros(p.shape)
            onehot[np.arange(p.shape[0]), idx] = mpmath.mpf(1)
            yy = onehot
        else:
            yy = _exact(y, "y")
        out = _output_target(MPMATH, p, yy, loss_type)
    return _round([out], dps)[0]


# ---------------------------------------------------------------------------------------------
# Proofs: each rule against an independent statement.

def _proof(name, fn):
    start = time.perf_counter()
    try:
        ok, method, detail = fn()
    except Exception as exc:  # a statement that raises is a failed proof, not a crash
        ok, method, detail = False, "symbolic", f"{type(exc).__name__}: {exc}"
    return ProofResult(op=name, ok=bool(ok), method=method, shapes=(), detail=detail,
                       seconds=time.perf_counter() - start)


def _symbols(sp, name, shape):
    flat = [sp.Symbol(f"{name}{i}", real=True) for i in range(int(np.prod(shape)))]
    return np.array(flat, dtype=object).reshape(shape)


def _prove_dense_local_update():
    """Dense (tanh): (1/B) J_Wᵀ(t − y) written as the delta rule xᵀ(tanh'(pre) ⊙ (t − y))/B
    equals −∂/∂W of (1/2B) Σ (y − t)², by SymPy differentiation."""
    sp = SYMPY.sp
    x, W, b, t = (_symbols(sp, n, s) for n, s in (("x", (2, 2)), ("W", (2, 2)), ("b", (2,)),
                                                  ("t", (2, 2))))
    y = layer_forward(SYMPY, "Dense", {"activation": "tanh"}, {"weight": W, "bias": b}, x)
    loss = sum((y - t).reshape(-1) ** 2) / (2 * 2)
    delta = np.matmul(x.T, (1 - y**2) * (t - y)) / 2
    for idx in np.ndindex(W.shape):
        diff = sp.expand(-sp.diff(loss, W[idx]) - delta[idx])
        if diff != 0 and sp.simplify(diff) != 0:
            return False, "symbolic", f"entry {idx} differs"
    return True, "symbolic", "delta rule = −∇_W of the local loss (B = 2, tanh)"


def _prove_chain_signal():
    """Chain-rule mode: composing each layer's J_xᵀ (SymPy, per layer) back through two Dense
    layers gives −∂/∂y_0 of ½‖y_2 − t‖² (the whole-chain derivative)."""
    sp = SYMPY.sp
    h = _symbols(sp, "h", (1, 2))
    t = _symbols(sp, "t", (1, 2))
    layers = [({"activation": "tanh"}, {"weight": _symbols(sp, "A", (2, 2)),
                                        "bias": _symbols(sp, "a", (2,))}),
              ({"activation": "sigmoid"}, {"weight": _symbols(sp, "C", (2, 2)),
                                           "bias": _symbols(sp, "c", (2,))})]
    outs = [h]
    for cfg, p in layers:
        outs.append(layer_forward(SYMPY, "Dense", cfg, p, outs[-1]))
    signal = t - outs[-1]
    for (cfg, p), x_sym in zip(reversed(layers), reversed(outs[:-1])):
        # J_xᵀ g of one layer on its own, differentiating that layer only
        xs = _symbols(sp, "z", x_sym.shape)
        y = layer_forward(SYMPY, "Dense", cfg, p, xs)
        inner = sum((y * signal).reshape(-1))
        subs = dict(zip(xs.reshape(-1), x_sym.reshape(-1)))
        signal = np.array([sp.diff(inner, z).subs(subs) for z in xs.reshape(-1)],
                          dtype=object).reshape(xs.shape)
    whole = sum(((outs[-1] - t) ** 2).reshape(-1)) / 2
    symbols = sorted(whole.free_symbols, key=str)
    diffs = [g + sp.diff(whole, z) for z, g in zip(h.reshape(-1), signal.reshape(-1))]
    worst = worst_at_points(symbols, diffs, 0)
    return worst < 1e-40, "sampling", f"max |diff| {worst:.1e} at 10 points, 50 digits"


def _prove_fixed_point():
    """pure_rnn, pure_lstm, pure_attention, pure_swiglu: t_out = y gives t_in = x exactly."""
    checked = []
    for name in ("pure_rnn", "pure_lstm", "pure_attention", "pure_swiglu"):
        rule = TARGETPROP_RULES[name]
        args, _ = rule.symbolic()
        for normalisation in NORMALISATIONS:
            args = dict(args, normalisation=normalisation)
            args["t_out"] = args["y"]
            result = rule.apply(SYMPY, **args)
            if any(SYMPY.sp.simplify(r - xv) != 0 for r, xv in zip(result.reshape(-1),
                                                                  args["x"].reshape(-1))):
                return False, "symbolic", f"{name} ({normalisation}): t_in != x when t_out = y"
        checked.append(name)
    return True, "symbolic", (f"t_out = y ⇒ t_in = x for {', '.join(checked)}, row and column "
                              "normalisation")


def _prove_momentum():
    """k = 3 steps with a constant rate·update d from zero velocity: v_k = (1 − μ^k)·d and
    θ_k = θ_0 + d · Σ_{j<=k} (1 − μ^j) (a geometric sum written by hand)."""
    sp = SYMPY.sp
    w0, d = sp.symbols("w0 d", real=True)
    mu, r = sp.symbols("mu r", positive=True)
    w, v = w0, sp.Integer(0)
    for _ in range(3):
        w, v = _momentum(SYMPY, w, v, d, r, mu)
    ok = (sp.expand(v - (1 - mu**3) * r * d) == 0 and
          sp.expand(w - (w0 + r * d * sum(1 - mu**j for j in (1, 2, 3)))) == 0)
    return ok, "symbolic", "3 steps, constant update: v = (1 − μ³)·r·d, geometric sum for θ"


def _prove_output_targets():
    """output_target − ŷ has the sign of −∂L/∂ŷ for every loss, and equals −N·∂L/∂ŷ for mse
    (N/2 elements), categorical_cross_entropy (N rows) and with_logits (N elements):
    differentiated by SymPy from the registry's loss forwards, checked at 50 digits."""
    sp = SYMPY.sp
    z = _symbols(sp, "z", (1, 3))
    y = _symbols(sp, "y", (1, 3))
    rng = np.random.default_rng(1)
    worst = 0.0
    for loss in ("mse", "categorical_cross_entropy", "binary_cross_entropy_with_logits",
                 "binary_cross_entropy"):
        value = _scalar(_op(SYMPY, loss, z, y))
        target = _output_target(SYMPY, z, y, loss)
        scale = {"mse": sp.Rational(3, 2), "categorical_cross_entropy": 1,
                 "binary_cross_entropy_with_logits": 3, "binary_cross_entropy": 1}[loss]
        pairs = [(target[0, i] - z[0, i], -scale * sp.diff(value, z[0, i])) for i in range(3)]
        fn = sp.lambdify(list(z.reshape(-1)) + list(y.reshape(-1)), pairs, modules="mpmath")
        with mpmath.workdps(50):
            for _ in range(4):
                zs = [mpmath.mpf(float(v)) for v in rng.uniform(0.05, 0.95, 3)]
                ys = [mpmath.mpf(float(v)) for v in rng.uniform(0, 1, 3)]
                if loss == "categorical_cross_entropy":   # a distribution row, summing to 1
                    ys = [v / mpmath.fsum(ys) for v in ys]
                for direction, steepest in fn(*zs, *ys):
                    if loss == "binary_cross_entropy":
                        if direction * steepest < 0:
                            return False, "sampling", f"{loss}: not a descent direction"
                    else:
                        worst = max(worst, float(abs(direction - steepest)))
    return worst < 1e-40, "sampling", (f"mse, categorical, with_logits: max |diff| {worst:.1e}; "
                                       "binary_cross_entropy: same sign (4 points each)")


def _prove_link_budget():
    """b = 1 for t = c·y (c > 0), 0 for t = −c·y, 1/2 for orthogonal (at 10 random points, 50
    digits), 0 for a zero vector."""
    rng = np.random.default_rng(2)
    worst = 0.0
    with mpmath.workdps(50):
        for _ in range(10):
            y = np.array([mpmath.mpf(float(v)) for v in rng.normal(size=3)], dtype=object)
            c = mpmath.mpf(float(rng.uniform(0.1, 10)))
            ortho = np.array([-y[1], y[0], 0], dtype=object)
            for t, want in ((c * y, 1), (-c * y, 0), (ortho, mpmath.mpf(1) / 2)):
                worst = max(worst, float(abs(_link_budget(MPMATH, y, t) - want)))
        zero = _link_budget(MPMATH, MPMATH.zeros((3,)), y)
    ok = worst < 1e-40 and zero == 0
    return ok, "sampling", f"aligned 1, opposite 0, orthogonal 1/2 (max |diff| {worst:.1e}), " \
                           "zero norm 0"


def _prove_normalisations():
    """What each normalisation means, for a 2x3 W of positive symbols (every sum above θ = 0):

    - row (Loom's engine): a constant target c on every output gives every input the target c
      (each input's target is a weighted *average* of the outputs it feeds);
    - column (Loom's document): the inputs' targets sum to the outputs' (each output's target is
      *shared out* over its inputs in proportion to the weights).
    """
    sp = SYMPY.sp
    W = np.array([sp.Symbol(f"w{i}", positive=True) for i in range(6)], dtype=object).reshape(2, 3)
    v = _symbols(sp, "v", (1, 3))
    c = sp.Symbol("c", real=True)
    row = route(SYMPY, W, np.full((1, 3), c, dtype=object), 0, "row")
    if any(sp.simplify(r - c) != 0 for r in row.reshape(-1)):
        return False, "symbolic", "row: a constant output target is not every input's target"
    col = route(SYMPY, W, v, 0, "column")
    if sp.simplify(sum(col.reshape(-1)) - sum(v.reshape(-1))) != 0:
        return False, "symbolic", "column: the inputs' targets do not sum to the outputs'"
    return True, "symbolic", "row averages (constant c ↦ c), column conserves the sum (W > 0)"


def _prove_loom_update():
    """Loom's delta rule equals the gradient form exactly when the Dense layer is linear: for
    ``activation="linear"``, (d_W, d_b) of ``loom_update`` = −∂/∂(W, b) of (1/2B) Σ (y − t)²
    (SymPy); with tanh they differ by the activation derivative."""
    sp = SYMPY.sp
    x, W, b, t = (_symbols(sp, n, s) for n, s in (("x", (2, 2)), ("W", (2, 2)), ("b", (2,)),
                                                  ("t", (2, 2))))
    rng = np.random.default_rng(3)
    for activation in ("linear", "tanh"):
        y = layer_forward(SYMPY, "Dense", {"activation": activation}, {"weight": W, "bias": b},
                          x)
        loss = sum((y - t).reshape(-1) ** 2) / (2 * 2)
        d_w, d_b = _loom_update(SYMPY, x, t - y, 2)
        diffs = [-sp.diff(loss, W[idx]) - d_w[idx] for idx in np.ndindex(W.shape)] + \
            [-sp.diff(loss, b[j]) - d_b[j] for j in range(2)]
        if activation == "linear":
            if any(sp.expand(d) != 0 for d in diffs):
                return False, "symbolic", "linear: loom_update != the gradient of the local loss"
            continue
        # tanh: the two differ (by the activation derivative) at a random point
        symbols = sorted(set().union(*(d.free_symbols for d in diffs)), key=str)
        point = {z: sp.Rational(int(v), 7) for z, v in zip(symbols,
                                                          rng.integers(-7, 8, len(symbols)))}
        if all(abs(float(d.subs(point))) < 1e-12 for d in diffs):
            return False, "symbolic", "tanh: loom_update equals the gradient form"
    return True, "symbolic", "loom_update = −∇ local loss for linear Dense, ≠ for tanh (B = 2)"


def prove_targetprop():
    """Check the TargetProp rules against independent statements (SymPy, 50-digit sampling).

    Returns
    -------
    list of ProofResult
        One per claim: ``dense_local_update``, ``chain_rule_signal``, ``pure_fixed_point``,
        ``momentum``, ``output_target``, ``link_budget``, ``normalisations``,
        ``loom_update``.
    """
    return [_proof("dense_local_update", _prove_dense_local_update),
            _proof("chain_rule_signal", _prove_chain_signal),
            _proof("pure_fixed_point", _prove_fixed_point),
            _proof("momentum", _prove_momentum),
            _proof("output_target", _prove_output_targets),
            _proof("link_budget", _prove_link_budget),
            _proof("normalisations", _prove_normalisations),
            _proof("loom_update", _prove_loom_update)]
