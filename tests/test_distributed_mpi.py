"""Data-parallel training under ``mpiexec -n 2`` against one process.

Each run is a subprocess of ``tests/mpi_train_script.py`` (a 6-5-3 tanh MLP on 45 synthetic
samples, batch 8, three epochs, validation data): about 3 s each. The expected values come
from an independent run: one process, the same seed and global batch; the claim is equality
bit for bit (the summation order is fixed by the batch, never by the number of ranks). Against
plain ``train`` (one matrix product over the batch) the claim is the bound derived in the
README, checked on one step from a float64 re-computation of the step.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

try:  # part of the test extra: missing means the environment is wrong, never a skip
    import mpi4py  # noqa: F401
except ImportError as exc:
    raise ImportError(f"the MPI tests need the test extra (pip install '.[test]'): {exc}") \
        from None

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "mpi_train_script.py"


def mpiexec():
    """The mpiexec of the environment running the tests (the mpich wheel puts it next to
    the interpreter), so a fresh venv with the test extra needs no system MPI."""
    path = Path(sys.executable).parent / "mpiexec"
    assert path.exists(), (f"no mpiexec next to {sys.executable}: install the test extra "
                           "(pip install '.[test]' brings the mpich wheel)")
    return str(path)


def run(out, *args, ranks=None, timeout=120, check=True):
    cmd = [sys.executable, str(SCRIPT), str(out), *args]
    if ranks is not None:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)
    proc.seconds = time.monotonic() - start
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def load(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


RUNS = ("float64", "float32", "sh-float32")  # mpi_train_script.RUNS: train twice, train_sh


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One-process runs (distributed=True, no mpiexec) of mpi_train_script's RUNS."""
    d = tmp_path_factory.mktemp("one")
    run(d / "one.npz", "--both")
    return {name: load(d / f"one.{name}.npz") for name in RUNS}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The same runs under mpiexec -n 2 (rank 1's parameters under "rank1")."""
    d = tmp_path_factory.mktemp("two")
    run(d / "two.npz", "--both", ranks=2)
    return {name: dict(load(d / f"two.{name}.npz"), rank1=load(d / f"two.{name}.rank1.npz"))
            for name in RUNS}


def assert_same_run(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert np.array_equal(got[k], want[k]), (k, got[k], want[k])


@pytest.mark.parametrize("name", RUNS)  # train: Adam float64, Momentum float32; train_sh
def test_two_ranks_equal_one_process_bit_for_bit(one_process, two_ranks, name):
    # 45 samples in batches of 8: the last batch has 5 samples, fewer than the blocks
    got = dict(two_ranks[name])
    rank1 = got.pop("rank1")
    assert_same_run(got, one_process[name])  # parameters and every history (reduced metrics)
    assert_same_run(rank1, {k: v for k, v in got.items() if k.startswith("p:")})
    assert not bool(got["fused"])  # the distributed run takes the per-batch path
    # the run trained: parameters moved away from the initial ones
    sys.path.insert(0, str(ROOT / "tests"))
    from mpi_train_script import build

    start = build(np.dtype(got["p:0.weight"].dtype), [6, 5, 3], seed=3).parameters()
    assert max(np.max(np.abs(got[f"p:{k}"] - v)) for k, v in start.items()) > 1e-3
    if name.startswith("sh"):  # the plateau policy acted: the same decisions on every rank
        assert len(set(got["lr"].tolist())) > 1, got["lr"]


@pytest.mark.slow  # two more launches (~5 s); the checkpoint holds nothing about the ranks
def test_checkpoint_from_two_ranks_resumes_in_one(tmp_path, one_process):
    ckpt = tmp_path / "ckpt.npz"
    run(tmp_path / "k2.npz", "--epochs", "2", "--checkpoint", str(ckpt), ranks=2)
    assert ckpt.exists()
    run(tmp_path / "resumed.npz", "--epochs", "3", "--resume", str(ckpt))
    resumed = load(tmp_path / "resumed.npz")
    assert_same_run(resumed, one_process["float64"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_step_within_the_stated_bound_of_plain_train(tmp_path, dtype):
    """One SGD step (one batch of 8, a single Dense layer): the data-parallel step differs
    from plain train's per-batch step by at most the README's bound, computed here in float64
    (for a float64 run the bound's own rounding is a relative 1e-15 of it, far below its
    slack)."""
    common = ["--dtype", dtype, "--widths", "6", "3", "--n", "8", "--batch", "8",
              "--epochs", "1", "--optimizer", "SGD", "--blocks", "4"]
    # plain train, then the data-parallel step in one process (bit for bit that of K ranks)
    run(tmp_path / "dist.npz", *common, "--with-plain")
    plain, dist = load(tmp_path / "dist.plain.npz"), load(tmp_path / "dist.npz")
    sys.path.insert(0, str(ROOT / "tests"))
    from mpi_train_script import build, data

    model = build(np.dtype(dtype), [6, 3], seed=3).parameters()
    w, b = model["0.weight"].astype(np.float64), model["0.bias"].astype(np.float64)
    x, y = data(8, 6, 3, 11, np.dtype(dtype))
    x = x.astype(np.float64)
    n, lr, u = 8, 0.05, np.finfo(dtype).eps / 2
    z = x @ w + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dz = (p - np.eye(3)[y]) / n
    gamma = lambda k: k * u / (1 - k * u)  # noqa: E731 - Higham's gamma_k
    # a forward row may round differently in a product of another row count: |dz| moves by
    # at most 2 max|dlogit| (softmax's Jacobian rows have 1-norm <= 2), |dlogit| <= 2 gamma
    dlogit = 2 * gamma(7) * (np.abs(x) @ np.abs(w) + np.abs(b)).max(axis=1)
    ddz = 2 * dlogit / n
    for name, terms, dterms in (("0.weight", np.abs(x).T @ np.abs(dz), np.abs(x).T @ ddz[:, None]
                                 * np.ones((1, 3))),
                                ("0.bias", np.abs(dz).sum(axis=0), ddz.sum() * np.ones(3))):
        # each of the two sums of n products has error <= gamma_n |terms| (any order), the
        # blocks' rescaling (p - y)/n_j * n_j/n adds 3u relative, the forward dterms
        bound = lr * ((2 * gamma(n) + 3 * u) * terms + dterms) + \
            4 * u * np.abs(plain[f"p:{name}"]).astype(np.float64)
        diff = np.abs(plain[f"p:{name}"].astype(np.float64) - dist[f"p:{name}"])
        assert np.all(diff <= bound), (name, diff.max(), bound.min())
    # the same step at all (a step moves the weights by about lr * |dz||x| ~ 1e-2)
    assert np.max(np.abs(plain["p:0.weight"] - dist["p:0.weight"])) < 1e3 * u


def failure_lines(proc):
    """The lines verigrad's ranks and sentinels wrote about the failure."""
    return [ln for ln in (proc.stdout + proc.stderr).splitlines()
            if ln.startswith("verigrad distributed:")]


def test_a_rank_that_raises_stops_every_rank_naming_it(tmp_path):
    proc = run(tmp_path / "f.npz", "--fail", "raise", "--timeout", "30", ranks=2, check=False)
    assert proc.returncode != 0
    assert "rank 1 of 2 raised ValueError: planted failure" in proc.stderr
    assert len(failure_lines(proc)) == 1, failure_lines(proc)  # rank 0's death is not news
    assert proc.seconds < 30


def test_a_rank_that_stops_answering_is_named_within_the_timeout(tmp_path):
    # the warm-up epoch first: a rank still compiling must not count as silent
    proc = run(tmp_path / "f.npz", "--fail", "hang", "--timeout", "2", "--warm-up", ranks=2,
               check=False, timeout=60)
    assert proc.returncode != 0
    assert "rank 0 of 2 waited 2 s" in proc.stderr and "no answer from rank(s) 1" in \
        proc.stderr, proc.stderr[-2000:]
    assert len(failure_lines(proc)) == 1, failure_lines(proc)  # rank 1's end is not news
    assert proc.seconds < 30  # 2 s timeout + ping grace + start-up, never the hour it sleeps


def test_a_rank_that_never_reaches_train_is_named_at_start_up(tmp_path):
    # it exits with status 1 (not a signal): mpiexec lets the others run, they must give up
    proc = run(tmp_path / "f.npz", "--fail", "early", "--timeout", "2", ranks=2, check=False,
               timeout=60)
    assert proc.returncode != 0
    lines = failure_lines(proc)
    assert len(lines) == 1 and "rank 0 of 2 waited 2 s in start-up" in lines[0] and \
        "no answer from rank(s) 1, which did not reach the start of train" in lines[0], \
        (proc.stdout + proc.stderr)[-2000:]
    assert proc.seconds < 30


def test_a_rank_killed_by_sigkill_is_named_and_every_rank_stops(tmp_path):
    """SIGKILL: the rank cannot speak and mpiexec kills the other at once; its sentinel names
    it, with the PID mpiexec names (mpiexec's own message gives no rank)."""
    import re

    proc = run(tmp_path / "f.npz", "--fail", "kill", "--timeout", "30", ranks=2, check=False,
               timeout=60)
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr  # mpiexec (hydra) reports on stdout
    assert "BAD TERMINATION" in said and "signal 9" in said, said[-2000:]
    lines = failure_lines(proc)
    assert len(lines) == 1 and "rank 1 of 2 (pid" in lines[0] and "died during training" in \
        lines[0], said[-2000:]
    ours = re.search(r"rank 1 of 2 \(pid (\d+) on", lines[0]).group(1)
    assert re.search(rf"PID {ours} RUNNING AT", said), said[-2000:]
    assert proc.seconds < 30
    assert not (tmp_path / "f.npz").exists()


def test_without_mpi4py_distributed_says_how_to_install(tmp_path):
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import numpy as np, fastlib\n"
            "m = fastlib.Sequential([fastlib.Dense(2, 2)], dtype=np.float64, seed=0)\n"
            "try:\n"
            "    fastlib.train(m, np.zeros((4, 2)), np.zeros(4, int), 1, 2, 0.1, 'cross_entropy',"
            " verbose=False, distributed=True)\n"
            "except ImportError as e:\n"
            "    print('IMPORT-ERROR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert "IMPORT-ERROR" in proc.stdout and "verigrad[mpi]" in proc.stdout, proc.stderr


@pytest.mark.parametrize("algorithm", ["targetprop", "cd"])
def test_targetprop_and_cd_say_they_do_not_run_data_parallel(algorithm):
    import fastlib

    m = fastlib.Sequential([fastlib.Dense(4, 3, "tanh"), fastlib.Dense(3, 2)], dtype=np.float64,
                           seed=0)
    x = np.random.default_rng(0).random((6, 4))
    with pytest.raises(NotImplementedError, match="does not run data-parallel"):
        if algorithm == "cd":
            from fastlib.rbm import RBM

            fastlib.train(RBM(4, 3, dtype=np.float64, seed=0), x, None, 1, 2, 0.1, None,
                          algorithm="cd", verbose=False, distributed=True)
        else:
            fastlib.train(m, x, np.zeros(6, int), 1, 2, 0.1, "cross_entropy",
                          algorithm="targetprop", verbose=False, distributed=True)


@pytest.mark.slow  # two launches of the CLI (~10 s)
def test_verigrad_train_distributed_prints_once_and_saves_the_one_process_model(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", VERIGRAD_THREADS="1")
    base = [sys.executable, "-m", "reports", "train", "--distributed", "--epochs", "1",
            "--hidden", "8", "--dtype", "float64"]
    one = subprocess.run(base + ["--save", str(tmp_path / "one.npz")], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300)
    two = subprocess.run([mpiexec(), "-n", "2"] + base + ["--save", str(tmp_path / "two.npz")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("test accuracy") == 1  # only rank 0 speaks
    assert "data-parallel on 2 MPI rank(s)" in two.stdout
    a, b = load(tmp_path / "one.npz"), load(tmp_path / "two.npz")
    weights = [k for k in a if k.startswith("param/")]
    assert len(weights) == 4 and all(np.array_equal(a[k], b[k]) for k in weights)
