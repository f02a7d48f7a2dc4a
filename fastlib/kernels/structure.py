"""Structure ops: transpose, reshape, concat, slice, forward and VJP, through one kernel.

Every one of them (and every VJP) is a copy between two strided index boxes of flat buffers:
``dst[d_off + sum_k i_k * d_strides[k]] = src[s_off + sum_k i_k * s_strides[k]]`` for all
``i`` in ``shape``. Transpose permutes the source strides, slice offsets and scales them,
concat writes each input into its region of the output, and the VJPs swap the roles. Outputs
are always new arrays (never views of an input).
"""
from __future__ import annotations

import operator

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _strided_copy(src, s_off, s_strides, dst, d_off, d_strides, shape):
    """Copy the index box ``shape`` from ``src`` to ``dst`` (flat buffers, element strides)."""
    nd = shape.size
    outer = 1
    for k in range(nd):
        if shape[k] == 0:
            return
        if k < nd - 1:
            outer *= shape[k]
    inner = shape[nd - 1]
    si = s_strides[nd - 1]
    di = d_strides[nd - 1]
    idx = np.zeros(nd, np.int64)
    so = s_off
    do = d_off
    for _ in range(outer):
        # slice views: offset indexing would keep Numba's wraparound test in the loop; unit
        # strides get step-free (contiguous) views, which copy at memory speed
        if di == 1 and si == 1:
            d1 = dst[do:do + inner]
            s1 = src[so:so + inner]
            for j in range(inner):
                d1[j] = s1[j]
        else:
            d = dst[do:do + (inner - 1) * di + 1:di]
            s = src[so:so + (inner - 1) * si + 1:si]
            for j in range(inner):
                d[j] = s[j]
        # advance the odometer over the outer axes
        k = nd - 2
        while k >= 0:
            idx[k] += 1
            so += s_strides[k]
            do += d_strides[k]
            if idx[k] < shape[k]:
                break
            so -= s_strides[k] * shape[k]
            do -= d_strides[k] * shape[k]
            idx[k] = 0
            k -= 1


def _c_strides(shape):
    """Element strides of a C-contiguous array of ``shape``."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


def _copy_box(src, s_off, s_strides, dst, d_off, d_strides, shape):
    if len(shape) == 0:          # 0-d: one element
        dst.reshape(-1)[d_off] = src.reshape(-1)[s_off]
        return
    _strided_copy(src.reshape(-1), s_off, np.asarray(s_strides, np.int64), dst.reshape(-1),
                  d_off, np.asarray(d_strides, np.int64), np.asarray(shape, np.int64))


# --- transpose -----------------------------------------------------------------------------

def normalize_perm(axes, ndim):
    """``axes`` (None reverses) as a tuple permutation of range(ndim), or a ValueError."""
    if axes is None:
        return tuple(range(ndim - 1, -1, -1))
    try:
        perm = tuple(operator.index(a) for a in axes)
    except TypeError:
        raise ValueError(f"transpose: axes must be None or a sequence of ints, got {axes!r}") \
            from None
    perm = tuple(a % ndim if -ndim <= a < ndim else a for a in perm)
    if sorted(perm) != list(range(ndim)):
        raise ValueError(f"transpose: axes {axes!r} is not a permutation of the input's "
                         f"{ndim} axes (expected each of 0..{ndim - 1} once)")
    return perm


def _permuted_copy(x, perm):
    shape = tuple(x.shape[p] for p in perm)
    out = np.empty(shape, x.dtype)
    xs = _c_strides(x.shape)
    _copy_box(x, 0, [xs[p] for p in perm], out, 0, _c_strides(shape), shape)
    return out


def transpose_forward(x, perm):
    """``np.transpose(x, perm)`` as a new C-contiguous array."""
    return _permuted_copy(x, perm)


def transpose_vjp(x, perm, grad):
    """VJP of transpose: the cotangent transposed by the inverse permutation."""
    return _permuted_copy(grad, tuple(int(i) for i in np.argsort(perm)))


# --- reshape -------------------------------------------------------------------------------

def normalize_shape(shape, size):
    """``shape`` (tuple of ints, at most one -1) resolved for ``size`` elements, or ValueError."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise ValueError(f"reshape: shape must be a tuple of ints, got {shape!r}") from None
    if sum(d == -1 for d in dims) > 1 or any(d < -1 for d in dims):
        raise ValueError(f"reshape: shape {dims} may hold one -1 and otherwise sizes >= 0")
    known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
    if -1 in dims:
        if known == 0 or size % known:
            raise ValueError(f"reshape: cannot infer -1 in {dims} for {size} elements")
        dims = tuple(size // known if d == -1 else d for d in dims)
    elif known != size:
        raise ValueError(f"reshape: cannot reshape {size} elements into shape {dims} "
                         f"({known} elements)")
    return dims


def _flat_copy(x, shape):
    out = np.empty(shape, x.dtype)
    if x.size:
        _copy_box(x, 0, [1], out, 0, [1], (x.size,))
    return out


def reshape_forward(x, shape):
    """``x`` reshaped to the resolved ``shape`` (a copy)."""
    return _flat_copy(x, shape)


def reshape_vjp(x, shape, grad):
    """VJP of reshape: the cotangent reshaped back to ``x.shape`` (a copy)."""
    return _flat_copy(grad, x.shape)


# --- concat --------------------------------------------------------------------------------

def concat_shape(a_shape, b_shape, axis):
    """(normalised axis, output shape) of concatenating a and b, or a ValueError."""
    nd = len(a_shape)
    if nd == 0 or len(b_shape) != nd:
        raise ValueError(f"concat: inputs need the same number (>= 1) of dimensions, got "
                         f"shapes {a_shape} and {b_shape}")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) \
            or not -nd <= axis < nd:
        raise ValueError(f"concat: axis must be an int in [-{nd}, {nd}), got {axis!r}")
    ax = int(axis) % nd
    for i in range(nd):
        if i != ax and a_shape[i] != b_shape[i]:
            raise ValueError(f"concat: shapes {a_shape} and {b_shape} differ on axis {i}; "
                             f"all axes but the concat axis ({ax}) must match")
    shape = list(a_shape)
    shape[ax] += b_shape[ax]
    return ax, tuple(shape)


def concat_forward(a, b, axis):
    """``np.concatenate([a, b], axis)`` (axis already normalised)."""
    _, shape = concat_shape(a.shape, b.shape, axis)
    out = np.empty(shape, a.dtype)
    os_ = _c_strides(shape)
    _copy_box(a, 0, _c_strides(a.shape), out, 0, os_, a.shape)
    _copy_box(b, 0, _c_strides(b.shape), out, a.shape[axis] * os_[axis], os_, b.shape)
    return out


def concat_vjp(a, b, axis, grad):
    """VJP of concat: the two regions of the cotangent, as new arrays."""
    gs = _c_strides(grad.shape)
    ga = np.empty(a.shape, a.dtype)
    gb = np.empty(b.shape, a.dtype)
    _copy_box(grad, 0, gs, ga, 0, _c_strides(a.shape), a.shape)
    _copy_box(grad, a.shape[axis] * gs[axis], gs, gb, 0, _c_strides(b.shape), b.shape)
    return ga, gb


# --- slice ---------------------------------------------------------------------------------

def slice_plan(shape, axis, start, stop, step):
    """(axis, start, step, output shape) of ``x[..., start:stop:step, ...]``, or a ValueError."""
    nd = len(shape)
    if nd == 0:
        raise ValueError("slice: the input is 0-d; there is no axis to slice")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) \
            or not -nd <= axis < nd:
        raise ValueError(f"slice: axis must be an int in [-{nd}, {nd}), got {axis!r}")
    for label, v in (("start", start), ("stop", stop)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise ValueError(f"slice: {label} must be an int or None, got {v!r}")
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(f"slice: step must be an int >= 1, got {step!r}")
    ax = int(axis) % nd
    lo, hi, st = slice(start, stop, int(step)).indices(shape[ax])
    out_shape = list(shape)
    out_shape[ax] = len(range(lo, hi, st))
    return ax, lo, st, tuple(out_shape)


def _slice_strides(shape, ax, lo, st):
    xs = _c_strides(shape)
    strides = list(xs)
    strides[ax] = xs[ax] * st
    return lo * xs[ax], strides


def slice_forward(x, plan):
    """The slice described by ``plan`` (from ``slice_plan``) as a new array."""
    ax, lo, st, shape = plan
    out = np.empty(shape, x.dtype)
    off, strides = _slice_strides(x.shape, ax, lo, st)
    _copy_box(x, off, strides, out, 0, _c_strides(shape), shape)
    return out


def slice_vjp(x, plan, grad):
    """VJP of slice: zeros of x's shape with the cotangent scattered into the sliced region."""
    ax, lo, st, shape = plan
    out = np.zeros(x.shape, x.dtype)
    off, strides = _slice_strides(x.shape, ax, lo, st)
    _copy_box(grad, 0, _c_strides(shape), out, off, strides, shape)
    return out
