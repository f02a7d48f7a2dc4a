"""Reference models: layers and containers traced onto a ``reflib.Tape`` from registry ops.

Parameter names and layouts are the contract shared with fastlib (``y = x @ W + b``, row-major,
batch first): a fastlib model's ``get_config()`` and ``parameters()`` load into its reference
twin with ``from_config(cfg)`` and ``load_parameters(params)``.
"""
from reflib.models.attention import MultiHeadAttention
from reflib.models.base import Layer
from reflib.models.config import LAYER_TYPES, from_config, twin
from reflib.models.containers import Parallel, Sequential
from reflib.models.layers import ACTIVATIONS, Dense, Embedding, LayerNorm, RMSNorm, Softmax, SwiGLU
from reflib.models.recurrent import LSTM, RNN

__all__ = ["ACTIVATIONS", "Dense", "Embedding", "LAYER_TYPES", "LSTM", "Layer", "LayerNorm",
           "MultiHeadAttention", "Parallel", "RMSNorm", "RNN", "Sequential", "Softmax", "SwiGLU",
           "from_config", "twin"]
