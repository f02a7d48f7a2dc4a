"""``fastlib.kernels.blas.dot_into``: the kernels' matrix product, through NumPy's OpenBLAS.

Each operand layout the kernels pass (rows, a transposed view, rows with a leading dimension
wider than the row, an empty product) is held to the float64 product within the classical
bound for a dot product of length k computed in the dtype (|error| <= gamma_k sum |a||b|,
gamma_k = k u / (1 - k u)); ``VERIGRAD_BLAS=numba`` falls back to Numba's ``np.dot``.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from fastlib import blas_choice
from fastlib.kernels import blas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@njit
def _product(a, b, out):
    blas.dot_into(a, b, out)


def _layouts(rng, dtype):
    big = rng.standard_normal((40, 60)).astype(dtype)
    m, k, n = 7, 33, 19
    return {
        "rows": (big[:m, :k], big[:k, :n]),
        "transposed b": (big[:m, :k], big[:n, :k].T),
        "transposed a": (big[:k, :m].T, big[:k, :n]),
        "both transposed": (big[:k, :m].T, big[:n, :k].T),
        "leading dimension": (big[:m, 5:5 + k], big[2:2 + k, 10:10 + n]),
        "every other row": (big[::2, :k][:m], big[:k, :n]),
        "k = 0": (big[:m, :0], big[:0, :n]),
        "m = 0": (big[:0, :k], big[:k, :n]),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_layout_is_the_product_within_the_dot_product_bound(dtype):
    rng = np.random.default_rng(5)
    u = np.finfo(dtype).eps / 2
    for name, (a, b) in _layouts(rng, dtype).items():
        out = np.full((a.shape[0], b.shape[1]), np.nan, dtype)
        _product(a, b, out)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        k = a.shape[1]
        gamma = k * u / (1 - k * u)
        bound = gamma * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
        assert np.all(np.abs(out - exact) <= bound), name


def test_an_operand_of_neither_layout_is_refused_not_misread():
    if blas_choice.choice() is None:
        pytest.skip("no CBLAS of NumPy's here: dot_into is np.dot, which takes any layout")
    big = np.ones((10, 12), np.float32)
    out = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="neither rows with unit stride"):
        _product(big[:4, ::2], big[:6, :3], out)        # every other column: no unit stride


def test_mismatched_shapes_are_refused_as_np_dot_refuses_them():
    a, b = np.ones((3, 4), np.float32), np.ones((5, 2), np.float32)
    with pytest.raises(ValueError, match="incompatible"):
        _product(a, b, np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="incompatible"):
        _product(a, np.ones((4, 2), np.float32), np.zeros((2, 2), np.float32))


def test_numpys_library_is_taken_when_it_exports_cblas():
    import ctypes

    assert blas.CHOICE == blas_choice.choice()      # the kernels call what is stated
    # an independent look: any OpenBLAS file of NumPy's wheel with a CBLAS sgemm must be taken
    exported = [p for p in blas_choice._candidates()
                if any(hasattr(ctypes.CDLL(str(p)), s) for s, _, _ in blas_choice._SYMBOLS)]
    if os.environ.get("VERIGRAD_BLAS", "").strip().lower() == "numba" or not exported:
        assert blas.CHOICE is None
        assert blas_choice.describe() == "numba np.dot (SciPy's BLAS)"
    else:
        c = blas.CHOICE
        assert c is not None and c.path in map(str, exported)
        assert c.int_bits in (32, 64) and c.sgemm and c.dgemm
        assert c.names[0] in blas_choice.describe() and c.names[0] in blas_choice.stamp()


def test_verigrad_blas_numba_keeps_numbas_np_dot(tmp_path):
    # its own cache folder: another BLAS choice must not touch the kernels the suite shares
    env = dict(os.environ, VERIGRAD_BLAS="numba", NUMBA_CACHE_DIR=str(tmp_path))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    code = ("from fastlib import blas_choice\nfrom fastlib.kernels import blas\n"
            "print(blas.CHOICE, '|', blas_choice.describe())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "None | numba np.dot (SciPy's BLAS)"
