"""Checkpoints: killed writers leave nothing behind for long, one writer per checkpoint, the
umask decides the mode, and a resume with other settings warns or refuses."""
from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import fastlib
from fastlib import io
from fastlib.errors import CheckpointLockedError
from fastlib.training import checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "checkpoint_kill_worker.py"


def _temporaries(ck):
    return sorted(p.name for p in ck.parent.iterdir() if p.name.endswith(".tmp"))


def _kill_during_writes(tmp_path, kills):
    """SIGKILL the worker ``kills`` times, each time while a checkpoint write is under way."""
    ck = tmp_path / "ck.npz"
    last_epoch, landed = 0, 0
    rng = np.random.default_rng(0)
    for k in range(kills):
        proc = subprocess.Popen([sys.executable, str(WORKER), str(ck), "100000"], cwd=ROOT,
                                stderr=subprocess.PIPE)
        try:
            # wait for a write of this run (a temporary file: it exists only during a write),
            # let it go on for 0-30 ms, then kill
            deadline = time.monotonic() + 120
            leftovers = set(_temporaries(ck))
            while not set(_temporaries(ck)) - leftovers:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "no checkpoint write began"
                time.sleep(0.0005)
            # the previous kill's temporaries are gone once this run took the lock
            assert not leftovers & set(_temporaries(ck)), (leftovers, _temporaries(ck))
            time.sleep(float(rng.uniform(0, 0.03)))
            proc.kill()
        finally:
            proc.kill()
            proc.wait()
            proc.stderr.close()
        landed += bool(_temporaries(ck))
        if ck.exists():
            c = checkpoint.load_checkpoint(ck)  # never truncated
            assert c.epoch >= last_epoch  # never went back
            assert np.all(c.params["0.weight"] == c.step)  # content matches its epoch
            last_epoch = c.epoch
    # a last run starts (and so cleans up), trains two more epochs and ends normally
    subprocess.run([sys.executable, str(WORKER), str(ck), str(last_epoch + 2)], cwd=ROOT,
                   check=True, timeout=300)
    assert checkpoint.load_checkpoint(ck).epoch == last_epoch + 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz"]  # no tmp, no lock
    return landed


def test_sigkill_during_checkpoint_writes_loses_nothing_and_leaves_nothing():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        landed = _kill_during_writes(pathlib.Path(folder), kills=3)
    assert landed >= 1  # at least one kill left a partial temporary file to clean up


@pytest.mark.slow
def test_sigkill_during_checkpoint_writes_many_times(tmp_path):
    assert _kill_during_writes(tmp_path, kills=30) >= 10


def _data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((12, 4)).astype(np.float32), np.arange(12).reshape(-1, 1) % 3


def _mlp(seed=0):
    return fastlib.Sequential([fastlib.Dense(4, 5, "relu"), fastlib.Dense(5, 3)],
                              dtype=np.float32, seed=seed)


def _train(ck=None, resume=None, epochs=1, **kw):
    x, y = kw.pop("data", _data())
    return fastlib.train(_mlp(), x, y, epochs, 4, 0.05, "cross_entropy", optimizer="Adam",
                         checkpoint=ck, resume=resume, verbose=False, **kw)


def test_a_second_writer_fails_naming_the_holder(tmp_path):
    ck = tmp_path / "ck.npz"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, '.');"
         "from fastlib.training.checkpoint import CheckpointLock;"
         f"lock = CheckpointLock({str(ck)!r}).acquire(); print('held', flush=True);"
         "time.sleep(60)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointLockedError) as info:
            _train(ck)
        message = str(info.value)
        assert f"process {holder.pid} on host {socket.gethostname()}" in message
        assert str(ck) in message and "another checkpoint path" in message
        assert not ck.exists()  # refused before training, nothing written
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # the holder died without releasing: the kernel dropped its lock, so the next run goes
    _train(ck)
    assert checkpoint.load_checkpoint(ck).epoch == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz"]


def test_stale_temporaries_of_this_checkpoint_are_removed_at_the_next_start(tmp_path):
    ck = tmp_path / "ck.npz"
    stale = [tmp_path / ".ck.npz.k1ll3d.tmp", tmp_path / ".ck.npz.x.tmp"]
    others = [tmp_path / ".other.npz.k1ll3d.tmp", tmp_path / "ck.npz.tmp", tmp_path / "notes"]
    for p in stale + others:
        p.write_bytes(b"partial")
    _train(ck)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ck.npz"] +
                                                                 [p.name for p in others])


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_file_modes_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        path = _mlp().save(tmp_path / "m.npz")
        ck = tmp_path / "ck.npz"
        _train(ck)
    finally:
        os.umask(old)
    for p in (path, ck):
        assert p.stat().st_mode & 0o777 == 0o666 & ~mask, (p, oct(p.stat().st_mode))


def test_sigterm_during_a_write_removes_the_temporary_file(tmp_path):
    code = ("import sys, time, numpy as np; sys.path.insert(0, '.'); import fastlib\n"
            "real = np.savez\n"
            "def slow(f, **e):\n"
            "    f.write(b'partial'); f.flush(); print('writing', flush=True); time.sleep(60)\n"
            "np.savez = slow\n"
            "m = fastlib.Sequential([fastlib.Dense(2, 2)])\n"
            f"m.save({str(tmp_path / 'm.npz')!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        assert _temporaries(tmp_path / "m.npz")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # still ends by the signal
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert list(tmp_path.iterdir()) == []


def test_resume_compares_every_trajectory_setting(tmp_path):
    ck = tmp_path / "ck.npz"
    _train(ck, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same settings: not a word
        _train(resume=ck, epochs=2, seed=1)
    with pytest.warns(RuntimeWarning, match="'seed': \\(1, 2\\)"):
        _train(resume=ck, epochs=2, seed=2)
    with pytest.raises(ValueError, match="'seed': \\(1, 2\\).*resume_mismatch='warn'"):
        _train(resume=ck, epochs=2, seed=2, resume_mismatch="error")
    x, y = _data()
    with pytest.raises(ValueError, match="'data'"):
        _train(resume=ck, epochs=2, seed=1, data=(x + 1, y), resume_mismatch="error")
    with pytest.raises(ValueError, match="'divergence'"):
        _train(resume=ck, epochs=2, seed=1, divergence={"max_weight": 10.0},
               resume_mismatch="error")
    with pytest.raises(ValueError, match="'options'"):
        _train(resume=ck, epochs=2, seed=1, fused=False, resume_mismatch="error")
    with pytest.raises(ValueError, match="resume_mismatch must be"):
        _train(resume=ck, epochs=2, seed=1, resume_mismatch="ignore")
