"""reflib.program: static programs and their backward programs, as PaddlePaddle builds them.

- ``ir``: the program IR: ``Operator`` (type, input / output slots, attributes), ``NetOp`` (a
  list of ops, nestable), ``RnnOp`` (a recurrent op with a step net), Paddle's ``@GRAD`` names.
- ``registry``: one registration per op type, giving its slots, attributes and gradient op.
- ``validate``: the checks that reject malformed programs with messages that say what to fix.
- ``backward``: ``backward(program, no_grad_vars)`` builds the backward program.
- ``executor``: ``run(program, scope, dps=None)`` (or ``Executor(dps).run(program, scope)``) runs
  any program in float64 or exactly.

The long story: docs/reflib.md, section ``reflib/program/__init__.py``.
"""
from reflib.program.backward import all_var_names, backward, final_outputs, required_seeds
from reflib.program.executor import Executor, run
from reflib.program.ir import (
    EMPTY_VAR, GRAD_SUFFIX, NOP, RENAME_INFIX, ZERO_SUFFIX, Memory, NetOp, Operator, ProgramError,
    RnnGradOp, RnnOp, forward_var_name, grad_var_name, is_grad_var,
)
from reflib.program.registry import REGISTRY, OpInfo, op_info, register_op, registered_types
from reflib.program.validate import check_forward_dataflow, check_program

__all__ = [
    "Operator", "NetOp", "RnnOp", "RnnGradOp", "Memory", "NOP", "ProgramError",
    "GRAD_SUFFIX", "ZERO_SUFFIX", "RENAME_INFIX", "EMPTY_VAR",
    "grad_var_name", "forward_var_name", "is_grad_var",
    "OpInfo", "REGISTRY", "op_info", "register_op", "registered_types",
    "check_program", "check_forward_dataflow",
    "backward", "required_seeds", "final_outputs", "all_var_names", "run", "Executor",
]
