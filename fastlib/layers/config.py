"""``from_config``: rebuild any fastlib model from its ``get_config()`` dict.

The dicts are reflib's (``reflib.models.config``): the keys are the constructors' keyword names.

The long story: docs/fastlib-training.md, section ``fastlib/layers/config.py``.
"""
from __future__ import annotations

import importlib

import numpy as np

from fastlib.layers.attention import MultiHeadAttention
from fastlib.layers.base import check_dtype, make_rng
from fastlib.layers.containers import Parallel, Sequential
from fastlib.layers.dense import Dense
from fastlib.layers.embedding import Embedding
from fastlib.layers.norm import LayerNorm, RMSNorm, Softmax
from fastlib.layers.recurrent import LSTM, RNN
from fastlib.layers.swiglu import SwiGLU
from optable.layers import IGNORED_KEYS, parse_config  # noqa: F401 (IGNORED_KEYS: public)

LAYER_TYPES = {cls.__name__: cls for cls in (Dense, RNN, LSTM, MultiHeadAttention, SwiGLU,
                                             LayerNorm, RMSNorm, Embedding, Softmax,
                                             Sequential, Parallel)}
# Layer types defined outside fastlib.layers register themselves in LAYER_TYPES when their
# module is imported; this names the module so that a saved model loads in a fresh process.
_TYPES_ELSEWHERE = {"RBM": "fastlib.rbm"}
_NOT_CONFIG = ("self", "dtype", "seed", "rng")


def from_config(config, dtype=np.float32, seed=0, rng=None):
    """Build a model from a config dict (nested to any depth).

    Parameters
    ----------
    config : dict
        As produced by ``get_config()`` of a fastlib or reflib layer.
    dtype : float32 (default) or float64
    seed : int or numpy.random.Generator, default 0
        Every parameter is drawn from one generator, children in order, so
        ``from_config(cfg, seed=s)`` equals ``reflib.models.from_config(cfg, seed=s)`` (rounded
        to ``dtype``). Load trained values afterwards with ``model.load_parameters(params)``.
    rng : numpy.random.Generator, optional
        Instead of ``seed``.

    Returns
    -------
    Layer
    """
    dtype = check_dtype(dtype, "from_config")
    gen = make_rng(None if rng is not None and seed == 0 else seed, rng)
    model = _build(config, "config", dtype)
    model.reset_parameters(rng=gen)
    return model


def _build(config, where, dtype):
    name = config.get("type") if isinstance(config, dict) else None
    if name in _TYPES_ELSEWHERE and name not in LAYER_TYPES:
        importlib.import_module(_TYPES_ELSEWHERE[name])
    cls, kwargs = parse_config(config, where, LAYER_TYPES, _NOT_CONFIG)
    if cls in (Sequential, Parallel):
        kwargs["layers"] = [_build(c, f"{where}.layers[{i}]", dtype)
                            for i, c in enumerate(kwargs["layers"])]
    return cls(**kwargs, dtype=dtype)
