"""The parameter shapes a saved architecture declares, computed without building anything.

``fastlib.load`` reads JSON it did not write. Building the model first would let a few bytes
of JSON (``Dense(25000, 25000)``) allocate gigabytes before the file is refused, so the loader
first asks this module for the parameters the architecture declares (dotted names in
``parameters()`` order, shapes in Python integers), and builds only when they match the stored
arrays and fit the size limit. The shapes are the layer kinds' one declaration
(``optable.parameters.LAYER_KINDS``), which the layers draw from too;
``tests/test_model_schema.py`` checks that it predicts every type's ``parameters()``.
"""
from __future__ import annotations

import numbers

from optable.parameters import LAYER_KINDS, parameter_shapes

__all__ = ["CONTAINERS", "MAX_DEPTH", "MAX_DIM", "SchemaError",
           "declared_parameters"]

# Containers nest to this depth at most in a file (a JSON document nested deeper is refused
# before it is parsed; Python's recursion would give out long before a real model needs it).
MAX_DEPTH = 100
# No single dimension of a layer may exceed this (a 2**31-wide layer is a corrupt file).
MAX_DIM = 2 ** 31 - 1


class SchemaError(Exception):
    """An architecture that does not describe a model: ``where`` in it, and ``problem``."""

    def __init__(self, where: str, problem: str):
        self.where, self.problem = where, problem
        super().__init__(f"{where}: {problem}")


CONTAINERS = ("Sequential", "Parallel")


def declared_parameters(config) -> dict:
    """The parameters ``config`` declares: ``{dotted name: shape tuple}`` in ``parameters()`` order.

    Checks the structure (dicts with a known ``"type"``, containers with a list of layers, nesting
    at most ``MAX_DEPTH``) and the sizing integers (ints, not bools, in 1..``MAX_DIM``). Other keys
    (activation names, eps, ...) are left to the layers' constructors.

    Parameters
    ----------
    config : object
        Parsed JSON, supposedly a ``get_config()`` dict.

    Returns
    -------
    dict of str to tuple of int

    Raises
    ------
    SchemaError
        Naming the place in the architecture (``architecture.layers[2].in_features``) and the
        problem.
    """
    out = {}
    # an explicit stack, not recursion: the depth is checked, never hit as a RecursionError
    stack = [(config, "architecture", "", 0)]
    while stack:
        node, where, prefix, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SchemaError(where, f"containers nested more than {MAX_DEPTH} deep")
        if not isinstance(node, dict):
            raise SchemaError(where, f"a layer config must be a JSON object with a 'type', got "
                                     f"{_kind(node)}")
        kind = node.get("type")
        if kind in CONTAINERS:
            layers = node.get("layers")
            if not isinstance(layers, list):
                raise SchemaError(f"{where}.layers", f"{kind} needs a list of layer configs, "
                                                     f"got {_kind(layers)}")
            # reversed onto the stack, so children come off it in order
            for i in range(len(layers) - 1, -1, -1):
                stack.append((layers[i], f"{where}.layers[{i}]", f"{prefix}{i}.", depth + 1))
            continue
        if not isinstance(kind, str) or kind not in LAYER_KINDS:
            known = sorted(LAYER_KINDS) + list(CONTAINERS)
            raise SchemaError(f"{where}.type", f"unknown layer type {_short(kind)}; known types: "
                                               f"{known}")
        for key in LAYER_KINDS[kind].sizes:
            value = node.get(key)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise SchemaError(f"{where}.{key}", f"{kind} needs an integer {key}, got "
                                                    f"{_kind(value)}")
            if not 1 <= value <= MAX_DIM:
                raise SchemaError(f"{where}.{key}", f"{key}={value} is outside 1..{MAX_DIM}")
        for name, shape in parameter_shapes(kind, node).items():
            out[prefix + name] = shape
    return out


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {_short(value)}"
    if isinstance(value, str):
        return f"the string {_short(value)}"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def _short(value, limit=60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
