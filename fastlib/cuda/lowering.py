"""The compiled program on the device: each row lowered to its kind's kernels, run in order.

:func:`compile_program` builds the CPU's program (``fastlib.training.program``: the same
builder, the same checked rows) for a model and its data; :class:`Lowered` binds every row to
the device kernels of its kind (:data:`.layers.KERNELS`, keyed by the record's ``op``) over the
run's flat weights, laid out by the program's blocks. Forward runs the rows in order, each
reading and writing the slots its record names; backward in reverse, each input's cotangent
written, added or skipped as the row's ``grad_x`` / ``grad_x2`` say; a model's softmax
layers run after the row before them (``softmax_after``). A kind without device kernels, or a model the program
does not express, raises :class:`.layers.DeviceUnsupportedError` naming it before data moves.
"""
from __future__ import annotations

import numpy as np

from fastlib.kernels import instructions as ins

from . import device
from . import train_kernels as tk
from .layers import KERNELS, DT, DeviceUnsupportedError, Recurrent, add_into, launch
from .norm import SOFTMAX, rows_forward_device, rows_vjp_device

__all__ = ["Lowered", "check_lowerable", "compile_program", "layers_of"]


def layers_of(model, where="model", after_layer=False):
    """``(position, layer, after_layer)`` of every layer of ``model``, depth first;
    ``after_layer``: the layer follows another inside a Sequential."""
    yield where, model, after_layer
    in_sequence = type(model).__name__ == "Sequential"
    for i, child in enumerate(getattr(model, "_children", ())):
        yield from layers_of(child, f"{where}.layers[{i}]", in_sequence and i > 0)


def _why_not(model):
    """A sentence naming the first layer of ``model`` the program cannot hold, and the fix."""
    from fastlib import layers as host

    known = {kind.layer for op, kind in ins.INSTRUCTIONS.items() if op in KERNELS and kind.layer}
    fix = "train it with device='cpu'"
    for where, layer, after_layer in layers_of(model):
        kind = type(layer).__name__
        if kind in ("Sequential", "Parallel") and type(layer) is getattr(host, kind):
            continue
        if kind == "Softmax" and type(layer) is host.Softmax:
            if layer.axis != -1 or not after_layer:
                alone = "" if after_layer else ", with no layer before it in a Sequential"
                return (f"{where} is a Softmax over axis {layer.axis}{alone}; the device "
                        f"applies a softmax over the last axis (axis=-1) to the output of the "
                        f"layer before it; {fix}")
            continue
        if kind not in known or type(layer) is not getattr(host, kind, None):
            return (f"{where} is a {type(layer).__module__}.{type(layer).__qualname__}, which "
                    f"the compiled program does not express (its layer kinds: "
                    f"{', '.join(sorted(known))} and Softmax, inside Sequential / Parallel); "
                    f"{fix}")
    return ("the model's layers are arranged in a way the compiled program does not express "
            "(an Embedding that is not the first layer, a Parallel mixing sequence and "
            f"per-sample branches, a width that does not match its input); {fix}")


def _device_program(*args):
    """The CPU builder's program (``fastlib.training.program.Program``: the same rows, slots,
    blocks and parameter names), with the softmax the device applies after a row where the
    model has one: a Dense with activation softmax is its linear row and a softmax after it,
    a ``Softmax`` layer over the last axis (not a Sequential's first layer, whose input other
    rows may read) a softmax after the row before it. ``softmax_after``: per softmax, its row.
    ``unit_ends``: where each unit's output is final (a top-level Sequential's children, else
    the whole model: the units mixed precision rounds), as ``(row, softmaxes after it)``.
    """
    from fastlib.layers import Dense, Sequential, Softmax
    from fastlib.layers.activations import ACTIVATIONS, LEAKY_SLOPE
    from fastlib.training.program import Program, Unsupported

    class DeviceProgram(Program):
        def __init__(self):
            self.softmax_after = []
            self.unit_ends = []
            super().__init__(*args)
            if not self.unit_ends:        # a top-level Parallel: one unit, the whole model
                self._unit_end()

        def _unit_end(self):
            k = len(self._rows) - 1
            if k >= 0:
                self.unit_ends.append((k, self.softmax_after.count(k)))

        def _emit(self, layer, src, prefix):
            if type(layer) is Sequential:
                top = layer is args[0]
                for i, child in enumerate(layer.layers):
                    if type(child) is Softmax and i > 0 and child.axis == -1:
                        self.softmax_after.append(len(self._rows) - 1)
                    else:
                        src = self._emit(child, src, f"{prefix}{i}.")
                    if top:
                        self._unit_end()
                return src
            if type(layer) is Dense and layer.activation == "softmax":
                if src[0] == self.input_slot and self.tokens or layer.in_features != src[1]:
                    raise Unsupported
                out = self._row(ins.DENSE, src, layer.out_features, layer, prefix,
                                shared={"pre": -1}, activation=ACTIVATIONS["linear"],
                                slope=LEAKY_SLOPE)
                self.softmax_after.append(len(self._rows) - 1)
                return out
            return super()._emit(layer, src, prefix)
    return DeviceProgram()


def compile_program(model, x):
    """The program of ``model`` for the data ``x`` (one sample per piece), as the CPU builds it
    (with the softmax rows' places, ``softmax_after``, where the model has softmax layers).

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
    try:
        program = _device_program(model, np.dtype(model.dtype), steps, 1, d_in, tokens,
                                  x.ndim == 3)
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

    def __init__(self, program, w, g, recurrence, dtype, rounding=None):
        check_lowerable(program)
        self.softmax_after = list(getattr(program, "softmax_after", ()))
        # mixed precision (``rounding``, a .mixed.DeviceMixed): each unit's output rounded to
        # the format in the forward, and its cotangent in the backward, where the unit ends
        self.rounding = rounding
        self.unit_ends = set(getattr(program, "unit_ends", ())) if rounding else set()
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
        self.softmax_inputs = []
        for k, kern in enumerate(self.kernels):
            row = kern.row
            op, x, y = int(row["op"]), acts[int(row["x"])], int(row["y"])
            if op == ins.ADD:
                out = kern.forward(x, acts[int(row["x2"])])
            elif op == ins.COLUMNS:
                out = kern.forward(x, acts.get(y))   # the join's first row makes y
            else:
                out = kern.forward(x)
            acts[y] = self._rounded(DT(out.data, self._shape(y, count)), k, 0)
            for j in range(self.softmax_after.count(k)):  # a softmax after this row
                self.softmax_inputs.append(acts[y])
                acts[y] = self._rounded(
                    DT(rows_forward_device(SOFTMAX, acts[y].data, acts[y].shape, 2),
                       acts[y].shape), k, j + 1)
        self.count = count
        return acts[self.output_slot]

    def backward(self, grad):
        """Every row's backward from the output's cotangent ``grad`` (a DT): the parameters'
        gradients land in their blocks of ``g``."""
        cot = {self.output_slot: grad}
        inputs = list(self.softmax_inputs)
        for k in range(len(self.kernels) - 1, -1, -1):
            kern = self.kernels[k]
            row = kern.row
            y = int(row["y"])
            after = self.softmax_after.count(k)
            self._round_cotangent(cot, y, k, after)
            for j in range(after, 0, -1):  # the softmaxes after this row
                x = inputs.pop()
                cot[y] = DT(rows_vjp_device(SOFTMAX, x.data, cot[y].data, x.shape, 2), x.shape)
                self._round_cotangent(cot, y, k, j - 1)
            op, g = int(row["op"]), cot[y]
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

    def _rounded(self, act, k, j):
        """``act``, or (mixed precision, where a unit ends) a rounded copy: the row's own
        output stays as its backward may read it, the rows after read the rounded one."""
        if (k, j) not in self.unit_ends:
            return act
        return DT(self.rounding.rounded_copy(act.data), act.shape)

    def _round_cotangent(self, cot, y, k, j):
        """Round (in place) the cotangent of a unit's output once every row after the unit
        has added to it (mixed precision)."""
        if (k, j) in self.unit_ends and y in cot:
            self.rounding.round_in_place(cot[y].data)

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
