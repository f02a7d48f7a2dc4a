"""Optimizers: (init, update) pairs over a parameter dict, with explicit, checkpointable state.

One class per optimizer of the registry (``optable.OPTIMIZERS``: names, hyperparameters,
defaults, state), made from it here; each runs its rule of ``fastlib.kernels.optim_rules``.
The long story: docs/fastlib-kernels.md, section ``fastlib/optim.py``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

import numpy as np

import optable.optimizers as _registry
from fastlib.kernels import optim as _k
from fastlib.kernels import optim_rules as _rules


@dataclass
class OptState:
    """Explicit optimizer state: the step count and one array per (state name, parameter).

    Attributes
    ----------
    t : int
        Number of updates applied so far; the next update uses step ``t + 1`` (the first is 1).
    slots : dict
        ``{state_name: {param_name: ndarray}}``, e.g. ``slots["m"]["0.weight"]`` (the registry
        names each optimizer's state).
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
    rule: ClassVar[object] = None       # its ``optim_rules.Rule``

    lr: float = 0.01

    def __post_init__(self):
        declared = _registry.OPTIMIZERS[self.name].hyper
        for h in declared:
            object.__setattr__(self, h.name, float(h.check(self.name, getattr(self, h.name))))

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
        """The coefficients of step ``t`` (>= 1) in ``dtype``, as the kernels take them: a
        table of one record (``coefficient_table(t, 1, lr, dtype)``)."""
        return self.coefficient_table(t, 1, lr, dtype)

    def coefficient_table(self, t0: int, count: int, lr: float | None = None,
                          dtype=np.float64) -> np.ndarray:
        """Coefficient records of steps ``t0, t0 + 1, ..., t0 + count - 1``, one each: one
        field per parameter of the rule (``optim_rules.coefficient_dtype``), the others 0.

        Computed in float64 with Python's float arithmetic (``1 - beta ** t`` through the C
        library's ``pow``) and rounded once to ``dtype``, so one step and the fused epoch
        kernel's table hold identical numbers.
        """
        hyper = self.hyperparameters()
        if lr is not None:
            hyper["lr"] = lr
        steps = range(t0, t0 + count)
        table = np.zeros(count, _rules.coefficient_dtype(dtype))
        for f in self.rule.fields:
            table[f] = _rules.coefficient_column(f, hyper, steps)
        return table

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
    while len(arrays) < _rules.MAX_STATE:
        arrays.append(_EMPTY[p.dtype])
    return arrays


def _optimizer_class(rule):
    """The dataclass of ``rule``'s optimizer: its hyperparameters as fields with defaults."""
    sig = _registry.OPTIMIZERS[rule.name]
    summary = rule.source.__doc__.split("\n\n")[0]
    hyper = ", ".join(f"{h.name}={h.default:g}" for h in sig.hyper)
    doc = (f"{rule.name}: {summary}\n\nHyperparameters (defaults): {hyper}; state: "
           f"{', '.join(sig.state) or 'none'}.")
    cls = dataclasses.make_dataclass(
        rule.name, [(h.name, float, field(default=h.default)) for h in sig.hyper],
        bases=(Optimizer,), frozen=True,
        namespace={"name": rule.name, "kind": rule.kind, "state_names": sig.state,
                   "rule": rule, "__doc__": doc, "__module__": __name__})
    return cls


# name (lower case) -> class; the public spelling is each class's ``name``.
OPTIMIZERS = {rule.name.lower(): _optimizer_class(rule) for rule in _rules.RULES}
globals().update({cls.name: cls for cls in OPTIMIZERS.values()})   # fastlib.optim.<Name>

__all__ = ["Optimizer", "OptState", *(cls.name for cls in OPTIMIZERS.values()), "OPTIMIZERS",
           "get", "from_config"]


def get(optimizer="SGD", **hyper) -> Optimizer:
    """Resolve an optimizer from a name (case-insensitive) or pass an instance through.

    Parameters
    ----------
    optimizer : str or Optimizer
        A name of ``OPTIMIZERS`` in any case, or an :class:`Optimizer` instance (returned as
        is when ``hyper`` is empty).
    **hyper
        Hyperparameters (``lr``, ``beta``, ...). Unknown names raise ``TypeError`` naming the
        accepted ones.

    Returns
    -------
    Optimizer
    """
    if isinstance(optimizer, Optimizer):
        return dataclasses.replace(optimizer, **_check_hyper(optimizer, hyper)) \
            if hyper else optimizer
    if not isinstance(optimizer, str):
        raise TypeError(f"optimizer must be a name ({', '.join(_registry.OPTIMIZERS)}) or a "
                        f"fastlib.optim.Optimizer, got {type(optimizer).__name__}")
    cls = OPTIMIZERS[_registry.lookup_optimizer(optimizer, ValueError).name.lower()]
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
    _registry.check_hyperparameters(_registry.OPTIMIZERS[cls.name], hyper)
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
