"""The sentinel of one MPI rank: names the rank when it dies without a word.

The long story: docs/fastlib.md, section ``fastlib/training/rank_sentinel.py``.
"""
import os
import sys
import time

DONE = b"done"        # the rank finished training
CLAIMED = b"claimed"  # the rank reported its own failure and claimed it
GRACE = 0.5           # seconds a sentinel that cannot tell waits for the first one's claim
KEEP = 3.0            # seconds a claim stays (every other sentinel looks within GRACE), then goes
# NOTE: how much earlier than every other sentinel of its host a sentinel must have woken to
# call its rank the first death when it found them all dead already: mpiexec kills the others
# only after it has seen the first one die, and a rank's teardown takes milliseconds more
# (measured here: the killed ranks' sentinels woke 14-25 ms after the first's), while ranks
# that die together wake their sentinels within scheduling jitter
FIRST_BY = 0.005


def alive(pid):
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): signal 0 tells whether the process exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def claim(path, text):
    """Create ``path`` holding ``text``; False when someone else created it first."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except OSError:  # no writable temporary directory: speak rather than stay silent
        return True
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


LAUNCHERS = ("mpiexec", "mpirun", "prterun", "orterun")


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def launcher_stderr():
    """Where the sentinel writes: the stderr of ``mpiexec`` when it runs on this host (then
    the message reaches the user's terminal or pipe even after mpiexec has exited, and whoever
    reads that pipe to its end waits for it), else the rank's parent's (mpiexec's proxy or
    daemon, forwarding to mpiexec); ``-`` (the rank's own stderr) without ``/proc``."""
    try:
        pid = os.getppid()
        first = f"/proc/{pid}/fd/2"
        for _ in range(3):
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip().startswith(LAUNCHERS):
                    path = f"/proc/{pid}/fd/2"
                    if os.access(path, os.W_OK):
                        return path
            pid = _parent(pid)
            if pid <= 1:
                break
        return first if os.access(first, os.W_OK) else "-"
    except (OSError, ValueError, IndexError):
        return "-"


class Sentinel:
    """The rank's side: starts the sentinel process; :meth:`finish` sends the word."""

    def __init__(self, rank, size, host, claim_path, peers):
        import subprocess

        self.claim_path = claim_path
        out = launcher_stderr()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(rank), str(size), host,
             str(os.getpid()), claim_path, out] + [str(p) for p in peers],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if out != "-" else None,
            start_new_session=True)  # its own session: mpiexec's clean-up does not reach it

    def finish(self, word=DONE):
        """Training ended (``DONE``) or the rank reported its own failure and claimed it
        (``CLAIMED``: the sentinel removes the claim later): the sentinel leaves quietly."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(word)
            self.proc.stdin.close()
        except OSError:  # the sentinel is gone already: nothing to tell it
            pass
        if word == DONE:  # a claimed failure is followed by MPI_Abort: no need to wait
            try:
                self.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - never let the sentinel hold training up
                pass
        self.proc = None


def _forget_claim(path):
    """Remove the claim once every other sentinel has looked (no file outlives the job)."""
    time.sleep(KEEP)
    try:
        os.unlink(path)
    except OSError:
        pass


def _wake_path(claim_path, pid):
    return f"{claim_path}.woke-{pid}"


def _note_wake(claim_path, pid, woke):
    """Write the time this sentinel saw its rank die (for :func:`_woke_first`); the path, or
    None when it could not be written."""
    path = _wake_path(claim_path, pid)
    try:
        with open(path, "w") as f:
            f.write(repr(woke))
    except OSError:
        return None
    return path


def _woke_first(claim_path, woke, peers):
    """Whether every other rank's sentinel here noted a wake at least FIRST_BY after
    ``woke`` (False when one noted none: it may still run, or cannot tell)."""
    for peer in peers:
        try:
            with open(_wake_path(claim_path, peer)) as f:
                theirs = float(f.read())
        except (OSError, ValueError):
            return False
        if theirs < woke + FIRST_BY:
            return False
    return True


def _forget(path, wait=True):
    """Remove a wake note once the other sentinels have read it (within GRACE of theirs)."""
    if path is None:
        return
    if wait:
        time.sleep(KEEP)
    try:
        os.unlink(path)
    except OSError:
        pass


def main(argv):
    rank, size, host, pid, claim_path, out_path = argv[:6]
    peers = [int(p) for p in argv[6:]]
    try:
        out = sys.stderr if out_path == "-" else open(out_path, "w")
    except OSError:
        out = sys.stderr
    word = sys.stdin.buffer.read()
    if word == DONE:
        return 0
    if word == CLAIMED:
        try:
            out.close()  # hold nothing of the launcher's while waiting
        except OSError:
            pass
        _forget_claim(claim_path)
        return 0
    woke = time.monotonic()
    noted = _note_wake(claim_path, pid, woke)
    who = f"rank {rank} of {size} (pid {pid} on {host})"
    first = any(alive(p) for p in peers)
    if not first:  # the others here are gone too (or there are none): let the first claim
        # NOTE: on a busy host a sentinel may wake after mpiexec has already killed the
        # others; when every other sentinel here woke FIRST_BY later, this one's rank still
        # died first (each sentinel has noted its time within GRACE)
        time.sleep(GRACE)
        first = bool(peers) and _woke_first(claim_path, woke, peers)
        if not first and peers:
            time.sleep(GRACE)
    if not claim(claim_path, f"{who} died\n"):
        _forget(noted)
        return 0  # an earlier failure on this host was claimed (and reported) first
    if first:
        msg = (f"{who} died during training without a word (killed by a signal: SIGKILL, "
               f"the OOM killer, or a crash in native code) while the other ranks on {host} "
               "ran; the others stop (mpiexec ends them, or they give up after the timeout)")
    else:
        msg = (f"{who} ended during training without a word, after or together with the other "
               f"ranks on {host}: killed by a signal, or ended by mpiexec after a rank "
               "elsewhere failed (the first failure's own message names that rank)")
    try:
        out.write(f"verigrad distributed: {msg}\n")
        out.flush()
        out.close()
    except OSError:  # the launcher is gone: nobody to tell
        pass
    _forget_claim(claim_path)
    _forget(noted, wait=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
