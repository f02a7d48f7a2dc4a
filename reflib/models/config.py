"""Architecture configs: ``get_config()`` dicts and ``from_config`` that rebuilds any model.

The long story: docs/reflib.md, section ``reflib/models/config.py``.
"""
from __future__ import annotations

import inspect

from reflib.models.attention import MultiHeadAttention
from reflib.models.base import Layer, close_matches
from reflib.models.containers import Parallel, Sequential
from reflib.models.layers import Dense, Embedding, LayerNorm, RMSNorm, Softmax, SwiGLU
from reflib.models.recurrent import LSTM, RNN

LAYER_TYPES = {cls.__name__: cls for cls in (Dense, RNN, LSTM, MultiHeadAttention, SwiGLU,
                                             LayerNorm, RMSNorm, Embedding, Softmax,
                                             Sequential, Parallel)}
IGNORED_KEYS = frozenset({"dtype"})


def from_config(config, *, seed=None, rng=None):
    """Build a reference model from a config dict (nested to any depth).

    Parameters
    ----------
    config : dict
        As produced by ``get_config()`` of a reflib or fastlib layer.
    seed, rng :
        Initialisation source for the whole model (children drawn in order); neither means
        seed 0. Load trained values afterwards with ``model.load_parameters(params)``.

    Returns
    -------
    Layer
    """
    model = _build(config, "config")
    model.reset_parameters(seed=seed, rng=rng)
    return model


def _build(config, where):
    if not isinstance(config, dict):
        raise TypeError(f"{where}: a layer config must be a dict with a 'type' key, got "
                        f"{type(config).__name__}")
    if "type" not in config:
        raise ValueError(f"{where}: config has no 'type' key; expected one of "
                         f"{sorted(LAYER_TYPES)}")
    name = config["type"]
    cls = LAYER_TYPES.get(name)
    if cls is None:
        lowered = {k.lower(): k for k in LAYER_TYPES}
        hint = (f"; did you mean {lowered[name.lower()]!r}?" if isinstance(name, str) and
                name.lower() in lowered else close_matches(name, LAYER_TYPES))
        raise ValueError(f"{where}: unknown layer type {name!r}{hint}; known types: "
                         f"{sorted(LAYER_TYPES)}")
    kwargs = {k: v for k, v in config.items() if k != "type" and k not in IGNORED_KEYS}
    signature = inspect.signature(cls.__init__)
    accepted = [p for p in signature.parameters if p not in ("self", "seed", "rng")]
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
        kwargs["layers"] = [_build(c, f"{where}.layers[{i}]") for i, c in enumerate(layers)]
    return cls(**kwargs)


def twin(model, *, strict=True):
    """The reference twin of any model that has ``get_config()`` and ``parameters()``.

    A reflib model is returned as it is; any other (a fastlib model) is rebuilt from its config
    with ``from_config`` and loaded with its parameter values (copied to float64).

    Raises
    ------
    TypeError
        When ``model`` has neither a reflib type nor ``get_config``/``parameters``.
    """
    if isinstance(model, Layer):
        return model
    if not (callable(getattr(model, "get_config", None)) and
            callable(getattr(model, "parameters", None))):
        raise TypeError(f"expected a reflib model, or a model with get_config() and parameters() "
                        f"(e.g. a fastlib model); got {type(model).__name__}")
    ref = from_config(model.get_config())
    ref.load_parameters({k: v for k, v in model.parameters().items()}, strict=strict)
    return ref
