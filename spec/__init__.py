"""spec: the truth. Every op declared once (forward, one VJP per input, domains, shapes, kinks),
proven with SymPy and evaluated to any precision with mpmath; the optimizers as equations.

>>> import spec
>>> spec.OPS["tanh"].inputs
('x',)

The long story: docs/spec.md, section ``spec/__init__.py``.
"""
from __future__ import annotations

import spec.domains as domains
from spec.errors import RegistryError, UnknownOpError, UnknownOptimizerError
from spec.opspec import REQUIRED, Example, Kink, OpSpec, Param
from spec.registry import check_covers_table, validate_op, validate_registry
from spec.catalog import OPS

from spec.evaluate import evaluate, evaluate_forward  # noqa: E402
from spec.samples import sample_case, sample_inputs  # noqa: E402
from spec.prove import ProofResult, prove, prove_all  # noqa: E402
from spec.second_order import hvp, jvp  # noqa: E402
from spec.prove_second_order import prove_second  # noqa: E402
from spec.optimizers import OPTIMIZERS, OptimizerSpec, engine_step, step  # noqa: E402
from spec.optimizer_proofs import prove_optimizers  # noqa: E402
from spec.targetprop import TARGETPROP_DEFAULTS, TARGETPROP_RULES, prove_targetprop  # noqa: E402
from spec.rbm import RBM_RULES, prove_rbm  # noqa: E402

__all__ = [
    "OPS", "OpSpec", "Param", "Example", "Kink", "REQUIRED", "domains",
    "evaluate", "evaluate_forward", "sample_inputs", "sample_case",
    "prove", "prove_all", "ProofResult", "jvp", "hvp", "prove_second",
    "OPTIMIZERS", "OptimizerSpec", "step", "engine_step", "prove_optimizers",
    "TARGETPROP_RULES", "TARGETPROP_DEFAULTS", "prove_targetprop", "RBM_RULES", "prove_rbm",
    "validate_op", "validate_registry", "UnknownOpError", "UnknownOptimizerError", "RegistryError",
]
