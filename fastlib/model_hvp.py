"""Hessian- and Gauss-Newton-vector products of a model's loss for its parameters.

Forward over reverse, op by op: the model is read as its chain of registry ops, each layer
kind as the reference models trace it (a ``Dense`` is ``matmul``, ``add``, its activation; an
``LSTM`` its unrolled gates), the forward pass carries a tangent
beside every value (``fastlib.jvp``), and the backward pass carries the tangent of every
adjoint: for an op with inputs ``x``, output adjoint ``g`` and its tangent ``ġ``,

    adjoint(x) = VJP(x, g),   tangent of adjoint(x) = VJP(x, ġ) + HVP(x, g, ẋ).

The tangents of the parameters' adjoints are ``H v``. Dropping every HVP term but the loss's
gives the Gauss-Newton product ``Jᵀ H_loss J v`` (positive semi-definite for the convex losses).
"""
from __future__ import annotations

import numpy as np

from fastlib import ops as _ops
from fastlib.layers.activations import LEAKY_SLOPE
from fastlib.second_order import hvp as _op_hvp
from fastlib.second_order import jvp as _op_jvp

__all__ = ["hvp", "model_hvp", "gnvp"]


def hvp(subject, *args, **kwargs):
    """``fastlib.hvp``: an op's HVP (``hvp(name, inputs, cotangent, tangents, params=None)``,
    see ``fastlib.second_order.hvp``) or a model's (``hvp(model, x, y, loss, v)``, see
    :func:`model_hvp`), told apart by the first argument (an op name is a str)."""
    if isinstance(subject, str):
        return _op_hvp(subject, *args, **kwargs)
    return model_hvp(subject, *args, **kwargs)


class _Chain:
    """The model's forward as registry ops, a tangent carried beside every value (fastlib.jvp).

    Keys name the values: a parameter's dotted name, ``"x"`` for the input, ``"c<n>"`` for a
    constant, ``"s<n>"`` for the result of step n; ``steps`` lists (op, input keys, params,
    result key) in execution order for the backward pass.
    """

    def __init__(self, dtype):
        self.dtype = dtype
        self.values, self.tangents, self.steps = {}, {}, []

    def leaf(self, key, value, tangent=None):
        self.values[key] = value
        self.tangents[key] = np.zeros_like(value) if tangent is None else tangent
        return key

    def const(self, value):
        return self.leaf(f"c{len(self.values)}", np.ascontiguousarray(value, dtype=self.dtype))

    def op(self, name, *keys, **params):
        res = f"s{len(self.steps)}"
        self.values[res], self.tangents[res] = _op_jvp(
            name, [self.values[k] for k in keys], [self.tangents[k] for k in keys], params)
        self.steps.append((name, list(keys), params, res))
        return res

    def shape(self, key):
        return self.values[key].shape


# -- each layer kind as registry ops (the documented formulas, as the reference models trace) --

def _activation(chain, h, name):
    """A Dense layer's activation (softmax over the last axis); linear adds nothing."""
    if name == "linear":
        return h
    if name == "leaky_relu":
        return chain.op(name, h, negative_slope=LEAKY_SLOPE)
    if name == "softmax":
        return chain.op(name, h, axis=-1)
    return chain.op(name, h)


def _affine(chain, x, w, b=None):
    """``x @ w (+ b)`` over the last axis; more than two axes go through a 2-D reshape."""
    shape = chain.shape(x)
    n_out = chain.shape(w)[1]
    flat = x if len(shape) == 2 else chain.op("reshape", x, shape=(-1, shape[-1]))
    y = chain.op("matmul", flat, w)
    if b is not None:
        y = chain.op("add", y, b)
    return y if len(shape) == 2 else chain.op("reshape", y, shape=tuple(shape[:-1]) + (n_out,))


def _dense(layer, chain, x, p):
    return _activation(chain, _affine(chain, x, p + "weight", p + "bias"), layer.activation)


def _swiglu(layer, chain, x, p):
    gate = chain.op("silu", _affine(chain, x, p + "w_gate"))
    return _affine(chain, chain.op("mul", gate, _affine(chain, x, p + "w_up")), p + "w_down")


def _layer_norm(layer, chain, x, p):
    y = chain.op("layer_norm", x, eps=layer.eps)
    return chain.op("add", chain.op("mul", y, p + "weight"), p + "bias")


def _rms_norm(layer, chain, x, p):
    return chain.op("mul", chain.op("rms_norm", x, eps=layer.eps), p + "weight")


def _softmax(layer, chain, x, p):
    return chain.op("softmax", x, axis=layer.axis)


def _embedding(layer, chain, x, p):
    idx = layer.indices(chain.values[x])
    one_hot = np.zeros((idx.size, layer.num))
    one_hot[np.arange(idx.size), idx.reshape(-1)] = 1
    rows = chain.op("matmul", chain.const(one_hot), p + "weight")
    return chain.op("reshape", rows, shape=idx.shape + (layer.dim,))


def _time_step(chain, x, t, features):
    batch = chain.shape(x)[0]
    return chain.op("reshape", chain.op("slice", x, axis=1, start=t, stop=t + 1),
                    shape=(batch, features))


def _stack_steps(chain, steps):
    batch, hidden = chain.shape(steps[0])
    out = None
    for h in steps:
        h3 = chain.op("reshape", h, shape=(batch, 1, hidden))
        out = h3 if out is None else chain.op("concat", out, h3, axis=1)
    return out


def _rnn(layer, chain, x, p):
    h, states = None, []
    for t in range(chain.shape(x)[1]):
        pre = chain.op("matmul", _time_step(chain, x, t, layer.input_size), p + "w_ih")
        if h is not None:   # h_0 = 0: the first step has no recurrent term
            pre = chain.op("add", pre, chain.op("matmul", h, p + "w_hh"))
        h = chain.op("tanh", chain.op("add", pre, p + "b"))
        states.append(h)
    return _stack_steps(chain, states) if layer.return_sequences else h


def _lstm(layer, chain, x, p):
    H = layer.hidden_size
    h = c = None
    states = []
    for t in range(chain.shape(x)[1]):
        gates = chain.op("matmul", _time_step(chain, x, t, layer.input_size), p + "w_ih")
        if h is not None:
            gates = chain.op("add", gates, chain.op("matmul", h, p + "w_hh"))
        gates = chain.op("add", gates, p + "b")
        i, f, g, o = (chain.op("slice", gates, axis=1, start=k * H, stop=(k + 1) * H)
                      for k in range(4))
        i, f, o = chain.op("sigmoid", i), chain.op("sigmoid", f), chain.op("sigmoid", o)
        ig = chain.op("mul", i, chain.op("tanh", g))
        c = ig if c is None else chain.op("add", chain.op("mul", f, c), ig)   # c_0 = 0
        h = chain.op("mul", o, chain.op("tanh", c))
        states.append(h)
    return _stack_steps(chain, states) if layer.return_sequences else h


def _attend(chain, q, k, v, root_dh):
    scores = chain.op("matmul", q, chain.op("transpose", k, axes=(0, 2, 1)))
    weights = chain.op("softmax", chain.op("div", scores, root_dh), axis=-1)
    return chain.op("matmul", weights, v)


def _attention(layer, chain, x, p):
    seq = chain.shape(x)[1]
    q, k, v = (_affine(chain, x, p + f"w_{n}", p + f"b_{n}") for n in "qkv")
    dh = layer.d_model // layer.heads
    root_dh = chain.const(np.sqrt(np.float64(dh)))
    out = None
    for h in range(layer.heads):
        qh, kh, vh = (chain.op("slice", m, axis=2, start=h * dh, stop=(h + 1) * dh)
                      for m in (q, k, v))
        if layer.causal:   # query row t sees key/value rows 0..t only
            ah = None
            for t in range(seq):
                row = _attend(chain, chain.op("slice", qh, axis=1, start=t, stop=t + 1),
                              chain.op("slice", kh, axis=1, start=0, stop=t + 1),
                              chain.op("slice", vh, axis=1, start=0, stop=t + 1), root_dh)
                ah = row if ah is None else chain.op("concat", ah, row, axis=1)
        else:
            ah = _attend(chain, qh, kh, vh, root_dh)
        out = ah if out is None else chain.op("concat", out, ah, axis=-1)
    return _affine(chain, out, p + "w_o", p + "b_o")


def _sequential(layer, chain, x, p):
    for i, child in enumerate(layer.layers):
        x = _trace(child, chain, x, f"{p}{i}.")
    return x


def _parallel(layer, chain, x, p):
    out = None
    for i, child in enumerate(layer.layers):
        y = _trace(child, chain, x, f"{p}{i}.")
        if out is not None:
            y = (chain.op("concat", out, y, axis=-1) if layer.combine == "concat"
                 else chain.op("add", out, y))
        out = y
    return out


_TRACES = {"Dense": _dense, "SwiGLU": _swiglu, "LayerNorm": _layer_norm, "RMSNorm": _rms_norm,
           "Softmax": _softmax, "Embedding": _embedding, "RNN": _rnn, "LSTM": _lstm,
           "MultiHeadAttention": _attention, "Sequential": _sequential, "Parallel": _parallel}


def _check_supported(layer):
    """A ValueError naming the first layer (depth first) the product has no trace for."""
    from fastlib import layers

    kind = type(layer).__name__
    if kind not in _TRACES or type(layer) is not getattr(layers, kind):
        raise ValueError(f"fastlib.hvp: {kind} is not a layer the model Hessian-vector product "
                         f"supports; it supports fastlib's {', '.join(sorted(_TRACES))} "
                         f"(or pass an op name for an op's HVP)")
    for child in getattr(layer, "layers", ()):
        _check_supported(child)


def _trace(layer, chain, x, prefix):
    return _TRACES[type(layer).__name__](layer, chain, x, prefix)


def _chain(model, x, v):
    """The model's forward on a :class:`_Chain`: (chain, output key)."""
    _check_supported(model)
    chain = _Chain(model.dtype)
    first = model
    while type(first).__name__ in ("Sequential", "Parallel"):
        first = first.layers[0]
    if type(first).__name__ == "Embedding":
        xv = np.asarray(x)
        chain.values["x"], chain.tangents["x"] = xv, None     # indices: no tangent
    else:
        chain.leaf("x", np.ascontiguousarray(x, dtype=model.dtype))
    model.infer_shape(np.shape(x))   # an input the model does not take: its own clear error
    for key, w in model.parameters().items():
        chain.leaf(key, w, np.ascontiguousarray(v[key]))
    out = _trace(model, chain, "x", "")
    return chain, out


def _check_v(model, v):
    params = model.parameters()
    if not isinstance(v, dict) or set(v) != set(params):
        got = sorted(v) if isinstance(v, dict) else type(v).__name__
        raise ValueError(f"fastlib.hvp: v must be a dict keyed like model.parameters() "
                         f"({sorted(params)}); got {got}")
    for key, w in params.items():
        arr = np.asarray(v[key])
        if arr.shape != w.shape or arr.dtype != w.dtype:
            raise ValueError(f"fastlib.hvp: v[{key!r}] is {arr.dtype}{arr.shape}; the parameter "
                             f"is {w.dtype}{w.shape}")


def model_hvp(model, x, y, loss, v, gauss_newton=False):
    """``H v``: the Hessian of the mean loss of ``model`` on ``(x, y)`` times ``v``.

    Parameters
    ----------
    model : fastlib layer or container
        ``Dense``, ``SwiGLU``, ``LayerNorm``, ``RMSNorm``, ``Softmax``, ``Embedding``, ``RNN``,
        ``LSTM``, ``MultiHeadAttention``, and ``Sequential`` / ``Parallel`` of them; another
        layer class raises a ``ValueError`` naming it.
    x : array_like
        Input batch, as the model's forward takes it (integer indices for an ``Embedding``).
    y : array_like
        Targets in the format ``loss`` expects (as for ``fastlib.value_and_grad``).
    loss : str
        A loss name of ``fastlib.value_and_grad``.
    v : dict[str, ndarray]
        The direction, keyed and shaped like ``model.parameters()``, of the model's dtype.
    gauss_newton : bool, default False
        Give the Gauss-Newton product ``Jᵀ H_loss J v`` instead (see the module docstring).

    Returns
    -------
    dict[str, ndarray]
        Keyed like ``model.parameters()``.
    """
    from fastlib.losses import resolve_loss, validate_targets

    _check_v(model, v)
    name = resolve_loss(loss)
    chain, out = _chain(model, x, v)
    values, tangents, steps = chain.values, chain.tangents, chain.steps
    pred = values[out]
    target = validate_targets(name, pred, y)
    if name == "cross_entropy":
        target = np.asarray(target).reshape(-1)
    loss_inputs = [pred, target]
    t_target = None if name == "cross_entropy" else np.zeros_like(target)
    one = np.ones((), dtype=pred.dtype)
    adj = {out: _ops.vjp(name, loss_inputs, one)[0]}
    adj_dot = {out: _op_hvp(name, loss_inputs, one, [tangents[out], t_target])[0]}
    for op, keys, p, res in reversed(steps):
        if res not in adj:
            continue   # a result nothing downstream reads
        g, g_dot = adj.pop(res), adj_dot.pop(res)
        inputs = [values[k] for k in keys]
        first = _ops.vjp(op, inputs, g, **p)
        linear = _ops.vjp(op, inputs, g_dot, **p)
        second = (None,) * len(keys) if gauss_newton else _op_hvp(
            op, inputs, g, [tangents[k] for k in keys], p)
        for k, a, lin, sec in zip(keys, first, linear, second):
            if a is None or tangents[k] is None:
                continue   # class indices
            d = lin if sec is None else lin + sec
            adj[k] = adj[k] + a if k in adj else a
            adj_dot[k] = adj_dot[k] + d if k in adj_dot else d
    return {key: adj_dot[key] if key in adj_dot else np.zeros_like(w)
            for key, w in model.parameters().items()}


def gnvp(model, x, y, loss, v):
    """The Gauss-Newton product ``Jᵀ H_loss J v`` (see :func:`model_hvp`)."""
    return model_hvp(model, x, y, loss, v, gauss_newton=True)
