"""Training checkpoints: everything a run needs to continue exactly where it stopped.

One ``.npz`` archive (``fastlib.io``'s container, format ``verigrad-checkpoint``) holding the
model (architecture and weights, so ``fastlib.load`` reads it too), the optimizer's config,
step count and state arrays, the shuffling Generator's state, the number of epochs done, the
histories, the algorithm's own state, and (for ``train_sh``) the plateau policy and the best
weights. Resuming restores all of it, so a run stopped after epoch k and resumed ends with the
same weights, bit for bit, as one that never stopped.

The long story: docs/fastlib.md, section ``fastlib/training/checkpoint.py``.
"""
from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import dataclass, field

import numpy as np

from fastlib import io
from fastlib.errors import CheckpointLockedError, CorruptFileError
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


def load_checkpoint(path, *, max_bytes=None) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`, validating all of it first.

    The container and the model part are checked as ``fastlib.load`` checks them; then every
    checkpoint field (types, the optimizer's config and state arrays against the parameters'
    shapes, the RNG state, the histories, the plateau policy) before any array data is read.

    Raises
    ------
    FileNotFoundError
        No such file.
    fastlib.errors.CorruptFileError
        Anything else wrong with the file (a plain model file says it is not a checkpoint); the
        message names the file, the entry and the problem.
    """
    meta, arrays = io.read_archive(
        path, formats=(io.CHECKPOINT_FORMAT,), max_bytes=max_bytes,
        check=lambda m, h: _check_entries(m, h, path, max_bytes))
    names = meta["parameters"]
    io.check_finite(path, {k: v for k, v in arrays.items()
                           if k.startswith((io.PARAM, _OPT, _BEST))})
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


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number_or_none(v):
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


# field -> (test, what it must be); checked in this order
_FIELDS = {
    "epoch": (_is_int, "a whole number >= 0"),
    "opt_t": (_is_int, "a whole number >= 0"),
    "step": (_is_int, "a whole number >= 0"),
    "lr": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
           and math.isfinite(v) and v > 0, "a finite number > 0"),
    "optimizer": (lambda v: isinstance(v, dict), "an object (the optimizer's config)"),
    "opt_slots": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
                  and len(set(v)) == len(v), "a list of distinct slot names"),
    "rng_state": (lambda v: isinstance(v, dict), "an object (the Generator's state)"),
    "history": (lambda v: isinstance(v, dict), "an object"),
    "config": (lambda v: isinstance(v, dict), "an object"),
    "algo_json": (lambda v: isinstance(v, dict), "an object"),
    "policy": (lambda v: v is None or isinstance(v, dict), "null or an object"),
    "has_best": (lambda v: isinstance(v, bool), "true or false"),
}
_HISTORY_LISTS = ("loss", "acc", "val_loss", "val_acc", "epoch_times", "lr")


def _check_entries(meta, headers, path, max_bytes):
    """Refuse a checkpoint whose metadata or arrays do not fit together (before reading data)."""
    from fastlib import optim
    from fastlib.training.early_stopping import PlateauPolicy

    declared = io.check_model_entries(meta, headers, path, max_bytes)

    def bad(field, problem):
        return CorruptFileError(path, f"__meta__.{field}", problem)

    for key, (test, what) in _FIELDS.items():
        if key not in meta:
            raise bad(key, "missing; the file is incomplete or from another program")
        if not test(meta[key]):
            raise bad(key, f"must be {what}, got {json.dumps(meta[key])[:80]}")
    h = meta["history"]
    for key in _HISTORY_LISTS:
        if not isinstance(h.get(key), list) or not all(map(_is_number_or_none, h[key])):
            raise bad(f"history.{key}", "must be a list of numbers")
    if not _is_int(h.get("skipped")) or not isinstance(h.get("fused"), bool):
        raise bad("history", "needs 'skipped' (a whole number) and 'fused' (true or false)")
    # a run records one entry per epoch done; validation may have joined on a resume, so its
    # lists may be shorter (never longer), and a resume continues from these lengths
    done = meta["epoch"]
    for key in ("loss", "acc", "epoch_times", "lr"):
        if len(h[key]) != done:
            raise bad(f"history.{key}", f"holds {len(h[key])} entries for the {done} epoch(s) "
                      "the file says are done")
    if len(h["val_loss"]) != len(h["val_acc"]) or len(h["val_loss"]) > done:
        raise bad("history.val_loss", f"holds {len(h['val_loss'])} entries and val_acc "
                  f"{len(h['val_acc'])}, for {done} epoch(s) done")
    expected = {}
    for slot in meta["opt_slots"]:
        expected.update({f"{_OPT}{slot}/{n}": shape for n, shape in declared.items()})
    if meta["has_best"]:
        expected.update({_BEST + n: shape for n, shape in declared.items()})
    for member, shape in expected.items():
        if member not in headers:
            raise CorruptFileError(path, member, "missing; the file is incomplete")
        got = headers[member]
        if tuple(got.shape) != shape or got.dtype != np.dtype(meta["dtype"]):
            raise CorruptFileError(path, member, f"stored as {got.dtype.str} {tuple(got.shape)}, "
                                   f"expected {meta['dtype']} {shape} like its parameter")
    # the configs are rebuilt now, so a bad one is refused here and not halfway into a resume
    for field, rebuild in (("optimizer", optim.from_config),
                           ("rng_state", restore_generator),
                           ("policy", lambda p: p is None or PlateauPolicy.from_state_dict(p))):
        try:
            rebuild(meta[field])
        except Exception as exc:  # noqa: BLE001 - any refusal of a value read from the file
            raise bad(field, f"cannot be restored ({type(exc).__name__}: {str(exc)[:200]})") \
                from None
    optimizer = optim.from_config(meta["optimizer"])
    if sorted(meta["opt_slots"]) != sorted(optimizer.state_names):
        raise bad("opt_slots", f"lists {meta['opt_slots']}, but {optimizer.name} keeps "
                               f"{list(optimizer.state_names)}")


def restore_generator(state: dict) -> np.random.Generator:
    """A Generator whose bit generator continues from a saved ``bit_generator.state``."""
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint RNG state must be a dict, got {type(state).__name__}")
    name = state.get("bit_generator")
    bit_gen_cls = getattr(np.random, str(name), None)
    if bit_gen_cls is None or not isinstance(bit_gen_cls, type):
        raise ValueError(f"checkpoint RNG state names an unknown bit generator {name!r}")
    bit_gen = bit_gen_cls()
    bit_gen.state = state
    return np.random.Generator(bit_gen)


# ---------------------------------------------------------------------------------------------
# one writer per checkpoint

def check_checkpoint_path(path) -> None:
    """Refuse a ``checkpoint=`` path that cannot be written, before the run trains an epoch.

    Without this, a folder or a missing folder is only found when the lock or the first write
    fails: an epoch's work lost, and an error naming ``<path>.lock`` or a hidden temporary.

    Raises
    ------
    TypeError
        Not a path.
    IsADirectoryError, FileNotFoundError, PermissionError
        ``path`` is a folder; its folder does not exist; its folder takes no new files.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint must be a file path (str or os.PathLike), got "
                        f"{type(path).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint={path!r} is a folder; pass a file name, e.g. "
                                f"{os.path.join(path, 'checkpoint.npz')!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"checkpoint={path!r}: folder {folder!r} does not exist; "
                                "create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"checkpoint={path!r}: cannot write in folder {folder!r} "
                              "(permission denied); pass a writable path")


class CheckpointLock:
    """Exclusive right to write one checkpoint path, held for a whole training run.

    A lock file ``<checkpoint>.lock`` beside the checkpoint is locked with ``flock`` (the
    kernel releases it when the holder dies, even by SIGKILL, so a killed run never blocks the
    next one) and holds the holder's pid, host and start time, which a second writer's
    :class:`~fastlib.errors.CheckpointLockedError` names. Taking the lock also removes the
    temporary files that killed writers of this checkpoint left behind (no one else can be
    writing them). Releasing removes the lock file.

    Where ``fcntl`` is missing (Windows) no lock is taken.
    """

    def __init__(self, checkpoint_path):
        self.path = os.fspath(checkpoint_path)
        self.lock_path = self.path + ".lock"
        self.fd = None
        self.removed_temporaries = []

    def acquire(self) -> "CheckpointLock":
        """Take the lock, or raise :class:`CheckpointLockedError` naming the holder."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on this platform
            return self
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_holder(fd)
                os.close(fd)
                raise CheckpointLockedError(self.path, holder, self.lock_path) from None
            # NOTE: the file may have been unlinked by its previous holder between our open and
            # our flock; then this lock guards nothing and we start again on the new file.
            try:
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())
        self.fd = fd
        for tmp in io.stale_temporaries(self.path):
            try:
                os.unlink(tmp)
                self.removed_temporaries.append(str(tmp))
            except OSError:
                pass
        return self

    def release(self) -> None:
        """Remove the lock file and let go of the lock (idempotent)."""
        if self.fd is None:
            return
        try:
            os.unlink(self.lock_path)  # while still holding it, so no one locks a stale file
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _read_holder(fd) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 4096).decode() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
