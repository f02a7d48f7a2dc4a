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

if SIMULATOR:  # two races of the simulator's own, closed before any kernel runs under it
    from . import simulator_fixes as _simulator_fixes
    _simulator_fixes.install()

#: Threads per block of elementwise and gather/scatter kernels.
BLOCK = 8 if SIMULATOR else 256

#: Largest number of threads per block of the tree reductions; a power of two.
REDUCE_BLOCK = 8 if SIMULATOR else 256

#: Side of the square shared-memory tiles of the remaining 16 x 16 GEMM-like kernels (SwiGLU's
#: fused gate / up product and its two-half input gradient): TILE x TILE threads per block.
TILE = 4 if SIMULATOR else 16

#: The register-blocked GEMM (:mod:`.linalg`): a GEMM_BM x GEMM_BN block of C per thread block,
#: GEMM_BK-deep slices of A and B staged through shared memory, GEMM_TY x GEMM_TX threads, each
#: holding (GEMM_BM / GEMM_TY) x (GEMM_BN / GEMM_TX) outputs in registers (4 x 4 on a GPU).
GEMM_BM = GEMM_BN = 8 if SIMULATOR else 64
GEMM_BK = 4 if SIMULATOR else 16
GEMM_TX = GEMM_TY = 4 if SIMULATOR else 16

#: Blocks a launch should have to fill the GPU: a GEMM with fewer output tiles splits its inner
#: (long) axis into chunks, reduced in a fixed order (:mod:`.linalg`); the column sums likewise.
#: Per streaming multiprocessor, times the device's count (:func:`.device.sm_count`).
BLOCKS_PER_SM = 2

#: Each split of a GEMM's inner axis is at least this many GEMM_BK slices (a split that short
#: would spend more on its partials than on its products).
MIN_SPLIT_SLICES = 1 if SIMULATOR else 4

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

#: Each chunk of a split column sum (bias, norm scales, embedding backward) is at least this
#: many rows.
MIN_SPLIT_ROWS = 2 if SIMULATOR else 32

#: Most float64 entries of the embedding backward's per-chunk tables (splits x vocabulary x
#: width): a large vocabulary gets fewer chunks rather than a large workspace.
MAX_SPLIT_TABLE = 1 << 22

#: The widest attention head the device kernels take (their per-thread float64 accumulators
#: have this many entries); a wider head is refused when the model is built for the device.
ATTENTION_MAX_HEAD_DIM = 128

#: Recurrent layers (:mod:`.recurrent`): REC_THREADS threads per block; a forward tile holds
#: REC_COLUMNS gate columns (an LSTM's unit with its four gates), a backward tile REC_BACK_UNITS
#: units; a product is split into shares of at least REC_MIN_SHARE terms; REC_WEIGHT_CACHE
#: entries of shared memory hold a block's recurrent weights across steps (32 KiB in float64).
REC_THREADS = 16 if SIMULATOR else 128
REC_COLUMNS = 8 if SIMULATOR else 4
REC_BACK_UNITS = 2 if SIMULATOR else 1
REC_MIN_SHARE = 2 if SIMULATOR else 16
REC_WEIGHT_CACHE = 64 if SIMULATOR else 4096
