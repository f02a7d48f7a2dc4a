"""The models ``verigrad bench train --model NAME`` times: one module per model.

Each module ``reports.bench.models.<name>`` gives

- ``DESCRIPTION``: one line naming the model, loss, optimizer and dtype;
- ``BATCH_SIZES`` and ``SAMPLES``: the defaults of ``--batch-sizes`` and ``--samples``;
- ``build(seed)`` and ``LOSS``: the fastlib model (every engine starts from its initial
  parameters; the sequence models' also takes ``dtype``) and its loss;
- ``data(args) -> (x, y, source)``: the training data in fastlib's format;
- ``ENGINES``: engine name -> ``bench(x, y, bs, max_steps, seed=0) -> common.Run``;
- ``missing(engine)``: None, or the line saying why that engine cannot run here.
:data:`MODELS` is the one list of names the command line accepts.
"""
from __future__ import annotations

import importlib

MODELS = ("mlp", "lstm", "attention", "transformer")
#: Accepted only with ``--device cuda`` on numba's CUDA simulator (see ``tiny.py``).
SIMULATOR_MODELS = ("tiny",)


def load(name):
    """The module of model ``name`` (one of :data:`MODELS` or :data:`SIMULATOR_MODELS`)."""
    if name not in MODELS + SIMULATOR_MODELS:
        raise KeyError(name)
    return importlib.import_module(f"reports.bench.models.{name}")
