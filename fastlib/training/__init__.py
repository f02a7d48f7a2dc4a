"""fastlib's training machinery, one idea per module.

- ``loop``: ``train`` / ``train_sh``, joining the run's parts (``arguments``, ``options``,
  ``run_data``, ``backends``, ``epochs``, ``divergence``, ``checkpointing``, ``plateau``,
  ``callbacks``, ``progress``, ``result``: docs/training.md, "Inside the loop");
- ``algorithms``: the per-batch algorithm protocol and the registry;
- ``early_stopping``: ``train_sh``'s plateau policy and the divergence rules, as pure objects;
- ``clipping`` / ``checkpoint``: gradient clipping; checkpoint files for exact resumption;
- ``program`` / ``schedules``: one compiled program per model, run under a schedule.

``fastlib`` exports ``train``, ``train_sh``, their results and options from here. (There is no
``fastlib/train.py``: it would replace the function ``fastlib.train`` once imported.)
"""
from fastlib.training.algorithms import (ALGORITHMS, ALIASES, Algorithm, BatchResult,
                                         EpochStats, StepContext, TrainConfig, algorithm_names,
                                         evaluate_model, get_algorithm, register_algorithm)
from fastlib.training import backprop  # noqa: F401 - registers "bp"
from fastlib.training.clipping import clip_gradients
from fastlib.training.early_stopping import DivergenceRules, PlateauPolicy
from fastlib.training.loop import TrainingHistorySH, TrainingResult, train, train_sh
from fastlib.training.options import TrainOptions

__all__ = ["train", "train_sh", "TrainingResult", "TrainingHistorySH", "register_algorithm",
           "get_algorithm", "Algorithm", "ALGORITHMS", "BatchResult", "EpochStats", "StepContext",
           "TrainConfig", "evaluate_model", "clip_gradients", "PlateauPolicy", "ALIASES",
           "algorithm_names", "TrainOptions", "DivergenceRules"]
