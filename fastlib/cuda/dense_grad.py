"""Dense's backward as two GEMM launches with the activation's derivative fused into their loads.

For ``out = f(x @ W + b)`` and cotangent ``g``, ``gpre = g * f'(pre)`` is never stored: the
GEMM of :mod:`.linalg` forms it while loading its tiles (:func:`gpre_loader`), rounded to the
dtype exactly where the unfused path stored it. ``grad_W = x^T gpre`` reads ``x`` along its
contiguous axis and, in the same launch, gives ``grad_b`` (column sums of ``gpre`` accumulated
in float64 in row order, rounded once); ``grad_x = gpre W^T``. So a Dense backward is two
launches (one for the first layer), whatever the split of the long axis (docs/gpu.md).
"""
from __future__ import annotations

import functools

from numba import cuda, float64

from .linalg import gemm_device
from .scalar import ACTIVATIONS, WITH_PARAM


@functools.lru_cache(maxsize=None)
def gpre_loader(scalar):
    """GEMM operand load ``load(g, pre, param)`` (the values ``g[i]``, ``pre[i]``): ``g *
    f'(pre)`` for the activation ``scalar`` (a name of :data:`.scalar.ACTIVATIONS`), or ``g``
    for ``None`` (linear, which reads no ``pre``)."""
    if scalar is None:
        def load(g, pre, param):
            return g
    elif scalar in WITH_PARAM:
        df = ACTIVATIONS[scalar][1]

        def load(g, pre, param):
            return g * df(float64(pre), param)
    else:
        df = ACTIVATIONS[scalar][1]

        def load(g, pre, param):
            return g * df(float64(pre))
    load.__name__ = load.__qualname__ = f"gpre_{scalar or 'linear'}"   # names the kernel
    compiled = cuda.jit(device=True)(load)
    compiled.uses_aux = scalar is not None
    return compiled


def dense_grads(d_g, d_x, d_w, d_pre, rows, n_in, n_out, scalar, param, d_gw, d_gb, d_gx=None):
    """Write ``grad_W`` into ``d_gw``, ``grad_b`` into ``d_gb`` (None: no bias) and, when
    ``d_gx`` is given, ``grad_x`` into it; ``scalar`` the activation (None: linear).

    Two launches at most; nothing allocated in a steady training step."""
    load = gpre_loader(scalar)
    # grad_W = x^T (n_in, rows) @ gpre (rows, n_out): x read transposed, gpre formed on load
    gemm_device(d_x, (0, 1, n_in), d_g, (0, n_out, 1), 1, n_in, n_out, rows, d_x.dtype,
                param=param, d_c=d_gw, load_b=load, aux_b=d_pre, d_colsum=d_gb)
    if d_gx is not None:
        # grad_x = gpre (rows, n_out) @ W^T (n_out, n_in): W read transposed
        gemm_device(d_g, (0, n_out, 1), d_w, (0, 1, n_out), 1, rows, n_in, n_out, d_x.dtype,
                    param=param, d_c=d_gx, load_a=load, aux_a=d_pre)
