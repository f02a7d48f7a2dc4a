"""The environment variables verigrad reads: one table, rendered into docs/cli.md.

``tests/test_environment_variables.py`` scans the packages for ``VERIGRAD_*`` and ``FASTLIB_*``
names and fails when one is read but missing here, or listed here but read nowhere.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Variable", "VARIABLES", "render"]


class Variable(NamedTuple):
    """One environment variable: its name, what it holds, the default, where it is explained."""

    name: str
    value: str
    default: str
    effect: str
    doc: str


VARIABLES = (
    Variable("VERIGRAD_BLAS", "numba", "NumPy's own OpenBLAS where it exports CBLAS "
             "(`fastlib.blas_choice`), else Numba's np.dot",
             "`numba`: fastlib's kernels multiply matrices through Numba's np.dot (SciPy's "
             "OpenBLAS) instead", "performance.md"),
    Variable("VERIGRAD_MNIST_DIR", "DIR", "the user cache (`~/.cache/verigrad/mnist` on Linux), "
             "then `../shared/data/mnist`, whichever holds the files",
             "the folder with the four MNIST idx files (train, bench, the MNIST tests)",
             "training.md"),
    Variable("VERIGRAD_MNIST_URL", "URL", "torchvision's mirror (`fastlib.datasets.MNIST_URL`)",
             "where `load_mnist(download=True)` and `verigrad train --download` fetch the four "
             "MNIST files from, each checked by its published SHA-256", "training.md"),
    Variable("VERIGRAD_PIECES", "N", "from the usable cores and the model's size",
             "how many pieces a compiled training step is cut into; fixes every bit of the "
             "result on any machine (`train(pieces=)` and `--pieces` win)", "architecture.md"),
    Variable("VERIGRAD_THREADS", "N", "Numba's default (all cores)",
             "threads for fastlib's parallel kernels", "distributed.md"),
    Variable("VERIGRAD_ADAPTIVE_THREADS", "0 or 1", "1",
             "1: parallel kernels use only the cores idle right now; 0: always the thread "
             "count", "performance.md"),
    Variable("VERIGRAD_PARALLEL_MIN_SIZE", "N", "32768",
             "elements below which an elementwise kernel runs on one thread", "performance.md"),
    Variable("VERIGRAD_FIRST_RUN_PROBE", "PATH", "none (no recording)",
             "set by `python tools/first_run.py` for the runs it measures: each process writes "
             "its Numba compile time by kernel module to PATH.PID.json", "performance.md"),
    Variable("VERIGRAD_CONFORM_CACHE", "DIR or off", "`$XDG_CACHE_HOME/verigrad/exact` "
             "(`~/.cache/verigrad/exact`)",
             "the exact oracle's values, kept between runs and shared by processes, in a "
             "folder per version of the referee's code (an edit to spec, reflib or the checks "
             "starts a fresh one); off: this process only", "reports-accuracy.md"),
    Variable("VERIGRAD_JAX_CACHE", "DIR or off", "`$XDG_CACHE_HOME/verigrad/jax` "
             "(`~/.cache/verigrad/jax`)",
             "JAX's compiled executables, kept between runs of the jax engine (up to "
             "512 MiB; a program that set its own JAX cache keeps it)", "accuracy-report.md"),
    Variable("FASTLIB_MAX_LOAD_BYTES", "N", "2147483648 (2 GiB)",
             "the most bytes of arrays one model or checkpoint file may declare "
             "(`load(max_bytes=)` wins)", "training.md"),
    Variable("FASTLIB_CUDA_GRAPHS", "0 or 1", "1",
             "0: the GPU step runs as plain launches instead of a replayed CUDA graph",
             "gpu.md"),
    Variable("FASTLIB_CUDA_PERSISTENT", "0 or 1", "1",
             "0: a recurrent layer on the GPU launches its cell per time step instead of one "
             "persistent kernel for the whole sequence", "gpu.md"),
)


def render() -> str:
    """The table as Markdown (a section of docs/cli.md)."""
    out = ["## Environment variables\n",
           "Read when the package is imported (the fastlib settings) or when the command "
           "starts.\n",
           "| variable | value | default | what it does | more |",
           "|---|---|---|---|---|"]
    for v in VARIABLES:
        out.append(f"| `{v.name}` | {v.value} | {v.default} | {v.effect} | "
                   f"[{v.doc}]({v.doc}) |")
    return "\n".join(out) + "\n"
