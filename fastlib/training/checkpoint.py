"""Training checkpoints: everything a run needs to continue exactly where it stopped.

One ``.npz`` archive (``fastlib.io``'s container, format ``verigrad-checkpoint``) holding the
model (architecture and weights, so ``fastlib.load`` reads it too), the optimizer's config,
step count and state arrays, the shuffling Generator's state, the number of epochs done, the
histories, the algorithm's own state, and (for ``train_sh``) the plateau policy and the best
weights. Resuming restores all of it, so a run stopped after epoch k and resumed ends with the
same weights, bit for bit, as one that never stopped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fastlib import io
from fastlib.optim import OptState

_OPT = "opt/"
_ALGO = "algo/"
_BEST = "best/"


@dataclass
class Checkpoint:
    """The content of a checkpoint file (see the module docstring)."""

    epoch: int
    params: dict
    optimizer: dict            # Optimizer.get_config()
    opt_state: OptState
    rng_state: dict            # numpy Generator.bit_generator.state
    history: dict              # name -> list, as TrainingResult's histories
    lr: float
    step: int = 0
    config: dict = field(default_factory=dict)     # the run's settings, to warn on changes
    algo_state: dict = field(default_factory=dict)  # ndarrays and JSON scalars
    policy: dict | None = None
    best_params: dict | None = None
    architecture: dict | None = None
    dtype: str | None = None


def save_checkpoint(path, model, ckpt: Checkpoint):
    """Write ``ckpt`` (with ``model``'s architecture and current weights) atomically."""
    meta, arrays = io.model_entries(model)
    for slot, per_param in ckpt.opt_state.slots.items():
        for name, arr in per_param.items():
            arrays[f"{_OPT}{slot}/{name}"] = arr
    algo_json = {}
    for key, value in ckpt.algo_state.items():
        if isinstance(value, np.ndarray):
            arrays[_ALGO + key] = value
        else:
            algo_json[key] = value
    if ckpt.best_params is not None:
        for name, arr in ckpt.best_params.items():
            arrays[_BEST + name] = arr
    meta.update({
        "format": io.CHECKPOINT_FORMAT, "version": io.VERSION, "epoch": ckpt.epoch,
        "optimizer": ckpt.optimizer, "opt_t": ckpt.opt_state.t,
        "opt_slots": list(ckpt.opt_state.slots), "rng_state": ckpt.rng_state,
        "history": ckpt.history, "lr": ckpt.lr, "step": ckpt.step, "config": ckpt.config,
        "algo_json": algo_json, "policy": ckpt.policy,
        "has_best": ckpt.best_params is not None,
    })
    return io.write_archive(path, meta, arrays)


def load_checkpoint(path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises
    ------
    FileNotFoundError, ValueError
        Missing file, another format (a plain model file says so), or a newer version.
    """
    meta, arrays = io.read_archive(path, formats=(io.CHECKPOINT_FORMAT,))
    try:
        names = meta["parameters"]
        slots = {s: {n: arrays[f"{_OPT}{s}/{n}"] for n in names} for s in meta["opt_slots"]}
        params = {n: arrays["param/" + n] for n in names}
        best = ({n: arrays[_BEST + n] for n in names} if meta["has_best"] else None)
        algo_state = dict(meta["algo_json"])
        algo_state.update({k[len(_ALGO):]: v for k, v in arrays.items() if k.startswith(_ALGO)})
        return Checkpoint(
            epoch=int(meta["epoch"]), params=params, optimizer=meta["optimizer"],
            opt_state=OptState(int(meta["opt_t"]), slots), rng_state=meta["rng_state"],
            history=meta["history"], lr=float(meta["lr"]), step=int(meta["step"]),
            config=meta["config"], algo_state=algo_state, policy=meta["policy"],
            best_params=best, architecture=meta["architecture"], dtype=meta["dtype"])
    except KeyError as exc:
        raise ValueError(f"{path}: checkpoint entry {exc.args[0]!r} is missing; the file is "
                         "incomplete or from another program") from None


def restore_generator(state: dict) -> np.random.Generator:
    """A Generator whose bit generator continues from a saved ``bit_generator.state``."""
    name = state.get("bit_generator")
    bit_gen_cls = getattr(np.random, str(name), None)
    if bit_gen_cls is None or not isinstance(bit_gen_cls, type):
        raise ValueError(f"checkpoint RNG state names an unknown bit generator {name!r}")
    bit_gen = bit_gen_cls()
    bit_gen.state = state
    return np.random.Generator(bit_gen)
