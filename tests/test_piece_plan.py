"""The piece plan of the compiled training paths (fastlib.training.piece_plan).

Independent sources: the same run in another process on one thread and on two (equal bit for
bit by design: the plan, not the threads, fixes every summation order); the generic per-batch
path (``fused=False``) for what a plan computes; the plan handed in, for what is recorded.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastlib
from fastlib import config
from fastlib.training import general_schedule, mlp_schedule, piece_plan

PLANS = (1, 2, 3, 4, 8, 16)

# trains one tiny model of each compiled schedule at every plan and prints the bytes of the
# final parameters and losses, hashed; run once with one Numba thread and once with two
_SCRIPT = textwrap.dedent("""
    import hashlib, json, sys
    import numpy as np
    import fastlib
    plans = json.loads(sys.argv[1])
    rng = np.random.default_rng(0)
    x2 = rng.standard_normal((21, 5)); y2 = rng.integers(0, 3, (21, 1))
    x3 = rng.standard_normal((21, 3, 2)); y3 = rng.standard_normal((21, 3, 2))

    def models():
        yield "mlp", "mlp", fastlib.Sequential([fastlib.Dense(5, 9, "tanh"),
                                                fastlib.Dense(9, 3)], seed=1), x2, y2, "cross_entropy"
        yield "lstm", "general", fastlib.Sequential([fastlib.LSTM(2, 3), fastlib.Dense(3, 3)],
                                                    seed=1), x3, y2, "cross_entropy"
        yield "attention", "general", fastlib.Sequential([
            fastlib.MultiHeadAttention(2, 2, causal=True), fastlib.LayerNorm(2)], seed=1), \
            x3, y3, "mse"

    out = {}
    for plan in plans:
        for name, schedule, m, x, y, loss in models():
            r = fastlib.train(m, x, y, 2, 6, 0.05, loss, optimizer="Adam", seed=3,
                              gradient_clip=0.5, clip_mode="norm", verbose=False, pieces=plan)
            assert (r.path, r.schedule) == ("program", schedule) and r.piece_plan == {"pieces": plan, "source": "argument"}, r
            h = hashlib.sha256(np.asarray(r.loss_history).tobytes())
            for k, v in sorted(m.parameters().items()):
                h.update(v.tobytes())
            out[f"{name} {plan}"] = h.hexdigest()
    print(json.dumps(out))
""")


def _run(threads):
    env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "VERIGRAD_ADAPTIVE_THREADS": "0"}
    env.pop("VERIGRAD_PIECES", None)
    env.pop("VERIGRAD_THREADS", None)
    run = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(PLANS)], capture_output=True,
                         text=True, env=env, cwd=pathlib.Path(__file__).parents[1], timeout=900)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


# two subprocesses compiling every path at six plans: minutes, so a deeper run (-m slow)
@pytest.mark.slow
def test_every_plan_gives_the_same_bits_on_one_thread_and_two():
    one, two = _run(1), _run(2)
    assert len(one) == 3 * len(PLANS)
    assert one == two


def _mlp(seed=0):
    return fastlib.Sequential([fastlib.Dense(5, 6, "relu"), fastlib.Dense(6, 3)], seed=seed)


def _data(n=13):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 5)), rng.integers(0, 3, (n, 1))


def test_the_plan_comes_from_the_argument_the_config_or_the_machine(monkeypatch):
    x, y = _data()
    monkeypatch.setattr(config, "PIECES", None)
    r = fastlib.train(_mlp(), x, y, 1, 4, 0.1, "cross_entropy", verbose=False)
    # 45 parameters, below SPLIT_MIN_PARAMS: one piece on any machine
    assert r.piece_plan == {"pieces": 1, "source": "machine"} and r.schedule == "mlp"
    monkeypatch.setattr(config, "PIECES", "3")   # as read from VERIGRAD_PIECES
    r = fastlib.train(_mlp(), x, y, 1, 4, 0.1, "cross_entropy", verbose=False)
    assert r.piece_plan == {"pieces": 3, "source": "config"}
    r = fastlib.train(_mlp(), x, y, 1, 4, 0.1, "cross_entropy", verbose=False, pieces=5)
    assert r.piece_plan == {"pieces": 5, "source": "argument"}
    r = fastlib.train(_mlp(), x, y, 1, 4, 0.1, "cross_entropy", verbose=False, fused=False)
    assert r.path == "generic" and r.schedule is None and r.piece_plan is None and not r.fused


@pytest.mark.parametrize("bad", [0, -1, 2.5, "two", piece_plan.MAX_PIECES + 1])
def test_a_bad_plan_is_refused_with_its_name_and_the_fix(bad):
    x, y = _data()
    m = _mlp()
    before = {k: v.copy() for k, v in m.parameters().items()}
    with pytest.raises(ValueError, match=r"pieces must be a whole number of pieces from 1 to "
                                         r".*leave it unset"):
        fastlib.train(m, x, y, 1, 4, 0.1, "cross_entropy", verbose=False, pieces=bad)
    for k, v in m.parameters().items():
        np.testing.assert_array_equal(v, before[k])


def test_a_checkpoint_carries_the_plan_and_a_resume_keeps_it(tmp_path, monkeypatch):
    """Two epochs at plan 3 (from the config), saved, resumed with no plan set: the resumed
    run uses the saved plan and ends bit for bit where the uninterrupted run ends."""
    x, y = _data(n=17)
    kw = dict(optimizer="Adam", seed=5, verbose=False)
    monkeypatch.setattr(config, "PIECES", 3)
    full = _mlp()
    fastlib.train(full, x, y, 4, 3, 0.01, "cross_entropy", **kw)
    ck = tmp_path / "ck.npz"
    fastlib.train(_mlp(), x, y, 2, 3, 0.01, "cross_entropy", checkpoint=ck, **kw)
    resumed = _mlp(seed=9)
    monkeypatch.setattr(config, "PIECES", None)
    r = fastlib.train(resumed, x, y, 4, 3, 0.01, "cross_entropy", resume=ck, **kw)
    assert r.piece_plan == {"pieces": 3, "source": "checkpoint"}
    for k, v in full.parameters().items():
        np.testing.assert_array_equal(resumed.parameters()[k], v)


def test_threads_never_exceed_the_pieces_or_the_cores(monkeypatch):
    monkeypatch.setattr(config, "THREADS", 64)
    cores = config.usable_cores()
    assert piece_plan.piece_threads(1) == 1
    assert piece_plan.piece_threads(1000) == cores
    monkeypatch.setattr(config, "THREADS", 1)
    assert piece_plan.piece_threads(16) == 1


def test_the_schedules_choose_from_the_cores_and_the_shapes():
    # sample pieces: one per core down to one sample each; recurrent pieces of at most
    # PIECE sequences (batch 32: 2 pieces of 16 on one or two cores)
    assert general_schedule.PIECE == 16
    assert [general_schedule.machine_pieces(32, 64, True, c) for c in (1, 2, 4, 16, 64)] == \
        [2, 2, 4, 16, 32]
    # no recurrent row: one piece below MIN_PIECE_ROWS rows, else one per core (at most a
    # sample each)
    rows = general_schedule.MIN_PIECE_ROWS
    assert general_schedule.machine_pieces(rows - 1, 1, False, 16) == 1
    assert [general_schedule.machine_pieces(32, 64, False, c) for c in (1, 2, 16, 64)] == \
        [1, 2, 16, 32]
    assert mlp_schedule.machine_pieces(mlp_schedule.SPLIT_MIN_PARAMS - 1, 16) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("plan", [1, 4, 9])
def test_sample_pieces_at_the_boundaries_equal_the_generic_path(dtype, plan):
    """Batches of 5 (the last of 2): plan 4 leaves pieces of one sample, plan 9 more pieces
    than samples; the compiled epochs agree with the per-batch loop to summation order."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 3, 2)).astype(dtype)
    y = rng.integers(0, 2, (7, 1))
    got = []
    for fused in (True, False):
        m = fastlib.Sequential([fastlib.LSTM(2, 3), fastlib.Dense(3, 2)], dtype=dtype, seed=4)
        r = fastlib.train(m, x, y, 2, 5, 0.05, "cross_entropy", optimizer="Adam", seed=1,
                          verbose=False, fused=fused, pieces=plan)
        assert r.schedule == ("general" if fused else None)
        got.append(m.parameters())
    # two epochs of four Adam steps on O(1) values: the paths differ by summation order
    # (a few eps per product), amplified by Adam's normalisation near zero gradients
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for k, v in got[1].items():
        np.testing.assert_allclose(got[0][k], v, rtol=tol, atol=tol)
