"""fastlib's Numba kernels: private ``@njit(cache=True)`` kernels on plain arrays, with the
public wrappers that validate and allocate beside them (stumpy's ``stump`` / ``_stump`` style).

The long story: docs/fastlib.md, section ``fastlib/kernels/__init__.py``.
"""
