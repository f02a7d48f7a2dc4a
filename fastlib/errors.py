"""The one error type for files fastlib refuses to read.

Every loader (``fastlib.load``, training checkpoints, the MNIST IDX reader, the report baseline)
turns whatever is wrong with a file into :class:`CorruptFileError`, a ``ValueError`` subclass
whose message names the file, the part of it at fault (an archive member, a metadata field, a
header) and the problem. Code that reads files it did not write can therefore catch one type, and
a user never sees a ``RecursionError``, a zip library's internals or a NumPy message without the
file's name.
"""
from __future__ import annotations

__all__ = ["CorruptFileError"]


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
