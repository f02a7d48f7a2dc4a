"""Architecture configs: ``get_config()`` dicts and ``from_config`` that rebuilds any model.

The long story: docs/reflib.md, section ``reflib/models/config.py``.
"""
from __future__ import annotations

from optable.layers import IGNORED_KEYS, parse_config  # noqa: F401 (IGNORED_KEYS: public)
from reflib.models.attention import MultiHeadAttention
from reflib.models.base import Layer
from reflib.models.containers import Parallel, Sequential
from reflib.models.layers import Dense, Embedding, LayerNorm, RMSNorm, Softmax, SwiGLU
from reflib.models.recurrent import LSTM, RNN

LAYER_TYPES = {cls.__name__: cls for cls in (Dense, RNN, LSTM, MultiHeadAttention, SwiGLU,
                                             LayerNorm, RMSNorm, Embedding, Softmax,
                                             Sequential, Parallel)}


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
    cls, kwargs = parse_config(config, where, LAYER_TYPES)
    if cls in (Sequential, Parallel):
        kwargs["layers"] = [_build(c, f"{where}.layers[{i}]")
                            for i, c in enumerate(kwargs["layers"])]
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
