"""The fused optimizer update on the device: every optimizer, one pass per parameter array.

The rules are the CPU's own sources (``fastlib.kernels.optim_rules``), compiled here as device
functions over ``fastlib.cuda.scalar``'s math shim, and :func:`step_element` switches on the
kind with text generated from them, reading the coefficient record by field name (``c["lr"]``):
the same kinds, the same record (filled by ``fastlib.optim``'s optimizer objects in float64 and
rounded once to the parameter dtype), the same arithmetic in the same order as on the CPU.
An engine-form rule (the look-ahead variable w~ = w - beta v) runs as on the CPU.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numba import cuda, types
from numba.np.numpy_support import from_dtype

from fastlib import optim as _optim
from fastlib.kernels import optim_rules as _rules
from fastlib.kernels.switch import compile_switch, switch_source

from . import device
from .device import kernel
from .scalar import SHIM, compile_sources


def _element_branch(rule):
    return [_rules.call_line(rule, lambda x: x, lambda f: f"c[{f!r}]")]


#: The text of :func:`step_element`, generated from the rules.
STEP_SOURCE = switch_source("step_element", "kind, w, g, a, b, c", "kind",
                            _rules.cases(_element_branch), tail=["    return w, a, b"])

DEVICE = compile_sources(
    {**_rules.SOURCES, "step_element": compile_switch(STEP_SOURCE, "step_element", {},
                                                      lambda fn: fn)},
    SHIM, cuda.jit(device=True))
#: ``step_element(kind, w, g, a, b, c) -> (w, a, b)``: one step of optimizer ``kind`` on one
#: element (state ``a``, ``b`` passed through where the rule keeps less), record ``c``.
step_element = DEVICE["step_element"]


def coefficient_signatures(template):
    """One kernel signature per dtype of ``device.DTYPES``: ``template`` as a Numba signature
    string, with ``{t}`` the dtype and ``{c}`` a 1-d array of its coefficient records.

    (A record type has no name in a signature string, so the string is read the way Numba
    reads its own: evaluated over ``numba.types``, with the record array added.)
    """
    out = []
    for t in device.DTYPES:
        names = {**vars(types), "coefficients": from_dtype(_rules.coefficient_dtype(t))[::1]}
        out.append(eval(template.format(t=t, c="coefficients"), {}, names))
    return out


@cuda.jit(device=True)
def update_at(kind, i, w, g, a, b, c):
    """One step of optimizer ``kind`` on element ``i`` of ``w`` and its state ``a``, ``b``, in
    place; a state array is empty (and never indexed) where the rule keeps less state."""
    if a.shape[0] == 0:
        w[i], _, _ = step_element(kind, w[i], g[i], w[i], w[i], c)
    elif b.shape[0] == 0:
        w[i], a[i], _ = step_element(kind, w[i], g[i], a[i], a[i], c)
    else:
        w[i], a[i], b[i] = step_element(kind, w[i], g[i], a[i], b[i], c)


def _update_body(kind, w, g, a, b, table):
    c = table[0]
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < w.shape[0]:
        update_at(kind, i, w, g, a, b, c)
        i += step


_update = kernel(*coefficient_signatures(
    "void(int64, {t}[::1], {t}[::1], {t}[::1], {t}[::1], {c})"))(_update_body)


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
        A name of ``fastlib.optim.OPTIMIZERS`` (any case) or an optimizer object.
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
        while len(flat) < 2 + _rules.MAX_STATE:
            flat.append(device.empty(0, p.dtype))
        _update[device.grid_1d(int(p.size))](opt.kind, flat[0], flat[1], flat[2], flat[3], c)
        if host:  # copy back into the caller's arrays, as the CPU update is in place
            p[...] = device.get(flat[0], p.shape)
            for a, d_a in zip(slots, flat[2:]):
                a[...] = device.get(d_a, a.shape)
    state.t = t
    return state
