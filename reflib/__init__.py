"""reflib: the referee. Slow, small, obviously correct; float64 or exact (mpmath) on demand.

Public names are resolved lazily from the module that defines them.
"""
from __future__ import annotations

from optable.lazy import lazy_namespace

# public name -> module that defines it (one table; ``__all__`` is derived from it)
_EXPORTS = {
    "forward": "reflib.ops", "vjp": "reflib.ops",
    "jvp": "reflib.forward_mode", "hvp": "reflib.second_order",
    "model_hvp": "reflib.second_order", "gnvp": "reflib.second_order",
    "Tape": "reflib.tape", "AutogradError": "reflib.tape",
    "Dense": "reflib.models", "RNN": "reflib.models", "LSTM": "reflib.models",
    "MultiHeadAttention": "reflib.models", "SwiGLU": "reflib.models",
    "LayerNorm": "reflib.models", "RMSNorm": "reflib.models", "Embedding": "reflib.models",
    "Softmax": "reflib.models", "Sequential": "reflib.models", "Parallel": "reflib.models",
    "from_config": "reflib.models",
    "value_and_grad": "reflib.train", "train_step": "reflib.train",
    "TargetPropConfig": "reflib.targetprop", "TargetPropState": "reflib.targetprop",
    "targetprop_forward": "reflib.targetprop", "targetprop_backward": "reflib.targetprop",
    "apply_targetprop_gaps": "reflib.targetprop",
    "RBM": "reflib.rbm", "cd_step": "reflib.rbm",
}
_SUBMODULES = ("ops", "tape", "program", "models", "losses", "optim", "train", "targetprop", "rbm",
               "forward_mode", "recorded", "second_order", "scalar_rules")

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_namespace("reflib", _EXPORTS, _SUBMODULES)
