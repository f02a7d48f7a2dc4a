"""Each optimizer's stated update proven equal to a textbook statement, over one general step.

The long story: docs/spec.md, section ``spec/optimizer_proofs.py``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping

import mpmath
import numpy as np

from spec.backends import SYMPY
from spec.optimizers import OPTIMIZERS, lookup_optimizer
from spec.prove import MIN_POINTS, ProofResult

POINTS = MIN_POINTS
DPS = 50
TOL = 1e-40


# ---------------------------------------------------------------------------------------------
# The textbook statements, each in its source's own names. ``sqrt`` is passed in (SymPy's).

def _sgd_pytorch(theta, g, t, state, gamma, sqrt):
    return theta - gamma * g, {}


def _momentum_pytorch_dampened(theta, g, t, state, gamma, mu, sqrt):
    tau = mu                                     # dampening equal to the momentum
    b = mu * state["b"] + (1 - tau) * g
    return theta - gamma * b, {"b": b}


def _nag_sutskever(theta, g, t, state, epsilon, mu, sqrt):
    # g is ∇f(θ_t + μ v_t), the gradient at the look-ahead point
    v = mu * state["v"] - epsilon * g
    return theta + v, {"v": v}


def _adagrad_ruder(theta, g, t, state, eta, epsilon, sqrt):
    G = state["G"] + g * g
    return theta - eta / sqrt(G + epsilon) * g, {"G": G}


def _rmsprop_ruder(theta, g, t, state, eta, gamma, epsilon, sqrt):
    Eg2 = gamma * state["Eg2"] + (1 - gamma) * g * g
    return theta - eta / sqrt(Eg2 + epsilon) * g, {"Eg2": Eg2}


def _adam_kingma_ba(theta, g, t, state, alpha, beta_1, beta_2, epsilon, sqrt):
    m = beta_1 * state["m"] + (1 - beta_1) * g           # biased first moment
    v = beta_2 * state["v"] + (1 - beta_2) * g * g       # biased second raw moment
    m_hat = m / (1 - beta_1**t)
    v_hat = v / (1 - beta_2**t)
    return theta - alpha * m_hat / (sqrt(v_hat) + epsilon), {"m": m, "v": v}


def _adamw_pytorch(theta, g, t, state, gamma, beta_1, beta_2, epsilon, lam, sqrt):
    theta = theta - gamma * lam * theta                  # decoupled decay first
    return _adam_kingma_ba(theta, g, t, state, gamma, beta_1, beta_2, epsilon, sqrt)


@dataclass(frozen=True)
class Textbook:
    """One source's statement and how its names map to the project's.

    ``hyper``: project hyperparameter -> the source's name; ``state``: project state variable
    -> (the source's name, sign) with project value = sign · source value.
    """

    source: str
    step: Callable
    hyper: Mapping
    state: Mapping


TEXTBOOK = {
    "SGD": Textbook("PyTorch SGD", _sgd_pytorch, {"lr": "gamma"}, {}),
    "Momentum": Textbook("PyTorch SGD, dampening = momentum", _momentum_pytorch_dampened,
                         {"lr": "gamma", "beta": "mu"}, {"v": ("b", 1)}),
    "NAG": Textbook("Sutskever et al. 2013", _nag_sutskever, {"lr": "epsilon", "beta": "mu"},
                    {"v": ("v", -1)}),
    "Adagrad": Textbook("Duchi et al. 2011 / Ruder 2016", _adagrad_ruder,
                        {"lr": "eta", "eps": "epsilon"}, {"G": ("G", 1)}),
    "RMSprop": Textbook("Hinton lecture 6e / Ruder 2016", _rmsprop_ruder,
                        {"lr": "eta", "gamma": "gamma", "eps": "epsilon"}, {"E": ("Eg2", 1)}),
    "Adam": Textbook("Kingma & Ba 2015, Algorithm 1", _adam_kingma_ba,
                     {"lr": "alpha", "beta1": "beta_1", "beta2": "beta_2", "eps": "epsilon"},
                     {"m": ("m", 1), "v": ("v", 1)}),
    "AdamW": Textbook("Loshchilov & Hutter 2019 (PyTorch AdamW)", _adamw_pytorch,
                      {"lr": "gamma", "beta1": "beta_1", "beta2": "beta_2", "eps": "epsilon",
                       "weight_decay": "lam"}, {"m": ("m", 1), "v": ("v", 1)}),
}


# ---------------------------------------------------------------------------------------------
# One general step, symbolically

# Sampled ranges (the hyperparameters' legal ranges, away from their ends; accumulated squares
# are >= 0). ``t`` is drawn as an integer.
_RANGES = {"w": (-2.0, 2.0), "g": (-2.0, 2.0), "m": (-2.0, 2.0), "v": (0.0, 2.0),
           "G": (0.0, 2.0), "E": (0.0, 2.0), "lr": (0.001, 0.5), "beta": (0.05, 0.95),
           "gamma": (0.05, 0.95), "eps": (1e-3, 0.1), "weight_decay": (0.001, 0.5),
           "beta1": (0.05, 0.95), "beta2": (0.05, 0.999), "t": (1, 60)}
_NONNEGATIVE_STATE = {"G", "E"}         # and Adam's v


def _symbols(opt):
    """Project-named symbols: w, g, t, the state and the hyperparameters."""
    sp = SYMPY.sp
    sym = {"w": sp.Symbol("w", real=True), "g": sp.Symbol("g", real=True),
           "t": sp.Symbol("t", positive=True, integer=True)}
    for s in opt.state:
        nonneg = s in _NONNEGATIVE_STATE or (s == "v" and "beta2" in opt.hyper)
        sym[s] = sp.Symbol(s, nonnegative=True) if nonneg else sp.Symbol(s, real=True)
    for h in opt.hyper:
        sym[h] = sp.Symbol(h, positive=True)
    return sym


def _stated(opt, sym, engine=False, w=None):
    state = {s: sym[s] for s in opt.state}
    hyper = {h: sym[h] for h in opt.hyper}
    return opt.apply(SYMPY, sym["w"] if w is None else w, sym["g"], state, sym["t"], hyper,
                     engine=engine)


def _textbook(book, sym):
    state = {name: sign * sym[s] for s, (name, sign) in book.state.items()}
    hyper = {name: sym[h] for h, name in book.hyper.items()}
    theta, new = book.step(sym["w"], sym["g"], sym["t"], state, sqrt=SYMPY.sp.sqrt, **hyper)
    return theta, {s: sign * new[name] for s, (name, sign) in book.state.items()}


def _is_zero(diff):
    """True when SymPy reduces ``diff`` to exactly 0."""
    sp = SYMPY.sp
    if sp.expand(diff) == 0:
        return True
    # square roots of a ratio (√(v/(1−β2^t))) compare once each argument is reduced alone
    reduced = diff.replace(lambda e: e.is_Pow and e.exp == sp.S.Half,
                           lambda e: sp.sqrt(sp.factor(sp.cancel(e.base))))
    return sp.cancel(reduced) == 0


def _sample(diffs, symbols, seed=0):
    """Largest |difference| over ``POINTS`` random points at ``DPS`` digits."""
    sp = SYMPY.sp
    fn = sp.lambdify(symbols, list(diffs.values()), modules="mpmath")
    rng = np.random.default_rng(seed)
    worst, where = 0.0, ""
    with mpmath.workdps(DPS):
        for _ in range(POINTS):
            args = []
            for s in symbols:
                lo, hi = _RANGES[s.name]
                args.append(mpmath.mpf(int(rng.integers(lo, hi + 1))) if s.name == "t"
                            else mpmath.mpf(float(rng.uniform(lo, hi))))
            for name, value in zip(diffs, fn(*args)):
                err = float(abs(value))
                if not err <= worst:
                    worst = err if err == err else float("inf")
                    where = name
    return worst, where


def _decide(diffs, symbols):
    """(method, ok, worst, what differs) for every difference in ``diffs`` being 0."""
    worst, where = _sample(diffs, symbols)
    if not worst < TOL:
        return "sampling", False, worst, where
    if all(_is_zero(d) for d in diffs.values()):
        return "symbolic", True, worst, ""
    return "sampling", True, worst, ""


def _general_step(opt):
    """Stated update vs the textbook's, from a symbolic state: {output: difference}."""
    sym = _symbols(opt)
    w_new, state_new = _stated(opt, sym)
    theta, book_state = _textbook(TEXTBOOK[opt.name], sym)
    diffs = {"w": w_new - theta}
    diffs.update({s: state_new[s] - book_state[s] for s in opt.state})
    return diffs, sym


def _engine_step(opt):
    """The engine's form against the stated one, from a symbolic engine state (NAG: w̃, v):
    after one step the state agrees and the engine holds the parameters where the stated form
    puts them (NAG: w̃ = w − β·v, so the next gradient is taken at the same point)."""
    sym = _symbols(opt)
    hyper = {h: sym[h] for h in opt.hyper}
    state = {s: sym[s] for s in opt.state}
    w_table, table = _stated(opt, sym, w=sym["w"] + opt.offset(SYMPY, state, hyper))
    w_engine, engine = _stated(opt, sym, engine=True)
    diffs = {f"engine {s}": engine[s] - table[s] for s in opt.state}
    diffs["engine w"] = w_engine - opt.held(SYMPY, w_table, table, hyper)
    return diffs, sym


def _used(sym, diffs):
    free = set().union(*(d.free_symbols for d in diffs.values()))
    return [s for s in sym.values() if s in free]


def prove_optimizers(names=None):
    """Prove each optimizer's stated update equal to its textbook statement, over one step.

    Parameters
    ----------
    names : iterable of str or OptimizerSpec, optional
        Default: every optimizer of ``spec.OPTIMIZERS``. An ``OptimizerSpec`` (e.g. a
        deliberately broken copy in a test) is proven against the textbook of its name.

    Returns
    -------
    list of ProofResult
        ``op`` is the optimizer's name; ``method`` "symbolic" (SymPy reduced every difference
        to 0) or "sampling" (SymPy could not, and only ``POINTS`` points at ``DPS`` digits
        decided: the verdict then says "checked at N points"). A wrong update fails at the
        sampled points, with the output (``w`` or a state variable) that differs.
    """
    results = []
    for name in (OPTIMIZERS if names is None else names):
        opt = lookup_optimizer(name)
        start = time.perf_counter()
        book = TEXTBOOK[opt.name]
        what = f"one general step vs {book.source} (symbolic state, g, t, hyperparameters)"
        try:
            diffs, sym = _general_step(opt)
            if opt.engine_update is not None:
                more, _ = _engine_step(opt)
                diffs.update(more)
                what += "; the engine's form and the point it holds"
            method, ok, worst, where = _decide(diffs, _used(sym, diffs))
            if ok:
                detail = "equal" + (f" (only checked: max |diff| {worst:.1e} at {POINTS} "
                                    f"points, {DPS} digits)" if method == "sampling" else "")
            else:
                detail = (f"NOT equal to {book.source}: {where} differs by {worst:.3g} at a "
                          f"sampled point")
        except Exception as exc:  # a formula that raises is a failed proof, not a crash
            method, ok, worst = "symbolic", False, 0.0
            detail = f"{type(exc).__name__}: {exc}"
        results.append(ProofResult(op=opt.name, ok=ok, method=method, shapes=(what,),
                                   seconds=time.perf_counter() - start, detail=detail,
                                   max_error=worst, points=POINTS))
    return results


__all__ = ["TEXTBOOK", "Textbook", "prove_optimizers"]
