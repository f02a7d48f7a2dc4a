"""``from_config``: rebuild any fastlib model from its ``get_config()`` dict.

The dicts are reflib's (``reflib.models.config``): the keys are the constructors' keyword names.

The long story: docs/fastlib.md, section ``fastlib/layers/config.py``.
"""
from __future__ import annotations

import importlib
import inspect

import numpy as np

from fastlib.layers.attention import MultiHeadAttention
from fastlib.layers.base import check_dtype, close_matches, make_rng
from fastlib.layers.containers import Parallel, Sequential
from fastlib.layers.dense import Dense
from fastlib.layers.embedding import Embedding
from fastlib.layers.norm import LayerNorm, RMSNorm, Softmax
from fastlib.layers.recurrent import LSTM, RNN
from fastlib.layers.swiglu import SwiGLU

LAYER_TYPES = {cls.__name__: cls for cls in (Dense, RNN, LSTM, MultiHeadAttention, SwiGLU,
                                             LayerNorm, RMSNorm, Embedding, Softmax,
                                             Sequential, Parallel)}
# Layer types defined outside fastlib.layers register themselves in LAYER_TYPES when their
# module is imported; this names the module so that a saved model loads in a fresh process.
_TYPES_ELSEWHERE = {"RBM": "fastlib.rbm"}
IGNORED_KEYS = frozenset({"dtype"})
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
    if not isinstance(config, dict):
        raise TypeError(f"{where}: a layer config must be a dict with a 'type' key, got "
                        f"{type(config).__name__}")
    if "type" not in config:
        raise ValueError(f"{where}: config has no 'type' key; expected one of "
                         f"{sorted(LAYER_TYPES)}")
    name = config["type"]
    if name in _TYPES_ELSEWHERE and name not in LAYER_TYPES:
        importlib.import_module(_TYPES_ELSEWHERE[name])
    cls = LAYER_TYPES.get(name)
    if cls is None:
        lowered = {k.lower(): k for k in LAYER_TYPES}
        hint = (f"; did you mean {lowered[name.lower()]!r}?"
                if isinstance(name, str) and name.lower() in lowered
                else close_matches(name, LAYER_TYPES))
        raise ValueError(f"{where}: unknown layer type {name!r}{hint}; known types: "
                         f"{sorted(LAYER_TYPES)}")
    kwargs = {k: v for k, v in config.items() if k != "type" and k not in IGNORED_KEYS}
    signature = inspect.signature(cls.__init__)
    accepted = [p for p in signature.parameters if p not in _NOT_CONFIG]
    for key in kwargs:
        if key not in accepted:
            raise ValueError(f"{where}: {name} config has unknown key {key!r}"
                             f"{close_matches(key, accepted)}; accepted keys: {accepted}")
    required = [p for p in accepted if signature.parameters[p].default is inspect.Parameter.empty]
    missing = [p for p in required if p not in kwargs]
    if missing:
        raise ValueError(f"{where}: {name} config is missing {missing}")
    if cls in (Sequential, Parallel):
        layers = kwargs.pop("layers")
        if not isinstance(layers, (list, tuple)):
            raise TypeError(f"{where}: {name}'s 'layers' must be a list of configs")
        kwargs["layers"] = [_build(c, f"{where}.layers[{i}]", dtype)
                            for i, c in enumerate(layers)]
    return cls(**kwargs, dtype=dtype)
