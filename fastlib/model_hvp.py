"""Hessian- and Gauss-Newton-vector products of a model's loss for its parameters.

Forward over reverse, op by op: the model is read as its chain of ops (a ``Dense`` layer is
``matmul``, ``add`` of the bias, then its activation), the forward pass carries a tangent
beside every value (``fastlib.jvp``), and the backward pass carries the tangent of every
adjoint: for an op with inputs ``x``, output adjoint ``g`` and its tangent ``ġ``,

    adjoint(x) = VJP(x, g),   tangent of adjoint(x) = VJP(x, ġ) + HVP(x, g, ẋ).

The tangents of the parameters' adjoints are ``H v``. Dropping every HVP term but the loss's
gives the Gauss-Newton product ``Jᵀ H_loss J v`` (positive semi-definite for the convex losses).
Supported models: a ``Dense`` or a ``Sequential`` of ``Dense`` layers (MLPs); other layers raise.
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


def _dense_layers(model):
    """[(parameter key prefix, Dense layer)] of an MLP; ValueError naming what is not one."""
    from fastlib.layers import Dense, Sequential

    if isinstance(model, Dense):
        return [("", model)]
    if isinstance(model, Sequential):
        out = []
        for i, child in enumerate(model.layers):
            if not isinstance(child, Dense):
                raise ValueError(f"fastlib.hvp: layer {i} is a {type(child).__name__}; the model "
                                 f"Hessian-vector product supports Dense layers (MLPs) only")
            out.append((f"{i}.", child))
        return out
    raise ValueError(f"fastlib.hvp: the model is a {type(model).__name__}; pass a Dense or a "
                     f"Sequential of Dense layers (or an op name for an op's HVP)")


def _activation(layer):
    """(op name, params) of a Dense layer's activation, or None for linear."""
    name = layer.activation
    if name == "linear":
        return None
    if name == "leaky_relu":
        return name, {"negative_slope": LEAKY_SLOPE}
    if name == "softmax":
        return name, {"axis": -1}
    return name, {}


def _chain(model, x, v):
    """The model's ops as [(op, [input keys], params)] with the keys' values and tangents."""
    params = model.parameters()
    dtype = model.dtype
    values = {"x": np.ascontiguousarray(x, dtype=dtype)}
    tangents = {"x": np.zeros_like(values["x"])}
    for key, w in params.items():
        values[key] = w
        tangents[key] = np.ascontiguousarray(v[key])
    if values["x"].ndim != 2:
        raise ValueError(f"fastlib.hvp: the input must be (batch, features); got shape "
                         f"{values['x'].shape}")
    steps, h = [], "x"
    for k, (prefix, layer) in enumerate(_dense_layers(model)):
        steps.append(("matmul", [h, prefix + "weight"], {}, f"{k}.mm"))
        steps.append(("add", [f"{k}.mm", prefix + "bias"], {}, f"{k}.pre"))
        h = f"{k}.pre"
        act = _activation(layer)
        if act is not None:
            steps.append((act[0], [h], act[1], f"{k}.act"))
            h = f"{k}.act"
    return steps, values, tangents, h


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
    model : fastlib.Dense or fastlib.Sequential of Dense
    x : array_like
        Input batch ``(batch, features)``.
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
    steps, values, tangents, out = _chain(model, x, v)
    for op, keys, p, res in steps:
        values[res], tangents[res] = _op_jvp(op, [values[k] for k in keys],
                                             [tangents[k] for k in keys], p)
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
        g, g_dot = adj.pop(res), adj_dot.pop(res)
        inputs = [values[k] for k in keys]
        first = _ops.vjp(op, inputs, g, **p)
        linear = _ops.vjp(op, inputs, g_dot, **p)
        second = (None,) * len(keys) if gauss_newton else _op_hvp(
            op, inputs, g, [tangents[k] for k in keys], p)
        for k, a, lin, sec in zip(keys, first, linear, second):
            d = lin if sec is None else lin + sec
            adj[k] = adj[k] + a if k in adj else a
            adj_dot[k] = adj_dot[k] + d if k in adj_dot else d
    return {key: adj_dot[key] for key in model.parameters()}


def gnvp(model, x, y, loss, v):
    """The Gauss-Newton product ``Jᵀ H_loss J v`` (see :func:`model_hvp`)."""
    return model_hvp(model, x, y, loss, v, gauss_newton=True)
