"""Embedding: a lookup table from integer indices of any shape to ``indices.shape + (dim,)``."""
from __future__ import annotations

import numpy as np

from fastlib.kernels import dense as kernels
from fastlib.layers.base import UNBOUNDED, Layer, set_sizes


class Embedding(Layer):
    """``y = weight[indices]``; the weight gradient scatter-adds the output rows (repeats sum).

    Parameters
    ----------
    num, dim : int
        ``weight (num, dim)``, Xavier-uniform with fan_in = num, fan_out = dim (as reflib).
    dtype, seed, rng :
        As for ``Dense``.

    Input: integer indices (or floats holding whole numbers) in ``[0, num)``, any shape; it has
    no gradient, so ``backward`` returns None for it.
    """

    takes_indices = True
    _out_attr = "dim"
    output_range = UNBOUNDED

    def __init__(self, num, dim, *, dtype=np.float32, seed=None, rng=None):
        super().__init__(dtype)
        set_sizes(self, num=num, dim=dim)
        self.reset_parameters(seed, rng)

    def infer_shape(self, shape):
        return tuple(shape) + (self.dim,)

    def indices(self, values):
        """``values`` as int64 indices, checked: whole numbers in ``[0, num)``.

        NOTE: checked on every forward (a min/max, cheap next to the gather), since an
        out-of-range negative index would otherwise wrap around silently.
        """
        arr = np.asarray(values)
        if arr.dtype.kind == "b" or arr.dtype.kind not in "iuf":
            raise TypeError(f"Embedding: indices must be integers, got dtype {arr.dtype}")
        if arr.dtype.kind == "f":
            whole = np.isfinite(arr) & (arr == np.round(arr))
            if not whole.all():
                at = tuple(int(i) for i in np.argwhere(~whole)[0])
                raise ValueError(f"Embedding: indices must be whole numbers, got {arr[at]} at "
                                 f"{at} (pass integer token ids, not embeddings)")
        # NOTE: the range is checked on the indices as given, before the cast: a float index
        # beyond int64 (1e30) would become -2**63 (with NumPy's warning) and be reported as that
        if arr.size and (arr.min() < 0 or arr.max() >= self.num):
            bad = arr[(arr < 0) | (arr >= self.num)].reshape(-1)[0].item()
            # a whole float as the int it stands for (7, not 7.0), one beyond int64 as 1e+30
            shown = bad if isinstance(bad, int) or abs(bad) >= 2 ** 63 else int(bad)
            raise ValueError(f"Embedding: index {shown} out of range [0, {self.num}); check the "
                             "vocabulary size (num)")
        return arr.astype(np.int64, copy=False)

    def _run(self, x):
        idx = np.ascontiguousarray(self.indices(x))
        self.hist_in, self.hist_pre = idx, None
        self._out_shape = idx.shape + (self.dim,)
        y = np.empty((idx.size, self.dim), self.dtype)
        kernels.embedding_forward(idx.reshape(-1), self._params["weight"], y)
        return y.reshape(self._out_shape)

    def backward(self, grad_out, need_input_grad=True):
        g = np.ascontiguousarray(self._cotangent(grad_out).reshape(-1, self.dim))
        idx = self.hist_in.reshape(-1)
        dw = np.empty_like(self._params["weight"])
        # the rows in index order: one sample of one position each (layout group 1)
        kernels.embedding_backward(idx, g, dw, np.empty(dw.size, np.float64), idx.size, 1, 1)
        return None, {"weight": dw}

    def get_config(self):
        return {"type": "Embedding", "num": self.num, "dim": self.dim}
