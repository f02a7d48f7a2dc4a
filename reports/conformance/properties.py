"""The checks of the suite, as plain functions of a drawn case (Hypothesis-free, pytest-free).

Each returns a :class:`Result`: the measures taken (error and bound in eps units per array) and
whether all hold. The runner and ``tests/conformance`` wrap them in Hypothesis; a failing
case can be replayed by calling the function again (the reproduction the runner prints does
exactly that).

Ops (any engine):

- :func:`check_call`: forward and every VJP against the exact values (``oracle``) under the
  bounds of ``bounds``; also the engine's contract (shapes, dtypes, None for class indices,
  no exception on a valid call, no NaN/Inf);
- :func:`check_jvp`: ``<t, Jᵀc> = <J t, c>`` along a random direction ``t``, with ``J t`` by
  central differences of the *forward* formula at 50 digits (``h = 1e-20``: truncation
  O(h²) ~ 1e-40, cancellation loses 20 of the 70 working digits), so the engine's VJP is held
  against the derivative of the forward and not against the registry's VJP formula. Central
  differences rather than the complex step: the registry's formulas use ``where``, ``maximum``
  and ``abs``, which have no complex extension, and the inputs keep 1e-2 from every kink;
- :func:`check_unsupported`: an op an engine declares unsupported raises ``UnsupportedOpError``.

Beyond ops: :func:`check_optimizer` (k steps against ``spec.step``), :func:`check_tape_laws`
(random DAGs on reflib's and fastlib's tapes); training runs are checked in ``training_rows``
(``check_train_step`` is re-exported here), TargetProp / CD in ``algorithms``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from reports.conformance import bounds as _bounds
from reports.conformance import oracle as _oracle

__all__ = ["Result", "check_call", "check_jvp", "check_unsupported", "check_optimizer",
           "check_tape_laws", "check_train_step", "TAPE_ENGINES"]


@dataclass
class Result:
    """Measures of one case; ``ok`` when every measure is within its bound."""

    measures: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def ok(self):
        return not self.notes and all(m.ok for m in self.measures)

    @property
    def worst(self):
        """The measure with the largest error/bound ratio (None when nothing was measured)."""
        if not self.measures:
            return None

        def ratio(m):
            if m.error == 0:
                return (0.0, -m.bound)
            return (math.inf if m.bound == 0 else m.error / m.bound, -m.bound)
        return max(self.measures, key=ratio)

    def fail(self, note):
        self.notes.append(note)
        return self

    def describe(self):
        """One line per failing measure or note."""
        lines = list(self.notes)
        for m in self.measures:
            if not m.ok:
                lines.append(m.note or
                             f"{m.what}: error {m.error:.4g} eps > bound {m.bound:.4g} eps")
        return "; ".join(lines)

    def __repr__(self):
        w = self.worst
        head = "ok" if self.ok else "FAIL: " + self.describe()
        tail = "" if w is None else f" (worst {w.what}: {w.error:.3g} eps, bound {w.bound:.3g})"
        return f"<Result {head}{tail}>"


def _differentiable(name):
    import spec

    op = spec.OPS[name]
    return [op.vjp.get(n) is not None for n in op.inputs]


def _call(result, what, fn):
    """Run an engine call; an exception on a valid call is a failure with its message.

    Floating-point warnings (overflow in an intermediate, say) are silenced: the results are
    measured, so a warning adds nothing but noise to the table.
    """
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn()
    except Exception as exc:  # the engine's own error: report it, do not crash the suite
        result.fail(f"{what} raised {type(exc).__name__}: {exc}")
        return None


def check_call(engine, ex):
    """Forward and every VJP of ``engine`` on the call ``ex`` against the exact values.

    Parameters
    ----------
    engine : engine (``engines.get_engine``)
    ex : strategies.OpExample

    Returns
    -------
    Result
    """
    result = Result()
    dtype = np.dtype(ex.dtype)
    exact = _oracle.exact_vjp(ex.name, ex.inputs, ex.grad, ex.params)
    inputs64 = [_oracle.as_float64(x) for x in ex.inputs]
    a_out, a_grads = _bounds.admissible(ex.name, inputs64, _oracle.as_float64(ex.grad),
                                        ex.params, exact.out[0],
                                        [None if g is None else g[0] for g in exact.grads])
    magnitude = max([float(np.max(np.abs(x))) for x in inputs64 + [_oracle.as_float64(ex.grad)]
                     if np.size(x)] + [0.0])
    out = _call(result, "forward", lambda: engine.forward(ex.name, list(ex.inputs), **ex.params))
    if out is not None:
        result.measures.append(_oracle.measure("output", out, exact.out, a_out, dtype,
                                               magnitude))
    grads = _call(result, "vjp", lambda: engine.vjp(ex.name, list(ex.inputs), ex.grad,
                                                     **ex.params))
    if grads is None:
        return result
    grads = tuple(grads)
    import spec

    names = spec.OPS[ex.name].inputs
    if len(grads) != len(names):
        return result.fail(f"vjp returned {len(grads)} gradients for {len(names)} inputs "
                           f"({', '.join(names)})")
    for iname, g, e, a in zip(names, grads, exact.grads, a_grads):
        if e is None:
            if g is not None:
                result.fail(f"vjp returned an array for {iname!r}, which is not "
                            f"differentiable (class indices): expected None")
            continue
        if g is None:
            result.fail(f"vjp returned None for the differentiable input {iname!r}")
            continue
        result.measures.append(_oracle.measure(f"d/d{iname}", g, e, a, dtype, magnitude))
    return result


def _jvp_exact(ex, directions, h_digits=20):
    """<J t, c> by central differences of the spec's forward at 50 digits (see module doc)."""
    import mpmath

    differentiable = _differentiable(ex.name)

    def compute():
        with mpmath.workdps(_oracle.DPS + 20):
            h = mpmath.mpf(10) ** (-h_digits)
            sides = []
            for sign in (1, -1):
                args = []
                for x, t, d in zip(ex.inputs, directions, differentiable):
                    if not d:
                        args.append(np.asarray(x).astype(np.int64))
                        continue
                    x64, t64 = np.asarray(x, np.float64), np.asarray(t, np.float64)
                    arr = np.empty(x64.shape, dtype=object)
                    arr.reshape(-1)[:] = [mpmath.mpf(float(a)) + sign * h * mpmath.mpf(float(b))
                                          for a, b in zip(x64.reshape(-1), t64.reshape(-1))]
                    args.append(arr)
                sides.append(_oracle.exact_forward_at(ex.name, args, ex.params))
            c = np.asarray(ex.grad, np.float64).reshape(-1)
            diff = np.asarray(sides[0] - sides[1], dtype=object).reshape(-1)
            total = mpmath.fsum(mpmath.mpf(float(ci)) * di for ci, di in zip(c, diff)) / (2 * h)
            return float(total)

    return _oracle.cached("jvp", ex.name, list(ex.inputs) + [ex.grad] + list(
        t for t in directions if t is not None), ex.params, compute)


def check_jvp(engine, ex, direction_seed=0):
    """``<t, Jᵀ c>`` from the engine's VJP against ``<J t, c>`` of the exact forward.

    The direction ``t`` is standard normal (one per differentiable input, from
    ``direction_seed``); the bound is ``Σ |t| A`` with ``A`` the admissible VJP errors, so this
    holds whenever the VJPs are within their own bounds, and fails when a VJP is not the
    derivative of the forward (a missing term, a wrong sign, a transposed gradient).
    """
    result = Result()
    dtype = np.dtype(ex.dtype)
    rng = np.random.default_rng(direction_seed)
    differentiable = _differentiable(ex.name)
    directions = [rng.standard_normal(np.shape(x)) if d else None
                  for x, d in zip(ex.inputs, differentiable)]
    grads = _call(result, "vjp", lambda: engine.vjp(ex.name, list(ex.inputs), ex.grad,
                                                     **ex.params))
    if grads is None:
        return result
    exact = _oracle.exact_vjp(ex.name, ex.inputs, ex.grad, ex.params)
    inputs64 = [_oracle.as_float64(x) for x in ex.inputs]
    _, a_grads = _bounds.admissible(ex.name, inputs64, _oracle.as_float64(ex.grad), ex.params,
                                    exact.out[0],
                                    [None if g is None else g[0] for g in exact.grads])
    terms, allowed, ref = [], 0.0, 0.0
    for g, t, a, e in zip(grads, directions, a_grads, exact.grads):
        if t is None:
            continue
        if g is None or np.shape(g) != np.shape(t):
            return result.fail(f"vjp returned {None if g is None else np.shape(g)} where an "
                               f"array of shape {np.shape(t)} was expected")
        g64 = np.asarray(g, np.float64)
        if not np.all(np.isfinite(g64)):
            return result.fail("vjp returned a non-finite value")
        terms.extend((t * g64).reshape(-1).tolist())
        allowed += float(np.sum(np.abs(t) * a))
        ref += float(np.sum(np.abs(t * e[0])))
    engine_side = math.fsum(terms)
    exact_side = _jvp_exact(ex, directions)
    eps = float(np.finfo(dtype).eps)
    tiny = float(np.finfo(dtype).tiny)
    diff = abs(engine_side - exact_side)
    # float64 rounding of the exact side and of the products t * g (2 eps64 each, relative to
    # the terms' magnitude): far below any float32 bound, a few eps for float64.
    slack = 4 * 2.0 ** -52 * sum(abs(v) for v in terms) + tiny * math.sqrt(max(len(terms), 1))
    ref = max(ref, tiny)
    from reports.conformance.oracle import Measure

    ok = diff <= allowed * eps + slack
    result.measures.append(Measure("<t, J^T c>", diff / (eps * ref),
                                   (allowed * eps + slack) / (eps * ref), ok,
                                   "" if ok else f"<t, J^T c> = {engine_side!r} but <J t, c> = "
                                                 f"{exact_side!r}"))
    return result


def check_unsupported(engine, name):
    """An op ``engine`` declares unsupported must raise ``UnsupportedOpError`` (both calls)."""
    import spec

    result = Result()
    ex = spec.OPS[name].examples[0]
    inputs = spec.sample_inputs(name, np.random.default_rng(0), shapes=ex.shapes,
                                params=dict(ex.params))
    dtype = np.dtype(engine.dtypes[0])
    op = spec.OPS[name]
    inputs = [x if op.domains[n] == "class_index" else x.astype(dtype)
              for n, x in zip(op.inputs, inputs)]
    grad = np.ones(op.check_shapes([x.shape for x in inputs], dict(ex.params)), dtype)
    for what, call in (("forward", lambda: engine.forward(name, inputs, **ex.params)),
                       ("vjp", lambda: engine.vjp(name, inputs, grad, **ex.params))):
        try:
            call()
        except NotImplementedError:
            continue
        except Exception as exc:
            result.fail(f"{what} of unsupported {name} raised {type(exc).__name__} ({exc}); "
                        f"expected UnsupportedOpError")
            continue
        result.fail(f"{name} is declared unsupported but {what} returned a value; raise "
                    f"UnsupportedOpError (or drop the claim)")
    return result


# ---------------------------------------------------------------------------------------------
# optimizers


OPTIMIZER_K = 16   # eps per step: ~10 roundings per element per step (spec.optimizers' table)


def _rel_measure(what, got, exact_hi, dtype, k_eps, scale=None):
    """Normwise error of ``got`` in eps units relative to ``max(||exact||, ||scale||)``."""
    from reports.conformance.oracle import Measure

    eps = float(np.finfo(dtype).eps)
    got = np.asarray(got)
    if got.shape != np.shape(exact_hi):
        return Measure(what, math.inf, k_eps, False,
                       f"{what}: shape {got.shape}, expected {np.shape(exact_hi)}")
    if got.dtype != dtype:
        return Measure(what, math.inf, k_eps, False,
                       f"{what}: dtype {got.dtype}, expected {dtype}")
    g64 = got.astype(np.float64)
    if not np.all(np.isfinite(g64)):
        return Measure(what, math.inf, k_eps, False, f"{what}: non-finite values")
    ref = float(np.linalg.norm(exact_hi))
    if scale is not None:
        ref = max(ref, float(np.linalg.norm(scale)))
    ref = max(ref, float(np.finfo(dtype).tiny))
    err = float(np.linalg.norm(g64 - exact_hi)) / (eps * ref)
    return Measure(what, err, k_eps, err <= k_eps)


def exact_trajectory(name, w0, grads, hyper):
    """Exact parameters and state after each step of ``spec.step`` (the table's form).

    For NAG the parameters reported are w - beta v: the look-ahead point the engine form
    stores (spec.optimizers' NOTE), so engines are compared on what they hold.
    """
    import spec

    def compute():
        w, state, out = np.asarray(w0, np.float64), None, []
        for t, g in enumerate(grads, start=1):
            w, state = spec.step(name, w, np.asarray(g, np.float64), state, t, **hyper)
            shown = w
            if name == "NAG":
                beta = hyper.get("beta", spec.OPTIMIZERS["NAG"].hyper["beta"])
                shown = w - spec.backends.MPMATH.param(beta) * state["v"]
            out.append((np.asarray(shown, dtype=float),
                        {k: np.asarray(v, dtype=float) for k, v in state.items()}))
        return out

    return _oracle.cached("optim", name, [np.asarray(w0)] + [np.asarray(g) for g in grads],
                          hyper, compute)


def _bias_condition(name, hyper, t):
    """Condition number of Adam's bias corrections 1 - beta^t at step t (0 for the others).

    ``1 - beta2**t`` cancels for beta2 near 1 (1 - 0.9999**2 ~ 2e-4): a rounding of beta2**t is
    amplified by beta2**t / (1 - beta2**t), and the update divides by its square root.
    """
    if name not in ("Adam", "AdamW"):
        return 0.0
    import spec

    h = {**spec.OPTIMIZERS[name].hyper, **hyper}
    b1, b2 = float(h["beta1"]), float(h["beta2"])
    k1 = b1 ** t / (1 - b1 ** t) if b1 ** t < 1 else 0.0
    k2 = b2 ** t / (1 - b2 ** t) if b2 ** t < 1 else 0.0
    return k1 + k2 / 2


def check_optimizer(engine, name, w0, grads, hyper, dtype):
    """``len(grads)`` steps of ``engine.optimizer_step`` against ``spec.step``'s trajectory.

    Inputs are cast to ``dtype`` first and the exact trajectory is computed from the cast
    values, so only the engine's arithmetic is measured. Bound after step t:
    ``OPTIMIZER_K * t * (1 + κ_t)`` eps, relative to the larger of ||w|| and the distance the
    parameters travelled (so a step much larger than w is measured against the step), with κ_t
    the conditioning of Adam's bias corrections (``_bias_condition``); the state (m, v, G, E,
    v) is held to ``OPTIMIZER_K * t`` relative to its own norm.
    """
    dtype = np.dtype(dtype)
    result = Result()
    w0 = np.asarray(w0).astype(dtype)
    grads = [np.asarray(g).astype(dtype) for g in grads]
    exact = exact_trajectory(name, w0.astype(np.float64), [g.astype(np.float64) for g in grads],
                             hyper)
    w, state = w0.copy(), {}
    travelled, previous = 0.0, w0.astype(np.float64)
    for t, (g, (w_exact, s_exact)) in enumerate(zip(grads, exact), start=1):
        step = _call(result, f"step {t}", lambda: engine.optimizer_step(name, w, g, state, t,
                                                                        **dict(hyper)))
        if step is None:
            return result
        w, state = step
        travelled += _oracle.norm(w_exact - previous)
        previous = w_exact
        k = OPTIMIZER_K * t
        scale = max(_oracle.norm(w0.astype(np.float64)), travelled)
        result.measures.append(_rel_measure(f"w after step {t}", w, w_exact, dtype,
                                            k * (1 + _bias_condition(name, hyper, t)),
                                            scale=np.array([scale])))
        for key, value in s_exact.items():
            if key not in state:
                return result.fail(f"step {t}: state has no {key!r} (keys {sorted(state)})")
            result.measures.append(_rel_measure(f"{key} after step {t}", state[key], value,
                                                dtype, k))
    return result


# ---------------------------------------------------------------------------------------------
# tape laws


TAPE_ENGINES = ("reflib", "fastlib")


def _tape(engine):
    if engine == "reflib":
        import reflib

        return reflib.Tape()
    import fastlib

    return fastlib.Tape()


def check_tape_laws(engine, dag, seed):
    """The tape laws of DESIGN.md on one random DAG, for ``engine`` ("reflib" or "fastlib").

    1. backward_dense reaches exactly the nodes graph reachability says (others None);
    2. the sparse form has the same keys and values as the dense form;
    3. backward_dense_all is backward_dense with zeros where not reached;
    4. backward_dense_all == backward_dense_from(one-hot seed) (every VJP here maps 0 to 0);
    5. custom nodes run in id order n-1..0, each reached node once;
    6. linearity in the seed: bd(a s1 + b s2) = a bd(s1) + b bd(s2);
    7. every reached slot equals the exact gradient (reflib's tape at 30 digits).
    """
    import reflib

    from reports.conformance.strategies import build_dag, reached

    nodes, out = dag
    result = Result()
    rng = np.random.default_rng(seed)
    tape = _tape(engine)
    build_dag(tape, nodes)
    shape = np.shape(tape.value(out))
    s1, s2 = rng.standard_normal(shape), rng.standard_normal(shape)
    dense = tape.backward_dense(out, s1)
    hit = reached(nodes, out)
    got_hit = {i for i, g in enumerate(dense) if g is not None}
    if got_hit != hit:
        result.fail(f"law 1: backward_dense reached {sorted(got_hit)}, graph reachability "
                    f"gives {sorted(hit)}")
    sparse = tape.backward(out, s1)
    if sorted(sparse) != sorted(got_hit) or any(
            not np.array_equal(sparse[i], dense[i]) for i in sparse):
        result.fail("law 2: backward (sparse) differs from backward_dense")
    dense_all = tape.backward_dense_all(out, s1)
    for i, (a, d) in enumerate(zip(dense_all, dense)):
        want = np.zeros(np.shape(tape.value(i))) if d is None else d
        if not np.array_equal(np.asarray(a), np.asarray(want)):
            result.fail(f"law 3: backward_dense_all slot {i} is not backward_dense's (or zeros)")
            break
    one_hot = [np.zeros(np.shape(tape.value(i))) for i in range(len(tape))]
    one_hot[out] = s1
    from_form = tape.backward_dense_from(one_hot)
    for i in range(len(tape)):
        if not np.allclose(np.asarray(from_form[i], float), np.asarray(dense_all[i], float),
                           rtol=1e-12, atol=0):
            result.fail(f"law 4: backward_dense_from(one-hot) slot {i} differs from "
                        f"backward_dense_all")
            break
    # law 5: the order of custom-node calls of the first backward
    tape5 = _tape(engine)
    calls5 = build_dag(tape5, nodes)
    tape5.backward_dense(out, s1)
    if calls5 != sorted(calls5, reverse=True) or len(set(calls5)) != len(calls5):
        result.fail(f"law 5: custom VJPs ran in order {calls5}, expected ids descending, once")
    a, b = 0.75, -1.5
    lin = tape.backward_dense(out, a * s1 + b * s2)
    d2 = tape.backward_dense(out, s2)
    both = sorted(hit & got_hit)     # law 1 reports any difference between the two sets
    for i in both:
        want = a * np.asarray(dense[i], float) + b * np.asarray(d2[i], float)
        scale = np.linalg.norm(np.abs(a * np.asarray(dense[i], float))
                               + np.abs(b * np.asarray(d2[i], float))) + 1e-300
        if np.linalg.norm(np.asarray(lin[i], float) - want) > 1e-12 * scale:
            result.fail(f"law 6: slot {i} is not linear in the seed")
            break
    exact_tape = reflib.Tape(dps=30)
    build_dag(exact_tape, nodes)
    exact = exact_tape.backward_dense(out, s1)
    eps = 2.0 ** -52
    from reports.conformance.oracle import Measure

    worst = Measure("slots", 0.0, 1e4, True)
    norms = [np.linalg.norm(np.asarray(e, float)) for e in exact if e is not None]
    floor = max(norms) if norms else 1.0
    for i in both:
        e = np.asarray(exact[i], dtype=float)
        err = np.linalg.norm(np.asarray(dense[i], float) - e) / (eps * max(
            np.linalg.norm(e), 1e-3 * floor, 1e-300))
        if err > worst.error:
            worst = Measure(f"slot {i}", float(err), 1e4, err <= 1e4)
    # NOTE: 1e4 eps64 ~ 2e-12: at most 8 ops on values in [-2, 2], each a few ulps; the floor
    # at 1e-3 of the largest slot absorbs slots that cancel to ~0 (x - x).
    result.measures.append(worst)
    return result


# the training rows live in their own module; re-exported for callers of the former check
from reports.conformance.training_rows import check_train_step  # noqa: E402,F401
