"""Tunables of the CUDA engine, in one place: block sizes, GEMM tile, grid cap.

The simulator (``NUMBA_ENABLE_CUDASIM=1``) runs every CUDA thread as a Python thread and every
block one after another, so it gets small blocks and a small grid cap. The kernels are written
for any of these values (grid-stride loops, tree reductions over any power-of-two block, tiles
that mask their edges), so the small simulator values exercise the same code paths a GPU runs,
including the loops that a large GPU grid would rarely repeat.
"""
from __future__ import annotations

from numba.core import config as _numba_config

#: True when numba.cuda runs on the simulator (decided by NUMBA_ENABLE_CUDASIM at numba import).
SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

#: Threads per block of elementwise and gather/scatter kernels.
BLOCK = 8 if SIMULATOR else 256

#: Largest number of threads per block of the tree reductions; a power of two.
REDUCE_BLOCK = 8 if SIMULATOR else 256

#: Side of the square shared-memory tiles of the GEMM kernel (TILE x TILE threads per block).
TILE = 4 if SIMULATOR else 16

#: Most blocks launched along one grid axis; grid-stride loops cover the rest.
MAX_GRID = 4 if SIMULATOR else 65535

#: Blocks of the guard's sum-of-squares pass over the flat gradient buffer (fixed, so the
#: update kernel reads a fixed, short list of block partials, every block in the same order).
GUARD_BLOCKS = 2 if SIMULATOR else 64

#: Most blocks of the guarded update (a grid-stride loop over the flat parameter buffer).
UPDATE_BLOCKS = 4 if SIMULATOR else 1024

#: Compile device kernels with numba-cuda's on-disk cache (``cache=True``), so a second process
#: loads them instead of compiling; fastlib's cache guard drops the cache when a source changes.
CACHE = True
