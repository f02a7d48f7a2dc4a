"""First-order rounding error through the adjoint: running error analysis that keeps correlations.

``AdjointError(u)`` evaluates reflib's formulas as ``RunningError(u)`` does (same values, same
radii, same rules for which operations round) and records every rounding site on a tape;
``adjoint_radii`` sweeps it backwards once for all outputs together (one adjoint per output):
output ``k`` is bounded by ``sum_j |d out_k / d z_j| * rho_j`` over the sites ``z_j``, ``rho_j``
the site's own rounding. Errors that cancel downstream cancel here too, except a product's
rounding, which an engine may fuse away (FMA) in one use and keep in another: its uses by a sum
count apart. Each bound is at most its running radius (triangle inequality, site by site).

The long story: docs/conformance.md, the train rows' adjoint radius.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from reflib.running_error import ELEMENTARY, Bounded, RunningError, _exact_factor, _parts, _u

__all__ = ["Traced", "AdjointError", "adjoint_radii"]

# the tape of the innermost AdjointError.context() (None outside one)
_TAPE = [None]


class _Tape:
    """The rounding sites of one evaluation: per node its own rounding ``rho``, whether it is
    a rounded product, and up to two parents with the partial derivatives of the node's value
    with respect to them and whether the node may fuse that parent (a sum of a product)."""

    def __init__(self):
        self.rho, self.product = [], []
        self.pa, self.da, self.fa, self.pb, self.db, self.fb = [], [], [], [], [], []

    def node(self, rho, parents, product=False, fusing=False):
        """A new node (its index) rounding by ``rho`` over ``parents``, [(node, partial)];
        ``fusing``: the node is a sum, which an engine may fuse with a product operand."""
        (pa, da), (pb, db) = (list(parents) + [(-1, 0.0), (-1, 0.0)])[:2]
        self.rho.append(rho)
        self.product.append(product)
        self.pa.append(pa)
        self.da.append(da)
        self.fa.append(fusing and pa >= 0 and self.product[pa])
        self.pb.append(pb)
        self.db.append(db)
        self.fb.append(fusing and pb >= 0 and self.product[pb])
        return len(self.rho) - 1


def _tape():
    tape = _TAPE[0]
    if tape is None:
        raise RuntimeError("Traced arithmetic ran outside AdjointError.context(); wrap the "
                           "computation in `with F.context():`")
    return tape


def _node(o):
    if isinstance(o, Traced):
        return o.n
    if isinstance(o, Bounded) and o.r != 0.0:
        # a rounded value that is not on the tape would drop its error from every bound
        raise TypeError(f"{o!r} carries a rounding error but no node; evaluate with "
                        f"AdjointError's own functions")
    return -1


def _traced(b, rounds, parents, product=False, fusing=False):
    """``b`` (a Bounded result) as a Traced: a new node when it rounds or combines parents,
    the parent's own node when it is that parent unchanged, none when nothing upstream
    rounded. ``product``: a rounded product; ``fusing``: a sum (see ``_Tape.node``)."""
    parents = [(n, d) for n, d in parents if n >= 0 and d != 0.0]
    rho = _u_of(b.v) if rounds else 0.0
    if rho == 0.0 and not parents:
        return Traced(b.v, b.r, -1)
    if rho == 0.0 and len(parents) == 1 and parents[0][1] == 1.0 and not fusing:
        return Traced(b.v, b.r, parents[0][0])
    tape = _tape()
    # a product that rounds, or the negation of one (which passes its uses on to it)
    product = product and (rho > 0.0 or (len(parents) == 1 and tape.product[parents[0][0]]))
    return Traced(b.v, b.r, tape.node(rho, parents, product, fusing))


def _u_of(v):
    return _u() * abs(v)


class Traced(Bounded):
    """A :class:`Bounded` (value and running radius) that also names its node on the tape of
    rounding sites (``n``; -1 when no rounding reaches it)."""

    __slots__ = ("n",)

    def __init__(self, v, r=0.0, n=-1):
        super().__init__(v, r)
        self.n = n

    def __repr__(self):
        return f"Traced({self.v!r}, {self.r!r}, node={self.n})"

    def __neg__(self):
        # the negation of a product is fused as one too (c - a b): it passes the flag on
        return _traced(Bounded(-self.v, self.r), False, [(self.n, -1.0)], product=True)

    def __abs__(self):
        # NOTE: at 0 the slope is taken as +1: the error's size is right, its sign unknown
        return _traced(Bounded(abs(self.v), self.r), False,
                       [(self.n, -1.0 if self.v < 0 else 1.0)])

    def __add__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        return _sum(self, o, 1.0)

    __radd__ = __add__

    def __sub__(self, o):
        if _parts(o)[0] is None:
            return NotImplemented
        return _sum(self, o, -1.0)

    def __rsub__(self, o):
        if _parts(o)[0] is None:
            return NotImplemented
        return _sum(o, self, -1.0)

    def __mul__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        b = Bounded.__mul__(self, o)
        rounds = not ((orr == 0.0 and _exact_factor(ov)) or
                      (self.r == 0.0 and _exact_factor(self.v)))
        return _traced(b, rounds, [(self.n, ov), (_node(o), self.v)], product=True)

    __rmul__ = __mul__

    def __truediv__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        return _divide(self, self.v, self.r, o, ov, orr)

    def __rtruediv__(self, o):
        ov, orr = _parts(o)
        if ov is None:
            return NotImplemented
        return _divide(o, ov, orr, self, self.v, self.r)


def _sum(a, b, sign):
    """``a + sign * b`` (``sign`` ±1) as Bounded adds it: a sum that rounds may fuse a
    product operand (an FMA)."""
    av, ar = _parts(a)
    bv, br = _parts(b)
    s = Bounded(av, ar) + Bounded(sign * bv, br)
    rounds = not ((bv == 0.0 and br == 0.0) or (av == 0.0 and ar == 0.0))
    return _traced(s, rounds, [(_node(a), 1.0), (_node(b), sign)], fusing=rounds)


def _divide(a, av, ar, b, bv, br):
    from reflib.running_error import _divide as bounded_divide

    q = bounded_divide(av, ar, bv, br)
    rounds = not (br == 0.0 and _exact_factor(bv))
    return _traced(q, rounds, [(_node(a), 1.0 / bv), (_node(b), -q.v / bv)])


def _unary(f, df):
    """``f`` rounded once with slope ``df``, as running_error's."""
    def apply(x):
        if not isinstance(x, Bounded):
            x = Traced(float(x))
        v = f(x.v)
        slope = df(x.v, v)
        return _traced(Bounded(v, abs(slope) * x.r + _u_of(v)), True, [(_node(x), slope)])
    return apply



class AdjointError(RunningError):
    """``RunningError(u)`` whose entries are :class:`Traced`: the same values and running
    radii, and a tape of rounding sites for :func:`adjoint_radii`.

    One instance records one evaluation: every ``context()`` of the instance writes to the
    same tape, so a forward and its backward (which ``reflib.Tape`` runs in separate
    contexts) share it. Make a new instance per evaluation.

    Parameters
    ----------
    u : float
        The unit roundoff: ``np.finfo(dtype).eps / 2`` (float32: ``2**-24``).

    Examples
    --------
    >>> import numpy as np
    >>> from reflib.adjoint_error import AdjointError, adjoint_radii
    >>> from reflib.ops import forward
    >>> F = AdjointError(2.0 ** -24)
    >>> x = np.array([1.0, 1.0 + 2.0 ** -20])
    >>> d = forward("sub", [forward("add", [x, x], dps=F), x], dps=F)   # (x + x) - x
    >>> bool(adjoint_radii(F, d)[1] <= d[1].r)
    True
    """

    _functions = {name: _unary(f, df) for name, (f, df) in ELEMENTARY.items()}

    def __init__(self, u):
        super().__init__(u)
        self.tape = _Tape()

    def __repr__(self):
        return f"AdjointError(u={self.u!r})"

    @contextlib.contextmanager
    def context(self):
        """The unit roundoff and the tape every Traced operation inside uses."""
        saved = _TAPE[0]
        _TAPE[0] = self.tape
        try:
            with super().context():
                yield
        finally:
            _TAPE[0] = saved

    def _leaf(self, v, what):
        if isinstance(v, Traced):
            return v
        b = super()._leaf(v, what)
        return Traced(b.v, b.r, -1) if b.r == 0.0 else b

    def const(self, value):
        c = super().const(value)
        if c.r == 0.0:
            return Traced(c.v)
        with self.context():
            return Traced(c.v, c.r, self.tape.node(c.r, ()))

    def zeros(self, shape):
        out = np.empty(shape, dtype=object)
        out.fill(Traced(0.0))
        return out

    def pi(self):
        with self.context():
            return Traced(math.pi, self.u * math.pi, self.tape.node(self.u * math.pi, ()))



def adjoint_radii(numeric, outputs):
    """The first-order rounding error bound of every entry of ``outputs`` (module doc).

    Parameters
    ----------
    numeric : AdjointError
        The numeric that evaluated ``outputs`` (its tape holds their rounding sites).
    outputs : array_like of Traced
        Results of that evaluation (reals count as exact).

    Returns
    -------
    numpy.ndarray
        ``sum_j |d out / d z_j| * rho_j`` per entry, shaped like ``outputs``: never above the
        entry's running radius (``Bounded.r``); not finite where a slope on the way is not.
    """
    arr = np.asarray(outputs, dtype=object)
    flat = [_node(o) for o in arr.reshape(-1)]
    tape = numeric.tape
    live = sorted({n for n in flat if n >= 0})
    out = np.zeros(len(flat))
    if not live:
        return out.reshape(arr.shape)
    rho, product = np.asarray(tape.rho), np.asarray(tape.product)
    top = live[-1]
    # adj[j, k]: d(output k) / d(node j), filled from the outputs back (parents precede
    # their children on the tape, so row j is complete when the sweep reaches it); for a
    # product, fused[j] is the part of adj[j] that reaches it through sums that may fuse it
    # and apart[j] the sum of those parts' magnitudes, use by use
    adj = np.zeros((top + 1, len(flat)))
    fused = np.zeros((top + 1, len(flat)))
    apart = np.zeros((top + 1, len(flat)))
    for k, n in enumerate(flat):
        if n >= 0:
            adj[n, k] = 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(top, -1, -1):
            row = adj[j]
            if not (row.any() or apart[j].any()):
                continue
            if rho[j]:
                # a product's rounding may be fused away in any use by a sum: |kept uses| plus
                # each fusable use on its own; any other site: |its whole adjoint|
                shared = np.abs(row - fused[j]) + apart[j] if product[j] else np.abs(row)
                out += shared * rho[j]
            elif product[j]:     # a negated product: its fusable uses are the product's
                fused[tape.pa[j]] += tape.da[j] * fused[j]
                apart[tape.pa[j]] += apart[j]
            for p, d, f in ((tape.pa[j], tape.da[j], tape.fa[j]),
                            (tape.pb[j], tape.db[j], tape.fb[j])):
                if p >= 0:
                    step = d * row
                    adj[p] += step
                    if f:
                        fused[p] += step
                        apart[p] += np.abs(step)
    return out.reshape(arr.shape)

