"""fastlib layers: parameters of one float dtype, forward with history capture, backward.

Names and parameter layouts are the contract of docs/CONTRACTS.md (``y = x @ W +
b``, row-major, batch first); configs and initial draws equal reflib.models'.
"""
from fastlib.layers.activations import ACTIVATIONS
from fastlib.layers.attention import MultiHeadAttention
from fastlib.layers.base import Layer
from fastlib.layers.config import LAYER_TYPES, from_config
from fastlib.layers.containers import Parallel, Sequential
from fastlib.layers.dense import Dense
from fastlib.layers.embedding import Embedding
from fastlib.layers.norm import LayerNorm, RMSNorm, Softmax
from fastlib.layers.recurrent import LSTM, RNN
from fastlib.layers.swiglu import SwiGLU

__all__ = ["ACTIVATIONS", "Dense", "Embedding", "LAYER_TYPES", "LSTM", "Layer", "LayerNorm",
           "MultiHeadAttention", "Parallel", "RMSNorm", "RNN", "Sequential", "Softmax", "SwiGLU",
           "from_config"]
