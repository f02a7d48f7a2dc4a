"""fastlib's training machinery, one idea per module.

- ``loop``: ``train`` / ``train_sh`` and their results;
- ``algorithms``: the per-batch algorithm protocol, the registry and back-propagation;
- ``early_stopping``: ``train_sh``'s plateau policy as a pure object;
- ``clipping``: gradient clipping and the finiteness guard;
- ``checkpoint``: checkpoint files for exact resumption;
- ``program`` / ``schedules``: one compiled program per model, run under a schedule.

``fastlib`` exports ``train``, ``train_sh``, ``TrainingResult``, ``TrainingHistorySH`` and
``register_algorithm`` from here. (There is deliberately no ``fastlib/train.py``: a submodule of
that name would replace the function ``fastlib.train`` with a module whenever it was imported.)
"""
from fastlib.training.algorithms import (ALGORITHMS, ALIASES, Algorithm, BatchResult,
                                         EpochStats, StepContext, TrainConfig, algorithm_names,
                                         evaluate_model, get_algorithm, register_algorithm)
from fastlib.training import backprop  # noqa: F401 - registers "bp"
from fastlib.training.clipping import clip_gradients
from fastlib.training.early_stopping import PlateauPolicy
from fastlib.training.loop import TrainingHistorySH, TrainingResult, train, train_sh

__all__ = ["train", "train_sh", "TrainingResult", "TrainingHistorySH", "register_algorithm",
           "get_algorithm", "Algorithm", "ALGORITHMS", "BatchResult", "EpochStats", "StepContext",
           "TrainConfig", "evaluate_model", "clip_gradients", "PlateauPolicy", "ALIASES",
           "algorithm_names"]
