"""Device twins of fastlib's layers: forward with history and backward, all in device memory.

:func:`build` walks a host model (``fastlib.layers``) and returns a tree of twins that read the
parameters from a store of flat device arrays keyed like ``model.parameters()``. Each twin
keeps the history its backward needs (the input, pre-activations, states) on the device, so a
training step moves no activation to the host. A layer type without a twin makes :func:`build`
raise :class:`DeviceUnsupportedError` naming the layer's position and type, before any step runs.

The math is the CPU layers' (``fastlib/layers``), built from the engine's kernels: the tiled
GEMM (:mod:`.linalg`) with Dense's bias + activation epilogue (:mod:`.dense`), the row kernels
of softmax / layer_norm / rms_norm (:mod:`.norm`), and the helpers of :mod:`.train_kernels`.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from fastlib.layers.activations import LEAKY_SLOPE  # Dense's leaky_relu slope: one source

from . import attention, device, recurrent, swiglu
from . import train_kernels as tk
from .dense import DENSE_ACTIVATIONS, _dense_forward_device
from .dense_grad import dense_grads
from .linalg import gemm_device
from .norm import LAYER_NORM, RMS_NORM, SOFTMAX, rows_forward_device, rows_vjp_device
from .structure import gather_device, scatter_device

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


class DeviceLayer:
    """Base of the twins: the host layer's name / dtype and its parameters in the store."""

    def __init__(self, layer, store, prefix, grads=None):
        self.layer = layer
        self.store = store
        self.grads = grads
        self.prefix = prefix
        self.dtype = np.dtype(layer.dtype)

    def p(self, name):
        return self.store[self.prefix + name]

    def g(self, name):
        """Where the gradient of parameter ``name`` goes: its view of the training run's flat
        gradient buffer (so the guard and the update read one array), or a new array."""
        key = self.prefix + name
        if self.grads is not None and key in self.grads:
            return self.grads[key]
        return device.empty(int(self.store[key].shape[0]), self.dtype)

    def forward(self, x: DT) -> DT:
        raise NotImplementedError

    def backward(self, g: DT, need_input_grad: bool):
        """``(grad_in DT or None, {store key: flat grad})`` from the last forward."""
        raise NotImplementedError


def dense_backward(d_g, d_x, d_w, d_pre, rows, n_in, n_out, activation, dtype,
                   need_input_grad=True, d_gw=None, d_gb=None):
    """(grad_x or None, grad_W, grad_b) of ``activation(x @ W + b)`` on flat device arrays.

    The math of :func:`.dense._dense_backward_device` in two launches (:mod:`.dense_grad`):
    the activation's derivative fused into both GEMMs' loads, the bias gradient (per-column
    float64 sums, rounded once) in grad_W's launch. softmax (a row op) takes one more launch,
    its row VJP. ``d_gw`` / ``d_gb`` receive the gradients when given.
    """
    scalar = None
    if activation == "softmax":
        d_g = rows_vjp_device(SOFTMAX, d_pre, d_g, (rows, n_out), 1)
    elif activation != "linear":
        scalar = DENSE_ACTIVATIONS[activation]
    d_gw = device.empty(n_in * n_out, dtype) if d_gw is None else d_gw
    d_gb = device.empty(n_out, dtype) if d_gb is None else d_gb
    d_gx = device.empty(rows * n_in, dtype) if need_input_grad else None
    dense_grads(d_g, d_x, d_w, d_pre, rows, n_in, n_out, scalar, LEAKY_SLOPE, d_gw, d_gb, d_gx)
    return d_gx, d_gw, d_gb


class DDense(DeviceLayer):
    def forward(self, x):
        L = self.layer
        rows = _size(x.shape[:-1])
        out, pre = _dense_forward_device(x.data, self.p("weight"), self.p("bias"), rows,
                                         L.in_features, L.out_features, L.activation,
                                         LEAKY_SLOPE)
        self.hist = (x, pre, rows)
        return DT(out, x.shape[:-1] + (L.out_features,))

    def backward(self, g, need_input_grad):
        L = self.layer
        x, pre, rows = self.hist
        gx, gw, gb = dense_backward(g.data, x.data, self.p("weight"), pre, rows, L.in_features,
                                    L.out_features, L.activation, self.dtype, need_input_grad,
                                    self.g("weight"), self.g("bias"))
        grads = {self.prefix + "weight": gw, self.prefix + "bias": gb}
        return (DT(gx, x.shape) if need_input_grad else None), grads


class DLayerNorm(DeviceLayer):
    """Normalise and affine map in one launch forward; backward two: the weight and bias
    gradients as one pair of column sums, the row VJP of ``g * weight``."""
    affine_bias = True
    mode = LAYER_NORM

    def forward(self, x):
        d = self.layer.d
        rows = _size(x.shape[:-1])
        xhat = device.empty(rows * d, self.dtype)
        y = device.empty(rows * d, self.dtype)
        w = self.p("weight")
        bias = self.p("bias") if self.affine_bias else w
        tk.norm_affine[device.row_grid(rows), device.reduce_block(d)](
            x.data, w, bias, xhat, y, rows, d, self.mode, self.layer.eps, int(self.affine_bias))
        self.hist = (x, xhat, rows)
        return DT(y, x.shape)

    def backward(self, g, need_input_grad):
        d = self.layer.d
        x, xhat, rows = self.hist
        gw = self.g("weight")
        gb = self.g("bias") if self.affine_bias else gw
        column_sums(g.data, rows, d, tk.SUM_AB_AND_A if self.affine_bias else tk.SUM_AB, gw,
                    xhat, gb)
        grads = {self.prefix + "weight": gw}
        if self.affine_bias:
            grads[self.prefix + "bias"] = gb
        if not need_input_grad:
            return None, grads
        dx = device.empty(rows * d, self.dtype)
        tk.norm_affine_vjp[device.row_grid(rows), device.reduce_block(d)](
            x.data, g.data, self.p("weight"), dx, rows, d, self.mode, self.layer.eps)
        return DT(dx, x.shape), grads


class DRMSNorm(DLayerNorm):
    affine_bias = False
    mode = RMS_NORM


class DSoftmax(DeviceLayer):
    def forward(self, x):
        axis = self.layer.axis % len(x.shape)
        self.hist = (x, axis)
        return DT(rows_forward_device(SOFTMAX, x.data, x.shape, axis), x.shape)

    def backward(self, g, need_input_grad):
        x, axis = self.hist
        if not need_input_grad:
            return None, {}
        return DT(rows_vjp_device(SOFTMAX, x.data, g.data, x.shape, axis), x.shape), {}


class DEmbedding(DeviceLayer):
    def forward(self, x):
        n, dim = _size(x.shape), self.layer.dim
        out = device.empty(n * dim, self.dtype)
        launch(tk.embedding_forward, n * dim)(self.p("weight"), x.data, out, n, dim)
        self.hist = x
        return DT(out, x.shape + (dim,))

    def backward(self, g, need_input_grad):
        x = self.hist
        n, num, dim = _size(x.shape), self.layer.num, self.layer.dim
        dw = self.g("weight")
        cap = max(1, device.config.MAX_SPLIT_TABLE // max(1, num * dim))
        threads, col_blocks, splits = column_geometry(n, dim, cap)
        work = device.empty(splits * num * dim, np.float64)
        grid = (min(device.config.MAX_GRID, col_blocks), min(device.config.MAX_GRID, splits))
        tk.embedding_backward[grid, threads](x.data, g.data, dw, work,
                                             device.arrival_counters(col_blocks), n, num, dim,
                                             splits)
        return None, {self.prefix + "weight": dw}


class DSwiGLU(DeviceLayer):
    """Two launches forward, four backward (three as the first layer): :mod:`.swiglu`."""

    def forward(self, x):
        L, dt = self.layer, self.dtype
        rows = _size(x.shape[:-1])
        y, au, h = swiglu.swiglu_forward_device(x.data, self.p("w_gate"), self.p("w_up"),
                                                self.p("w_down"), rows, L.d, L.hidden, L.out,
                                                dt)
        self.hist = (x, au, h, rows)
        return DT(y, x.shape[:-1] + (L.out,))

    def backward(self, g, need_input_grad):
        L, dt = self.layer, self.dtype
        x, au, h, rows = self.hist
        names = ("w_gate", "w_up", "w_down")
        grads = {self.prefix + n: self.g(n) for n in names}
        dx = swiglu.swiglu_backward_device(
            g.data, x.data, self.p("w_gate"), self.p("w_up"), self.p("w_down"), au, h, rows,
            L.d, L.hidden, L.out, dt, *grads.values(), need_input_grad)
        return (DT(dx, x.shape) if need_input_grad else None), grads


def _swap01(d_x, a, b, c):
    """(a, b, c) C-contiguous -> (b, a, c) C-contiguous, as a new flat array."""
    return gather_device(d_x, (b, a, c), (c, b * c, 1))


class DRecurrent(DeviceLayer):
    """RNN and LSTM: time-major (T, B, ...) inside; the input projection of every time step as
    one GEMM, then one persistent launch through time forward and one backward, or one launch
    per step where ``recurrence`` says so (:mod:`.recurrent`)."""

    recurrence = None  # the run's (set by build); a fresh one for a twin built alone

    def forward(self, x):
        L, dt = self.layer, self.dtype
        batch, steps, n_in = x.shape
        H, k = L.hidden_size, self._gates
        xt = _swap01(x.data, batch, steps, n_in)
        xw, _ = _dense_forward_device(xt, self.p("w_ih"), self.p("b"), steps * batch, n_in,
                                      k * H, "linear", 0.0)
        hs = device.empty(steps * batch * H, dt)
        if self._gates == 4:
            cache = (device.empty(steps * 4 * batch * H, dt), device.empty(steps * batch * H, dt),
                     device.empty(steps * batch * H, dt))
        else:
            cache = (hs, hs, hs)  # an RNN has no gates or cells: the kernel never reads these
        if self.recurrence is None:
            self.recurrence = recurrent.Recurrence()
        recurrent.forward(self._gates == 4, xw, self.p("w_hh"), hs, *cache, steps, batch, H,
                          self.recurrence)
        self.hist = (x, xt, hs, cache)
        if L.return_sequences:
            return DT(_swap01(hs, steps, batch, H), (batch, steps, H))
        last = device.empty(batch * H, dt)
        launch(tk.copy, batch * H)(hs[(steps - 1) * batch * H:], last)
        return DT(last, (batch, H))

    def backward(self, g, need_input_grad):
        L, dt = self.layer, self.dtype
        x, xt, hs, cache = self.hist
        batch, steps, n_in = x.shape
        H, k = L.hidden_size, self._gates
        if L.return_sequences:
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
        grads = {self.prefix + "w_ih": mm(xt, dz, n_in, k * H, rows, dt, ta=True,
                                          out=self.g("w_ih")),
                 self.prefix + "b": col_sums(dz, rows, k * H, dt, out=self.g("b"))}
        if steps > 1:
            grads[self.prefix + "w_hh"] = mm(hs, dz[batch * k * H:], H, k * H,
                                             (steps - 1) * batch, dt, ta=True,
                                             out=self.g("w_hh"))
        else:
            grads[self.prefix + "w_hh"] = w_hh = self.g("w_hh")
            device.fill(w_hh, 0.0)
        grads = {self.prefix + n: grads[self.prefix + n] for n in ("w_ih", "w_hh", "b")}
        if not need_input_grad:
            return None, grads
        dxt = mm(dz, self.p("w_ih"), rows, n_in, k * H, dt, tb=True)
        return DT(_swap01(dxt, steps, batch, n_in), x.shape), grads


class DRNN(DRecurrent):
    _gates = 1


class DLSTM(DRecurrent):
    _gates = 4


class DAttention(DeviceLayer):
    """Self-attention: the q, k, v and output projections as Dense GEMMs, the core flash-style
    (:mod:`.attention`: one launch forward, one backward, a block per (batch, head); only the
    rows' log-sum-exp is kept between them)."""

    def __init__(self, layer, store, prefix, grads=None):
        super().__init__(layer, store, prefix, grads)
        dh = layer.d_model // layer.heads
        if dh > device.config.ATTENTION_MAX_HEAD_DIM:
            raise DeviceUnsupportedError(
                f"train(device='cuda'): MultiHeadAttention({layer.d_model}, {layer.heads}) has "
                f"heads of width {dh}, wider than the device kernels' "
                f"{device.config.ATTENTION_MAX_HEAD_DIM}; use more heads or train it with "
                f"device='cpu'")

    def _core_launch(self, batch, steps):
        threads = 1
        while threads < steps and threads < device.config.BLOCK:
            threads *= 2
        return min(device.config.MAX_GRID, batch * self.layer.heads), threads

    def forward(self, x):
        L, dt = self.layer, self.dtype
        batch, steps, d = x.shape
        nh, dh, rows = L.heads, d // L.heads, batch * steps
        proj = {}
        for n in "qkv":
            proj[n], _ = _dense_forward_device(x.data, self.p(f"w_{n}"), self.p(f"b_{n}"), rows,
                                               d, d, "linear", 0.0)
        # the scale as the dtype holds it (the CPU layer's value)
        scale = float(dt.type(1.0 / np.sqrt(dh)))
        lse = device.empty(batch * nh * steps, np.float64)
        att = device.empty(rows * d, dt)
        attention.forward[self._core_launch(batch, steps)](
            proj["q"], proj["k"], proj["v"], att, lse, batch, steps, nh, dh, scale,
            int(L.causal))
        y, _ = _dense_forward_device(att, self.p("w_o"), self.p("b_o"), rows, d, d, "linear", 0.0)
        self.hist = (x, proj, lse, att, scale)
        return DT(y, x.shape)

    def backward(self, g, need_input_grad):
        L, dt = self.layer, self.dtype
        x, proj, lse, att, scale = self.hist
        batch, steps, d = x.shape
        nh, dh, rows = L.heads, d // L.heads, batch * steps
        datt, gw_o, gb_o = dense_backward(g.data, att, self.p("w_o"), g.data, rows, d, d,
                                          "linear", dt, True, self.g("w_o"), self.g("b_o"))
        delta = device.empty(batch * nh * steps, np.float64)
        dproj = {n: device.empty(rows * d, dt) for n in "qkv"}
        attention.backward[self._core_launch(batch, steps)](
            proj["q"], proj["k"], proj["v"], datt, lse, delta, dproj["q"], dproj["k"],
            dproj["v"], batch, steps, nh, dh, scale, int(L.causal))
        grads, dx = {}, None
        for n in "qkv":
            gx, gw, gb = dense_backward(dproj[n], x.data, self.p(f"w_{n}"), dproj[n], rows, d, d,
                                        "linear", dt, need_input_grad, self.g(f"w_{n}"),
                                        self.g(f"b_{n}"))
            grads[self.prefix + f"w_{n}"] = gw
            grads[self.prefix + f"b_{n}"] = gb
            if need_input_grad:
                dx = gx if dx is None else add_into(dx, gx)
        grads[self.prefix + "w_o"] = gw_o
        grads[self.prefix + "b_o"] = gb_o
        return (DT(dx, x.shape) if need_input_grad else None), grads


class DSequential(DeviceLayer):
    def __init__(self, layer, store, prefix, children, grads=None):
        super().__init__(layer, store, prefix, grads)
        self.children = children

    def forward(self, x):
        for c in self.children:
            x = c.forward(x)
        return x

    def backward(self, g, need_input_grad):
        grads = {}
        for i in range(len(self.children) - 1, -1, -1):
            g, part = self.children[i].backward(g, need_input_grad or i > 0)
            grads.update(part)
        return g, grads


class DParallel(DSequential):
    def forward(self, x):
        outs = [c.forward(x) for c in self.children]
        lead = outs[0].shape[:-1]
        rows = _size(lead)
        if self.layer.combine == "add":
            total = device.empty(_size(outs[0].shape), self.dtype)
            launch(tk.copy, total.shape[0])(outs[0].data, total)
            for o in outs[1:]:
                add_into(total, o.data)
            self.widths = None
            return DT(total, outs[0].shape)
        self.widths = [o.shape[-1] for o in outs]
        width = sum(self.widths)
        total = device.empty(rows * width, self.dtype)
        at = 0
        for o, w in zip(outs, self.widths):
            scatter_device(o.data, total, (rows, w), (width, 1), at)
            at += w
        return DT(total, lead + (width,))

    def backward(self, g, need_input_grad):
        grads, dx = {}, None
        if self.widths is None:
            parts = [g] * len(self.children)
        else:
            lead = g.shape[:-1]
            rows, width = _size(lead), g.shape[-1]
            parts, at = [], 0
            for w in self.widths:
                parts.append(DT(gather_device(g.data, (rows, w), (width, 1), at), lead + (w,)))
                at += w
        for child, part in zip(self.children, parts):
            gi, child_grads = child.backward(part, need_input_grad)
            grads.update(child_grads)
            if need_input_grad and gi is not None:
                dx = gi if dx is None else DT(add_into(dx.data, gi.data), dx.shape)
        return dx, grads


_TWINS = {"Dense": DDense, "LayerNorm": DLayerNorm, "RMSNorm": DRMSNorm, "Softmax": DSoftmax,
          "Embedding": DEmbedding, "SwiGLU": DSwiGLU, "RNN": DRNN, "LSTM": DLSTM,
          "MultiHeadAttention": DAttention}
_CONTAINERS = {"Sequential": DSequential, "Parallel": DParallel}


def build(model, store, prefix="", where="model", grads=None, recurrence=None):
    """The device twin of ``model`` reading parameters from ``store`` (flat device arrays).

    ``grads`` (keyed like ``store``) are where backward writes each parameter's gradient
    (views of one flat buffer in training); without it, backward returns new arrays.
    ``recurrence`` (:class:`.recurrent.Recurrence`, one per run) tells the recurrent layers
    how to step through time.

    Raises
    ------
    DeviceUnsupportedError
        A layer (at ``where``, e.g. ``model.layers[2]``) whose type has no device twin; the
        message names the type and says to train with ``device="cpu"``.
    """
    # NOTE: dispatch on the exact class, not isinstance: a user's subclass of Dense may change
    # forward / backward, and its twin would silently compute the parent's math.
    kind = type(model).__name__
    from fastlib import layers as host_layers
    if kind in _CONTAINERS and type(model) is getattr(host_layers, kind):
        children = [build(c, store, f"{prefix}{i}.", f"{where}.layers[{i}]", grads, recurrence)
                    for i, c in enumerate(model._children)]
        return _CONTAINERS[kind](model, store, prefix, children, grads)
    if kind in _TWINS and type(model) is getattr(host_layers, kind):
        twin = _TWINS[kind](model, store, prefix, grads)
        if recurrence is not None and isinstance(twin, DRecurrent):
            twin.recurrence = recurrence
        return twin
    raise DeviceUnsupportedError(
        f"train(device='cuda'): {where} is a {type(model).__module__}.{type(model).__qualname__}, "
        f"which has no device implementation (the device runs fastlib's own "
        f"{', '.join(sorted(_TWINS))} inside Sequential / Parallel); train it with "
        f"device='cpu'")
