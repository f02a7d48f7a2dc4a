"""Each optimizer's update rule, written once as a scalar source over named coefficients.

A rule is plain Python on one element: ``rule(w, g, *state, *coefficients) -> (w, *state)``,
its state parameters named as the registry's state variables (``optable.OPTIMIZERS``), its
other parameters the fields of the coefficient record (``coefficient_dtype``) that the wrapper
fills per step in float64 (:func:`coefficient_column`). ``fastlib.kernels.optim`` compiles the
rules for the CPU and ``fastlib.cuda.optim`` for CUDA, both from :data:`SOURCES`. AdamW is Adam
composed with decoupled weight decay, as optax chains its transformations. docs/fastlib.md
explains the rules and the record.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from math import sqrt  # the math shim's sqrt (fastlib.kernels.scalar.MATH_SHIM)

import numpy as np
from numba import njit

import optable.optimizers as _registry

#: name -> the plain Python function of each rule and building block, in definition order.
SOURCES = {}


def rule_source(fn):
    """Record ``fn`` in :data:`SOURCES`; return its CPU compile (inlined into the loops, IEEE
    division and no contraction, so a step's bits do not depend on the compiler's choices)."""
    SOURCES[fn.__name__] = fn
    return njit(inline="always", error_model="numpy")(fn)


# --- the rules, one per optimizer of the registry (its name in lower case) -------------------

@rule_source
def sgd(w, g, lr):
    """Plain gradient descent: w - lr g."""
    return w - lr * g


@rule_source
def momentum(w, g, v, lr, beta, one_minus_beta):
    """v = beta v + (1 - beta) g ; w - lr v (DataCode's dampened momentum)."""
    v = beta * v + one_minus_beta * g
    return w - lr * v, v


@rule_source
def nag(w, g, v, lr, beta):
    """The engine form on the look-ahead variable w~ = w - beta v, with g = grad f(w~):
    v = beta v + lr g ; w~ - lr g - beta v (spec proves it equal to the table's form)."""
    v = beta * v + lr * g
    return w - lr * g - beta * v, v


@rule_source
def adagrad(w, g, G, lr, eps):
    """G = G + g^2 ; w - lr / sqrt(G + eps) g (eps inside the root, as DataCode)."""
    G = G + g * g
    return w - lr / sqrt(G + eps) * g, G


@rule_source
def rmsprop(w, g, E, lr, gamma, one_minus_gamma, eps):
    """E = gamma E + (1 - gamma) g^2 ; w - lr / sqrt(E + eps) g (eps inside the root)."""
    E = gamma * E + one_minus_gamma * (g * g)
    return w - lr / sqrt(E + eps) * g, E


@rule_source
def scale_by_adam(g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bias_beta1,
                  inv_bias_beta2, eps):
    """Adam's direction m^ / (sqrt(v^) + eps) and its new moments (optax's scale_by_adam).

    NOTE (speed): the bias corrections multiply by the reciprocals 1 / (1 - beta^t), computed
    once per step in float64, instead of dividing every element.
    """
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * (g * g)
    return (m * inv_bias_beta1) / (sqrt(v * inv_bias_beta2) + eps), m, v


@rule_source
def add_decayed_weights(u, w, weight_decay):
    """u + weight_decay w: decay on the weight before the step (optax's add_decayed_weights)."""
    return u + weight_decay * w


@rule_source
def adam(w, g, m, v, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bias_beta1,
         inv_bias_beta2, eps):
    """Adam with bias correction: w - lr m^ / (sqrt(v^) + eps) (optax's chain of scale_by_adam
    and the learning rate)."""
    u, m, v = scale_by_adam(g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2,
                            inv_bias_beta1, inv_bias_beta2, eps)
    return w - lr * u, m, v


@rule_source
def adamw(w, g, m, v, lr, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bias_beta1,
          inv_bias_beta2, eps, weight_decay):
    """Adam with decoupled weight decay: w - lr (m^ / (sqrt(v^) + eps) + weight_decay w)
    (optax's chain of scale_by_adam, add_decayed_weights and the learning rate)."""
    u, m, v = scale_by_adam(g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2,
                            inv_bias_beta1, inv_bias_beta2, eps)
    return w - lr * add_decayed_weights(u, w, weight_decay), m, v


# --- the coefficient record ----------------------------------------------------------------------

# A field is a hyperparameter by its own name, or one of these of a hyperparameter h, in
# float64 with Python's float arithmetic (the C library's pow), at the steps t (1 = the first):
# a number, or a list of one number per step.
_DERIVED = {"one_minus_": lambda h, steps: 1.0 - h,
            "inv_bias_": lambda h, steps: [1.0 / (1.0 - h ** t) for t in steps]}


def coefficient_column(field, hyper, steps):
    """Coefficient ``field`` for the hyperparameters ``hyper`` at ``steps``: one float64 number
    for every step, or a list of one per step."""
    if field in hyper:
        return float(hyper[field])
    prefix = next(p for p in _DERIVED if field.startswith(p))
    return _DERIVED[prefix](float(hyper[field[len(prefix):]]), steps)


@dataclass(frozen=True)
class Rule:
    """One optimizer's compiled rule: its kind code, source and what it reads."""

    name: str           # the registry's name
    kind: int           # its position in the registry
    source: object      # the plain Python function (``SOURCES``)
    state: tuple        # the state parameters (the registry's state variables)
    fields: tuple       # the coefficient parameters (record fields)


def _rule(kind, sig):
    source = SOURCES.get(sig.name.lower())
    if source is None:
        raise ImportError(f"fastlib.kernels.optim_rules: optimizer {sig.name!r} of the registry "
                          f"has no rule; write {sig.name.lower()}(w, g, *state, *coefficients)")
    params = tuple(inspect.signature(source).parameters)
    n = len(sig.state)
    if params[:2] != ("w", "g") or params[2:2 + n] != sig.state:
        raise ImportError(f"fastlib.kernels.optim_rules: {source.__name__} takes {params}; it "
                          f"must take (w, g, {', '.join(sig.state)}, *coefficients)")
    fields = params[2 + n:]
    unknown = [f for f in fields if f not in sig.defaults and not any(
        f.startswith(p) and f[len(p):] in sig.defaults for p in _DERIVED)]
    if unknown:
        raise ImportError(f"fastlib.kernels.optim_rules: {source.__name__} reads {unknown}, which "
                          f"are neither hyperparameters of {sig.name} nor "
                          f"{[p + '<hyperparameter>' for p in _DERIVED]}")
    return Rule(sig.name, kind, source, sig.state, fields)


#: One rule per optimizer of the registry, in its order.
RULES = tuple(_rule(kind, sig) for kind, sig in enumerate(_registry.OPTIMIZERS.values()))
#: The fields of the coefficient record: every rule's coefficients, in order of appearance.
FIELDS = tuple(dict.fromkeys(f for r in RULES for f in r.fields))
#: Most state arrays a rule keeps (the kernels pass that many, empty when unused).
MAX_STATE = max(len(r.state) for r in RULES)


def coefficient_dtype(dtype):
    """The coefficient record in ``dtype`` (float32 or float64): one field per coefficient."""
    return np.dtype([(f, np.dtype(dtype)) for f in FIELDS])


def cases(branch):
    """``(kind, name, branch(rule))`` of every rule: the cases of a kernel switching on the
    kind (``fastlib.kernels.switch.switch_source``)."""
    return [(r.kind, r.name, branch(r)) for r in RULES]


def call_line(rule, element, coefficients):
    """``w, a = momentum(w, g, a, lr, ...)``: the call of ``rule`` on ``element("w")``,
    ``element("g")`` and its state ``element("a")``, ``element("b")``, with the text
    ``coefficients(field)`` for each field."""
    state = [element(s) for s in "ab"[:len(rule.state)]]
    outs = ", ".join([element("w")] + state)
    args = [element("w"), element("g")] + state + [coefficients(f) for f in rule.fields]
    return f"{outs} = {rule.source.__name__}({', '.join(args)})"
