"""fastlib's Numba kernels: private ``@njit(cache=True)`` kernels on plain arrays, with the
public wrappers that validate and allocate beside them (stumpy's ``stump`` / ``_stump`` style).

Modules (one idea each):

- ``vecmath``: vectorisable exp / log / log1p / tanh / Phi, dispatched on float32 / float64.
- ``scalar``: ``<op>_f`` / ``<op>_df`` for every unary op: the single source of each activation,
  inlined by the elementwise kernels and by the layers' fused kernels.
- ``elementwise``: the unary ops over arrays (forward and VJP).
- ``binary``: add, sub, mul, div, maximum with NumPy broadcasting.
- ``reduce``: pairwise sums, sum / mean / logsumexp, summing a gradient back to a shape.
- ``linalg``: matmul (2-D and batched) through BLAS.
- ``structure``: transpose, reshape, concat, slice through one strided-copy kernel.
- ``norm``: softmax, log_softmax, layer_norm, rms_norm over rows.
- ``loss``: the five losses, forward and VJP fused where that pays.

NOTE: Numba's on-disk cache is keyed by each kernel's own source file; it does not notice edits
to an inlined function in another module (``vecmath``, ``scalar``). After editing those, delete
``fastlib/kernels/__pycache__/*.nbi`` and ``*.nbc``.

Importing this package imports no kernel module (and compiles nothing).
"""
