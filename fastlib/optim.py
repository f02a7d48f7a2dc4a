"""Optimizers: (init, update) pairs over a parameter dict, with explicit, checkpointable state.

The long story: docs/fastlib.md, section ``fastlib/optim.py``.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

import numpy as np

from fastlib.kernels import optim as _k

__all__ = ["Optimizer", "OptState", "SGD", "Momentum", "NAG", "Adagrad", "RMSprop", "Adam",
           "AdamW", "OPTIMIZERS", "get", "from_config"]


@dataclass
class OptState:
    """Explicit optimizer state: the step count and one array per (state name, parameter).

    Attributes
    ----------
    t : int
        Number of updates applied so far; the next update uses step ``t + 1`` (the first is 1).
    slots : dict
        ``{state_name: {param_name: ndarray}}``, e.g. ``slots["m"]["0.weight"]`` for Adam.
        Arrays are updated in place by :meth:`Optimizer.update`.
    """

    t: int = 0
    slots: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> dict:
        return self.slots[name]

    def copy(self) -> "OptState":
        """A deep copy (new arrays), e.g. to snapshot the state before a risky step."""
        return OptState(self.t, {s: {p: a.copy() for p, a in d.items()}
                                 for s, d in self.slots.items()})


@dataclass(frozen=True)
class Optimizer:
    """Base class: hyperparameters as dataclass fields, rule in the kernel of ``kind``."""

    name: ClassVar[str] = ""
    kind: ClassVar[int] = -1
    state_names: ClassVar[tuple] = ()

    lr: float = 0.01

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating,
                                                                 np.integer)):
                raise TypeError(f"{self.name}: hyperparameter {f.name!r} must be a real number, "
                                f"got {type(value).__name__}")
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"{self.name}: hyperparameter {f.name!r} must be finite, "
                                 f"got {value}")
            object.__setattr__(self, f.name, value)
        if self.lr <= 0:
            raise ValueError(f"{self.name}: lr must be > 0, got {self.lr}")
        self._check()

    def _check(self) -> None:
        """Range checks of the subclass's own hyperparameters."""

    # -- configuration ------------------------------------------------------------------------
    def hyperparameters(self) -> dict:
        """The hyperparameters as a plain dict (names of docs/CONTRACTS.md)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def get_config(self) -> dict:
        """JSON-able description; :func:`from_config` rebuilds the optimizer."""
        return {"name": self.name, **self.hyperparameters()}

    def with_lr(self, lr: float) -> "Optimizer":
        """The same optimizer with another learning rate."""
        return dataclasses.replace(self, lr=lr)

    # -- the (init, update) pair ------------------------------------------------------------
    def init(self, params: Mapping[str, np.ndarray]) -> OptState:
        """Zero state for every parameter (same shape and dtype), step count 0."""
        _check_params(self.name, params)
        return OptState(0, {s: {k: np.zeros(p.shape, p.dtype) for k, p in params.items()}
                            for s in self.state_names})

    def coefficients(self, t: int, lr: float | None = None, dtype=np.float64) -> np.ndarray:
        """The scalar coefficient vector the kernel uses at step ``t`` (>= 1), in ``dtype``.

        Layout (unused entries 0): SGD ``(lr)``; Momentum ``(lr, beta, 1-beta)``; NAG
        ``(lr, beta)``; Adagrad ``(lr, eps)``; RMSprop ``(lr, gamma, 1-gamma, eps)``;
        Adam/AdamW ``(lr, beta1, 1-beta1, beta2, 1-beta2, 1/(1-beta1^t), 1/(1-beta2^t), eps,
        weight_decay)`` with weight_decay 0 for Adam.
        """
        return self.coefficient_table(t, 1, lr, dtype)[0]

    def coefficient_table(self, t0: int, count: int, lr: float | None = None,
                          dtype=np.float64) -> np.ndarray:
        """Coefficients of steps ``t0, t0 + 1, ..., t0 + count - 1``, one row each.

        Computed in float64 with Python's float arithmetic (``1 - beta ** t`` through the C
        library's ``pow``) and rounded once to ``dtype``, so one step and the fused epoch
        kernel's table hold identical numbers.
        """
        c = np.zeros((count, _k.N_COEFFS), np.float64)
        c[:, 0] = self.lr if lr is None else lr
        self._fill(c, range(t0, t0 + count))
        return c.astype(dtype)

    def _fill(self, c: np.ndarray, steps: range) -> None:
        """Write the subclass's coefficient columns (after column 0, the rate) for ``steps``."""

    def update(self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray],
               state: OptState, *, lr: float | None = None) -> OptState:
        """Apply one step in place to ``params`` and ``state``'s arrays; return the state.

        Parameters
        ----------
        params : mapping of str to ndarray
            The model's parameters (float32 or float64), changed in place.
        grads : mapping of str to ndarray
            Gradients with the same keys, shapes and dtypes.
        state : OptState
            From :meth:`init` (or a previous update / a checkpoint).
        lr : float, optional
            Overrides the optimizer's learning rate for this step (LR schedules).

        Returns
        -------
        OptState
            ``state`` with ``t`` advanced by one (the arrays are the same objects).
        """
        _check_update(self, params, grads, state)
        t = state.t + 1
        coeff = {}
        for key, p in params.items():
            if p.dtype not in coeff:
                coeff[p.dtype] = self.coefficients(t, lr, p.dtype)
            g = grads[key]
            flat_w = p.reshape(-1) if p.flags.c_contiguous else np.ascontiguousarray(p).reshape(-1)
            flat_g = np.ascontiguousarray(g).reshape(-1)
            a, b = _state_flat(self, state, key, p)
            _k.update_flat(self.kind, flat_w, flat_g, a, b, coeff[p.dtype])
            if not p.flags.c_contiguous:  # the update ran on a copy: write it back
                p[...] = flat_w.reshape(p.shape)
        state.t = t
        return state


_EMPTY = {np.dtype(np.float32): np.zeros(0, np.float32),
          np.dtype(np.float64): np.zeros(0, np.float64)}


def _state_flat(opt, state, key, p):
    arrays = [state.slots[s][key].reshape(-1) for s in opt.state_names]
    while len(arrays) < 2:
        arrays.append(_EMPTY[p.dtype])
    return arrays


def _check_beta(opt, name, value):
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{opt.name}: {name} must be in [0, 1), got {value}")


def _check_eps(opt, value):
    if value < 0.0:
        raise ValueError(f"{opt.name}: eps must be >= 0, got {value}")


@dataclass(frozen=True)
class SGD(Optimizer):
    """Plain gradient descent: ``w = w - lr * g``."""

    name: ClassVar[str] = "SGD"
    kind: ClassVar[int] = _k.SGD
    state_names: ClassVar[tuple] = ()
    lr: float = 0.01


@dataclass(frozen=True)
class Momentum(Optimizer):
    """Momentum with DataCode's (1 - beta): ``v = beta v + (1-beta) g ; w = w - lr v``."""

    name: ClassVar[str] = "Momentum"
    kind: ClassVar[int] = _k.MOMENTUM
    state_names: ClassVar[tuple] = ("v",)
    lr: float = 0.01
    beta: float = 0.9

    def _check(self):
        _check_beta(self, "beta", self.beta)

    def _fill(self, c, steps):
        c[:, 1], c[:, 2] = self.beta, 1.0 - self.beta


@dataclass(frozen=True)
class NAG(Optimizer):
    """Nesterov: ``v = beta v + lr grad f(w - beta v) ; w = w - v``.

    Runs in spec's engine form on the shifted parameters ``w~ = w - beta v`` (what the model
    holds and where the gradient is taken): ``v = beta v + lr g ; w~ = w~ - lr g - beta v``.
    The table's ``w`` is ``w~ + beta v``.
    """

    name: ClassVar[str] = "NAG"
    kind: ClassVar[int] = _k.NAG
    state_names: ClassVar[tuple] = ("v",)
    lr: float = 0.01
    beta: float = 0.9

    def _check(self):
        _check_beta(self, "beta", self.beta)

    def _fill(self, c, steps):
        c[:, 1] = self.beta


@dataclass(frozen=True)
class Adagrad(Optimizer):
    """``G = G + g^2 ; w = w - lr / sqrt(G + eps) g`` (eps inside the root, as DataCode)."""

    name: ClassVar[str] = "Adagrad"
    kind: ClassVar[int] = _k.ADAGRAD
    state_names: ClassVar[tuple] = ("G",)
    lr: float = 0.01
    eps: float = 1e-8

    def _check(self):
        _check_eps(self, self.eps)

    def _fill(self, c, steps):
        c[:, 1] = self.eps


@dataclass(frozen=True)
class RMSprop(Optimizer):
    """``E = gamma E + (1-gamma) g^2 ; w = w - lr / sqrt(E + eps) g`` (eps inside the root)."""

    name: ClassVar[str] = "RMSprop"
    kind: ClassVar[int] = _k.RMSPROP
    state_names: ClassVar[tuple] = ("E",)
    lr: float = 0.001
    gamma: float = 0.9
    eps: float = 1e-8

    def _check(self):
        _check_beta(self, "gamma", self.gamma)
        _check_eps(self, self.eps)

    def _fill(self, c, steps):
        c[:, 1], c[:, 2], c[:, 3] = self.gamma, 1.0 - self.gamma, self.eps


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with bias correction: ``w = w - lr m_hat / (sqrt(v_hat) + eps)``."""

    name: ClassVar[str] = "Adam"
    kind: ClassVar[int] = _k.ADAM
    state_names: ClassVar[tuple] = ("m", "v")
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def _check(self):
        _check_beta(self, "beta1", self.beta1)
        _check_beta(self, "beta2", self.beta2)
        _check_eps(self, self.eps)

    def _fill(self, c, steps):
        c[:, 1], c[:, 2] = self.beta1, 1.0 - self.beta1
        c[:, 3], c[:, 4] = self.beta2, 1.0 - self.beta2
        b1, b2 = self.beta1, self.beta2
        # NOTE: Python floats (the C library's pow) everywhere; the kernel multiplies by these
        # reciprocals of the bias corrections 1 - beta^t (see fastlib.kernels.optim).
        c[:, 5] = [1.0 / (1.0 - b1 ** t) for t in steps]
        c[:, 6] = [1.0 / (1.0 - b2 ** t) for t in steps]
        c[:, 7] = self.eps


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay: ``w = w - lr (m_hat / (sqrt(v_hat) + eps) + wd w)``."""

    name: ClassVar[str] = "AdamW"
    kind: ClassVar[int] = _k.ADAMW
    weight_decay: float = 0.01

    def _check(self):
        super()._check()
        if self.weight_decay < 0:
            raise ValueError(f"AdamW: weight_decay must be >= 0, got {self.weight_decay}")

    def _fill(self, c, steps):
        super()._fill(c, steps)
        c[:, 8] = self.weight_decay


# name (lower case) -> class; the public spelling is each class's ``name``.
OPTIMIZERS = {cls.name.lower(): cls for cls in (SGD, Momentum, NAG, Adagrad, RMSprop, Adam, AdamW)}


def get(optimizer="SGD", **hyper) -> Optimizer:
    """Resolve an optimizer from a name (case-insensitive) or pass an instance through.

    Parameters
    ----------
    optimizer : str or Optimizer
        ``"SGD" "Momentum" "NAG" "Adagrad" "RMSprop" "Adam" "AdamW"`` in any case, or an
        :class:`Optimizer` instance (returned as is when ``hyper`` is empty).
    **hyper
        Hyperparameters (``lr``, ``beta``, ...). Unknown names raise ``TypeError`` naming the
        accepted ones.

    Returns
    -------
    Optimizer
    """
    if isinstance(optimizer, Optimizer):
        return dataclasses.replace(optimizer, **_check_hyper(type(optimizer), hyper)) \
            if hyper else optimizer
    if not isinstance(optimizer, str):
        raise TypeError(f"optimizer must be a name ({', '.join(c.name for c in OPTIMIZERS.values())}) "
                        f"or a fastlib.optim.Optimizer, got {type(optimizer).__name__}")
    cls = OPTIMIZERS.get(optimizer.lower())
    if cls is None:
        close = difflib.get_close_matches(optimizer.lower(), OPTIMIZERS, n=3, cutoff=0.5)
        hint = (f" (did you mean {' or '.join(OPTIMIZERS[c].name for c in close)}?)" if close
                else "")
        raise ValueError(f"unknown optimizer {optimizer!r}{hint}; known optimizers (any case): "
                         f"{', '.join(c.name for c in OPTIMIZERS.values())}")
    return cls(**_check_hyper(cls, hyper))


def from_config(config: Mapping) -> Optimizer:
    """Rebuild an optimizer from :meth:`Optimizer.get_config`'s dict."""
    config = dict(config)
    name = config.pop("name", None)
    if name is None:
        raise ValueError("optimizer config has no 'name' key: expected the dict written by "
                         "Optimizer.get_config()")
    return get(name, **config)


def _check_hyper(cls, hyper: dict) -> dict:
    allowed = [f.name for f in dataclasses.fields(cls)]
    for key in hyper:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{cls.name} has no hyperparameter {key!r}{hint}; it takes "
                            f"{', '.join(allowed)}")
    return hyper


def _check_params(name: str, params: Mapping) -> None:
    if not isinstance(params, Mapping):
        raise TypeError(f"{name}: parameters must be a dict name -> ndarray "
                        f"(model.parameters()), got {type(params).__name__}")
    for key, p in params.items():
        if not isinstance(p, np.ndarray):
            raise TypeError(f"{name}: parameter {key!r} must be a numpy array, "
                            f"got {type(p).__name__}")
        if p.dtype not in (np.float32, np.float64):
            raise TypeError(f"{name}: parameter {key!r} has dtype {p.dtype}; optimizers run on "
                            "float32 or float64 parameters")


def _check_update(opt: Optimizer, params, grads, state) -> None:
    _check_params(opt.name, params)
    if not isinstance(state, OptState):
        raise TypeError(f"{opt.name}: state must be the OptState returned by init(), "
                        f"got {type(state).__name__}")
    if not isinstance(grads, Mapping):
        raise TypeError(f"{opt.name}: grads must be a dict keyed like the parameters, "
                        f"got {type(grads).__name__}")
    if set(grads) != set(params):
        missing = sorted(set(params) - set(grads))
        extra = sorted(set(grads) - set(params))
        raise ValueError(f"{opt.name}: grads and parameters have different keys "
                         f"(missing gradients: {missing}; unknown gradients: {extra})")
    for s in opt.state_names:
        if s not in state.slots or set(state.slots[s]) != set(params):
            raise ValueError(f"{opt.name}: state has no {s!r} array for every parameter; "
                             "build it with init(params) for these parameters")
    for key, p in params.items():
        g = grads[key]
        if not isinstance(g, np.ndarray) or g.shape != p.shape:
            shape = getattr(g, "shape", type(g).__name__)
            raise ValueError(f"{opt.name}: gradient {key!r} has shape {shape}, "
                             f"parameter has {p.shape}")
        if g.dtype != p.dtype:
            raise TypeError(f"{opt.name}: gradient {key!r} is {g.dtype} but the parameter is "
                            f"{p.dtype}; cast the gradient to the parameter's dtype")
        for s in opt.state_names:
            a = state.slots[s][key]
            if a.shape != p.shape or a.dtype != p.dtype or not a.flags.c_contiguous:
                raise ValueError(f"{opt.name}: state {s!r} for {key!r} is {a.dtype}{a.shape}, "
                                 f"expected contiguous {p.dtype}{p.shape}")
