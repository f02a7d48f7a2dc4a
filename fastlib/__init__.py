"""fastlib: the fast Numba engine (CPU, and CUDA through numba.cuda).

Public names are resolved lazily from the module that defines them, so ``import fastlib`` is
cheap and never imports SymPy or ``spec`` (a test checks ``sys.modules``).
"""
from __future__ import annotations

from fastlib._version import read_version as _read_version
from fastlib.cache_guard import ensure_fresh_cache as _ensure_fresh_cache
from optable.lazy import lazy_namespace

# before any kernel module loads: stale cached kernels (an edited or upgraded callee) crash
_ensure_fresh_cache()

#: the verigrad distribution's version (``verigrad --version`` prints it)
__version__ = _read_version()

# public name -> module that defines it (one table; ``__all__`` is derived from it)
_EXPORTS = {
    # ops: the name-keyed kernel table and the engine protocol
    "OPS": "fastlib.ops", "forward": "fastlib.ops", "vjp": "fastlib.ops",
    "UnknownOpError": "fastlib.ops",
    # the fast tape
    "Tape": "fastlib.tape", "AutogradError": "fastlib.tape",
    # layers and containers
    "Layer": "fastlib.layers", "Dense": "fastlib.layers", "RNN": "fastlib.layers",
    "LSTM": "fastlib.layers", "MultiHeadAttention": "fastlib.layers", "SwiGLU": "fastlib.layers",
    "LayerNorm": "fastlib.layers", "RMSNorm": "fastlib.layers", "Embedding": "fastlib.layers",
    "Softmax": "fastlib.layers", "Sequential": "fastlib.layers", "Parallel": "fastlib.layers",
    "value_and_grad": "fastlib.grad",
    # forward mode and second order: per op, and a model's loss
    "jvp": "fastlib.second_order", "hvp": "fastlib.model_hvp",
    "model_hvp": "fastlib.model_hvp", "gnvp": "fastlib.model_hvp",
    # losses
    "onehot": "fastlib.losses",
    # training
    "train": "fastlib.training", "train_sh": "fastlib.training",
    "TrainingResult": "fastlib.training",
    "TrainingHistorySH": "fastlib.training", "register_algorithm": "fastlib.training",
    "TrainOptions": "fastlib.training", "DivergenceRules": "fastlib.training",
    # the public errors and warnings (fastlib.errors)
    "CorruptFileError": "fastlib.errors", "CheckpointLockedError": "fastlib.errors",
    "DivergenceWarning": "fastlib.errors",
    # saving
    "load": "fastlib.loading",
    # Target Propagation and contrastive divergence
    "TargetPropConfig": "fastlib.targetprop", "TargetPropState": "fastlib.targetprop",
    "targetprop_forward": "fastlib.targetprop", "targetprop_backward": "fastlib.targetprop",
    "apply_targetprop_gaps": "fastlib.targetprop",
    "RBM": "fastlib.rbm", "cd_gradients": "fastlib.rbm",
}
_SUBMODULES = ("ops", "tape", "layers", "grad", "losses", "optim", "training", "datasets", "io",
               "kernels", "config", "cuda", "targetprop", "rbm", "cache_guard", "errors",
               "second_order", "model_hvp")

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_namespace("fastlib", _EXPORTS, _SUBMODULES)
