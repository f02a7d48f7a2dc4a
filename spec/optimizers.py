"""Optimizers as math: elementwise update equations, exactly as DataCode's table.

Notation: ``w`` parameters, ``g`` the gradient, ``t`` the step count (1 for the first update),
η = ``lr``. Every update is elementwise; state starts at zeros.

The long story: docs/spec.md, section ``spec/optimizers.py``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import mpmath
import numpy as np

import optable.optimizers as _registry
from spec.backends import MPMATH, SYMPY
from spec.errors import RegistryError, UnknownOptimizerError, did_you_mean
from spec.evaluate import as_array, _check_dps, GUARD_DIGITS
from spec.opspec import call_formula


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer: hyperparameter defaults, state names, and the update as a formula.

    ``update`` names what it needs from ``M, w, g, t``, the state variables and the
    hyperparameters, and returns ``(w_new, {state name: new value})``.
    """

    name: str
    hyper: Mapping
    state: tuple
    update: Callable
    equations: str
    engine_update: Callable = None      # the form an engine runs, when it differs (NAG)
    engine_offset: Callable = None      # how far behind the table's w that form holds the
    #                                     parameters (NAG: β·v, it holds w̃ = w − β·v)

    def __post_init__(self):
        object.__setattr__(self, "hyper", MappingProxyType(dict(self.hyper)))
        object.__setattr__(self, "state", tuple(self.state))

    def apply(self, M, w, g, state, t, hyper, engine=False):
        """Run one update with backend ``M`` (values already converted for it)."""
        fn = self.engine_update if engine and self.engine_update is not None else self.update
        env = dict(state)
        env.update(hyper)
        env.update(M=M, w=w, g=g, t=t)
        return call_formula(fn, env)

    def offset(self, M, state, hyper):
        """``engine_offset`` at ``state`` (0 when the engine holds the table's parameters)."""
        if self.engine_offset is None:
            return 0
        env = dict(state)
        env.update(hyper)
        env.update(M=M)
        return call_formula(self.engine_offset, env)

    def held(self, M, w, state, hyper):
        """The parameters an engine running ``engine_update`` holds when the table's form is at
        ``w`` with ``state``: ``w − offset``."""
        return w - self.offset(M, state, hyper)

    def symbolic(self):
        """The update as SymPy equations ``[Eq(v_new, ...), Eq(w_new, ...)]`` (scalar symbols)."""
        sp = SYMPY.sp
        w, g = sp.symbols("w g", real=True)
        t = sp.Symbol("t", positive=True, integer=True)
        state = {s: sp.Symbol(s, real=True) for s in self.state}
        hyper = {h: sp.Symbol(h, positive=True) for h in self.hyper}
        w_new, new_state = self.apply(SYMPY, w, g, state, t, hyper)
        eqs = [sp.Eq(sp.Symbol(f"{s}_new"), new_state[s]) for s in self.state]
        return eqs + [sp.Eq(sp.Symbol("w_new"), w_new)]


def _sgd(M, w, g, lr):
    return w - lr * g, {}


def _momentum(M, w, g, v, lr, beta):
    v_new = beta * v + (1 - beta) * g
    return w - lr * v_new, {"v": v_new}


def _nag(M, w, g, v, lr, beta):
    # g is ∇f(w − β·v), taken at the look-ahead point with the state before this step.
    v_new = beta * v + lr * g
    return w - v_new, {"v": v_new}


def _nag_engine(M, w, g, v, lr, beta):
    # w here is the stored w̃ = w − β·v and g = ∇f(w̃): see the module docstring.
    v_new = beta * v + lr * g
    return w - lr * g - beta * v_new, {"v": v_new}


def _nag_offset(M, v, beta):
    return beta * v


def _adagrad(M, w, g, G, lr, eps):
    G_new = G + g**2
    return w - lr / M.sqrt(G_new + eps) * g, {"G": G_new}


def _rmsprop(M, w, g, E, lr, gamma, eps):
    E_new = gamma * E + (1 - gamma) * g**2
    return w - lr / M.sqrt(E_new + eps) * g, {"E": E_new}


def _moments(M, g, t, m, v, beta1, beta2):
    """Adam's moments and their bias corrections: (m, v, m̂, v̂)."""
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g**2
    return m_new, v_new, m_new / (1 - beta1**t), v_new / (1 - beta2**t)


def _adam(M, w, g, t, m, v, lr, beta1, beta2, eps):
    m_new, v_new, m_hat, v_hat = _moments(M, g, t, m, v, beta1, beta2)
    return w - lr * m_hat / (M.sqrt(v_hat) + eps), {"m": m_new, "v": v_new}


def _adamw(M, w, g, t, m, v, lr, beta1, beta2, eps, weight_decay):
    m_new, v_new, m_hat, v_hat = _moments(M, g, t, m, v, beta1, beta2)
    return (w - lr * (m_hat / (M.sqrt(v_hat) + eps) + weight_decay * w),
            {"m": m_new, "v": v_new})


def _declare(name, update, equations, engine_update=None, engine_offset=None):
    """``name``'s formulas, with its hyperparameters, defaults and state from the op table's
    optimizer registry (``optable.optimizers``)."""
    sig = _registry.OPTIMIZERS[name]
    return OptimizerSpec(name, sig.defaults, sig.state, update, equations, engine_update,
                         engine_offset)


OPTIMIZERS = MappingProxyType({o.name: o for o in (
    _declare("SGD", _sgd, "w ← w − η·g"),
    _declare("Momentum", _momentum, "v ← β·v + (1−β)·g ; w ← w − η·v"),
    _declare("NAG", _nag, "v ← β·v + η·∇f(w − β·v) ; w ← w − v   (g = ∇f(w − β·v))",
             engine_update=_nag_engine, engine_offset=_nag_offset),
    _declare("Adagrad", _adagrad, "G ← G + g² ; w ← w − η/√(G + ε)·g"),
    _declare("RMSprop", _rmsprop, "E ← γ·E + (1−γ)·g² ; w ← w − η/√(E + ε)·g"),
    _declare("Adam", _adam, "m ← β1·m + (1−β1)·g ; v ← β2·v + (1−β2)·g² ; m̂ = m/(1−β1^t) ; "
                            "v̂ = v/(1−β2^t) ; w ← w − η·m̂/(√v̂ + ε)"),
    _declare("AdamW", _adamw,
             "as Adam, then w ← w − η·(m̂/(√v̂ + ε) + λ·w)   (λ = weight_decay)"),
)})
if list(OPTIMIZERS) != list(_registry.OPTIMIZERS):
    raise RegistryError(f"spec.optimizers states {list(OPTIMIZERS)} but the optimizer registry "
                        f"lists {list(_registry.OPTIMIZERS)}; give each registered optimizer "
                        f"one formula")


def lookup_optimizer(name):
    """The ``OptimizerSpec`` called ``name`` (case-insensitive)."""
    if isinstance(name, OptimizerSpec):
        return name
    return OPTIMIZERS[_registry.lookup_optimizer(name, UnknownOptimizerError).name]


def _arrays(opt, w, g, state):
    w = as_array(w, f"{opt.name}: w")
    g = as_array(g, f"{opt.name}: g")
    if g.shape != w.shape:
        raise ValueError(f"{opt.name}: g has shape {g.shape} but w has {w.shape}; the gradient "
                         f"must be shaped like the parameters")
    if state is None:
        state = {}
    if not isinstance(state, Mapping):
        raise TypeError(f"{opt.name}: state must be a dict keyed by {list(opt.state)}; got "
                        f"{type(state).__name__}")
    unknown = [k for k in state if k not in opt.state]
    if unknown:
        expected = ", ".join(opt.state) if opt.state else "no state"
        raise ValueError(f"{opt.name}: unknown state variable {unknown[0]!r}"
                         f"{did_you_mean(unknown[0], opt.state)} ({opt.name} keeps {expected})")
    arrays = {}
    for key in opt.state:
        if key in state and state[key] is not None:
            s = as_array(state[key], f"{opt.name}: state {key!r}")
            if s.shape != w.shape:
                raise ValueError(f"{opt.name}: state {key!r} has shape {s.shape} but w has "
                                 f"{w.shape}")
            arrays[key] = s
        else:
            arrays[key] = np.zeros(w.shape)
    for label, arr in [("w", w), ("g", g)] + [(f"state {k!r}", a) for k, a in arrays.items()]:
        flat = [float(v) for v in np.reshape(arr, -1)]
        if not all(np.isfinite(flat)):
            raise ValueError(f"{opt.name}: {label} holds NaN or Inf; it must be finite")
    return w, g, arrays


def _mpf(arr):
    out = np.empty(np.shape(arr), dtype=object)
    out.reshape(-1)[:] = [mpmath.mpf(v) if not isinstance(v, (np.integer, np.floating))
                          else mpmath.mpf(v.item()) for v in np.reshape(arr, -1)]
    return out


def _rounded(arr):
    out = np.empty(np.shape(arr), dtype=object)
    out.reshape(-1)[:] = [+mpmath.mpf(v) for v in np.reshape(np.asarray(arr, dtype=object), -1)]
    return out


def _step(opt, w, g, state, t, dps, hyper, engine):
    dps = _check_dps(dps)
    if not isinstance(t, (numbers.Integral, np.integer)) or isinstance(t, bool) or t < 1:
        raise ValueError(f"{opt.name}: t is the step count, an int >= 1 (1 for the first "
                         f"update); got {t!r}")
    hyper = _registry.check_hyperparameters(_registry.OPTIMIZERS[opt.name], hyper, opt.name)
    w, g, state = _arrays(opt, w, g, state)
    with mpmath.workdps(dps + GUARD_DIGITS):
        values = {k: MPMATH.param(v) for k, v in hyper.items()}
        try:
            w_new, new_state = opt.apply(MPMATH, _mpf(w), _mpf(g),
                                         {k: _mpf(a) for k, a in state.items()}, int(t), values,
                                         engine=engine)
        except ZeroDivisionError:
            raise ValueError(f"{opt.name}: division by zero (eps=0 with a zero accumulated "
                             f"gradient); use eps > 0") from None
    with mpmath.workdps(dps):
        return _rounded(w_new), {k: _rounded(new_state[k]) for k in opt.state}


def step(name, w, g, state, t, dps=50, **hyper):
    """One optimizer step evaluated exactly (mpmath at ``dps`` digits), as the table states it.

    Parameters
    ----------
    name : str
        Optimizer name, case-insensitive: SGD, Momentum, NAG, Adagrad, RMSprop, Adam, AdamW.
    w, g : array_like
        Parameters and gradient, the same shape. For NAG, ``g`` is ∇f(w − β·v) (the gradient at
        the look-ahead point, with the state before this step).
    state : dict or None
        State arrays keyed by the optimizer's state names (``v``; ``G``; ``E``; ``m``, ``v``);
        missing entries are zeros.
    t : int
        Step count, 1 for the first update.
    dps : int, default 50
        Decimal digits of the results.
    **hyper
        Hyperparameters by name (``lr``, ``beta``, ``gamma``, ``beta1``, ``beta2``, ``eps``,
        ``weight_decay``); defaults from ``OPTIMIZERS[name].hyper``.

    Returns
    -------
    w_new : numpy.ndarray of mpmath.mpf
    state_new : dict of numpy.ndarray of mpmath.mpf
        Every state variable of the optimizer.

    Examples
    --------
    >>> w, s = step("momentum", [1.0], [0.5], None, 1, lr=0.25, beta=0.5)
    >>> float(w[0]), float(s["v"][0])
    (0.9375, 0.25)
    """
    return _step(lookup_optimizer(name), w, g, state, t, dps, hyper, engine=False)


def engine_step(name, w, g, state, t, dps=50, **hyper):
    """One step in the form an engine runs (see the module docstring); as ``step`` otherwise.

    For NAG, ``w`` is the stored shifted parameter w̃ = w − β·v, ``g`` = ∇f(w̃), and the result
    is (w̃_new, {"v": v_new}) with w̃_new = w̃ − η·g − β·v_new. For the other optimizers this is
    ``step``.
    """
    return _step(lookup_optimizer(name), w, g, state, t, dps, hyper, engine=True)
