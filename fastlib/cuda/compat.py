"""The installed CUDA stack's known gaps, bridged narrowly, and a probe that it can compile.

numba-cuda 0.30 registers its NumPy overloads when it first compiles a kernel, and one of them
is written ``overload(np.row_stack)``: on NumPy 2.5, which removed that alias of ``vstack``,
``import numba.cuda`` succeeds and the first compile raises ``AttributeError``. The machines
one rents today ship exactly that pair, often with no package index to install another NumPy.
:func:`bridge_row_stack` imports that one numba-cuda module with ``numpy.row_stack`` present
(as ``numpy.vstack``, what it was) and removes the alias again, so NumPy stays as shipped.
:func:`compile_problem` compiles a tiny kernel once per process and says, in one line, why
kernels cannot be built here (docs/gpu.md, "Install and check").
"""
from __future__ import annotations

import numpy as np

#: The numba-cuda module whose import needs ``numpy.row_stack`` on NumPy 2.5.
ROW_STACK_MODULE = "numba.cuda.np.arrayobj"

#: What :func:`bridge_row_stack` did in this process (None until it ran; then a line or "").
BRIDGED = [None]


def bridge_row_stack() -> str:
    """Import numba-cuda's array overloads with ``numpy.row_stack`` defined for that import.

    Returns
    -------
    str
        "" when NumPy has ``row_stack`` (nothing to do), else the line saying what was done.
        Called before fastlib.cuda's first compile; a second call does nothing.
    """
    if BRIDGED[0] is not None:
        return BRIDGED[0]
    import importlib
    import importlib.util

    try:
        present = importlib.util.find_spec(ROW_STACK_MODULE) is not None
    except ImportError:  # numba's own older numba.cuda has no such package
        present = False
    if hasattr(np, "row_stack") or not present:
        BRIDGED[0] = ""
        return ""
    np.row_stack = np.vstack
    try:
        importlib.import_module(ROW_STACK_MODULE)
    finally:
        del np.row_stack  # NumPy as shipped for everyone else
    BRIDGED[0] = (f"NumPy {np.__version__} has no numpy.row_stack, which numba-cuda's "
                  f"{ROW_STACK_MODULE} registers an overload for: that module was imported "
                  f"with numpy.row_stack = numpy.vstack for its import only")
    return BRIDGED[0]


_PROBE = {}


def _probe_body(out):
    i = out.shape[0] - 1
    out[i] = out[i] * 2.0


def compile_problem(cuda) -> str | None:
    """Why numba-cuda cannot compile kernels here (one line), or None; once per process.

    Compiles a one-line kernel to PTX for the current GPU after :func:`bridge_row_stack`. The
    first real compile pays the same set-up, so the probe costs little beyond it.
    """
    if "reason" not in _PROBE:
        try:
            bridge_row_stack()
            cc = cuda.get_current_device().compute_capability
            cuda.compile_ptx(_probe_body, "void(float32[::1])", cc=cc)
            _PROBE["reason"] = None
        except Exception as exc:  # reported, never raised: the engine then says it cannot run
            _PROBE["reason"] = (
                f"numba-cuda cannot compile a kernel here ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:300]}); numba {_version('numba')}, numba-cuda "
                f"{_version('numba-cuda')}, NumPy {np.__version__}: install a numba-cuda and "
                f"NumPy that work together (pip install 'verigrad[cuda]')")
    return _PROBE["reason"]


def _version(dist):
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"
