"""The public errors and warnings of fastlib (each also importable as ``fastlib.<name>``).

Every loader (``fastlib.load``, training checkpoints, the MNIST IDX reader, the report baseline)
turns whatever is wrong with a file into :class:`CorruptFileError`, a ``ValueError`` subclass
whose message names the file, the part of it at fault (an archive member, a metadata field, a
header) and the problem. Code that reads files it did not write can therefore catch one type, and
a user never sees a ``RecursionError``, a zip library's internals or a NumPy message without the
file's name. A training run stopped because it diverged warns with
:class:`DivergenceWarning`, which a caller can filter or turn into an error by its type.
"""
from __future__ import annotations

__all__ = ["CorruptFileError", "CheckpointLockedError", "DivergenceWarning"]


class CorruptFileError(ValueError):
    """A file that cannot be read as what it claims to be.

    Parameters
    ----------
    path : str or path-like
        The file.
    member : str
        The part of the file at fault: an archive member (``"__meta__"``,
        ``"param/0.weight"``), a metadata field (``"__meta__: architecture.layers[1]"``), a
        header, or ``"archive"`` for the container as a whole.
    problem : str
        What is wrong, and where useful what to do about it.

    Attributes
    ----------
    path, member, problem : str
        As given; ``str(error)`` is ``"{path}: {member}: {problem}"``.
    """

    def __init__(self, path, member: str, problem: str):
        self.path = str(path)
        self.member = member
        self.problem = problem
        super().__init__(f"{self.path}: {member}: {problem}")

    def __reduce__(self):  # picklable across processes despite the three-argument constructor
        return (type(self), (self.path, self.member, self.problem))


class CheckpointLockedError(RuntimeError):
    """Another live run is writing the same training checkpoint; the message names it.

    Attributes
    ----------
    path : str
        The checkpoint.
    holder : dict
        What the holder wrote into the lock file (``pid``, ``host``, ``started``), as far as it
        could be read.
    """

    def __init__(self, path, holder: dict, lock_path):
        self.path, self.holder, self.lock_path = str(path), dict(holder), str(lock_path)
        who = (f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
               f"{', started ' + str(holder['started']) if holder.get('started') else ''}")
        super().__init__(f"checkpoint {self.path} is being written by another run ({who}; lock "
                         f"file {self.lock_path}); two runs writing one checkpoint would "
                         "overwrite each other: give this run another checkpoint path, or "
                         "wait for that run to end")

    def __reduce__(self):
        return (type(self), (self.path, self.holder, self.lock_path))


class DivergenceWarning(RuntimeWarning):
    """Training stopped because it diverged, and the last good epoch's weights were put back.

    The message is ``TrainingResult.stop_reason``: the rule that fired (or the non-finite loss
    and its batch), the epoch whose weights were restored, and what to try. A subclass of
    ``RuntimeWarning``, so filters on that keep working; ``warnings.simplefilter("error",
    fastlib.DivergenceWarning)`` turns a divergence into an exception.
    """
