"""The device kernels of each program row kind: forward with history and backward, on the device.

One class per instruction kind of ``fastlib.kernels.instructions`` (:data:`KERNELS`, keyed by
the record's ``op``): it reads its row's fields by name, its parameters from the row's blocks
of the run's flat weight vector (the program's layout) and writes their gradients into the same
blocks of the flat gradient buffer; it keeps the history its backward needs on the device, so a
step moves no activation to the host. :mod:`.lowering` runs the rows. The math is the CPU
program's, built from the engine's kernels: the tiled GEMM (:mod:`.linalg`) with Dense's
epilogues (:mod:`.dense`, :mod:`.dense_grad`), the row kernels (:mod:`.train_kernels`), the
recurrent (:mod:`.recurrent`), attention (:mod:`.attention`) and SwiGLU (:mod:`.swiglu`) ones.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from fastlib.kernels import instructions as ins
from fastlib.layers.activations import ACTIVATIONS

from . import attention, device, recurrent, swiglu
from . import train_kernels as tk
from .dense import DENSE_ACTIVATIONS, _dense_forward_device
from .dense_grad import dense_grads
from .linalg import gemm_device
from .norm import LAYER_NORM, RMS_NORM
from .structure import gather_device

#: A device tensor: a flat C-contiguous device array and the shape it stands for.
DT = namedtuple("DT", "data shape")



class DeviceUnsupportedError(ValueError):
    """A model (or a training option) that ``train(device="cuda")`` cannot run on the device."""


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))


def launch(kern, n):
    """``kern`` configured for a grid-stride loop over ``n`` items."""
    return kern[device.grid_1d(max(int(n), 1))]


def mm(d_a, d_b, m, n, k, dtype, ta=False, tb=False, batch=1, shared_b=False, out=None):
    """``A @ B`` for ``batch`` products of (m, k) @ (k, n); ``ta`` / ``tb`` read an operand
    stored transposed ((k, m) / (n, k)); ``shared_b`` uses one B for the whole batch; ``out``
    receives the product (a gradient's view of the flat buffer) instead of a new array."""
    sa = (1, m) if ta else (k, 1)
    sb = (1, k) if tb else (n, 1)
    return gemm_device(d_a, (m * k,) + sa, d_b, (0 if shared_b else k * n,) + sb, batch, m, n,
                       k, dtype, d_c=out)


def column_geometry(rows, d, cap=None):
    """(threads, column blocks, row chunks) of a column reduction over ``rows`` x ``d``: a
    power-of-two block over the columns, and the rows split until the launch fills the GPU
    (each chunk at least ``config.MIN_SPLIT_ROWS`` rows; at most ``cap`` chunks)."""
    threads = 1
    while threads < d and threads < device.config.BLOCK:
        threads *= 2
    col_blocks = -(-d // threads)
    splits = 1
    target = device.fill_target()
    if col_blocks < target:
        splits = max(1, min(-(-target // col_blocks), rows // device.config.MIN_SPLIT_ROWS))
    if cap is not None:
        splits = max(1, min(splits, cap))
    return threads, col_blocks, splits


def column_sums(d_a, rows, d, mode, out, d_b=None, out2=None):
    """Per-column sums of a (rows, d) array in one launch (:data:`.train_kernels.column_sums`:
    ``mode`` SUM_A, SUM_AB or SUM_AB_AND_A), float64 in row order per chunk, chunks added in
    order, rounded once into ``out`` (and ``out2``)."""
    threads, col_blocks, splits = column_geometry(rows, d)
    work = device.empty(2 * splits * d if splits > 1 else 0, np.float64)
    arrivals = device.arrival_counters(col_blocks)
    grid = (min(device.config.MAX_GRID, col_blocks), min(device.config.MAX_GRID, splits))
    tk.column_sums[grid, threads](d_a, d_a if d_b is None else d_b, out,
                                  out if out2 is None else out2, work, arrivals, rows, d, mode,
                                  splits)
    return out


def col_sums(d_a, rows, d, dtype, d_b=None, out=None):
    """Per-column ``sum_r a[r, j] (* b[r, j])`` in float64, rounded once to ``dtype``."""
    out = device.empty(d, dtype) if out is None else out
    return column_sums(d_a, rows, d, tk.SUM_A if d_b is None else tk.SUM_AB, out, d_b)


def add_into(d_a, d_b):
    """``a += b`` elementwise on flat device arrays of one size."""
    launch(tk.add_into, d_a.shape[0])(d_a, d_b)
    return d_a


#: Dense activation names by their code (the records hold the code).
_ACTIVATION_NAMES = {code: name for name, code in ACTIVATIONS.items()}


class RowKernels:
    """Base of the row kinds: one program row's fields, parameter blocks and gradient blocks.

    Parameters
    ----------
    row : numpy.void
        The row's record (``instructions.ROW``), read by field name.
    sizes : dict
        ``instructions.row_sizes`` of the row (``steps``, ``d_in``, ``d_out`` and its ints).
    w, g : device arrays
        The run's flat weights and gradients, laid out by the program's blocks.
    blocks : numpy.ndarray
        The program's block table (``instructions.BLOCK``).
    dtype : numpy.dtype
        The model's dtype.
    """

    def __init__(self, row, sizes, w, g, blocks, dtype):
        self.row, self.s, self.dtype = row, sizes, np.dtype(dtype)
        self._w, self._g, self._blocks = w, g, blocks

    def _span(self, field):
        b = self._blocks[int(self.row[field])]
        at = int(b["offset"])
        return at, at + int(b["rows"]) * int(b["cols"])

    def p(self, field):
        """The parameter block ``field`` of this row: a view of the flat weights."""
        lo, hi = self._span(field)
        return self._w[lo:hi]

    def g(self, field):
        """Where the gradient of block ``field`` goes: its view of the flat gradients."""
        lo, hi = self._span(field)
        return self._g[lo:hi]

    def forward(self, x: DT) -> DT:
        raise NotImplementedError

    def backward(self, g: DT, need_input_grad: bool):
        """The input's cotangent (DT, or None without ``need_input_grad``) from the last
        forward; the parameters' gradients are written into their blocks."""
        raise NotImplementedError


def dense_backward(d_g, d_x, d_w, d_pre, rows, n_in, n_out, activation, dtype,
                   need_input_grad, d_gw, d_gb, param=0.0):
    """grad_x or None of ``activation(x @ W + b)`` on flat device arrays; grad_W and grad_b
    written into ``d_gw`` and ``d_gb``.

    The math of :func:`.dense._dense_backward_device` in two launches (:mod:`.dense_grad`):
    the activation's derivative fused into both GEMMs' loads, the bias gradient (per-column
    float64 sums, rounded once) in grad_W's launch.
    """
    scalar = None if activation == "linear" else DENSE_ACTIVATIONS[activation]
    d_gx = device.empty(rows * n_in, dtype) if need_input_grad else None
    dense_grads(d_g, d_x, d_w, d_pre, rows, n_in, n_out, scalar, param, d_gw, d_gb, d_gx)
    return d_gx


class Dense(RowKernels):
    def forward(self, x):
        s, rows = self.s, _size(x.shape[:-1])
        self.activation = _ACTIVATION_NAMES[int(self.row["activation"])]
        out, pre = _dense_forward_device(x.data, self.p("weight"), self.p("bias"), rows,
                                         s["d_in"], s["d_out"], self.activation,
                                         float(self.row["slope"]))
        self.hist = (x, pre, rows)
        return DT(out, x.shape[:-1] + (s["d_out"],))

    def backward(self, g, need_input_grad):
        s = self.s
        x, pre, rows = self.hist
        gx = dense_backward(g.data, x.data, self.p("weight"), pre, rows, s["d_in"], s["d_out"],
                            self.activation, self.dtype, need_input_grad, self.g("weight"),
                            self.g("bias"), float(self.row["slope"]))
        return DT(gx, x.shape) if need_input_grad else None


class LayerNorm(RowKernels):
    """Normalise and affine map in one launch forward; backward two: the weight and bias
    gradients as one pair of column sums, the row VJP of ``g * weight``."""
    affine_bias = True
    mode = LAYER_NORM

    def forward(self, x):
        d = self.s["d_in"]
        rows = _size(x.shape[:-1])
        xhat = device.empty(rows * d, self.dtype)
        y = device.empty(rows * d, self.dtype)
        w = self.p("weight")
        bias = self.p("bias") if self.affine_bias else w
        tk.norm_affine[device.row_grid(rows), device.reduce_block(d)](
            x.data, w, bias, xhat, y, rows, d, self.mode, float(self.row["eps"]),
            int(self.affine_bias))
        self.hist = (x, xhat, rows)
        return DT(y, x.shape)

    def backward(self, g, need_input_grad):
        d = self.s["d_in"]
        x, xhat, rows = self.hist
        gw = self.g("weight")
        gb = self.g("bias") if self.affine_bias else gw
        column_sums(g.data, rows, d, tk.SUM_AB_AND_A if self.affine_bias else tk.SUM_AB, gw,
                    xhat, gb)
        if not need_input_grad:
            return None
        dx = device.empty(rows * d, self.dtype)
        tk.norm_affine_vjp[device.row_grid(rows), device.reduce_block(d)](
            x.data, g.data, self.p("weight"), dx, rows, d, self.mode, float(self.row["eps"]))
        return DT(dx, x.shape)


class RMSNorm(LayerNorm):
    affine_bias = False
    mode = RMS_NORM


class Embedding(RowKernels):
    def forward(self, x):
        n, dim = _size(x.shape), self.s["d_out"]
        out = device.empty(n * dim, self.dtype)
        launch(tk.embedding_forward, n * dim)(self.p("weight"), x.data, out, n, dim)
        self.hist = x
        return DT(out, x.shape[:-1] + (dim,))

    def backward(self, g, need_input_grad):
        x = self.hist
        n, num, dim = _size(x.shape), self.s["num"], self.s["d_out"]
        dw = self.g("weight")
        cap = max(1, device.config.MAX_SPLIT_TABLE // max(1, num * dim))
        threads, col_blocks, splits = column_geometry(n, dim, cap)
        work = device.empty(splits * num * dim, np.float64)
        grid = (min(device.config.MAX_GRID, col_blocks), min(device.config.MAX_GRID, splits))
        tk.embedding_backward[grid, threads](x.data, g.data, dw, work,
                                             device.arrival_counters(col_blocks), n, num, dim,
                                             splits)
        return None


class SwiGLU(RowKernels):
    """Two launches forward, four backward (three as the first row): :mod:`.swiglu`."""

    def forward(self, x):
        s, dt = self.s, self.dtype
        rows = _size(x.shape[:-1])
        y, au, h = swiglu.swiglu_forward_device(x.data, self.p("w_gate_up"), self.p("w_down"),
                                                rows, s["d_in"], s["hidden"], s["d_out"], dt)
        self.hist = (x, au, h, rows)
        return DT(y, x.shape[:-1] + (s["d_out"],))

    def backward(self, g, need_input_grad):
        s, dt = self.s, self.dtype
        x, au, h, rows = self.hist
        dx = device.empty(rows * s["d_in"], dt) if need_input_grad else None
        swiglu.swiglu_backward_device(
            g.data, x.data, self.p("w_gate_up"), self.p("w_down"), au, h, rows, s["d_in"],
            s["hidden"], s["d_out"], dt, self.g("w_gate_up"), self.g("w_down"), dx)
        return DT(dx, x.shape) if need_input_grad else None


def _swap01(d_x, a, b, c):
    """(a, b, c) C-contiguous -> (b, a, c) C-contiguous, as a new flat array."""
    return gather_device(d_x, (b, a, c), (c, b * c, 1))


class Recurrent(RowKernels):
    """RNN and LSTM: time-major (T, B, ...) inside; the input projection of every time step as
    one GEMM, then one persistent launch through time forward and one backward, or one launch
    per step where ``recurrence`` says so (:mod:`.recurrent`)."""

    gates = 1
    recurrence = None  # the run's (set by the lowering); a fresh one for a row run alone

    def forward(self, x):
        dt, k = self.dtype, self.gates
        batch, steps, n_in = x.shape
        H = self.s["d_out"]
        xt = _swap01(x.data, batch, steps, n_in)
        xw, _ = _dense_forward_device(xt, self.p("w_ih"), self.p("bias"), steps * batch, n_in,
                                      k * H, "linear", 0.0)
        hs = device.empty(steps * batch * H, dt)
        if k == 4:
            cache = (device.empty(steps * 4 * batch * H, dt), device.empty(steps * batch * H, dt),
                     device.empty(steps * batch * H, dt))
        else:
            cache = (hs, hs, hs)  # an RNN has no gates or cells: the kernel never reads these
        if self.recurrence is None:
            self.recurrence = recurrent.Recurrence()
        recurrent.forward(k == 4, xw, self.p("w_hh"), hs, *cache, steps, batch, H,
                          self.recurrence)
        self.hist = (x, xt, hs, cache)
        if self.s["every_state"]:
            return DT(_swap01(hs, steps, batch, H), (batch, steps, H))
        last = device.empty(batch * H, dt)
        launch(tk.copy, batch * H)(hs[(steps - 1) * batch * H:], last)
        return DT(last, (batch, 1, H))

    def backward(self, g, need_input_grad):
        dt, k = self.dtype, self.gates
        x, xt, hs, cache = self.hist
        batch, steps, n_in = x.shape
        H = self.s["d_out"]
        if self.s["every_state"]:
            dhs = _swap01(g.data, batch, steps, H)
        else:
            dhs = device.zeros(steps * batch * H, dt)
            launch(tk.copy, batch * H)(g.data, dhs[(steps - 1) * batch * H:])
        dz = device.empty(steps * k * batch * H, dt)
        # the LSTM's carried cell cotangent, written at the last step before any read
        dc = device.empty(batch * H, dt) if k == 4 else dz
        recurrent.backward(k == 4, dhs, hs, *cache, dc, dz, self.p("w_hh"), steps, batch, H,
                           self.recurrence)
        rows = steps * batch
        mm(xt, dz, n_in, k * H, rows, dt, ta=True, out=self.g("w_ih"))
        col_sums(dz, rows, k * H, dt, out=self.g("bias"))
        if steps > 1:
            mm(hs, dz[batch * k * H:], H, k * H, (steps - 1) * batch, dt, ta=True,
               out=self.g("w_hh"))
        else:
            device.fill(self.g("w_hh"), 0.0)
        if not need_input_grad:
            return None
        dxt = mm(dz, self.p("w_ih"), rows, n_in, k * H, dt, tb=True)
        return DT(_swap01(dxt, steps, batch, n_in), x.shape)


class RNN(Recurrent):
    gates = 1


class LSTM(Recurrent):
    gates = 4


class Attention(RowKernels):
    """Self-attention: q, k and v as one GEMM of the ``w_qkv`` block (bias ``b_qkv`` in its
    epilogue), the core flash-style (:mod:`.attention`: one launch forward, one backward, a
    block per (batch, head); only the rows' log-sum-exp is kept between them), the output
    projection a Dense GEMM; backward: ``w_o``'s two, the core's one, the ``w_qkv`` and
    ``b_qkv`` gradients in one GEMM and the input's cotangent in one."""

    def __init__(self, row, sizes, w, g, blocks, dtype):
        super().__init__(row, sizes, w, g, blocks, dtype)
        d, heads = sizes["d_in"], sizes["heads"]
        if d // heads > device.config.ATTENTION_MAX_HEAD_DIM:
            raise DeviceUnsupportedError(
                f"train(device='cuda'): MultiHeadAttention({d}, {heads}) has heads of width "
                f"{d // heads}, wider than the device kernels' "
                f"{device.config.ATTENTION_MAX_HEAD_DIM}; use more heads or train it with "
                f"device='cpu'")

    def _core_launch(self, batch, steps):
        threads = 1
        while threads < steps and threads < device.config.BLOCK:
            threads *= 2
        return min(device.config.MAX_GRID, batch * self.s["heads"]), threads

    def forward(self, x):
        dt = self.dtype
        batch, steps, d = x.shape
        nh = self.s["heads"]
        dh, rows = d // nh, batch * steps
        qkv, _ = _dense_forward_device(x.data, self.p("w_qkv"), self.p("b_qkv"), rows, d, 3 * d,
                                       "linear", 0.0)
        lse = device.empty(batch * nh * steps, np.float64)
        att = device.empty(rows * d, dt)
        scale, causal = float(self.row["scale"]), int(self.row["causal"])
        attention.forward[self._core_launch(batch, steps)](
            qkv, qkv[d:], qkv[2 * d:], att, lse, batch, steps, nh, dh, 3 * d, scale, causal)
        y, _ = _dense_forward_device(att, self.p("w_o"), self.p("b_o"), rows, d, d, "linear",
                                     0.0)
        self.hist = (x, qkv, lse, att)
        return DT(y, x.shape)

    def backward(self, g, need_input_grad):
        dt = self.dtype
        x, qkv, lse, att = self.hist
        batch, steps, d = x.shape
        nh = self.s["heads"]
        dh, rows = d // nh, batch * steps
        datt = dense_backward(g.data, att, self.p("w_o"), g.data, rows, d, d, "linear", dt, True,
                              self.g("w_o"), self.g("b_o"))
        delta = device.empty(batch * nh * steps, np.float64)
        dqkv = device.empty(rows * 3 * d, dt)
        attention.backward[self._core_launch(batch, steps)](
            qkv, qkv[d:], qkv[2 * d:], datt, lse, delta, dqkv, dqkv[d:], dqkv[2 * d:], batch,
            steps, nh, dh, 3 * d, float(self.row["scale"]), int(self.row["causal"]))
        dx = dense_backward(dqkv, x.data, self.p("w_qkv"), dqkv, rows, d, 3 * d, "linear", dt,
                            need_input_grad, self.g("w_qkv"), self.g("b_qkv"))
        return DT(dx, x.shape) if need_input_grad else None


class Add(RowKernels):
    """A join of ``Parallel(combine="add")``: ``y = x + x2``, one launch; backward passes the
    cotangent to both inputs (:mod:`.lowering` deposits it)."""

    def forward(self, x, x2):
        y = device.empty(x.data.shape[0], self.dtype)
        launch(tk.add_pair, y.shape[0])(x.data, x2.data, y)
        return DT(y, x.shape)


class Columns(RowKernels):
    """A join of ``Parallel(combine="concat")``: ``x`` placed at columns ``col0..`` of ``y``
    (the join's rows share ``y``), one launch; backward reads the columns back, one launch."""

    def forward(self, x, y):
        rows, d_in, d_out = _size(x.shape[:-1]), self.s["d_in"], self.s["d_out"]
        if y is None:
            y = DT(device.empty(rows * d_out, self.dtype), x.shape[:-1] + (d_out,))
        launch(tk.put_columns, rows * d_in)(x.data, y.data, rows, d_in, d_out,
                                            int(self.row["col0"]))
        return y

    def columns(self, g, out, add):
        """Columns ``col0..`` of the cotangent ``g`` written (``add``: added) into ``out``."""
        rows, d_in, d_out = _size(g.shape[:-1]), self.s["d_in"], self.s["d_out"]
        launch(tk.take_columns, rows * d_in)(g.data, out, rows, d_in, d_out,
                                             int(self.row["col0"]), int(add))


#: The device kernels of every instruction kind, by the record's ``op``.
KERNELS = {ins.DENSE: Dense, ins.LAYER_NORM: LayerNorm, ins.RMS_NORM: RMSNorm,
           ins.EMBEDDING: Embedding, ins.SWIGLU: SwiGLU, ins.RNN: RNN, ins.LSTM: LSTM,
           ins.ATTENTION: Attention, ins.ADD: Add, ins.COLUMNS: Columns}
