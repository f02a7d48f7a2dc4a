"""The fused optimizer update on the device: all seven optimizers, one pass per parameter array.

The per-element rule :func:`step_element` is the device twin of
``fastlib.kernels.optim.step_element``: the same kind codes, the same coefficient vector (built
by ``fastlib.optim``'s optimizer objects, in float64 and rounded once to the parameter dtype),
the same arithmetic in the same order. Hyperparameters, names and defaults therefore come from
one place (``fastlib.optim``), and a test holds the two against DataCode's formulas.

NOTE: NAG runs on the look-ahead variable w~ = w - beta v, as the CPU kernel does (see its
NOTE): v' = beta v + lr g, w~' = w~ - lr g - beta v', with g taken at w~.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numba import cuda

from fastlib import optim as _optim
from fastlib.kernels.optim import ADAGRAD, MOMENTUM, NAG, RMSPROP, SGD

from . import device
from .device import kernel, signatures


@cuda.jit(device=True)
def _momentum(w, g, a, lr, beta, one_minus_beta):
    a = beta * a + one_minus_beta * g
    return w - lr * a, a


@cuda.jit(device=True)
def _nag(w, g, a, lr, beta):
    a = beta * a + lr * g
    return w - lr * g - beta * a, a


@cuda.jit(device=True)
def _adagrad(w, g, a, lr, eps):
    a = a + g * g
    return w - lr / math.sqrt(a + eps) * g, a


@cuda.jit(device=True)
def _rmsprop(w, g, a, lr, gamma, one_minus_gamma, eps):
    a = gamma * a + one_minus_gamma * (g * g)
    return w - lr / math.sqrt(a + eps) * g, a


@cuda.jit(device=True)
def _adam(w, g, m, v, lr, b1, one_minus_b1, b2, one_minus_b2, inv_bc1, inv_bc2, eps, wd):
    m = b1 * m + one_minus_b1 * g
    v = b2 * v + one_minus_b2 * (g * g)
    # the coefficient vector holds the reciprocals 1 / (1 - beta^t), as on the CPU
    m_hat = m * inv_bc1
    v_hat = v * inv_bc2
    # NOTE: wd = 0 for Adam; AdamW's decoupled term uses the weight before the step.
    return w - lr * (m_hat / (math.sqrt(v_hat) + eps) + wd * w), m, v


@cuda.jit(device=True)
def step_element(kind, w, g, a, b, c):
    """One optimizer step on one element; returns ``(w, a, b)`` (twin of the CPU rule).

    ``c``: SGD (lr); MOMENTUM (lr, beta, 1-beta); NAG (lr, beta); ADAGRAD (lr, eps);
    RMSPROP (lr, gamma, 1-gamma, eps); ADAM/ADAMW (lr, b1, 1-b1, b2, 1-b2, 1/bc1, 1/bc2, eps,
    wd).
    """
    if kind == SGD:
        w = w - c[0] * g
    elif kind == MOMENTUM:
        w, a = _momentum(w, g, a, c[0], c[1], c[2])
    elif kind == NAG:
        w, a = _nag(w, g, a, c[0], c[1])
    elif kind == ADAGRAD:
        w, a = _adagrad(w, g, a, c[0], c[1])
    elif kind == RMSPROP:
        w, a = _rmsprop(w, g, a, c[0], c[1], c[2], c[3])
    else:
        w, a, b = _adam(w, g, a, b, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8])
    return w, a, b


def _update_body(kind, w, g, a, b, c):
    # a and b may be empty for kinds with less state; they are indexed only when used.
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < w.shape[0]:
        if kind == SGD:
            w[i] = w[i] - c[0] * g[i]
        elif kind == MOMENTUM or kind == NAG or kind == ADAGRAD or kind == RMSPROP:
            w[i], a[i], _ = step_element(kind, w[i], g[i], a[i], a[i], c)
        else:
            w[i], a[i], b[i] = step_element(kind, w[i], g[i], a[i], b[i], c)
        i += step


_update = kernel(*signatures("void(int64, {t}[::1], {t}[::1], {t}[::1], {t}[::1], {t}[::1])"))(
    _update_body)


# ---------------------------------------------------------------------------------------------
# host side

def _check(opt, params, grads, state):
    if not isinstance(params, Mapping) or not isinstance(grads, Mapping):
        raise TypeError(f"{opt.name}: params and grads must be dicts name -> array "
                        f"(model.parameters() and the gradients keyed alike)")
    if not isinstance(state, _optim.OptState):
        raise TypeError(f"{opt.name}: state must be the OptState of optimizer_init() or "
                        f"fastlib.optim's init(), got {type(state).__name__}")
    if set(grads) != set(params):
        raise ValueError(f"{opt.name}: grads and params have different keys (missing gradients: "
                         f"{sorted(set(params) - set(grads))}; unknown gradients: "
                         f"{sorted(set(grads) - set(params))})")
    for s in opt.state_names:
        if set(state.slots.get(s, {})) != set(params):
            raise ValueError(f"{opt.name}: state has no {s!r} array for every parameter; build "
                             "it with optimizer_init(optimizer, params)")
    for key, p in params.items():
        arrays = [("parameter", p), ("gradient", grads[key])]
        arrays += [(f"state {s!r}", state.slots[s][key]) for s in opt.state_names]
        on_device = device.is_device_array(p)
        for what, a in arrays:
            if device.is_device_array(a) != on_device:
                raise TypeError(f"{opt.name}: {what} {key!r} and its parameter are not both "
                                "NumPy or both device arrays; keep each parameter's arrays "
                                "together")
            if np.dtype(a.dtype) not in (np.float32, np.float64) or a.dtype != p.dtype:
                raise TypeError(f"{opt.name}: {what} {key!r} is {a.dtype}; expected the "
                                f"parameter's dtype {p.dtype} (float32 or float64)")
            if tuple(int(d) for d in a.shape) != tuple(int(d) for d in p.shape):
                raise ValueError(f"{opt.name}: {what} {key!r} has shape {tuple(a.shape)}, "
                                 f"parameter has {tuple(p.shape)}")
            if on_device and not a.is_c_contiguous():
                raise ValueError(f"{opt.name}: device {what} {key!r} must be C-contiguous")


def optimizer_init(optimizer, params, **hyper):
    """Zero state (step 0) for ``params``: device arrays for device params, NumPy otherwise.

    Parameters
    ----------
    optimizer : str or fastlib.optim.Optimizer
    params : dict name -> ndarray or device array
    **hyper : hyperparameters when ``optimizer`` is a name

    Returns
    -------
    fastlib.optim.OptState
    """
    opt = _optim.get(optimizer, **hyper)
    slots = {}
    for s in opt.state_names:
        slots[s] = {}
        for key, p in params.items():
            if device.is_device_array(p):
                slots[s][key] = device.zeros(p.size, p.dtype).reshape(
                    tuple(int(d) for d in p.shape))
            else:
                slots[s][key] = np.zeros(p.shape, p.dtype)
    return _optim.OptState(0, slots)


def optimizer_update(optimizer, params, grads, state, *, lr=None, **hyper):
    """One fused optimizer step on the device, in place; returns ``state`` with ``t + 1``.

    Parameters
    ----------
    optimizer : str or fastlib.optim.Optimizer
        ``SGD Momentum NAG Adagrad RMSprop Adam AdamW`` (any case) or an optimizer object.
    params, grads : dict name -> array
        NumPy arrays (copied to the device, updated, copied back into the same arrays) or
        device arrays (updated where they are). Gradients have the parameters' shapes / dtypes.
    state : fastlib.optim.OptState
        From :func:`optimizer_init` (or ``fastlib.optim``'s ``init`` for NumPy parameters).
    lr : float, optional
        Overrides the learning rate for this step.
    **hyper : hyperparameters when ``optimizer`` is a name (``lr``, ``beta``, ``beta1``, ...).

    Returns
    -------
    fastlib.optim.OptState
        ``state``, its arrays updated in place and ``t`` advanced by one.
    """
    opt = _optim.get(optimizer, **hyper)
    _check(opt, params, grads, state)
    device.require_device()
    t = state.t + 1
    for key, p in params.items():
        c = device.put(opt.coefficients(t, lr, p.dtype))
        host = not device.is_device_array(p)
        slots = [state.slots[s][key] for s in opt.state_names]
        flat = [device.put(a) if host else a.reshape(int(p.size))
                for a in [p, grads[key], *slots]]
        while len(flat) < 4:
            flat.append(device.empty(0, p.dtype))
        _update[device.grid_1d(int(p.size))](opt.kind, flat[0], flat[1], flat[2], flat[3], c)
        if host:  # copy back into the caller's arrays, as the CPU update is in place
            p[...] = device.get(flat[0], p.shape)
            for a, d_a in zip(slots, flat[2:]):
                a[...] = device.get(d_a, a.shape)
    state.t = t
    return state
