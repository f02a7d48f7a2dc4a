"""The compiled program on the device: each row lowered to its kind's kernels, run in order.

:func:`compile_program` builds the CPU's program (``fastlib.training.program``: the same
builder, the same checked rows) for a model and its data; :class:`Lowered` binds every row to
the device kernels of its kind (:data:`.layers.KERNELS`, keyed by the record's ``op``) over the
run's flat weights, laid out by the program's blocks. Forward runs the rows in order, each
reading and writing the slots its record names; backward in reverse, each input's cotangent
written, added or skipped as the row's ``grad_x`` / ``grad_x2`` say; a model's trailing
``Softmax`` layers run after the rows. A kind without device kernels, or a model the program
does not express, raises :class:`.layers.DeviceUnsupportedError` naming it before data moves.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import instructions as ins

from . import device
from . import train_kernels as tk
from .layers import KERNELS, DT, DeviceUnsupportedError, Recurrent, add_into, launch
from .norm import SOFTMAX, rows_forward_device, rows_vjp_device

__all__ = ["Lowered", "check_lowerable", "compile_program", "layers_of", "softmax_tail"]


def layers_of(model, where="model"):
    """``(position, layer)`` of every layer of ``model``, depth first."""
    yield where, model
    for i, child in enumerate(getattr(model, "_children", ())):
        yield from layers_of(child, f"{where}.layers[{i}]")


def _why_not(model):
    """A sentence naming the first layer of ``model`` the program cannot hold, and the fix."""
    from fastlib import layers as host

    known = {kind.layer for op, kind in ins.INSTRUCTIONS.items() if op in KERNELS and kind.layer}
    fix = "train it with device='cpu'"
    tail = softmax_tail(model)
    for where, layer in list(layers_of(model))[:-tail or None]:
        kind = type(layer).__name__
        if kind in ("Sequential", "Parallel") and type(layer) is getattr(host, kind):
            continue
        if kind not in known or type(layer) is not getattr(host, kind, None):
            return (f"{where} is a {type(layer).__module__}.{type(layer).__qualname__}, which "
                    f"the compiled program does not express (its layer kinds: "
                    f"{', '.join(sorted(known))}, inside Sequential / Parallel, and Softmax "
                    f"layers over the last axis at the model's end); {fix}")
        if kind == "Dense" and layer.activation == "softmax":
            return (f"{where} is a Dense with activation 'softmax', which the compiled program "
                    f"does not express; end the model with a linear Dense and use the loss "
                    f"'cross_entropy' (the softmax is inside it), or {fix}")
    return ("the model's layers are arranged in a way the compiled program does not express "
            "(an Embedding that is not the first layer, a Parallel mixing sequence and "
            f"per-sample branches, a width that does not match its input); {fix}")


def softmax_tail(model):
    """How many of a Sequential's last layers are ``Softmax`` layers over the last axis (the
    device runs them after the program's rows; the program holds the layers before them)."""
    from fastlib.layers import Sequential, Softmax

    if type(model) is not Sequential:
        return 0
    n = 0
    for layer in reversed(model.layers[1:]):
        if type(layer) is not Softmax or layer.axis != -1:
            break
        n += 1
    return n


def _head_program(model, keep, *args):
    """The CPU builder's program of the first ``keep`` layers of the Sequential ``model`` (the
    same rows, slots, blocks and parameter names as the CPU's for those layers)."""
    from fastlib.training.program import Program

    class Head(Program):
        def __init__(self):
            self._top = model
            super().__init__(model, *args)

        def _emit(self, layer, src, prefix):
            if layer is not self._top or keep == len(model.layers):
                return super()._emit(layer, src, prefix)
            for i, child in enumerate(model.layers[:keep]):
                src = super()._emit(child, src, f"{prefix}{i}.")
            return src
    return Head()


def compile_program(model, x):
    """The program of ``model`` for the data ``x`` (one sample per piece), as the CPU builds it
    (for a model ending in ``Softmax`` layers, of the layers before them: :func:`softmax_tail`).

    Raises
    ------
    DeviceUnsupportedError
        The model is not one the program expresses; the message names the layer and the fix.
    """
    from fastlib.layers import Parallel, Sequential
    from fastlib.training import program as prog

    tokens = bool(model.takes_indices)
    steps, d_in = prog._model_steps(x, tokens)
    if type(model) not in (Sequential, Parallel) or steps is None or steps < 1:
        raise DeviceUnsupportedError(f"train(device='cuda'): {_why_not(model)}")
    tail = softmax_tail(model)
    try:
        program = _head_program(model, len(model.layers) - tail, np.dtype(model.dtype), steps,
                                1, d_in, tokens, x.ndim == 3)
    except prog.Unsupported:
        raise DeviceUnsupportedError(f"train(device='cuda'): {_why_not(model)}") from None
    if set(program.layout) != set(model.parameters()):
        raise DeviceUnsupportedError(
            f"train(device='cuda'): the compiled program lays out the parameters "
            f"{sorted(program.layout)}, the model has {sorted(model.parameters())}; train it "
            f"with device='cpu'")
    check_lowerable(program)
    return program


def check_lowerable(program):
    """Raise :class:`DeviceUnsupportedError` unless every row's kind has device kernels."""
    for k, row in enumerate(program.tables.rows):
        op = int(row["op"])
        if op not in KERNELS:
            name = ins.INSTRUCTIONS[op].name if op in ins.INSTRUCTIONS else f"op {op}"
            raise DeviceUnsupportedError(
                f"train(device='cuda'): program row {k} is a {name} (op {op}), which has no "
                f"device kernels (fastlib.cuda.layers.KERNELS holds "
                f"{', '.join(ins.INSTRUCTIONS[o].name for o in sorted(KERNELS))}); add its "
                f"forward and backward there, or train it with device='cpu'")


class Lowered:
    """A program's rows bound to their device kernels over the flat weights ``w`` and
    gradients ``g`` (laid out by the program's blocks); ``recurrence`` (one per run) tells
    the recurrent rows how to step through time."""

    def __init__(self, program, w, g, recurrence, dtype, softmax_tail=0):
        check_lowerable(program)
        self.softmax_tail = softmax_tail
        rows, self.slots, blocks = program.tables
        self.input_slot, self.output_slot = program.input_slot, program.output_slot
        self.kernels = []
        for row in rows:
            kern = KERNELS[int(row["op"])](row, ins.row_sizes(row, self.slots), w, g, blocks,
                                           dtype)
            if isinstance(kern, Recurrent):
                kern.recurrence = recurrence
            self.kernels.append(kern)
        self.dtype = np.dtype(dtype)

    def _shape(self, slot, count):
        s = self.slots[slot]
        return count, int(s["steps"]), int(s["width"])

    def forward(self, xb, count):
        """The output slot (a DT) of the rows run on the batch ``xb`` of ``count`` samples."""
        acts = {self.input_slot: DT(xb, self._shape(self.input_slot, count))}
        for kern in self.kernels:
            row = kern.row
            op, x, y = int(row["op"]), acts[int(row["x"])], int(row["y"])
            if op == ins.ADD:
                out = kern.forward(x, acts[int(row["x2"])])
            elif op == ins.COLUMNS:
                out = kern.forward(x, acts.get(y))   # the join's first row makes y
            else:
                out = kern.forward(x)
            acts[y] = DT(out.data, self._shape(y, count))
        self.count = count
        out = acts[self.output_slot]
        self.tail_inputs = []
        for _ in range(self.softmax_tail):  # the model's trailing Softmax layers
            self.tail_inputs.append(out)
            out = DT(rows_forward_device(SOFTMAX, out.data, out.shape, 2), out.shape)
        return out

    def backward(self, grad):
        """Every row's backward from the output's cotangent ``grad`` (a DT): the parameters'
        gradients land in their blocks of ``g``."""
        for x in reversed(self.tail_inputs):
            grad = DT(rows_vjp_device(SOFTMAX, x.data, grad.data, x.shape, 2), x.shape)
        cot = {self.output_slot: grad}
        for kern in reversed(self.kernels):
            row = kern.row
            op, g = int(row["op"]), cot[int(row["y"])]
            if op == ins.EMBEDDING:
                kern.backward(g, False)
            elif op == ins.ADD:
                # y = x + x2: both inputs take y's cotangent (x its buffer: y's cotangent is
                # read by no row after this one; x2 a copy, so adding into one never changes
                # the other)
                self._deposit(cot, row, "x", "grad_x", g, alias=True)
                self._deposit(cot, row, "x2", "grad_x2", g, alias=False)
            elif op == ins.COLUMNS:
                mode, x = int(row["grad_x"]), int(row["x"])
                if mode == ins.GRAD_ADD:
                    kern.columns(g, cot[x].data, True)
                elif mode == ins.GRAD_WRITE:
                    shape = self._shape(x, self.count)
                    buf = device.empty(int(np.prod(shape)), self.dtype)
                    kern.columns(g, buf, False)
                    cot[x] = DT(buf, shape)
            else:
                mode = int(row["grad_x"])
                gx = kern.backward(g, mode != ins.GRAD_SKIP)
                self._deposit(cot, row, "x", "grad_x", gx, alias=True)

    def _deposit(self, cot, row, field, mode_field, g, alias):
        """Write (``alias``: as is, else a copy), add or skip ``g`` as the row's cotangent of
        its input ``field``, as the mode ``row[mode_field]`` says."""
        mode, slot = int(row[mode_field]), int(row[field])
        if mode == ins.GRAD_SKIP:
            return
        if mode == ins.GRAD_ADD:
            add_into(cot[slot].data, g.data)
            return
        if not alias:
            buf = device.empty(g.data.shape[0], self.dtype)
            launch(tk.copy, buf.shape[0])(g.data, buf)
            g = DT(buf, g.shape)
        cot[slot] = DT(g.data, self._shape(slot, self.count))
