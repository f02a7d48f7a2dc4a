"""What fastlib's and reflib's layers share before any arithmetic: size checks and initial draws.

Both engines build the same architectures from the same configs, and one seed must give both
the same initial parameters; so the constructor checks (with their messages) and the
initialisation rules are written here once (each layer kind's parameters, and which rule
draws each, are declared in ``optable.parameters``). The layers' forward and backward stay each engine's
own. NumPy only, like the rest of optable.
"""
from __future__ import annotations

import difflib
import inspect
import numbers

import numpy as np

# NOTE: "relu-family" for He initialisation means exactly these two activations; every other
# weight matrix (tanh, sigmoid, gelu, silu layers, recurrent, attention, SwiGLU and embedding
# weights) is Xavier-uniform.
RELU_FAMILY = frozenset({"relu", "leaky_relu"})


def close_matches(name, options):
    """A ``"; did you mean ...?"`` suffix for an unknown ``name`` among ``options``."""
    found = difflib.get_close_matches(str(name), [str(o) for o in options], n=3, cutoff=0.5)
    return f"; did you mean {', '.join(repr(f) for f in found)}?" if found else ""


def he_normal(rng, shape):
    """He (Kaiming) normal: N(0, 2 / fan_in) with fan_in = shape[0] (``y = x @ W``)."""
    return rng.standard_normal(shape) * np.sqrt(2.0 / shape[0])


def xavier_uniform(rng, shape):
    """Xavier (Glorot) uniform: U(-a, a) with a = sqrt(6 / (shape[0] + shape[1]))."""
    limit = np.sqrt(6.0 / (shape[0] + shape[1]))
    return rng.uniform(-limit, limit, size=shape)


def check_positive_int(value, what, owner):
    """A size argument of a layer constructor as an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {what} must be a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"{owner}: {what} must be >= 1, got {value}")
    return int(value)


def set_sizes(layer, **sizes):
    """Check each size argument (``check_positive_int``) and store it on ``layer`` by name."""
    owner = type(layer).__name__
    for name, value in sizes.items():
        setattr(layer, name, check_positive_int(value, name, owner))


def check_heads(layer):
    """Raise unless ``layer.heads`` divides ``layer.d_model`` (heads are equal column slices)."""
    d_model, heads = layer.d_model, layer.heads
    if d_model % heads:
        divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
        raise ValueError(f"{type(layer).__name__}: heads ({heads}) must divide d_model "
                         f"({d_model}); pick one of {divisors}")


def check_bool(value, what, owner):
    """A flag argument of a layer constructor: True or False (NumPy's bool too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {what} must be True or False, got {value!r}")
    return bool(value)


def check_eps(value, owner):
    """A normalisation epsilon: a positive finite float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: eps must be a positive float, got {value!r}")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: eps must be positive and finite, got {value!r}")
    return float(value)


def layer_repr(layer):
    """``Dense(in_features=3, ...)`` from the layer's config; a container lists its children."""
    cfg = {k: v for k, v in layer.get_config().items() if k not in ("type", "layers")}
    args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
    if layer._children:
        inner = ", ".join(repr(c) for c in layer._children)
        return f"{type(layer).__name__}([{inner}]{', ' if args else ''}{args})"
    return f"{type(layer).__name__}({args})"


#: Config keys every engine accepts and ignores (a fastlib model's config names its dtype).
IGNORED_KEYS = frozenset({"dtype"})


def parse_config(config, where, layer_types, not_config=("self", "seed", "rng")):
    """Check one layer config of ``get_config()`` form; return ``(class, keyword arguments)``.

    Parameters
    ----------
    config : dict
        ``{"type": name, <constructor keyword>: value, ...}``; a container's ``"layers"`` must
        be a list of configs (built by the caller, which recurses).
    where : str
        Where the config sits (``"config.layers[1]"``), to start every message with.
    layer_types : Mapping[str, type]
        The engine's layer classes by name; a config's keys are the constructor's keywords
        except ``not_config``.

    Raises
    ------
    TypeError, ValueError
        Naming the key or the type at fault and what is accepted.
    """
    if not isinstance(config, dict):
        raise TypeError(f"{where}: a layer config must be a dict with a 'type' key, got "
                        f"{type(config).__name__}")
    if "type" not in config:
        raise ValueError(f"{where}: config has no 'type' key; expected one of "
                         f"{sorted(layer_types)}")
    name = config["type"]
    cls = layer_types.get(name)
    if cls is None:
        lowered = {k.lower(): k for k in layer_types}
        hint = (f"; did you mean {lowered[name.lower()]!r}?"
                if isinstance(name, str) and name.lower() in lowered
                else close_matches(name, layer_types))
        raise ValueError(f"{where}: unknown layer type {name!r}{hint}; known types: "
                         f"{sorted(layer_types)}")
    kwargs = {k: v for k, v in config.items() if k != "type" and k not in IGNORED_KEYS}
    signature = inspect.signature(cls.__init__)
    accepted = [p for p in signature.parameters if p not in not_config]
    for key in kwargs:
        if key not in accepted:
            raise ValueError(f"{where}: {name} config has unknown key {key!r}"
                             f"{close_matches(key, accepted)}; accepted keys: {accepted}")
    required = [p for p in accepted if signature.parameters[p].default is inspect.Parameter.empty]
    missing = [p for p in required if p not in kwargs]
    if missing:
        raise ValueError(f"{where}: {name} config is missing {missing}")
    if "layers" in kwargs and not isinstance(kwargs["layers"], (list, tuple)):
        raise TypeError(f"{where}: {name}'s 'layers' must be a list of configs")
    return cls, kwargs


class NormShell:
    """What both engines' LayerNorm and RMSNorm share: the width ``d``, ``eps`` and the config.

    A mixin placed before each engine's ``Layer``; the normalisation itself stays the engine's.
    """

    _in_attr = _out_attr = "d"        # fastlib's declared widths (reflib does not read them)
    _label_attrs = ("d",)

    def _setup(self, d, eps, seed, rng):
        set_sizes(self, d=d)
        self.eps = check_eps(eps, type(self).__name__)
        self.reset_parameters(seed, rng)

    def get_config(self):
        return {"type": type(self).__name__, "d": self.d, "eps": self.eps}


class RecurrentShell:
    """What both engines' RNN and LSTM share: sizes, the flag and the config (the parameters
    are the kinds' declaration in ``optable.parameters``)."""

    _in_attr, _out_attr = "input_size", "hidden_size"
    _label_attrs = ("input_size", "hidden_size")
    _input_rank = 3

    def _setup(self, input_size, hidden_size, return_sequences, seed, rng):
        set_sizes(self, input_size=input_size, hidden_size=hidden_size)
        self.return_sequences = check_bool(return_sequences, "return_sequences",
                                           type(self).__name__)
        self.reset_parameters(seed, rng)

    def get_config(self):
        return {"type": type(self).__name__, "input_size": self.input_size,
                "hidden_size": self.hidden_size, "return_sequences": self.return_sequences}


class AttentionShell:
    """What both engines' MultiHeadAttention share: sizes, heads, the flag and the config (the
    parameters are the kind's declaration in ``optable.parameters``)."""

    _in_attr = _out_attr = "d_model"
    _label_attrs = ("d_model", "heads")
    _input_rank, _feature_name = 3, "d_model"

    def _setup(self, d_model, heads, causal, seed, rng):
        set_sizes(self, d_model=d_model, heads=heads)
        check_heads(self)
        self.causal = check_bool(causal, "causal", type(self).__name__)
        self.reset_parameters(seed, rng)

    def get_config(self):
        return {"type": type(self).__name__, "d_model": self.d_model, "heads": self.heads,
                "causal": self.causal}
