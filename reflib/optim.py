"""Reference optimizers: ``spec``'s update applied to every parameter of a dict, explicit state.

The arithmetic is the spec's (``spec.engine_step`` / ``spec.step``: DataCode's equations
evaluated with mpmath); names, defaults and state variables are the registry's
(``optable.OPTIMIZERS``, which ``spec.OPTIMIZERS`` reads). This
module only validates, routes over the parameter dict and converts:

- ``dps=None``: the spec runs at ``SPEC_DPS`` digits and the results are rounded to float64
  (a correctly rounded reference for float64 engines);
- ``dps=int``: the spec runs at that precision and the results stay object arrays of mpf.

The long story: docs/reflib.md, section ``reflib/optim.py``.
"""
from __future__ import annotations

import numbers

import numpy as np

from optable.optimizers import check_hyperparameters, find_optimizer
from reflib.numeric import numeric_for

# NOTE: float64 results are rounded from a 50-digit evaluation, far beyond float64's 16 digits.
SPEC_DPS = 50
FORMS = ("engine", "table")


def _spec():
    # imported on first use: spec pulls in SymPy, which value_and_grad does not need
    import spec
    return spec


def optimizer_spec(name):
    """The ``spec.OptimizerSpec`` for ``name`` (case-insensitive).

    Raises
    ------
    spec.UnknownOptimizerError
        (a KeyError) naming the close matches, for an unknown name.
    """
    from spec.optimizers import lookup_optimizer
    return lookup_optimizer(name)


def state_variables(optimizer):
    """The names of ``optimizer``'s state arrays (``()`` for a stateless one)."""
    return tuple(optimizer_spec(optimizer).state)


def hyperparameters(optimizer, lr=None, **hyper):
    """The full hyperparameter dict of ``optimizer``: the registry's defaults overridden by the
    given (``optable.optimizers.check_hyperparameters``: names, real numbers, ranges).

    Raises
    ------
    ValueError
        For a name the optimizer does not have (with close matches), or a value that is not a
        finite real number in the hyperparameter's range.
    """
    opt = optimizer_spec(optimizer)
    given = dict(hyper)
    if lr is not None:
        given["lr"] = lr
    return check_hyperparameters(find_optimizer(opt.name), given, opt.name)


def init_state(optimizer, params, dps=None):
    """A fresh state: ``t = 0`` and zero slots shaped like each parameter."""
    zeros = _zeros_for(dps)
    return {"t": 0, "slots": {var: {k: zeros(np.shape(v)) for k, v in params.items()}
                              for var in state_variables(optimizer)}}


def step(optimizer, params, grads, state=None, t=None, lr=None, dps=None, form="engine",
         **hyper):
    """One update of every parameter through the spec.

    Parameters
    ----------
    optimizer : str
        A name of the optimizer registry (``optable.OPTIMIZERS``), in any case.
    params, grads : dict[str, numpy.ndarray]
        Same keys and shapes (``grads`` from ``reflib.value_and_grad``).
    state : dict, OptState-like or None
        See the module docstring; None is a fresh state.
    t : int or None
        Step number (>= 1); None means ``state["t"] + 1``.
    lr : float or None
        Learning rate (None: the optimizer's default).
    dps : int or None
        None: float64 results; an int: exact results at that many digits.
    form : {"engine", "table"}
        ``spec.engine_step`` (default) or ``spec.step``; they differ only for an optimizer whose
        engine form holds its parameters elsewhere (spec.optimizers).
    **hyper :
        Other hyperparameters by name.

    Returns
    -------
    new_params : dict[str, numpy.ndarray]
    new_state : dict
        ``{"t": t, "slots": {...}}``; the inputs are not modified.
    """
    opt = optimizer_spec(optimizer)
    if form not in FORMS:
        raise ValueError(f"form must be 'engine' or 'table', got {form!r}")
    hp = hyperparameters(opt.name, lr=lr, **hyper)
    _check_grads(params, grads)
    t0, slots = _read_state(opt, state)
    t = t0 + 1 if t is None else _check_step(t)
    update = _spec().engine_step if form == "engine" else _spec().step
    work_dps = SPEC_DPS if dps is None else dps
    new_params, new_slots = {}, {var: {} for var in opt.state}
    for key, w in params.items():
        slot = {var: slots[var][key] for var in opt.state if key in slots.get(var, {})}
        w_new, s_new = update(opt.name, np.asarray(w), np.asarray(grads[key]), slot, t,
                              dps=work_dps, **hp)
        new_params[key] = _convert(w_new, dps)
        for var in opt.state:
            new_slots[var][key] = _convert(s_new[var], dps)
    return new_params, {"t": t, "slots": new_slots}


# -- helpers -------------------------------------------------------------------------------------

def _read_state(opt, state):
    if state is None:
        return 0, {}
    if hasattr(state, "slots") and hasattr(state, "t"):
        t, slots = state.t, state.slots
    elif isinstance(state, dict) and set(state) <= {"t", "slots"}:
        t, slots = state.get("t", 0), state.get("slots", {})
    else:
        raise TypeError("optimizer state must be {'t': int, 'slots': {variable: {param: array}}} "
                        "(from reflib.optim.init_state or a previous step), or None")
    allowed = opt.state
    for var in slots:
        if var not in allowed:
            raise ValueError(f"{opt.name} has no state variable {var!r}; its state is "
                             f"{list(allowed) or 'empty'} (was the state made for another "
                             "optimizer?)")
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
        raise ValueError(f"state t must be an int >= 0 (steps taken), got {t!r}")
    return int(t), slots


def _check_step(t):
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1:
        raise ValueError(f"step t must be an int >= 1 (1 for the first update), got {t!r}")
    return int(t)


def _check_grads(params, grads):
    if set(params) != set(grads):
        missing = sorted(set(params) - set(grads))
        extra = sorted(set(grads) - set(params))
        raise ValueError(f"grads must have the parameters' names; missing {missing}, "
                         f"unexpected {extra}")
    for key in params:
        if np.shape(params[key]) != np.shape(grads[key]):
            raise ValueError(f"gradient of {key!r} has shape {np.shape(grads[key])}, the "
                             f"parameter {np.shape(params[key])}")


def _convert(arr, dps):
    arr = np.asarray(arr)
    if dps is None:
        return np.array([float(v) for v in arr.reshape(-1)], dtype=np.float64).reshape(arr.shape)
    return arr


def _zeros_for(dps):
    return numeric_for(dps).zeros
