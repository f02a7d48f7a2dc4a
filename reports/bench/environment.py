"""What a benchmark ran on: the BLAS libraries in use, the cores, and variables that slow them.

Every ``verigrad bench`` header prints :func:`header_lines`. Two machines' figures compare only
when the same BLAS kernel did the arithmetic: an environment variable such as
``OPENBLAS_CORETYPE=Haswell`` makes OpenBLAS run an older CPU's kernel, which can double a
GEMM-bound epoch while peers that bring their own GEMMs (PyTorch's MKL/oneDNN, XLA's Eigen) do
not move. The header names the library, version, threading layer and kernel
(threadpoolctl's ``threadpool_info()``) and warns about each such variable.
"""
from __future__ import annotations

import os

#: Environment variables that force a BLAS or vector kernel other than the one the library
#: would pick for this CPU: name -> what it does. A warning names the variable and says to
#: unset it. (Thread-count variables are not here: the benchmark pins threads itself.)
KERNEL_VARIABLES = {
    "OPENBLAS_CORETYPE": "forces OpenBLAS's kernel for that CPU type instead of this CPU's",
    "OPENBLAS_L2_SIZE": "overrides the L2 size OpenBLAS blocks its GEMM for",
    "MKL_ENABLE_INSTRUCTIONS": "caps the instruction set MKL may use",
    "MKL_DEBUG_CPU_TYPE": "forces MKL's code path for that CPU type",
    "MKL_CBWR": "pins MKL to a reproducible (often slower) code path",
    "ATEN_CPU_CAPABILITY": "caps PyTorch's vectorised CPU kernels to that instruction set",
    "NPY_DISABLE_CPU_FEATURES": "turns off NumPy's SIMD paths for those features",
    "NUMBA_CPU_NAME": "compiles Numba kernels for that CPU instead of this one",
    "NUMBA_CPU_FEATURES": "compiles Numba kernels for those CPU features only",
}


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), or ``os.cpu_count()`` where unknown."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def blas_libraries():
    """The BLAS libraries loaded in this process, as threadpoolctl describes them.

    NumPy's BLAS and SciPy's (the one Numba's ``np.dot`` calls) are loaded first, so both are
    listed when they are different libraries.

    Returns
    -------
    list of dict
        One per library: ``internal_api`` (openblas, mkl, blis), ``version``,
        ``threading_layer``, ``architecture`` (the kernel in use, e.g. SkylakeX, Haswell),
        ``num_threads``, ``prefix`` and ``filepath``. Empty when threadpoolctl is missing.
    """
    import numpy  # noqa: F401  (loads NumPy's BLAS)
    try:
        import scipy.linalg  # noqa: F401  (loads SciPy's BLAS, the one Numba's np.dot calls)
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keys = ("internal_api", "version", "threading_layer", "architecture", "num_threads",
            "prefix", "filepath")
    libs = [{k: info.get(k) for k in keys} for info in threadpool_info()
            if info.get("user_api") == "blas"]
    for lib in libs:
        lib["loaded_by"] = _loaded_by(lib.get("filepath") or "")
    return libs


def _loaded_by(path):
    """Which package shipped a library, from its folder (``numpy.libs``, ``scipy.libs``)."""
    parts = path.replace("\\", "/").split("/")
    for part in reversed(parts[:-1]):
        if part.endswith(".libs") or part in ("numpy", "scipy", "torch", "lib"):
            name = part[:-len(".libs")] if part.endswith(".libs") else part
            return {"scipy": "SciPy", "numpy": "NumPy"}.get(name, name)
    return "unknown"


def kernel_warnings(environ=None):
    """One line per environment variable that forces an older or slower kernel.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read (default ``os.environ``).

    Returns
    -------
    list of str
        ``"WARNING: OPENBLAS_CORETYPE=Haswell forces ...; unset OPENBLAS_CORETYPE ..."``.
    """
    environ = os.environ if environ is None else environ
    out = []
    for name, effect in KERNEL_VARIABLES.items():
        value = environ.get(name)
        if value is None or value == "":
            continue
        out.append(f"WARNING: {name}={value} {effect}; these figures may not be this "
                   f"machine's: unset {name} to measure the kernel the library picks itself "
                   f"(`env -u {name} verigrad bench ...`)")
    return out


def describe(library, threads=True):
    """One line for one BLAS library: api, version, threading layer, kernel (and threads)."""
    text = (f"{library.get('loaded_by', '?')}: "
            f"{library.get('internal_api')} {library.get('version')} "
            f"({library.get('prefix')}), {library.get('threading_layer')}, "
            f"kernel {library.get('architecture')}")
    return text + (f", {library.get('num_threads')} threads" if threads else "")


def environment(environ=None):
    """The facts the header prints, as a dict for the JSON reports."""
    from fastlib import blas_choice

    return {"blas": blas_libraries(), "kernels_blas": blas_choice.describe(),
            "usable_cores": usable_cores(), "warnings": kernel_warnings(environ)}


def header_lines(env=None, threads=True):
    """The header lines every benchmark prints: BLAS in use (one library a line), the cores,
    then any warnings (wrapped at 100 columns).

    Parameters
    ----------
    env : dict, optional
        :func:`environment`'s result (computed when omitted).
    threads : bool
        Print each library's thread count (False where the count varies by run).
    """
    from reports.commands.tables import wrap

    env = environment() if env is None else env
    # one library per line, in a fixed order (threadpoolctl lists them as they were loaded)
    libs = sorted(describe(lib, threads) for lib in env["blas"])
    if libs:
        lines = ["BLAS: " + ";\n  ".join(libs)]
    else:
        lines = ["BLAS: unknown (threadpoolctl is not installed: pip install threadpoolctl)"]
    if env.get("kernels_blas"):
        lines.append(f"fastlib's kernels multiply through: {env['kernels_blas']}")
    lines.append(f"cores this process may use: {env['usable_cores']}")
    return lines + [wrap(w, indent="  ") for w in env["warnings"]]
