"""The compiled program's records (fastlib.kernels.instructions): read by field name in Numba's
nopython mode on the CPU and in a ``numba.cuda`` kernel (under the simulator, in a subprocess).

Independent source: the hand-written tables below and their hand-computed sums.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
from numba import njit

from fastlib.kernels import instructions as ins


def _tables():
    """Two rows: a Dense reading slot 0 into slot 1 (weight block 0), a LayerNorm of slot 1
    into slot 3 with its 1/std in slot 2."""
    rows = np.full(2, ins.NONE, ins.ROW)
    for f in ins.INT_FIELDS + ins.REAL_FIELDS:
        rows[f] = 0
    rows[0]["op"], rows[0]["x"], rows[0]["y"], rows[0]["weight"] = ins.DENSE, 0, 1, 0
    rows[0]["slope"] = 0.25
    rows[1]["op"], rows[1]["x"], rows[1]["y"], rows[1]["rstd"] = ins.LAYER_NORM, 1, 3, 2
    rows[1]["eps"] = 0.5
    slots = np.array([(0, 1, 3), (6, 1, 2), (10, 1, 1), (12, 1, 2)], ins.SLOT)
    blocks = np.array([(0, 3, 2)], ins.BLOCK)
    return ins.ProgramTables(rows, slots, blocks)


@njit(cache=False)
def _read(tables, act, w, samples):
    """Per row: op + its real field times the sum of its output slot (and, for the Dense, of
    its weight block)."""
    out = np.zeros(tables.rows.shape[0])
    for k in range(tables.rows.shape[0]):
        r = tables.rows[k]
        y = ins.slot_view(act, tables.slots[r.y], samples)
        if r.op == ins.DENSE:
            out[k] = r.op + r.slope * y.sum() + ins.block_matrix(w, tables.blocks[r.weight]).sum()
        else:
            out[k] = r.op + r.eps * y.sum() + ins.slot_column(act, tables.slots[r.rstd],
                                                              samples).sum()
    return out


def test_the_records_are_read_by_field_name_in_nopython_mode():
    act = np.arange(16, dtype=np.float64)
    w = np.arange(6, dtype=np.float64)
    got = _read(_tables(), act, w, 2)
    # row 0: 0 + 0.25 * (6+7+8+9) + (0+...+5); row 1: 1 + 0.5 * (12+13+14+15) + (10+11)
    assert got.tolist() == [0 + 0.25 * 30 + 15, 1 + 0.5 * 54 + 21]


def test_the_layout_places_each_sample_and_position():
    got = [[ins.row_index(s, t, 5, 3, g) for t in range(3)] for g in (1, 2, 5)
           for s in range(5)]
    assert got[:5] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]]
    # groups of two samples time-major: (0, 1) rows 0..5, (2, 3) rows 6..11, (4) rows 12..14
    assert got[5:10] == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11], [12, 13, 14]]
    assert got[10:] == [[s, 5 + s, 10 + s] for s in range(5)]


def test_the_records_are_read_by_field_name_in_a_cuda_kernel():
    code = textwrap.dedent("""
        import numpy as np
        from numba import cuda
        from fastlib.kernels import instructions as ins

        @cuda.jit
        def read(rows, slots, act, out):
            k = cuda.grid(1)
            if k < rows.shape[0]:
                r = rows[k]
                y = slots[r.y]
                total = 0.0
                for i in range(y.offset, y.offset + 2 * y.steps * y.width):
                    total += act[i]
                out[k] = r.op + (r.slope if r.op == ins.DENSE else r.eps) * total

        rows = np.zeros(2, ins.ROW)
        rows[0]["op"], rows[0]["y"], rows[0]["slope"] = ins.DENSE, 0, 0.25
        rows[1]["op"], rows[1]["y"], rows[1]["eps"] = ins.LAYER_NORM, 1, 0.5
        slots = np.array([(6, 1, 2), (12, 1, 2)], ins.SLOT)
        out = np.zeros(2)
        read[1, 2](cuda.to_device(rows), cuda.to_device(slots),
                   cuda.to_device(np.arange(16.0)), out)
        print(out.tolist())
    """)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[-2] == str([0 + 0.25 * 30, 1 + 0.5 * 54])
