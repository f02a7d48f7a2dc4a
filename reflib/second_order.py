"""Reverse over reverse on reflib's tape: ``hvp`` for an op, ``model_hvp`` and ``gnvp`` for a
reference model's loss.

The tape is built on a ``reflib.recorded.RecordingNumeric``, so its first backward (the ops'
own VJPs) comes back as recorded functions of the leaves; ``<∇f, v>`` is formed from it and a
second reverse sweep gives ``H v``. No second-order rule is stated anywhere. Exact (``dps`` an
int): repeated at growing working precision until the digits stop moving, then rounded.

The long story: docs/second-order.md, section ``reflib``.
"""
from __future__ import annotations

import mpmath
import numpy as np

import optable
from optable.losses import resolve_loss
from reflib.forward_mode import run_exactly
from reflib.numeric import check_dps
from reflib.recorded import RecordingNumeric, gradient, values_of
from reflib.tape import Tape

__all__ = ["hvp", "model_hvp", "gnvp"]


def _numeric(digits):
    return RecordingNumeric(digits, working=None if digits is None else mpmath.mp.dps)


def _inner(F, grads, directions):
    """``Σ <grad_k, direction_k>`` as one recorded scalar (directions as constants)."""
    total = F.zeros(())[()]
    with F.context():
        for g, v in zip(grads, directions):
            for gi, vi in zip(np.asarray(g, dtype=object).flat, np.asarray(v).flat):
                total = total + gi * (F.zeros(())[()] + vi)   # vi in the number system
    return total


def _sweep(F, output, leaves):
    """``∂output/∂leaf`` for every leaf array, shaped like it."""
    out = []
    with F.context():
        for leaf in leaves:
            flat = np.empty(np.size(leaf), dtype=object)
            flat[:] = gradient(output, np.asarray(leaf, dtype=object).flat)
            out.append(flat.reshape(np.shape(leaf)))
    return out


def _check_finite(name, what, arr):
    values = np.asarray(arr, dtype=object)
    bad = [idx for idx, v in np.ndenumerate(values) if not mpmath.isfinite(mpmath.mpf(v))]
    if bad:
        raise ValueError(f"{name}: {what} holds {values[bad[0]]} at index {bad[0]}; it must be "
                         f"finite")


def hvp(name, inputs, cotangent, tangents, dps=None, **params):
    """``∇_x <g, J(x) t>`` of registry op ``name``, by a second backward through its recorded
    first backward on reflib's tape.

    Parameters
    ----------
    name, inputs, tangents, dps, **params
        As for ``reflib.jvp`` (``tangents`` is ``t``).
    cotangent : array_like
        ``g``, shaped like the output (0-d for losses).

    Returns
    -------
    tuple
        One array per input shaped like it (float64, or object arrays of ``mpmath.mpf``),
        ``Σ_j Σ_k g_j ∂²f_j/∂x_i∂x_k t_k`` for input ``i`` (``k`` over every input's entries,
        so the cross terms of a binary op are in); None for a class-index input. At a kink the
        second derivative of the piece the value selects (0 for every kink of the registry).

    Raises
    ------
    ValueError, TypeError
        As ``reflib.vjp`` and ``reflib.jvp`` (the tangents).

    Examples
    --------
    >>> import numpy as np
    >>> ha, hb = hvp("mul", [np.array([3.0]), np.array([7.0])], np.array([1.0]),
    ...              [np.array([1.0]), np.array([0.0])])
    >>> float(ha[0]), float(hb[0])          # the cross term reaches b only
    (0.0, 1.0)
    """
    sig = optable.lookup(optable.OPS, name)
    digits = check_dps(dps)
    tangents = optable.check_tangents(name, sig.inputs, sig.class_index, inputs, tangents)
    for iname, t in zip(sig.inputs, tangents):
        if t is not None:
            _check_finite(name, f"the tangent for {iname!r}", t)
    g = np.asarray(cotangent)
    _check_finite(name, "the cotangent", g)

    def compute():
        F = _numeric(digits)
        tape = Tape(dps=F)
        ids = [tape.leaf(x, requires_grad=iname not in sig.class_index)
               for iname, x in zip(sig.inputs, inputs)]
        out = tape.op(name, *ids, **params)
        if g.shape != tape.value(out).shape:
            raise ValueError(f"{name}: the cotangent has shape {g.shape} but the output has "
                             f"shape {tape.value(out).shape}; pass one shaped like the output "
                             f"(0-d for a loss)")
        grads = tape.backward_dense_all(out, g)                       # the recorded backward
        wrt = [i for i, t in zip(ids, tangents) if t is not None]
        s = _inner(F, [grads[i] for i in wrt], [t for t in tangents if t is not None])
        swept = iter(_sweep(F, s, [tape.value(i) for i in wrt]))
        return tuple(None if t is None else next(swept) for t in tangents)

    return run_exactly(compute, digits, name)


def _parameter_directions(model, v, who):
    params = model.parameters()
    if not hasattr(v, "keys") or set(v) != set(params):
        got = sorted(v) if hasattr(v, "keys") else type(v).__name__
        raise ValueError(f"{who}: v must be a dict keyed like model.parameters() "
                         f"({sorted(params)}); got {got}")
    out = {}
    for key, w in params.items():
        arr = np.asarray(v[key])
        if arr.shape != np.shape(w):
            raise ValueError(f"{who}: v[{key!r}] has shape {arr.shape}; the parameter has "
                             f"{np.shape(w)}")
        if arr.dtype.kind not in "iufO":
            raise TypeError(f"{who}: v[{key!r}] has dtype {arr.dtype}; pass real numbers")
        _check_finite(who, f"v[{key!r}]", arr)
        out[key] = arr
    return out


def _prepared(model, v, dps, who):
    """(reference twin, digits, checked directions, parameter names) of a model product."""
    from reflib.models.config import twin

    model = twin(model)
    return model, check_dps(dps), _parameter_directions(model, v, who), list(model.parameters())


def model_hvp(model, x, y, loss, v, dps=None, gauss_newton=False):
    """``H v``: the Hessian of the mean loss of a reference model on ``(x, y)`` times ``v``,
    by a second backward through the model's recorded first backward.

    Parameters
    ----------
    model : reflib model, or any model with ``get_config()`` and ``parameters()``
        Any reference model (Dense, RNN, LSTM, MultiHeadAttention, SwiGLU, LayerNorm, RMSNorm,
        Embedding, Softmax and containers of them); a fastlib model is read through its
        reference twin (``reflib.models.twin``).
    x, y : array_like
        Input batch and targets, as for ``reflib.train.value_and_grad``.
    loss : str
        A loss name of ``reflib.losses`` (``mse``, ``cross_entropy``, ...).
    v : dict[str, array_like]
        The direction, keyed and shaped like ``model.parameters()``.
    dps : int or None
        None: float64 arithmetic; an int: exact, rounded to ``dps`` digits.
    gauss_newton : bool, default False
        Give the Gauss-Newton product ``Jᵀ H_loss J v`` instead (see :func:`gnvp`).

    Returns
    -------
    dict[str, numpy.ndarray]
        Keyed like ``model.parameters()`` (float64, or object arrays of ``mpmath.mpf``).
        A parameter the loss does not reach gets zeros.

    Notes
    -----
    The same signature as ``fastlib.model_hvp`` (``fastlib.hvp(model, x, y, loss, v)``), plus
    ``dps``.
    """
    if gauss_newton:
        return gnvp(model, x, y, loss, v, dps=dps)
    model, digits, directions, names = _prepared(model, v, dps, "reflib.model_hvp")

    def compute():
        from reflib.train import trace_loss

        F = _numeric(digits)
        tape, loss_id, ids = trace_loss(model, x, y, loss, dps=F)
        grads = tape.backward_dense_all(loss_id, F.asarray(1.0))       # the recorded backward
        s = _inner(F, [grads[ids[k]] for k in names], [directions[k] for k in names])
        return tuple(_sweep(F, s, [tape.value(ids[k]) for k in names]))

    return dict(zip(names, run_exactly(compute, digits)))


def gnvp(model, x, y, loss, v, dps=None):
    """The Gauss-Newton product ``Jᵀ H_loss J v`` of a reference model's mean loss.

    ``J`` is the Jacobian of the model's output for its parameters, ``H_loss`` the loss's
    Hessian for the output. Every factor comes from reverse sweeps over recorded backwards:
    ``J v`` is the gradient, for a cotangent ``u`` held as recorded leaves, of ``<Jᵀ u, v>``
    (the first backward seeded with ``u``); ``H_loss (J v)`` is :func:`hvp` of the loss op;
    ``Jᵀ`` of that is one more backward of the same tape.

    Parameters
    ----------
    model, x, y, loss, v, dps :
        As for :func:`model_hvp`.

    Returns
    -------
    dict[str, numpy.ndarray]
        Keyed like ``model.parameters()``.
    """
    model, digits, directions, names = _prepared(model, v, dps, "reflib.gnvp")

    def compute():
        from reflib.train import trace_loss

        F = _numeric(digits)
        tape, loss_id, ids = trace_loss(model, x, y, loss, dps=F)
        out_id, target_id = tape.parents(loss_id)
        out = tape.value(out_id)
        u = F.asarray(np.zeros(out.shape))                        # the cotangent, as leaves
        pulled = tape.backward_dense_all(out_id, u)               # Jᵀ u, recorded
        s = _inner(F, [pulled[ids[k]] for k in names], [directions[k] for k in names])
        (jv,) = _sweep(F, s, [u])                                 # J v
        # H_loss (J v): the loss op's own reverse over reverse, at this precision
        loss_name = resolve_loss(loss)
        pred = values_of(out)
        target = values_of(tape.value(target_id))
        sub = Tape(dps=F)
        p = sub.leaf(pred)
        t = sub.leaf(target, requires_grad=False)
        ell = sub.op(loss_name, p, t)
        gp = sub.backward_dense_all(ell, F.asarray(1.0))[p]
        (hjv,) = _sweep(F, _inner(F, [gp], [values_of(jv)]), [sub.value(p)])
        seed = values_of(hjv)
        back = tape.backward_dense_all(out_id, seed)              # Jᵀ H_loss J v
        return tuple(values_of(back[ids[k]]) for k in names)

    return dict(zip(names, run_exactly(compute, digits)))
