"""``backward(program, no_grad_vars)``: the backward program, built as PaddlePaddle builds it.

The long story: docs/reflib.md, section ``reflib/program/backward.py``.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from reflib.program.ir import (
    EMPTY_VAR, NOP, RENAME_INFIX, ZERO_SUFFIX, NetOp, Operator, ProgramError, RnnOp, did_you_mean,
    forward_var_name, grad_var_name, is_grad_var, leaf_ops,
)
from reflib.program.registry import (
    ZERO_GRAD, differentiable_inputs, differentiable_outputs, make_grad_op, op_info,
)
from reflib.program.validate import check_forward_dataflow, check_program

__all__ = ["backward", "final_outputs", "required_seeds", "all_var_names"]


def all_var_names(program):
    """Every variable name a program mentions, step nets included."""
    names = set()
    for _, op in leaf_ops(program):
        names.update(op.input_names())
        names.update(op.output_names())
        if isinstance(op, RnnOp):
            names |= all_var_names(op.step_net)
    return names


def final_outputs(program):
    """The differentiable outputs no later op reads, in the order they are written."""
    ops = [op for _, op in leaf_ops(program)]
    read_later = set()
    finals = []
    for op in reversed(ops):
        finals[:0] = [v for v in differentiable_outputs(op) if v not in read_later]
        read_later.update(op.input_names())
    return finals


def _check_targets(program, targets):
    finals = final_outputs(program)
    if targets is None:
        # NOTE: by default the caller seeds the outputs of the program's last op (its loss);
        # any other output no op reads gets no gradient (a zero, never a required seed).
        ops = list(leaf_ops(program))
        return [v for v in differentiable_outputs(ops[-1][1]) if v in finals] if ops else []
    if isinstance(targets, str) or not isinstance(targets, Iterable):
        raise TypeError(f"targets must be a list of variable names, e.g. ['loss']; got {targets!r}")
    targets = list(targets)
    for v in targets:
        if v not in finals:
            why = ("a later op reads it" if v in all_var_names(program) else
                   "the program does not use it; " + did_you_mean(v, finals))
            raise ProgramError(f"target {v!r} cannot be seeded: {why}. Targets are outputs no op "
                               f"reads: {finals}")
    return targets


def _check_no_grad(program, no_grad_vars):
    if isinstance(no_grad_vars, str) or not isinstance(no_grad_vars, Iterable):
        raise TypeError(f"no_grad_vars must be a set of variable names, e.g. {{'x'}}; got "
                        f"{no_grad_vars!r}")
    names = all_var_names(program)
    out = set()
    for v in no_grad_vars:
        if not isinstance(v, str):
            raise TypeError(f"no_grad_vars holds {v!r}; variable names are strings")
        if v not in names:
            raise ProgramError(f"no_grad_vars names {v!r}, which the program does not use; "
                               f"{did_you_mean(v, names)}pass names of the program's variables")
        out.add(v)
    return out


def required_seeds(program, no_grad_vars=frozenset(), targets=None):
    """The gradient names the backward program reads from the caller: ``t@GRAD`` per target.

    Parameters
    ----------
    program : Operator
        The forward program.
    no_grad_vars, targets
        As for ``backward``; a target in ``no_grad_vars`` needs no seed.
    """
    no_grad = _check_no_grad(program, no_grad_vars)
    return [grad_var_name(v) for v in _check_targets(program, targets) if v not in no_grad]


def backward(program, no_grad_vars=frozenset(), targets=None):
    """Build the backward program of ``program`` (Paddle's ``Backward``).

    Parameters
    ----------
    program : Operator
        A forward program: a NetOp (nets and recurrent ops nest) or a single op. Each variable
        must be written once and before it is read; names must not contain ``@``.
    no_grad_vars : set of str
        Variables whose gradient is not wanted: no gradient flows through them, and an op all of
        whose outputs are in the set becomes a NOP. Names apply in step nets too (as Paddle's
        single set does).
    targets : list of str, optional
        The outputs whose gradients the caller feeds (the seeds, ``loss@GRAD``); each must be an
        output no op reads. Default: the outputs of the program's last op. Every other output
        gets a zero gradient: ops no seed reaches become NOPs, and a gradient op that needs a
        missing output gradient gets it from ``fill_zeros_like``.

    Returns
    -------
    Operator
        The backward program: a NetOp of gradient ops in reverse order (with inserted ``sum``
        and ``fill_zeros_like`` ops), or a single op / NOP for a single-op program. Run it with
        ``reflib.program.run`` on the scope of the forward run after putting the seeds
        (``required_seeds``: ``t@GRAD`` per target) in it; it writes ``x@GRAD`` for each variable
        that gets a gradient.

    Raises
    ------
    ProgramError
        For a malformed program or a no_grad name the program does not use.
    TypeError
        For arguments of the wrong type.

    Examples
    --------
    >>> from reflib.program import NetOp, Operator, backward
    >>> prog = NetOp([Operator("matmul", {"X": "x", "Y": "w"}, {"Out": "h"}),
    ...               Operator("sum", {"X": "h"}, {"Out": "loss"})])
    >>> [op.type for op in backward(prog).ops]
    ['sum_grad', 'matmul_grad']
    """
    check_program(program)
    check_forward_dataflow(program)
    user = _check_no_grad(program, no_grad_vars)
    no_grad = {grad_var_name(v) for v in user}
    seeds = {grad_var_name(v) for v in _check_targets(program, targets)} - no_grad
    return _Builder(no_grad, seeds, user).build(program)


def _sum_op(parts, out):
    # axis=() reduces over no axis: the op is the plain elementwise sum of its X variables.
    return Operator("sum", {"X": parts}, {"Out": [out]}, {"axis": ()})


class _Builder:
    """The state of one namespace's build: Paddle's no_grad_names, plus the gradients that exist.

    ``no_grad`` holds gradient names known not to be computed; ``available`` those that exist
    when the op being built runs (seeds, and the outputs of the gradient ops built so far, which
    run earlier). Both are shared across nesting levels, as Paddle shares no_grad_names.
    """

    def __init__(self, no_grad, available, user_no_grad):
        self.no_grad = set(no_grad)
        self.available = set(available)
        self.user_no_grad = user_no_grad
        self._renames = defaultdict(int)

    def build(self, op):
        return self._net(op) if isinstance(op, NetOp) else self._op(op)

    def _rename(self, grad_name):
        # NOTE: one counter per gradient name over the whole build, so that renamed partials of
        # nested nets (which all share a scope) never collide: @0, @1, then @2, ...
        k = self._renames[grad_name]
        self._renames[grad_name] += 1
        return f"{grad_name}{RENAME_INFIX}{k}"

    def _all_no_grad(self, grads):
        return all(g in self.no_grad for g in grads)

    def _nop_rules(self, ins, outs):
        """Paddle's two NOP rules: every input gradient, or every output gradient, not computed.

        NOTE: Paddle also puts the inputs' gradients of an op NOP'd by the second rule into the
        no-grad set. That is wrong when an input has other readers (W in y1 = xW, y2 = zW with
        y2 no-grad would lose its gradient from y1), so it is not done here: an input gradient
        no reader produces is found missing when its producer is reached (see ``_op``).
        """
        return self._all_no_grad(ins) or self._all_no_grad(outs)

    def _net(self, net):
        ins = [grad_var_name(v) for v in differentiable_inputs(net)]
        outs = [grad_var_name(v) for v in differentiable_outputs(net)]
        if self._nop_rules(ins, outs):
            return NOP
        at_entry = set(self.available)
        written_inside = set(differentiable_outputs(net))
        children = [self.build(op) for op in reversed(net.ops)]

        # The children that write each gradient without reading it first. A child that reads it
        # first (an inner sum accumulating into it) is not a separate producer.
        producers = defaultdict(list)
        for i, child in enumerate(children):
            reads = set(child.input_names())
            for g in dict.fromkeys(child.output_names()):
                if is_grad_var(g) and g not in reads:
                    producers[g].append(i)

        sums_after = defaultdict(list)
        for g, idx in producers.items():
            # NOTE: v is written in this net and g = v@GRAD already holds the contribution of the
            # ops after the net: the producers here must add to it, not overwrite it.
            accumulate = g in at_entry and forward_var_name(g) in written_inside
            if len(idx) < 2 and not accumulate:
                continue
            parts = []
            for i in idx:
                parts.append(self._rename(g))
                children[i] = children[i].renamed(g, parts[-1])
            sums_after[idx[-1]].append(_sum_op(([g] if accumulate else []) + parts, g))

        ops = []
        for i, child in enumerate(children):
            ops.append(child)
            ops.extend(sums_after[i])
        return NetOp(ops)

    def _op(self, op):
        info = op_info(op.type)
        if info.grad == ZERO_GRAD:
            return NOP
        ins = [grad_var_name(v) for v in differentiable_inputs(op)]
        outs = [grad_var_name(v) for v in differentiable_outputs(op)]
        if self._all_no_grad(ins):
            return NOP
        # NOTE: an output gradient that no gradient op produced and no caller feeds is zero
        # (nothing after the op depends on that output): it is "not computed", as in no_grad.
        self.no_grad.update(g for g in outs if g not in self.available)
        if self._nop_rules(ins, outs):
            return NOP
        grad_op = make_grad_op(op)
        if isinstance(op, RnnOp):
            grad_op = self._rnn(op, grad_op)
            if all(v == EMPTY_VAR for v in grad_op.output_names()):
                return NOP

        before = []
        for g in dict.fromkeys(outs):
            if g in self.no_grad:
                zero = forward_var_name(g) + ZERO_SUFFIX
                grad_op = grad_op.renamed(g, zero)
                before.append(Operator("fill_zeros_like", {"X": [forward_var_name(g)]}, {"Out": [zero]}))
        for g in set(grad_op.output_names()):
            if g in self.no_grad:
                grad_op = grad_op.renamed(g, EMPTY_VAR)

        # A variable read through two slots (mul(h, h)) gets two gradients from one op.
        counts = Counter(v for v in grad_op.output_names() if v != EMPTY_VAR)
        after = []
        if any(c > 1 for c in counts.values()):
            parts = defaultdict(list)
            outputs = {}
            for slot, names in grad_op.outputs.items():
                outputs[slot] = []
                for v in names:
                    if counts.get(v, 0) > 1:
                        parts[v].append(self._rename(v))
                        v = parts[v][-1]
                    outputs[slot].append(v)
            grad_op = grad_op.with_slots(outputs=outputs)
            after = [_sum_op(p, g) for g, p in parts.items()]

        self.available.update(g for g in counts if is_grad_var(g))
        if before or after:
            return NetOp(before + [grad_op] + after)
        return grad_op

    def _rnn(self, op, grad_op):
        """Attach the step net's backward; outer gradients the step net cannot give are not computed."""
        a = op.attrs
        step_no_grad = {grad_var_name(v) for v in self.user_no_grad}
        step_no_grad |= {grad_var_name(p) for p in op.inputs["Params"] if grad_var_name(p) in self.no_grad}
        step_no_grad |= {grad_var_name(alias) for x, alias in zip(op.inputs["X"], a["inlink_alias"])
                         if grad_var_name(x) in self.no_grad}
        # The executor feeds these at every step: the slice of the outer output gradient and the
        # gradient carried back from the next step.
        seeds = {grad_var_name(v) for v in a["outlink_alias"] + a["memories"]} - step_no_grad
        step_backward = _Builder(step_no_grad, seeds, self.user_no_grad).build(op.step_net)
        produced = set(step_backward.output_names())
        outputs = {}
        for slot, step_names in (("X@GRAD", a["inlink_alias"]), ("Boot@GRAD", a["pre_memories"]),
                                 ("Params@GRAD", op.inputs["Params"])):
            # A position the step net gives no gradient for writes nothing. Not a no-grad name:
            # the same outer variable may get its gradient from another slot or another op.
            outputs[slot] = [outer if grad_var_name(name) in produced else EMPTY_VAR
                             for outer, name in zip(grad_op.outputs[slot], step_names)]
        return grad_op.with_slots(outputs=outputs).with_step_net(step_backward)
